#include "cli/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace fedfleet::cli {
namespace {

// Chart frame in SVG user units (the SVG scales to its container's width).
constexpr double kWidth = 760;
constexpr double kHeight = 300;
constexpr double kLeft = 72;   // room for tick labels and the y-axis label
constexpr double kRight = 28;  // half of the last x tick label
constexpr double kTop = 14;
constexpr double kBottom = 48;  // tick labels and the x-axis label
constexpr int kTargetTicks = 6;

std::string num(double v, int decimals = 1) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

// A data value as an attribute (shortest exact text is not needed: 6 significant digits).
std::string dataNum(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// The range [lo, hi] widened to whole ticks of a 1-2-5 step, and the ticks.
struct Scale {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
  int decimals = 0;
};

Scale niceScale(double lo, double hi, bool integer_ticks, bool fixed_lo, bool fixed_hi) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.5;
    if (!fixed_lo) lo -= pad;
    if (!fixed_hi || hi == lo) hi += pad;
  }
  const double raw = (hi - lo) / kTargetTicks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
  if (integer_ticks) step = std::max(1.0, std::round(step));
  Scale s;
  s.step = step;
  s.lo = fixed_lo ? lo : std::floor(lo / step + 1e-9) * step;
  s.hi = fixed_hi ? hi : std::ceil(hi / step - 1e-9) * step;
  if (s.hi <= s.lo) s.hi = s.lo + step;
  const double first = std::ceil(s.lo / step - 1e-9) * step;
  for (double t = first; t <= s.hi + step * 1e-6 && s.ticks.size() < 50; t += step) {
    s.ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  s.decimals = step >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  return s;
}

// The data range of `values` (finite only) after `scale`, with the axis' fixed ends applied.
Scale axisScale(const ChartAxis& axis, double data_lo, double data_hi) {
  if (data_lo > data_hi) data_lo = 0, data_hi = 1;  // no data
  const double lo = axis.min.value_or(data_lo);
  const double hi = axis.max.value_or(data_hi);
  return niceScale(lo, hi, axis.integer_ticks, axis.min.has_value(), axis.max.has_value());
}

struct Frame {
  double left = kLeft, right = kRight, top = kTop, bottom = kBottom;
  double width = kWidth, height = kHeight;
  double plotWidth() const { return width - left - right; }
  double plotHeight() const { return height - top - bottom; }
};

double mapX(const Frame& f, const Scale& s, double v) {
  return f.left + (v - s.lo) / (s.hi - s.lo) * f.plotWidth();
}
double mapY(const Frame& f, const Scale& s, double v) {
  return f.top + f.plotHeight() - (v - s.lo) / (s.hi - s.lo) * f.plotHeight();
}

std::string svgOpen(const std::string& id, const Frame& f) {
  return "<svg data-chart=\"" + htmlEscape(id) + "\" viewBox=\"0 0 " + num(f.width, 0) + " " +
         num(f.height, 0) + "\" width=\"" + num(f.width, 0) + "\" height=\"" + num(f.height, 0) +
         "\" style=\"max-width:" + num(f.width, 0) +
         "px\" role=\"img\" font-family=\"sans-serif\" font-size=\"12\" "
         "xmlns=\"http://www.w3.org/2000/svg\">"
         "<defs><clipPath id=\"clip-" +
         htmlEscape(id) + "\"><rect x=\"" + num(f.left) + "\" y=\"" + num(f.top) + "\" width=\"" +
         num(f.plotWidth()) + "\" height=\"" + num(f.plotHeight()) + "\"/></clipPath></defs>";
}

// Grid lines, tick labels and axis labels.
std::string axes(const Frame& f, const Scale& xs, const Scale& ys, const ChartAxis& x,
                 const ChartAxis& y, bool x_ticks = true) {
  std::string out = "<g class=\"axes\">";
  for (double t : ys.ticks) {
    const double py = mapY(f, ys, t);
    out += "<line x1=\"" + num(f.left) + "\" x2=\"" + num(f.left + f.plotWidth()) + "\" y1=\"" +
           num(py) + "\" y2=\"" + num(py) + "\" stroke=\"#e3e3e3\"/>";
    out += "<text x=\"" + num(f.left - 6) + "\" y=\"" + num(py + 4) +
           "\" text-anchor=\"end\" fill=\"#444\">" + num(t, ys.decimals) + "</text>";
  }
  if (x_ticks) {
    for (double t : xs.ticks) {
      const double px = mapX(f, xs, t);
      out += "<line x1=\"" + num(px) + "\" x2=\"" + num(px) + "\" y1=\"" + num(f.top) + "\" y2=\"" +
             num(f.top + f.plotHeight()) + "\" stroke=\"#f0f0f0\"/>";
      out += "<text x=\"" + num(px) + "\" y=\"" + num(f.top + f.plotHeight() + 16) +
             "\" text-anchor=\"middle\" fill=\"#444\">" + num(t, xs.decimals) + "</text>";
    }
  }
  out += "<rect x=\"" + num(f.left) + "\" y=\"" + num(f.top) + "\" width=\"" + num(f.plotWidth()) +
         "\" height=\"" + num(f.plotHeight()) + "\" fill=\"none\" stroke=\"#999\"/>";
  out += "<text class=\"axis-label\" x=\"" + num(f.left + f.plotWidth() / 2) + "\" y=\"" +
         num(f.height - 8) + "\" text-anchor=\"middle\" fill=\"#222\">" + htmlEscape(x.label) +
         "</text>";
  const double cy = f.top + f.plotHeight() / 2;
  out += "<text class=\"axis-label\" x=\"16\" y=\"" + num(cy) +
         "\" text-anchor=\"middle\" fill=\"#222\" transform=\"rotate(-90 16 " + num(cy) + ")\">" +
         htmlEscape(y.label) + "</text>";
  return out + "</g>";
}

struct LegendEntry {
  std::string name;
  std::string color;
  bool dashed = false;
};

std::string legend(const std::vector<LegendEntry>& entries) {
  std::string out = "<figcaption class=\"legend\">";
  for (const auto& e : entries) {
    out += "<span class=\"key\"><span class=\"swatch\" style=\"background:" + htmlEscape(e.color) +
           (e.dashed ? ";opacity:0.6" : "") + "\"></span>" + htmlEscape(e.name) + "</span> ";
  }
  return out + "</figcaption>";
}

std::string figure(const std::string& title, const std::string& svg, const std::string& legend) {
  return "<figure class=\"chart\"><div class=\"chart-title\">" + htmlEscape(title) + "</div>" +
         svg + legend + "</figure>\n";
}

}  // namespace

