#include "common/history/peer_summary.h"

#include <algorithm>
#include <limits>
#include <map>

namespace fedfleet::history {
namespace {

uint64_t saturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

}  // namespace

std::vector<PeerSummary> summarizePeers(const std::vector<PeerIterationRecord>& rows) {
  std::map<uint32_t, PeerSummary> by_peer;
  std::map<uint32_t, double> staleness_sum;
  for (const PeerIterationRecord& r : rows) {
    auto [it, first] = by_peer.try_emplace(r.peer);
    PeerSummary& s = it->second;
    if (first) {
      s.peer = r.peer;
      s.first_start = r.t_start;
      s.last_end = r.t_end;
    }
    ++s.iterations;
    if (r.skipped) ++s.skipped;
    s.exchanges += r.exchanges;
    s.bytes_sent = saturatingAdd(s.bytes_sent, r.bytes_sent);
    s.bytes_received = saturatingAdd(s.bytes_received, r.bytes_received);
    s.compute_s += r.compute_s;
    s.comm_s += r.comm_s;
    s.wait_s += r.wait_s;
    staleness_sum[r.peer] += r.staleness;
    s.max_staleness = std::max(s.max_staleness, r.staleness);
    s.first_start = std::min(s.first_start, r.t_start);
    s.last_end = std::max(s.last_end, r.t_end);
  }
  std::vector<PeerSummary> out;
  out.reserve(by_peer.size());
  for (auto& [peer, s] : by_peer) {
    s.mean_staleness = staleness_sum[peer] / static_cast<double>(s.iterations);
    out.push_back(s);
  }
  return out;
}

}  // namespace fedfleet::history
