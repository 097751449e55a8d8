// The engine state blob: what RoundEngine::saveState() writes beside every checkpoint
// (CheckpointRecord::engine_state) and loadState() reads back when a run resumes. Layout: the
// magic "FFE1", then length-prefixed sections (u64 little-endian length, then the bytes) in a
// fixed order: generator, selector, server optimiser, control (the aggregator's state), blocks
// (block-cyclic runs only), partitions, privacy (differentially private runs only), norm
// reference (engine/norm_reference.h, opening with "NRF1") and quarantine
// (engine/quarantine.h, "QRN1"). Readers accept a blob that ends after any section from
// "control" on (states saved by earlier versions). Each owner encodes its own section; this
// file only frames them, and encodes the partition section.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace fedfleet::engine {

class EngineStateWriter {
 public:
  EngineStateWriter();
  // Appends one section.
  void section(std::string_view bytes);
  // The blob.
  std::string finish() && { return std::move(out_); }

 private:
  std::string out_;
};

class EngineStateReader {
 public:
  // kCorrupt when `blob` does not start with the magic. The reader views `blob`, which must
  // outlive it.
  static Result<EngineStateReader> open(std::string_view blob);
  // The next section; kCorrupt naming `what` when the blob ends before it or within it.
  Result<std::string_view> section(const char* what);
  bool atEnd() const { return in_.empty(); }
  // Whether the next section's bytes begin with `prefix` (false at the end or when truncated).
  bool nextStartsWith(std::string_view prefix) const;

 private:
  explicit EngineStateReader(std::string_view in) : in_(in) {}
  std::string_view in_;
};

// The partition section: which partition the coordinator assigned each client (u64 count, then
// per client a u32 id length, the id and the i32 partition), in the order given.
std::string encodePartitions(const std::vector<std::pair<std::string, int32_t>>& assigned);
// Parses a partition section of a run with `num_partitions` partitions; kCorrupt for a
// truncated section, a bad id (empty or over 128 bytes), a partition out of range or trailing
// bytes.
Result<std::map<std::string, int32_t>> parsePartitions(std::string_view section,
                                                       uint32_t num_partitions);

}  // namespace fedfleet::engine
