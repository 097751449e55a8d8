#include "engine/idle_clients.h"

#include <algorithm>
#include <unordered_set>

namespace fedfleet::engine {

void IdleClients::set(const ClientId& id, bool idle) {
  if (idle) {
    idle_.insert(id);
  } else {
    idle_.erase(id);
  }
}

std::vector<ClientId> IdleClients::sample(size_t k,
                                          const std::function<bool(const ClientId&)>& eligible,
                                          std::mt19937_64& rng) const {
  const size_t n = idle_.size();
  std::vector<ClientId> out;
  out.reserve(std::min(k, n));
  // Many idle clients: draw ranks uniformly and skip repeats and ineligible ones, which is
  // uniform sampling without replacement over the eligible clients at O(K log N). When that
  // keeps missing (few eligible), or there are few idle clients, list them all instead.
  if (n > 4 * k + 64) {
    std::uniform_int_distribution<size_t> rank(0, n - 1);
    std::unordered_set<size_t> seen;
    size_t budget = 50 * k + 1000;
    while (out.size() < k && budget-- > 0) {
      const size_t r = rank(rng);
      if (!seen.insert(r).second) continue;
      const ClientId& id = *idle_.find_by_order(r);
      if (eligible(id)) out.push_back(id);
    }
    if (out.size() == k) {
      std::sort(out.begin(), out.end());
      return out;
    }
    out.clear();
  }
  for (const ClientId& id : idle_) {
    if (eligible(id)) out.push_back(id);
  }
  const size_t take = std::min(k, out.size());
  for (size_t i = 0; i < take; ++i) {  // partial Fisher-Yates
    std::uniform_int_distribution<size_t> pick(i, out.size() - 1);
    std::swap(out[i], out[pick(rng)]);
  }
  out.resize(take);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace fedfleet::engine