std::string paletteColor(size_t i) {
  static const char* kColors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                  "#E69F00", "#56B4E9", "#000000", "#F0E442"};
  return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
}

std::string htmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string renderLineChart(const std::string& id, const std::string& title, const ChartAxis& x,
                            const ChartAxis& y, const std::vector<ChartSeries>& series) {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const auto& s : series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      const double vx = s.x[i] * x.scale, vy = s.y[i] * y.scale;
      if (!std::isfinite(vx) || !std::isfinite(vy)) continue;
      xlo = std::min(xlo, vx), xhi = std::max(xhi, vx);
      ylo = std::min(ylo, vy), yhi = std::max(yhi, vy);
    }
  }
  const Frame f;
  const Scale xs = axisScale(x, xlo, xhi), ys = axisScale(y, ylo, yhi);
  std::string svg = svgOpen(id, f) + axes(f, xs, ys, x, y);
  svg += "<g clip-path=\"url(#clip-" + htmlEscape(id) + ")\">";
  std::vector<LegendEntry> entries;
  for (const auto& s : series) {
    std::string d, markers;
    size_t points = 0;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      const double vx = s.x[i] * x.scale, vy = s.y[i] * y.scale;
      if (!std::isfinite(vx) || !std::isfinite(vy)) continue;
      const std::string px = num(mapX(f, xs, vx)), py = num(mapY(f, ys, vy));
      d += (points == 0 ? "M" : " L") + px + " " + py;
      markers += "<circle cx=\"" + px + "\" cy=\"" + py + "\" r=\"2.5\" fill=\"" +
                 htmlEscape(s.color) + "\"/>";
      ++points;
    }
    svg += "<path class=\"series\" data-series=\"" + htmlEscape(s.name) + "\" data-points=\"" +
           std::to_string(points) + "\" d=\"" + d + "\" fill=\"none\" stroke=\"" +
           htmlEscape(s.color) + "\" stroke-width=\"2\"" +
           (s.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>";
    if (points <= 200) svg += "<g class=\"markers\">" + markers + "</g>";
    entries.push_back({s.name, s.color, s.dashed});
  }
  svg += "</g></svg>";
  return figure(title, svg, legend(entries));
}

