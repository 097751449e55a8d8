// RefusalLog: connections refused before they became a client (a failed handshake, a key not in
// the allow-list, a connection closed by a limit before it authenticated), aggregated so that an
// operator sees each cause once and a flood cannot fill the log or the history.
//
// Refusals are grouped by (event kind, host, cause), the host being the address without its
// port (a reconnecting client comes from a new port each time), or by (kind, cause) alone for a
// kind set with groupAcrossHosts() (a flood from many addresses is then one group). The first
// refusal of a group is reported at once; the ones after it are only counted, and flush()
// reports each group's count once its interval has passed: one report per group and interval
// however long the refusals go on. A group quiet for a whole interval is forgotten, so its next
// refusal is reported at once again. A refusal may carry a detail (which limit closed the
// connection, say); a group's report lists its details and, across hosts, its busiest hosts,
// each with its count. At most `max_groups` groups are tracked; refusals beyond them fall into
// one group per kind, host "other hosts". One owner (the coordinator's loop thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace fedfleet::coordinator {

class RefusalLog {
 public:
  struct Report {
    std::string kind;    // the event kind ("handshake_refused", "auth_rejected", ...)
    std::string host;    // address without port ("other hosts" past max_groups; "" across hosts)
    std::string cause;   // what was wrong, for the operator
    uint64_t count = 0;  // refusals this report stands for
    bool first = false;  // the group's first refusal (count 1); else a summary of repeats
    // What the count is made of, most frequent first: by detail, and by host for a kind grouped
    // across hosts (at most kListed of each; the rest summed under "others").
    std::vector<std::pair<std::string, uint64_t>> details;
    std::vector<std::pair<std::string, uint64_t>> hosts;
    // "plain text ... (from 10.0.0.7)", "12 more from 10.0.0.7: ...", or across hosts
    // "1936 more: cause (1700 over ...; 236 ...), from 127.0.0.2 (500), ...".
    std::string text() const;
  };
  static constexpr size_t kListed = 5;

  explicit RefusalLog(double interval_s = 60, size_t max_groups = 256);

  // Refusals of `kind` are grouped by cause alone, whatever their host.
  void groupAcrossHosts(const std::string& kind) { across_hosts_.insert(kind); }

  // `count` refusals at `now` (seconds) of one (kind, address, cause), with an optional
  // `detail`: the report to make at once when this starts a group (it stands for one refusal;
  // the rest are counted), or nothing when the group was already reporting.
  std::optional<Report> note(const std::string& kind, const std::string& address,
                             const std::string& cause, double now, uint64_t count = 1,
                             const std::string& detail = "");
  // The repeats counted in groups whose interval has ended by `now`, one report each; those
  // groups count afresh for the next interval, and groups without repeats are forgotten.
  std::vector<Report> flush(double now);
  // Every group's repeats now, whatever its interval (the coordinator is stopping).
  std::vector<Report> flushAll();
  // Refusals seen in all, by kind (for metrics).
  const std::map<std::string, uint64_t>& totals() const { return totals_; }

  // "10.0.0.7" from "10.0.0.7:53122", "[::1]" from "[::1]:4000", an address without a port as
  // it is.
  static std::string hostOf(const std::string& address);

 private:
  struct Group {
    double since = 0;      // when its interval started
    uint64_t repeats = 0;  // counted since then
    std::map<std::string, uint64_t> details;
    std::map<std::string, uint64_t> hosts;  // groups across hosts only
  };
  using Key = std::tuple<std::string, std::string, std::string>;  // kind, host, cause
  Report summary(const Key& key, const Group& group) const;

  const double interval_s_;
  const size_t max_groups_;
  std::set<std::string> across_hosts_;
  std::map<Key, Group> groups_;
  std::map<std::string, uint64_t> totals_;
};

}  // namespace fedfleet::coordinator
