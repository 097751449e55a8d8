#include "sim/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace fedfleet::sim {

ProgressDisplay::ProgressDisplay(config::ProgressMode mode, uint32_t total_rounds, std::FILE* out)
    : total_(total_rounds), out_(out), started_(std::chrono::steady_clock::now()) {
  active_ = mode == config::ProgressMode::kOn ||
            (mode == config::ProgressMode::kAuto && isatty(fileno(out)) == 1);
}

ProgressDisplay::~ProgressDisplay() { finish(); }

std::string ProgressDisplay::duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%dm%02ds", static_cast<int>(s / 60),
                  static_cast<int>(std::fmod(s, 60)));
  } else {
    std::snprintf(buf, sizeof(buf), "%dh%02dm", static_cast<int>(s / 3600),
                  static_cast<int>(std::fmod(s, 3600) / 60));
  }
  return buf;
}

void ProgressDisplay::update(uint32_t round, std::optional<double> accuracy,
                             double virtual_seconds) {
  if (accuracy) last_accuracy_ = accuracy;
  if (!active_) return;
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  const double done = total_ > 0 ? static_cast<double>(round) / total_ : 1.0;
  const double eta = done > 0 ? wall * (1 - done) / done : NAN;
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(std::lround(done * kWidth));
  std::string bar(static_cast<size_t>(std::clamp(filled, 0, kWidth)), '#');
  bar.resize(kWidth, '.');
  char acc[16] = "-";
  if (last_accuracy_) std::snprintf(acc, sizeof(acc), "%.2f%%", 100 * *last_accuracy_);
  std::fprintf(out_, "\r\x1b[K[%s] round %u/%u  acc %s  virtual %s  wall %s  ETA %s", bar.c_str(),
               round, total_, acc, duration(virtual_seconds).c_str(), duration(wall).c_str(),
               duration(eta).c_str());
  std::fflush(out_);
}

void ProgressDisplay::finish() {
  if (!active_) return;
  std::fprintf(out_, "\r\x1b[K");
  std::fflush(out_);
  active_ = false;
}

}  // namespace fedfleet::sim
