#include "cli/report_text.h"

#include <cmath>
#include <cstdio>
#include <ctime>

#include "cli/svg_chart.h"

namespace fedfleet::cli {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string percent(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? fixed(*v * 100, 2) + "%" : "-";
}

std::string utcTime(double unix_seconds) {
  if (!std::isfinite(unix_seconds) || unix_seconds <= 0 || unix_seconds > 1e11) return "-";
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return "-";
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

Unit timeUnit(double max_seconds) {
  if (max_seconds > 3 * 3600) return {"h", 1.0 / 3600};
  if (max_seconds > 300) return {"min", 1.0 / 60};
  return {"s", 1};
}

Unit byteUnit(double max_bytes) {
  if (max_bytes >= 1e9) return {"GB", 1e-9};
  if (max_bytes >= 1e6) return {"MB", 1e-6};
  if (max_bytes >= 1e3) return {"kB", 1e-3};
  return {"B", 1};
}

std::string humanBytes(double bytes) {
  const Unit u = byteUnit(bytes);
  return fixed(bytes * u.scale, u.scale == 1 ? 0 : 1) + " " + u.name;
}

std::string humanSeconds(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  const Unit u = timeUnit(seconds);
  return fixed(seconds * u.scale, u.scale == 1 ? 1 : 2) + " " + u.name;
}

std::string td(const std::string& text, bool numeric) {
  return std::string(numeric ? "<td class=\"num\">" : "<td>") + htmlEscape(text) + "</td>";
}

}  // namespace fedfleet::cli
