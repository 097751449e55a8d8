// PartialLog: the chunks of uploads still in progress, kept so that they can be taken back out
// of the running sum.
//
// Streaming aggregation folds every chunk into the round's running sum as it arrives, so the
// coordinator holds O(model) however many clients upload at once. An update counts only when
// its last chunk and its summary have arrived; if the client is cancelled, lost or rejected
// first, the chunks it already sent are subtracted again. This log keeps their payloads (the
// compressed bytes as received) until then: in memory up to a bound, beyond it in an unlinked
// temporary file, so a burst of partial uploads costs disk, not memory.
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

namespace fedfleet::coordinator {

class PartialLog {
 public:
  explicit PartialLog(uint64_t memory_bound_bytes) : bound_(memory_bound_bytes) {}

  // Records one folded chunk of task `token`. Fails (kIoError) only when the spill file cannot
  // be written; the caller then treats the chunk as not folded.
  Status append(uint64_t token, uint64_t offset, uint64_t elements, std::string_view payload);
  // Calls fn(offset, elements, payload) for every chunk of `token`, in arrival order.
  Status forEach(uint64_t token,
                 const std::function<Status(uint64_t, uint64_t, std::string_view)>& fn);
  // Forgets the chunks of `token` (its update completed, or was taken back out).
  void erase(uint64_t token);
  // Forgets everything and truncates the spill file (at the end of a round).
  void clear();

  uint64_t memoryBytes() const { return in_memory_; }
  uint64_t spilledBytes() const { return spilled_; }

 private:
  struct Record {
    uint64_t offset = 0, elements = 0;
    std::string payload;      // when in memory
    int64_t file_pos = -1;    // when spilled
    uint64_t file_bytes = 0;
  };
  uint64_t bound_;
  uint64_t in_memory_ = 0;
  uint64_t spilled_ = 0;
  std::map<uint64_t, std::vector<Record>> records_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, &std::fclose};
};

}  // namespace fedfleet::coordinator
