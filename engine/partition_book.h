// PartitionBook: which data partition a joining client trains, when partitions are assigned at
// Hello rather than sampled per task. A client that asks for a partition in range gets it; a
// client a restored engine state names gets the partition it had before the restart (a
// reservation, kept until it says Hello again); anyone else gets the lowest partition that no
// client holds or has reserved, and, with more clients than partitions, they share. One owner:
// not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "engine/participant.h"

namespace fedfleet::engine {

class PartitionBook {
 public:
  explicit PartitionBook(uint32_t num_partitions) : n_(num_partitions) {}

  // The partition of client `id` joining now, which asked for `requested` (-1: any). `held`
  // lists what the known clients hold (one entry per known client, -1: none); it is called
  // only when the client neither asked for a partition in range nor had one reserved, so that
  // a fleet of clients that name their partitions joins in O(1) each. Its reservation, if it
  // had one, ends.
  int32_t join(const ClientId& id, int32_t requested,
               const std::function<std::vector<int32_t>()>& held);

  // A restored state's assignment of `id` (a client not known yet) to `partition`.
  void reserve(const ClientId& id, int32_t partition) { reserved_[id] = partition; }
  // Reservations of clients that have not said Hello since the restore, by id.
  const std::map<ClientId, int32_t>& reserved() const { return reserved_; }

 private:
  uint32_t n_;
  std::map<ClientId, int32_t> reserved_;
};

}  // namespace fedfleet::engine
