#include "engine/partition_book.h"

#include <optional>

namespace fedfleet::engine {

int32_t PartitionBook::join(const ClientId& id, int32_t requested,
                            const std::function<std::vector<int32_t>()>& held_by_known) {
  std::optional<int32_t> kept;
  if (auto r = reserved_.find(id); r != reserved_.end()) {
    kept = r->second;
    reserved_.erase(r);
  }
  if (requested >= 0 && static_cast<uint32_t>(requested) < n_) return requested;
  if (kept) return *kept;
  const std::vector<int32_t> held = held_by_known();
  std::vector<bool> taken(n_, false);
  for (int32_t p : held) {
    if (p >= 0 && static_cast<uint32_t>(p) < n_) taken[p] = true;
  }
  for (const auto& [other, p] : reserved_) {
    if (p >= 0 && static_cast<uint32_t>(p) < n_) taken[p] = true;
  }
  for (uint32_t i = 0; i < n_; ++i) {
    if (!taken[i]) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(held.size() % n_);  // more clients than partitions: share
}

}  // namespace fedfleet::engine
