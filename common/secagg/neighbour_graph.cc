#include "common/secagg/neighbour_graph.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/splitmix.h"

namespace fedfleet::secagg {

uint32_t defaultNeighbours(uint32_t n) {
  if (n <= 1) return 0;
  const uint32_t k = 2 * static_cast<uint32_t>(std::ceil(std::log2(static_cast<double>(n))));
  return std::min(k, n - 1);
}

uint32_t defaultThreshold(uint32_t k) { return (k + 1) / 2 + 1; }

Result<NeighbourGraph> NeighbourGraph::build(uint32_t n, uint32_t k, uint64_t seed) {
  NeighbourGraph g;
  g.neighbours_.resize(n);
  if (n <= 1) return g;
  if (k == 0) return invalidArgument("secagg.neighbours must be at least 2");
  if (k >= n - 1) {
    for (uint32_t i = 0; i < n; ++i) {
      for (uint32_t j = 0; j < n; ++j) {
        if (j != i) g.neighbours_[i].push_back(j);
      }
    }
    return g;
  }
  if (k % 2 != 0) {
    return invalidArgument(
        "secagg.neighbours must be even (or at least the cohort size - 1), got " +
        std::to_string(k));
  }
  // Fisher-Yates with a splitmix counter: the same seed gives the same graph everywhere.
  std::vector<uint32_t> ring(n);
  std::iota(ring.begin(), ring.end(), 0u);
  uint64_t ctr = seed;
  for (uint32_t i = n - 1; i > 0; --i) {
    const uint64_t r = splitMix64(ctr++);
    const uint32_t j = static_cast<uint32_t>(
        (static_cast<unsigned __int128>(r) * (static_cast<uint64_t>(i) + 1)) >> 64);
    std::swap(ring[i], ring[j]);
  }
  for (uint32_t pos = 0; pos < n; ++pos) {
    auto& out = g.neighbours_[ring[pos]];
    for (uint32_t d = 1; d <= k / 2; ++d) {
      out.push_back(ring[(pos + d) % n]);
      out.push_back(ring[(pos + n - d) % n]);
    }
    std::sort(out.begin(), out.end());
  }
  return g;
}

bool NeighbourGraph::adjacent(uint32_t i, uint32_t j) const {
  const auto& v = neighbours_[i];
  return std::binary_search(v.begin(), v.end(), j);
}

}  // namespace fedfleet::secagg
