// Numbers and table cells as the HTML report (cli/report.h, cli/peer_report.h) writes them.
#pragma once

#include <optional>
#include <string>

namespace fedfleet::cli {

// `v` with `decimals` decimals ("%.*f").
std::string fixed(double v, int decimals);

// A fraction as a percentage with 2 decimals ("12.50%"); "-" when absent or not finite.
std::string percent(const std::optional<double>& v);

// Unix seconds as "YYYY-MM-DD HH:MM:SS UTC"; "-" for what cannot be a wall-clock time.
std::string utcTime(double unix_seconds);

// A unit for values up to some maximum: its name and the factor values are multiplied by.
struct Unit {
  std::string name;
  double scale;
};

Unit timeUnit(double max_seconds);  // s, min or h
Unit byteUnit(double max_bytes);    // B, kB, MB or GB (powers of 1000)

std::string humanBytes(double bytes);      // "1.5 MB"
std::string humanSeconds(double seconds);  // "12.3 s", "4.50 min"; "-" when not finite

// A table cell holding `text` (escaped), right-aligned when `numeric`.
std::string td(const std::string& text, bool numeric = false);

}  // namespace fedfleet::cli