std::string renderBarChart(const std::string& id, const std::string& title,
                           const std::vector<double>& categories, const ChartAxis& x,
                           const ChartAxis& y, const std::vector<BarSeries>& series, bool stacked) {
  // The narrowest gap between categories sets the bar width.
  std::vector<double> sorted = categories;
  std::sort(sorted.begin(), sorted.end());
  double gap = 1;
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i] > sorted[i - 1]) gap = std::min(gap, sorted[i] - sorted[i - 1]);
  }
  double ymax = 0;
  for (size_t c = 0; c < categories.size(); ++c) {
    double total = 0;
    for (const auto& s : series) {
      const double v = c < s.values.size() && std::isfinite(s.values[c]) ? s.values[c] : 0;
      total = stacked ? total + std::max(0.0, v) * y.scale : std::max(total, v * y.scale);
    }
    ymax = std::max(ymax, total);
  }
  ChartAxis xa = x, ya = y;
  if (!sorted.empty() && !xa.min) xa.min = (sorted.front() - gap * 0.6) * x.scale;
  if (!sorted.empty() && !xa.max) xa.max = (sorted.back() + gap * 0.6) * x.scale;
  if (!ya.min) ya.min = 0;
  const Frame f;
  // 5% headroom, so the tallest bar does not touch the frame.
  const Scale xs = axisScale(xa, 0, 1), ys = axisScale(ya, 0, ymax > 0 ? ymax * 1.05 : 1);
  std::string svg = svgOpen(id, f) + axes(f, xs, ys, x, y);
  svg += "<g clip-path=\"url(#clip-" + htmlEscape(id) + ")\">";
  const double slot = std::min(40.0, 0.8 * gap * x.scale / (xs.hi - xs.lo) * f.plotWidth());
  const double bar = stacked || series.empty() ? slot : slot / series.size();
  for (size_t c = 0; c < categories.size(); ++c) {
    const double cx = mapX(f, xs, categories[c] * x.scale);
    double base = 0;
    for (size_t k = 0; k < series.size(); ++k) {
      const auto& s = series[k];
      const double v = c < s.values.size() && std::isfinite(s.values[c]) ? s.values[c] : 0;
      if (v <= 0) continue;
      const double lo = stacked ? base : 0, hi = lo + v * y.scale;
      if (stacked) base = hi;
      const double left = stacked ? cx - slot / 2 : cx - slot / 2 + k * bar;
      const double top = mapY(f, ys, hi), bottom = mapY(f, ys, lo);
      svg += "<rect class=\"bar\" data-series=\"" + htmlEscape(s.name) + "\" data-x=\"" +
             dataNum(categories[c]) + "\" data-value=\"" + dataNum(v) + "\" x=\"" + num(left) +
             "\" y=\"" + num(top) + "\" width=\"" + num(std::max(1.0, bar - 0.5)) + "\" height=\"" +
             num(std::max(0.5, bottom - top)) + "\" fill=\"" + htmlEscape(s.color) + "\"><title>" +
             htmlEscape(s.name) + " " + dataNum(categories[c]) + ": " + dataNum(v) +
             "</title></rect>";
    }
  }
  svg += "</g></svg>";
  std::vector<LegendEntry> entries;
  for (const auto& s : series) entries.push_back({s.name, s.color, false});
  return figure(title, svg, legend(entries));
}

