// The communication graph of a SecAgg+ round (Bell et al., CCS 2020): instead of every pair of
// the round's n clients sharing a mask (Bonawitz et al., CCS 2017: O(n) work per client), each
// client shares masks and secret shares with its k neighbours in a random k-regular graph, with
// k of order log n. The graph is a Harary graph (clients on a ring, each linked to the k/2
// nearest on either side) under a seeded random relabelling, so a client's neighbours are a
// random set the clients cannot choose; with k >= n - 1 it is the complete graph (plain SecAgg).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace fedfleet::secagg {

// The default degree for a round of n clients: 2 ceil(log2 n), at most n - 1.
uint32_t defaultNeighbours(uint32_t n);
// The default threshold for degree k: floor((k + 1) / 2) + 1, the least that keeps the
// coordinator from collecting both kinds of share of one client. A client's shares are held by
// its k neighbours and itself; each holder reveals one kind (the client itself only its seed's),
// and two disjoint sets of t among k + 1 holders need 2t <= k + 1. With it, a survivor whose
// t - 1 neighbours dropped still has t holders (k even: k + 1 - (t - 1) = t).
uint32_t defaultThreshold(uint32_t k);

class NeighbourGraph {
 public:
  // kInvalidArgument when k is odd and below n - 1, or 0 with n > 1.
  static Result<NeighbourGraph> build(uint32_t n, uint32_t k, uint64_t seed);

  uint32_t size() const { return static_cast<uint32_t>(neighbours_.size()); }
  // Client i's neighbours (never i), in increasing order.
  const std::vector<uint32_t>& neighbours(uint32_t i) const { return neighbours_[i]; }
  bool adjacent(uint32_t i, uint32_t j) const;

 private:
  std::vector<std::vector<uint32_t>> neighbours_;
};

}  // namespace fedfleet::secagg
