// Wall-clock time as the history stores it (runs' started_at, rounds' wall_end, events).
#pragma once

#include <chrono>

namespace fedfleet {

// Seconds since the Unix epoch, from the system clock.
inline double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace fedfleet