std::string renderTimeline(const std::string& id, const std::string& title,
                           const std::vector<TimelineRow>& rows,
                           const std::vector<TimelineKind>& kinds, const ChartAxis& x,
                           std::optional<double> end_marker) {
  constexpr double kRowHeight = 14;
  Frame f;
  f.width = 1000;  // a full-width chart, not one of a grid's columns
  f.left = 130;    // client ids
  f.height = kTop + kBottom + std::max<double>(1, rows.size()) * kRowHeight;
  double xhi = end_marker.value_or(0) * x.scale;
  for (const auto& r : rows) {
    for (const auto& s : r.segments) xhi = std::max(xhi, s.to * x.scale);
  }
  ChartAxis xa = x;
  if (!xa.min) xa.min = 0;
  const Scale xs = axisScale(xa, 0, xhi > 0 ? xhi : 1);
  // A y scale of one unit per row, so the grid falls between rows; no y ticks.
  Scale ys;
  ys.lo = 0;
  ys.hi = std::max<double>(1, rows.size());
  ChartAxis ya;
  std::string svg = svgOpen(id, f) + axes(f, xs, ys, x, ya);
  auto colorOf = [&](const std::string& kind) {
    for (const auto& k : kinds) {
      if (k.kind == kind) return k.color;
    }
    return std::string("#888");
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const double top = f.top + i * kRowHeight;
    svg += "<g class=\"timeline-row\" data-client=\"" + htmlEscape(r.client) + "\" data-status=\"" +
           htmlEscape(r.status) + "\">";
    const bool odd = !r.status.empty() && r.status != "completed";
    svg += "<text x=\"" + num(f.left - 6) + "\" y=\"" + num(top + kRowHeight - 3) +
           "\" text-anchor=\"end\" font-size=\"10\" fill=\"" + (odd ? "#b00" : "#333") + "\">" +
           htmlEscape(r.client) + (odd ? " (" + htmlEscape(r.status) + ")" : "") + "</text>";
    for (const auto& s : r.segments) {
      const double x0 = mapX(f, xs, s.from * x.scale), x1 = mapX(f, xs, s.to * x.scale);
      if (!std::isfinite(x0) || !std::isfinite(x1) || x1 < x0) continue;
      svg += "<rect class=\"segment\" data-kind=\"" + htmlEscape(s.kind) + "\" data-from=\"" +
             dataNum(s.from) + "\" data-to=\"" + dataNum(s.to) + "\" x=\"" + num(x0) + "\" y=\"" +
             num(top + 2) + "\" width=\"" + num(std::max(0.5, x1 - x0)) + "\" height=\"" +
             num(kRowHeight - 4) + "\" fill=\"" + htmlEscape(colorOf(s.kind)) + "\"><title>" +
             htmlEscape(r.client + " " + s.kind + ": " + dataNum(s.to - s.from) + " s") +
             "</title></rect>";
    }
    svg += "</g>";
  }
  if (end_marker) {
    const double px = mapX(f, xs, *end_marker * x.scale);
    svg += "<line class=\"round-end\" x1=\"" + num(px) + "\" x2=\"" + num(px) + "\" y1=\"" +
           num(f.top) + "\" y2=\"" + num(f.top + f.plotHeight()) +
           "\" stroke=\"#b00\" stroke-dasharray=\"4 3\"/>";
  }
  svg += "</svg>";
  std::vector<LegendEntry> entries;
  for (const auto& k : kinds) entries.push_back({k.label, k.color, false});
  if (end_marker) entries.push_back({"round end (dashed line)", "#b00", false});
  return figure(title, svg, legend(entries));
}

}  // namespace fedfleet::cli
