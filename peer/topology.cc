#include "peer/topology.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "common/check.h"

namespace fedfleet::peer {
namespace {

void addEdge(Graph& g, uint32_t a, uint32_t b) {
  if (a == b) return;
  g.neighbours[a].push_back(b);
  g.neighbours[b].push_back(a);
}

void normalise(Graph& g) {
  for (auto& n : g.neighbours) {
    std::sort(n.begin(), n.end());
    n.erase(std::unique(n.begin(), n.end()), n.end());
  }
}

Graph randomRegular(uint32_t p, uint32_t d, uint64_t seed) {
  FEDFLEET_CHECK_MSG(d >= 1 && d < p && (uint64_t{p} * d) % 2 == 0,
                     "random topology needs 1 <= degree < peers and peers * degree even");
  // The circulant graph is d-regular and simple; double edge swaps (a-b, c-d -> a-d, c-b)
  // keep both properties when the new edges are absent and the four ends distinct.
  std::set<std::pair<uint32_t, uint32_t>> edges;
  auto key = [](uint32_t a, uint32_t b) { return std::make_pair(std::min(a, b), std::max(a, b)); };
  for (uint32_t i = 0; i < p; ++i) {
    for (uint32_t k = 1; k <= d / 2; ++k) edges.insert(key(i, (i + k) % p));
    if (d % 2 == 1) edges.insert(key(i, (i + p / 2) % p));
  }
  std::vector<std::pair<uint32_t, uint32_t>> list(edges.begin(), edges.end());
  std::mt19937_64 rng(seed);
  const size_t swaps = 10 * list.size();
  for (size_t s = 0; s < swaps && list.size() >= 2; ++s) {
    std::uniform_int_distribution<size_t> pick(0, list.size() - 1);
    size_t x = pick(rng), y = pick(rng);
    if (x == y) continue;
    auto [a, b] = list[x];
    auto [c, e] = list[y];
    if (rng() & 1) std::swap(c, e);
    if (a == c || a == e || b == c || b == e) continue;
    auto n1 = key(a, e), n2 = key(c, b);
    if (edges.count(n1) || edges.count(n2)) continue;
    edges.erase(list[x]);
    edges.erase(list[y]);
    edges.insert(n1);
    edges.insert(n2);
    list[x] = n1;
    list[y] = n2;
  }
  Graph g;
  g.neighbours.resize(p);
  for (auto [a, b] : edges) addEdge(g, a, b);
  normalise(g);
  return g;
}

}  // namespace

Graph makeGraph(Topology topology, uint32_t peers, uint32_t degree, uint64_t seed) {
  FEDFLEET_CHECK_MSG(peers >= 2, "a topology needs at least 2 peers");
  Graph g;
  g.neighbours.resize(peers);
  switch (topology) {
    case Topology::kRing:
      for (uint32_t i = 0; i < peers; ++i) addEdge(g, i, (i + 1) % peers);
      break;
    case Topology::kTorus: {
      uint32_t rows = 1;
      for (uint32_t r = 1; uint64_t{r} * r <= peers; ++r) {
        if (peers % r == 0) rows = r;
      }
      const uint32_t cols = peers / rows;
      for (uint32_t i = 0; i < peers; ++i) {
        const uint32_t r = i / cols, c = i % cols;
        addEdge(g, i, ((r + 1) % rows) * cols + c);
        addEdge(g, i, r * cols + (c + 1) % cols);
      }
      break;
    }
    case Topology::kRandom:
      return randomRegular(peers, degree, seed);
  }
  normalise(g);
  return g;
}

std::vector<std::pair<uint32_t, double>> metropolisWeights(const Graph& graph, uint32_t i) {
  std::vector<std::pair<uint32_t, double>> out;
  const size_t di = graph.neighbours[i].size();
  double rest = 1;
  for (uint32_t j : graph.neighbours[i]) {
    const double w = 1.0 / (1.0 + static_cast<double>(std::max(di, graph.neighbours[j].size())));
    out.emplace_back(j, w);
    rest -= w;
  }
  out.emplace_back(i, rest);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint32_t> averagingPartners(const Graph& graph, uint32_t peer) {
  std::vector<uint32_t> out;
  const bool active = isActive(peer);
  for (uint32_t j : graph.neighbours[peer]) {
    if (isActive(j) != active) out.push_back(j);
  }
  if (out.empty()) {
    for (uint32_t j = 0; j < graph.size(); ++j) {
      if (isActive(j) != active) out.push_back(j);
    }
  }
  return out;
}

}  // namespace fedfleet::peer
