// ControlVariate: a SCAFFOLD client's control variate c_k,
// kept across tasks: zero at first, then c_k += Dc_k after every task whose update was uploaded
// (Trainer's TrainResult::control_delta). The client runtime keeps one per process, persisted to
// a file when configured; the simulator keeps one per virtual client, which is why the values
// can be held compactly.
//
// Storage, as error feedback's residual (common/compress/error_feedback.h): fp32 (exact, 4 bytes
// a parameter) or bf16 / fp16 (2 bytes a parameter; every stored value is rounded to nearest
// even, fp16 saturating at +-65504). Nothing is allocated while c_k is zero: a virtual client
// that never trained holds no memory for it.
//
// File format (save/load), little endian: the 8 bytes "FFCTLV01", the element count n (uint64),
// n fp32 values (whatever the storage in memory), then the SHA-256 of everything before it. A
// save writes a temporary file next to the target and renames it over the target, so a reader
// (or a crash) sees the old file or the new one, never a part.
//
// Not thread-safe: one owner (the client runtime's loop thread, or the simulator's worker
// running that virtual client) calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/compress/error_feedback.h"
#include "common/status.h"

namespace fedfleet::client {

class ControlVariate {
 public:
  // c_k = 0 for n parameters; allocates nothing yet.
  explicit ControlVariate(size_t n = 0,
                          compress::ResidualStorage storage = compress::ResidualStorage::kFp32);

  ControlVariate(ControlVariate&&) = default;
  ControlVariate& operator=(ControlVariate&&) = default;

  size_t size() const { return n_; }
  compress::ResidualStorage storage() const { return storage_; }
  // Bytes the values hold now: 0 while c_k is zero (after construction or reset), then 4n or 2n.
  size_t memoryBytes() const;

  // c_k as fp32, n values (zeros while nothing is allocated).
  std::vector<float> values() const;
  // Copies c_k[offset, offset + len) into out (fp32). offset + len must not exceed size()
  // (checked: a violation aborts).
  void values(size_t offset, size_t len, float* out) const;

  // c_k += delta (stored rounded to the storage format). delta.size() must equal size()
  // (checked: a violation aborts).
  void apply(const std::vector<float>& delta);
  // As apply, for n values at delta; n must equal size() (checked).
  void apply(const float* delta, size_t n);

  // c_k = 0 for n parameters; frees the values.
  void reset(size_t n);

  // Writes c_k to `path` atomically (path + ".tmp.XXXXXX", then rename). kIoError when the
  // temporary file cannot be created or written, or the rename fails (the target is untouched).
  Status save(const std::string& path) const;

  // Reads a file written by save() into a ControlVariate held as `storage`. kNotFound when the
  // file does not exist; kIoError when it cannot be read; kCorrupt when it is not one save()
  // writes (bad magic, size that does not match its count, checksum mismatch, a value that is
  // not finite).
  static Result<ControlVariate> load(const std::string& path, compress::ResidualStorage storage =
                                                                  compress::ResidualStorage::kFp32);

  // What a client starts from: load(path) when it holds n values; zeros otherwise. A missing file
  // is the normal first start (logged at info); a corrupt file, one that cannot be read or one of
  // another size is logged as a warning naming the file, and c_k starts from zero. An empty path
  // gives zeros without logging.
  static ControlVariate loadOrZeros(
      const std::string& path, size_t n,
      compress::ResidualStorage storage = compress::ResidualStorage::kFp32);

 private:
  bool allocated() const { return !fp32_.empty() || !half_.empty(); }

  size_t n_;
  compress::ResidualStorage storage_;
  std::vector<float> fp32_;     // kFp32, once allocated
  std::vector<uint16_t> half_;  // kBf16, kFp16, once allocated
};

}  // namespace fedfleet::client
