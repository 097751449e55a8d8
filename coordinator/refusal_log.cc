#include "coordinator/refusal_log.h"

#include <algorithm>
#include <cmath>

namespace fedfleet::coordinator {
namespace {

// Hosts counted per group across hosts; the rest are summed under "other hosts".
constexpr size_t kMaxHostsPerGroup = 256;

// The entries of `counts`, most frequent first, at most `listed` of them and the rest summed as
// `others`.
std::vector<std::pair<std::string, uint64_t>> mostFrequent(
    const std::map<std::string, uint64_t>& counts, size_t listed, const std::string& others) {
  std::vector<std::pair<std::string, uint64_t>> out(counts.begin(), counts.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (out.size() > listed) {
    uint64_t rest = 0;
    for (size_t i = listed; i < out.size(); ++i) rest += out[i].second;
    out.resize(listed);
    out.push_back({others, rest});
  }
  return out;
}

}  // namespace

std::string RefusalLog::Report::text() const {
  if (first) {
    const std::string what = details.empty() ? cause : cause + ": " + details.front().first;
    return what + " (from " + host + ")";
  }
  std::string out =
      std::to_string(count) + " more" + (host.empty() ? "" : " from " + host) + ": " + cause;
  if (!details.empty()) {
    out += " (";
    for (size_t i = 0; i < details.size(); ++i) {
      out += (i ? "; " : "") + std::to_string(details[i].second) + " " + details[i].first;
    }
    out += ")";
  }
  if (!hosts.empty()) {
    out += ", from ";
    for (size_t i = 0; i < hosts.size(); ++i) {
      out += (i ? ", " : "") + hosts[i].first + " (" + std::to_string(hosts[i].second) + ")";
    }
  }
  return out;
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
                                                   const std::string& cause, double now,
                                                   uint64_t count, const std::string& detail) {
  if (count == 0) return std::nullopt;
  totals_[kind] += count;
  const std::string host = hostOf(address);
  const bool across = across_hosts_.count(kind) > 0;
  Key key{kind, across ? "" : host, cause};
  auto it = groups_.find(key);
  if (it == groups_.end() && groups_.size() >= max_groups_) {
    key = Key{kind, "other hosts", "refusals beyond the groups tracked"};
    it = groups_.find(key);
  }
  auto add = [&](Group& g, uint64_t n) {
    if (n == 0) return;
    g.repeats += n;
    if (!detail.empty()) g.details[detail] += n;
    if (across) {
      const bool known = g.hosts.count(host) > 0;
      g.hosts[known || g.hosts.size() < kMaxHostsPerGroup ? host : "other hosts"] += n;
    }
  };
  if (it != groups_.end()) {
    add(it->second, count);
    return std::nullopt;
  }
  Group& group = groups_.emplace(key, Group{now, 0, {}, {}}).first->second;
  add(group, count - 1);
  Report first{kind, host, std::get<2>(key), 1, true, {}, {}};
  if (!detail.empty()) first.details.push_back({detail, 1});
  return first;
}

RefusalLog::Report RefusalLog::summary(const Key& key, const Group& group) const {
  const auto& [kind, host, cause] = key;
  Report r{kind, host, cause, group.repeats, false, {}, {}};
  r.details = mostFrequent(group.details, kListed, "other");
  r.hosts = mostFrequent(group.hosts, kListed, "other hosts");
  return r;
}

std::vector<RefusalLog::Report> RefusalLog::flush(double now) {
  std::vector<Report> out;
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (now - it->second.since < interval_s_) {
      ++it;
      continue;
    }
    if (it->second.repeats == 0) {
      it = groups_.erase(it);  // quiet for an interval: the next refusal is reported at once
      continue;
    }
    out.push_back(summary(it->first, it->second));
    it->second = Group{now, 0, {}, {}};
    ++it;
  }
  return out;
}

std::vector<RefusalLog::Report> RefusalLog::flushAll() {
  std::vector<Report> out;
  for (const auto& [key, group] : groups_) {
    if (group.repeats > 0) out.push_back(summary(key, group));
  }
  groups_.clear();
  return out;
}

}  // namespace fedfleet::coordinator
