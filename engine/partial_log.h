// PartialLog: the payloads of a round's updates, kept until the round settles.
//
// The coordinator folds an update into the round's running sum only when its weight and scale
// are final (the norm bound and weight cap need the whole round's norms and weights), so every
// chunk's payload (the compressed bytes as received) is kept here from its arrival until the
// update is folded at settlement, or dropped when the update does not complete (rejected,
// cancelled, client lost): in memory up to a bound, beyond it in an unlinked temporary file, so
// a round of many uploads costs disk, not memory. Freed in-memory buffers are kept for reuse
// (live and spare together within the bound), so round after round the same pages are written
// again instead of being returned to the system and faulted in anew (bench/fold_strategy.sh).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace fedfleet::engine {

class PartialLog {
 public:
  explicit PartialLog(uint64_t memory_bound_bytes) : bound_(memory_bound_bytes) {}

  // Records one chunk of task `token`. Fails (kIoError) only when the spill file cannot be
  // written; the caller then rejects the update.
  Status append(uint64_t token, uint64_t offset, uint64_t elements, std::string_view payload);
  // Calls fn(offset, elements, payload) for every chunk of `token`, in arrival order.
  Status forEach(uint64_t token,
                 const std::function<Status(uint64_t, uint64_t, std::string_view)>& fn);
  // Forgets the chunks of `token` (its update was folded, or will not count).
  void erase(uint64_t token);
  // Forgets everything and truncates the spill file (at the end of a round).
  void clear();

  uint64_t memoryBytes() const { return in_memory_; }
  uint64_t spilledBytes() const { return spilled_; }

 private:
  struct Record {
    uint64_t offset = 0, elements = 0;
    std::string payload;    // when in memory
    int64_t file_pos = -1;  // when spilled
    uint64_t file_bytes = 0;
  };
  // Forgets the in-memory payloads of `records`, keeping their buffers as spares.
  void recycle(std::vector<Record>& records);

  uint64_t bound_;
  uint64_t in_memory_ = 0;
  std::vector<std::string> spare_;  // freed payload buffers, reused by append()
  uint64_t spare_bytes_ = 0;        // their capacity
  uint64_t spilled_ = 0;
  std::map<uint64_t, std::vector<Record>> records_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, &std::fclose};
};

}  // namespace fedfleet::engine
