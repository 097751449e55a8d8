// RefusalLog: connections refused before they became a client (a failed handshake, a key not in
// the allow-list), aggregated so that an operator sees each cause once and a flood cannot fill
// the log or the history.
//
// Refusals are grouped by (event kind, host, cause), the host being the address without its
// port (a reconnecting client comes from a new port each time). The first refusal of a group
// is reported at once; the ones after it within `interval_s` are only counted, and flush()
// reports each group's count once its interval has passed. At most `max_groups` groups are
// tracked; refusals beyond them fall into one group per kind, host "other hosts". One owner (the
// coordinator's loop thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace fedfleet::coordinator {

class RefusalLog {
 public:
  struct Report {
    std::string kind;    // the event kind ("handshake_refused", "auth_rejected")
    std::string host;    // address without port ("other hosts" past max_groups)
    std::string cause;   // what was wrong, for the operator
    uint64_t count = 0;  // refusals this report stands for
    bool first = false;  // the group's first refusal (count 1); else a summary of repeats
    // "plain text ... from 10.0.0.7", or "12 more from 10.0.0.7 in the last 60 s: ...".
    std::string text() const;
  };

  explicit RefusalLog(double interval_s = 60, size_t max_groups = 256);

  // One refusal at `now` (seconds): the report to make at once, or nothing when it is a repeat
  // within its group's interval (then counted).
  std::optional<Report> note(const std::string& kind, const std::string& address,
                             const std::string& cause, double now);
  // The repeats counted in groups whose interval has ended by `now`, one report each; those
  // groups start afresh.
  std::vector<Report> flush(double now);
  // Refusals seen in all, by kind (for metrics).
  const std::map<std::string, uint64_t>& totals() const { return totals_; }

  // "10.0.0.7" from "10.0.0.7:53122", "[::1]" from "[::1]:4000", an address without a port as
  // it is.
  static std::string hostOf(const std::string& address);

 private:
  struct Group {
    double since = 0;      // when its first report was made
    uint64_t repeats = 0;  // counted since then
  };
  using Key = std::tuple<std::string, std::string, std::string>;  // kind, host, cause
  const double interval_s_;
  const size_t max_groups_;
  std::map<Key, Group> groups_;
  std::map<std::string, uint64_t> totals_;
};

}  // namespace fedfleet::coordinator
