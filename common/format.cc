#include "common/format.h"

#include <cmath>
#include <cstdio>

namespace fedfleet {

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  if (seconds < 0) return "-" + formatDuration(-seconds);
  char buf[64];
  if (seconds < 1) {
    std::snprintf(buf, sizeof buf, "%.0f ms", std::floor(seconds * 1000));
  } else if (seconds < 10) {
    std::snprintf(buf, sizeof buf, "%.1f s", std::floor(seconds * 10) / 10);
  } else if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.0f s", std::floor(seconds));
  } else {
    const auto total = static_cast<long long>(std::floor(seconds));
    const long long d = total / 86400, h = total % 86400 / 3600, m = total % 3600 / 60,
                    s = total % 60;
    if (d > 0) {
      std::snprintf(buf, sizeof buf, "%lld d %lld h", d, h);
    } else if (h > 0) {
      std::snprintf(buf, sizeof buf, "%lld h %lld min", h, m);
    } else {
      std::snprintf(buf, sizeof buf, "%lld min %lld s", m, s);
    }
  }
  return buf;
}

}  // namespace fedfleet
