// Who talks to whom in decentralised training, and with what weights: the pure functions under
// D-PSGD's mixing, AD-PSGD's bipartite roles and Hop's neighbourhoods (peer/peer_engine.h).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "peer/peer_engine.h"

namespace fedfleet::peer {

// An undirected graph over peers 0 .. P - 1: neighbours[i] sorted, without i, symmetric.
struct Graph {
  std::vector<std::vector<uint32_t>> neighbours;
  uint32_t size() const { return static_cast<uint32_t>(neighbours.size()); }
};

// ring: i - 1 and i + 1 (mod P; one neighbour when P = 2).
// torus: P = r x c with r the largest divisor of P at most sqrt(P); peer i = (i / c, i % c)
//   with its four neighbours up, down, left and right (mod r and c), duplicates merged (a side
//   of 2 gives one neighbour that way, a side of 1 none).
// random: a d-regular graph drawn with `seed`: the circulant graph (i +- 1 .. +- d/2, and
//   i + P/2 when d is odd) rewired by seeded double edge swaps that keep every degree d and the
//   graph simple. Same (P, d, seed), same graph.
// Requires P >= 2; random: 1 <= d < P and P d even (checked: aborts).
Graph makeGraph(Topology topology, uint32_t peers, uint32_t degree, uint64_t seed);

// Metropolis-Hastings weights on `graph` for peer i: (j, W_ij) for each neighbour j,
// W_ij = 1 / (1 + max(d_i, d_j)), then (i, W_ii = 1 - sum of those), in increasing j. The
// matrix is symmetric and doubly stochastic (rows and columns sum to 1).
std::vector<std::pair<uint32_t, double>> metropolisWeights(const Graph& graph, uint32_t i);

// AD-PSGD's bipartite roles: even ids are active (they initiate averaging), odd ids passive
// (they only answer). An active's partners are its passive neighbours in `graph`, or every
// passive peer when it has none; a passive's are its active neighbours likewise. Averaging
// only ever pairs an active with a passive, and a passive never waits on anyone, so no cycle
// of waits can form.
inline bool isActive(uint32_t peer) { return peer % 2 == 0; }
std::vector<uint32_t> averagingPartners(const Graph& graph, uint32_t peer);

}  // namespace fedfleet::peer
