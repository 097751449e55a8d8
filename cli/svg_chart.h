// Static SVG charts for the HTML report (cli/report.h): line charts, bar charts (stacked or
// grouped) and a per-client timeline, drawn in C++ so the report needs no script to show them.
//
// Each function returns one <figure> element: the <svg> (axes with "nice" 1-2-5 ticks, labelled
// with their units; data drawn in a clip box) and an HTML legend. For checks (tests, a browser's
// DOM) the elements carry data attributes:
//   <svg data-chart="ID">
//   line charts: <path class="series" data-series="NAME" data-points="N" d="M x y L x y ...">,
//                one M or L command per point;
//   bar charts:  <rect class="bar" data-series="NAME" data-x="X" data-value="V">, one per
//                non-zero value;
//   timelines:   <g class="timeline-row" data-client="ID" data-status="S"> holding
//                <rect class="segment" data-kind="KIND" data-from="F" data-to="T">.
// Text is HTML-escaped; NaN values are left out (a line breaks there is not attempted: the
// points on either side are joined).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace fedfleet::cli {

// The i-th colour of a palette that stays apart for colour-blind readers (Okabe-Ito).
std::string paletteColor(size_t i);

// Text safe in HTML element content and in double-quoted attribute values.
std::string htmlEscape(const std::string& text);

struct ChartAxis {
  std::string label;               // shown along the axis, with the unit: "test accuracy (%)"
  double scale = 1;                // data values are multiplied by this before drawing
  std::optional<double> min, max;  // fixed range (after scale); otherwise from the data
  bool integer_ticks = false;      // ticks on whole numbers only (rounds)
};

struct ChartSeries {
  std::string name;  // legend text
  std::string color;
  std::vector<double> x, y;  // same length
  bool dashed = false;
};

// A line chart with a marker on each point. Series with no finite point are drawn as an empty
// path (data-points="0") and still listed in the legend.
std::string renderLineChart(const std::string& id, const std::string& title, const ChartAxis& x,
                            const ChartAxis& y, const std::vector<ChartSeries>& series);

struct BarSeries {
  std::string name;
  std::string color;
  std::vector<double> values;  // one per category
};

// Bars at the x positions `categories` (for example round numbers): stacked, or side by side.
std::string renderBarChart(const std::string& id, const std::string& title,
                           const std::vector<double>& categories, const ChartAxis& x,
                           const ChartAxis& y, const std::vector<BarSeries>& series, bool stacked);

struct TimelineSegment {
  std::string kind;  // a key of the legend: "download", "compute", "upload", "idle"
  double from = 0;   // seconds on the chart's x axis
  double to = 0;
};

struct TimelineRow {
  std::string client;
  std::string status;  // "completed", "late", "dropped", "rejected"; "" for rows without one
                       // (a peer of a decentralised run)
  std::vector<TimelineSegment> segments;
};

struct TimelineKind {
  std::string kind;
  std::string label;
  std::string color;
};

// One row per client, segments coloured by kind; a dashed vertical line marks `end_marker` (the
// round's end). Rows whose status is neither "completed" nor "" have their label marked with the
// status.
std::string renderTimeline(const std::string& id, const std::string& title,
                           const std::vector<TimelineRow>& rows,
                           const std::vector<TimelineKind>& kinds, const ChartAxis& x,
                           std::optional<double> end_marker);

}  // namespace fedfleet::cli
