#include "peer/hop_queues.h"

#include <algorithm>

namespace fedfleet::peer {

HopQueues::HopQueues(std::vector<uint32_t> in_neighbours, uint32_t backup, uint32_t bound)
    : backup_(backup), bound_(bound) {
  for (uint32_t id : in_neighbours) {
    Neighbour n;
    n.id = id;
    neighbours_.push_back(std::move(n));
  }
}

const HopQueues::Neighbour* HopQueues::find(uint32_t id) const {
  for (const auto& n : neighbours_) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

bool HopQueues::onUpdate(uint32_t from, uint64_t iteration) {
  auto* n = const_cast<Neighbour*>(find(from));
  if (n == nullptr) return false;
  if (static_cast<int64_t>(iteration) <= n->newest) return true;
  n->newest = static_cast<int64_t>(iteration);
  n->arrivals.push_back({iteration, seq_++});
  return true;
}

void HopQueues::onDown(uint32_t peer) {
  if (auto* n = const_cast<Neighbour*>(find(peer))) n->live = false;
}

uint32_t HopQueues::live() const {
  uint32_t k = 0;
  for (const auto& n : neighbours_) k += n.live;
  return k;
}

uint32_t HopQueues::required() const {
  const uint32_t n = static_cast<uint32_t>(neighbours_.size());
  return std::min(n > backup_ ? n - backup_ : 0, live());
}

std::optional<std::vector<uint32_t>> HopQueues::chosenFor(uint64_t t) const {
  std::vector<std::pair<uint64_t, uint32_t>> ready;  // (arrival seq of the first tag >= t, id)
  for (const auto& n : neighbours_) {
    if (!n.live) continue;
    for (const auto& a : n.arrivals) {
      if (a.iteration >= t) {
        ready.emplace_back(a.seq, n.id);
        break;
      }
    }
  }
  const uint32_t need = required();
  if (ready.size() < need) return std::nullopt;
  std::sort(ready.begin(), ready.end());
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < need; ++i) out.push_back(ready[i].second);
  return out;
}

bool HopQueues::mayStart(uint64_t t) const {
  for (const auto& n : neighbours_) {
    if (n.live && n.newest < static_cast<int64_t>(t) - 1 - static_cast<int64_t>(bound_)) {
      return false;
    }
  }
  return true;
}

std::optional<uint64_t> HopQueues::skipTarget(uint64_t t) const {
  std::optional<uint64_t> out;
  for (const auto& n : neighbours_) {
    const int64_t ahead = n.newest + 1 - static_cast<int64_t>(t);
    if (n.live && ahead >= std::max<int64_t>(bound_, 1)) {
      const uint64_t resume = static_cast<uint64_t>(n.newest + 1);
      if (!out || resume > *out) out = resume;
    }
  }
  return out;
}

void HopQueues::prune(uint64_t t) {
  for (auto& n : neighbours_) {
    // Keep the newest arrival whatever its tag: chosenFor looks for the first tag >= t.
    auto keep = std::find_if(n.arrivals.begin(), n.arrivals.end(),
                             [t](const Arrival& a) { return a.iteration >= t; });
    n.arrivals.erase(n.arrivals.begin(), keep);
  }
}

int64_t HopQueues::newest(uint32_t peer) const {
  const Neighbour* n = find(peer);
  return n ? n->newest : -1;
}

}  // namespace fedfleet::peer
