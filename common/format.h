// Numbers for people: durations in the units an operator reads at a glance.
#pragma once

#include <string>

namespace fedfleet {

// "850 ms", "4.1 s", "59 s", "5 min 3 s", "2 h 5 min", "3 d 4 h"; negative durations get a
// leading '-'; a non-finite one is "?".
std::string formatDuration(double seconds);

}  // namespace fedfleet
