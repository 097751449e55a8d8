#include "coordinator/refusal_log.h"

#include <cmath>

namespace fedfleet::coordinator {

std::string RefusalLog::Report::text() const {
  if (first) return cause + " (from " + host + ")";
  return std::to_string(count) + " more from " + host + ": " + cause;
}

RefusalLog::RefusalLog(double interval_s, size_t max_groups)
    : interval_s_(interval_s), max_groups_(max_groups) {}

std::string RefusalLog::hostOf(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(0, close + 1);
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || address.find(':') != colon) return address;  // no port
  return address.substr(0, colon);
}

std::optional<RefusalLog::Report> RefusalLog::note(const std::string& kind,
                                                   const std::string& address,
                                                   const std::string& cause, double now) {
  ++totals_[kind];
  Key key{kind, hostOf(address), cause};
  auto it = groups_.find(key);
  if (it == groups_.end() && groups_.size() >= max_groups_) {
    key = Key{kind, "other hosts", "refusals beyond the groups tracked"};
    it = groups_.find(key);
  }
  if (it != groups_.end()) {
    ++it->second.repeats;
    return std::nullopt;
  }
  groups_.emplace(key, Group{now, 0});
  return Report{kind, std::get<1>(key), std::get<2>(key), 1, true};
}

std::vector<RefusalLog::Report> RefusalLog::flush(double now) {
  std::vector<Report> out;
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (now - it->second.since < interval_s_) {
      ++it;
      continue;
    }
    const auto& [kind, host, cause] = it->first;
    if (it->second.repeats > 0) out.push_back(Report{kind, host, cause, it->second.repeats, false});
    it = groups_.erase(it);  // the next refusal of this group is reported at once again
  }
  return out;
}

}  // namespace fedfleet::coordinator
