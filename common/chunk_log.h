// ChunkLog: the chunks of uploads still in flight, kept by upload so that an upload that never
// completes can be taken back out of a sum it was folded into chunk by chunk (or folded late).
//
// Its users: the engine's PartialLog (engine/partial_log.h: plaintext payloads kept until the
// round settles) and SecAggServer (common/secagg/secagg_server.h: masked chunks, already in the
// masked sum, kept until their upload completes). Payloads are kept in memory up to a bound,
// beyond it in an unlinked temporary file, so that many uploads in flight cost disk, not
// memory. Freed in-memory buffers are kept for reuse (live and spare together within the
// bound), so round after round the same pages are written again instead of being returned to
// the system and faulted in anew (bench/fold_strategy.sh). One owner: not thread-safe.
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

namespace fedfleet {

class ChunkLog {
 public:
  explicit ChunkLog(uint64_t memory_bound_bytes) : bound_(memory_bound_bytes) {}

  // Records one chunk of upload `token`. Fails (kIoError) only when the spill file cannot be
  // written; nothing is recorded then, and the caller rejects the upload.
  Status append(uint64_t token, uint64_t offset, uint64_t elements, std::string_view payload);
  // Calls fn(offset, elements, payload) for every chunk of `token`, in arrival order; stops at
  // the first error fn returns, or kIoError when a spilled chunk cannot be read back.
  Status forEach(uint64_t token,
                 const std::function<Status(uint64_t, uint64_t, std::string_view)>& fn);
  // Forgets the chunks of `token` (its upload was folded for good, or will not count).
  void erase(uint64_t token);
  // Forgets everything and truncates the spill file (at the end of a round).
  void clear();

  // Bytes of live payloads held in memory (at most the bound), and written to the spill file
  // since the last clear().
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

  // Constant after construction.
  const uint64_t bound_;

  uint64_t in_memory_ = 0;
  std::vector<std::string> spare_;  // freed payload buffers, reused by append()
  uint64_t spare_bytes_ = 0;        // their capacity
  uint64_t spilled_ = 0;
  std::map<uint64_t, std::vector<Record>> records_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, &std::fclose};
};

}  // namespace fedfleet
