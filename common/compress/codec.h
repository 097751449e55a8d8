// Codecs: how a client turns an update (a range of fp32 elements) into the bytes it uploads,
// and how the coordinator folds those bytes back into its running weighted sum.
//
//   none   fp32, lossless                                    32 bits a value
//   fp16   IEEE half, round to nearest even, saturating       16 bits
//   bf16   bfloat16, round to nearest even, saturating        16 bits
//   qsgd   QSGD 8 or 4 bits in buckets (stochastic, unbiased, seeded)   8 or 4 bits + 32/bucket
//   topk   the k = ratio * n largest magnitudes, indices delta-varint, values fp16
//   sign   scaled sign, 1 bit a value, scale = mean |x| of each bucket  1 bit + 32/bucket
//   lowrank  a rows x cols chunk as a rank-r product, fp16 factors   16 r (rows + cols) bits
//
// The payload format and what decoding checks are in common/compress/payload.h; the numeric
// definitions (QSGD levels and their random numbers, sign scales, rounding) in
// kernels/quantize.h and kernels/convert.h, whose kernels the codecs call; lowrank's in
// common/compress/lowrank.h. Biased codecs (topk, sign, lowrank) are meant to be used with
// common/compress/error_feedback.h.
//
// Usage, client side (one chunk of a delta):
//   FEDFLEET_ASSIGN_OR_RETURN(CodecSpec spec, parseCodecSpec("qsgd8"));
//   FEDFLEET_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, makeCodec(spec));
//   std::string payload;
//   codec->encode(delta + offset, len, seed, &payload);
// coordinator side (any codec, the header says which):
//   FEDFLEET_RETURN_IF_ERROR(decodeAccumulatePayload(payload, len, weight, sum + offset));
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/compress/codec_spec.h"
#include "common/compress/payload.h"
#include "common/status.h"

namespace fedfleet::compress {

// Stateless and thread-safe: every method is const and may run on many threads at once.
class Codec {
 public:
  virtual ~Codec() = default;

  // The (validated) spec this codec was made from.
  virtual const CodecSpec& spec() const = 0;

  // Appends to *out a payload holding x[0, n). `seed` drives the randomness (qsgd's stochastic
  // rounding, topk's threshold sample): the same (x, n, seed) gives the same bytes on every
  // machine; give every chunk of every update its own seed. topk's output does not depend on
  // the seed (the selection is exact); none, fp16, bf16 and sign ignore it.
  // x must be finite: a NaN or infinity yields a payload that decode refuses (CORRUPT), never
  // a crash. n must not exceed kMaxPayloadElements (checked: a violation aborts).
  virtual void encode(const float* x, size_t n, uint64_t seed, std::string* out) const = 0;

  // encode for a chunk that is `rows` whole rows of a matrix (rows >= 1 divides n): lowrank
  // factors it as rows x (n / rows); the other codecs ignore rows. encode itself is
  // encodeRows(x, n, 1, ...) for lowrank (a 1 x n matrix: the values as fp16 and one scale).
  virtual void encodeRows(const float* x, size_t n, size_t rows, uint64_t seed,
                          std::string* out) const {
    (void)rows;
    encode(x, n, seed, out);
  }

  // Decodes a payload of this codec holding exactly n elements into out[0, n). CORRUPT (out
  // untouched) for a payload of another codec, of another n, or malformed in any way
  // (payload.h). The payload's own parameters (bits, bucket, k) are used, not the spec's.
  virtual Status decode(std::string_view payload, size_t n, float* out) const = 0;

  // acc[i] = fma(w, decoded[i], acc[i]) for i < n without materialising the dense vector
  // where the codec allows; the same bits as decode then kernels::weightedAccumulate. CORRUPT
  // (acc untouched) as decode.
  virtual Status decodeAccumulate(std::string_view payload, size_t n, float w,
                                  float* acc) const = 0;

  // True for topk, sign and lowrank: decode(encode(x)) differs from x even in expectation, so
  // senders keep an ErrorFeedback residual (when spec().error_feedback).
  virtual bool biased() const = 0;

  // An upper bound on the bytes encode or encodeRows appends for n elements (exact for all but
  // topk and lowrank).
  virtual size_t maxEncodedBytes(size_t n) const = 0;
};

// A codec for a spec. INVALID_ARGUMENT when validate(spec) fails.
Result<std::unique_ptr<Codec>> makeCodec(const CodecSpec& spec);

// topk: how many elements a payload of n keeps, round(ratio * n) clamped to [1, n] (0 for
// n == 0).
size_t topkCount(size_t n, double ratio);

// The k largest magnitudes of x[0, n) as increasing indices (k <= n). Ties are broken by
// position: of equal magnitudes the lower index is kept, so the result is a function of x and
// k alone; magnitudes compare as kernels::magnitudeKey (+0 == -0; NaN above infinity).
// The threshold is estimated from a sample of max(1024, n / 100) magnitudes drawn with `seed`
// (over-selecting slightly), every element at or above it is collected
// (kernels::selectAtLeast), and the candidates are trimmed to exactly k; when the estimate
// collects fewer than k, it falls back to an exact selection over all n. `seed` changes only
// the time taken.
void selectTopK(const float* x, size_t n, size_t k, uint64_t seed, std::vector<uint32_t>* out);

// The same selection over candidates gathered elsewhere (the GPU's threshold select): of the
// `count` pairs (idx[j], values[j]), distinct indices in any order, the k (<= count) with the
// largest magnitudes, ties to the lower index, into *out_idx / *out_values in increasing index
// order. When the candidates hold every element at or above some magnitude and at least k of
// them, this is selectTopK's result.
void trimToTopK(const uint32_t* idx, const float* values, size_t count, size_t k,
                std::vector<uint32_t>* out_idx, std::vector<float>* out_values);

}  // namespace fedfleet::compress
