// Error feedback (EF-SGD, Karimireddy et al. 2019; DGC's local accumulation): a sender using a
// biased codec (topk, sign) keeps a residual r of what compression dropped and adds it back
// next time, so nothing is lost for good, only delayed:
//
//   p = x + r;   payload = encode(p);   r = p - decode(payload)
//
// Over T rounds, sum_t decode(payload_t) + r_T = sum_t x_t (exactly up to float rounding with
// fp32 storage). One ErrorFeedback covers a whole model of n elements and is used chunk by
// chunk: encode(codec, offset, x, len, ...) touches only the residual of [offset, offset + len).
//
// Storage. The residual is allocated on first use (a simulated client that never trains holds
// nothing) and kept as fp32 (exact bookkeeping, 4 bytes a parameter), or as bf16 or fp16 (2
// bytes a parameter, for the simulator's many virtual clients): the residual is then rounded to
// nearest even each time it is stored, a relative error of at most 2^-9 (bf16) or 2^-12 (fp16,
// within its range; beyond +-65504 it saturates) of the residual per round, which error feedback
// tolerates; fp16 keeps more precision, bf16 never saturates. Default fp32.
//
// Not thread-safe: one owner (a client's upload pipeline, or the simulator's worker running
// that virtual client) calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/compress/codec.h"
#include "common/status.h"

namespace fedfleet::compress {

enum class ResidualStorage { kFp32, kBf16, kFp16 };

// "fp32", "bf16", "fp16".
const char* residualStorageName(ResidualStorage storage);
// Parses those names; INVALID_ARGUMENT otherwise.
Result<ResidualStorage> parseResidualStorage(std::string_view text);

class ErrorFeedback {
 public:
  // A zero residual for n elements; allocates nothing yet.
  explicit ErrorFeedback(size_t n, ResidualStorage storage = ResidualStorage::kFp32);

  ErrorFeedback(ErrorFeedback&&) = default;
  ErrorFeedback& operator=(ErrorFeedback&&) = default;

  size_t size() const { return n_; }
  ResidualStorage storage() const { return storage_; }
  // Bytes the residual holds now: 0 until the first encode, then 4n (fp32) or 2n.
  size_t memoryBytes() const;

  // Appends to *out the payload of codec.encode(x + r) for the elements [offset, offset + len)
  // (x points at element `offset`'s value) and sets their residual to (x + r) - decoded.
  // INVALID_ARGUMENT when x + r is not finite (the codec's payload does not decode): then *out
  // and the residual are left as they were. offset + len must not exceed size() (checked: a
  // violation aborts). `rows`: the range is that many whole rows of a matrix (Codec::encodeRows).
  Status encode(const Codec& codec, size_t offset, const float* x, size_t len, uint64_t seed,
                std::string* out, size_t rows = 1);

  // Copies the residual of [offset, offset + len) into out (as fp32).
  void residual(size_t offset, size_t len, float* out) const;

  // Sets the residual to zero and frees its memory (for example when a client's model is
  // replaced and the old residual no longer applies).
  void reset();

 private:
  void allocate();

  size_t n_;
  ResidualStorage storage_;
  std::vector<float> fp32_;     // kFp32
  std::vector<uint16_t> half_;  // kBf16, kFp16
};

}  // namespace fedfleet::compress
