// Which codec compresses an update, as configs, tasks and the history name it.
//
// A spec is written as text in configs and on the command line:
//
//   spec := name [":" ratio] ("," key "=" value)*
//   none | fp32       32-bit floats, lossless
//   fp16 | bf16       16-bit floats, round to nearest even
//   qsgd8 | qsgd4     QSGD, 127 or 7 levels per sign, in buckets; key bucket=N
//   topk[:ratio]      top-k by magnitude, k = ratio * n (default 0.01); keys ef=on|off,
//                     warmup=N (sparsity warm-up rounds, default 0: off; see codecForRound),
//                     dense_below=N (tensors of fewer than N elements go as fp16, not
//                     sparsified; default 0: none; see denseBelow)
//   sign              scaled sign, 1 bit a value, a scale per bucket; keys bucket=N, ef=on|off
//   lowrank[:rank]    each tensor (rows = its first dimension) as a rank-r product of two fp16
//                     factors (default rank 4, at most kMaxRank = 64); key ef=on|off;
//                     common/compress/lowrank.h
//
// e.g. "none", "fp16", "qsgd8", "qsgd4,bucket=256", "topk:0.01", "topk:0.001,ef=off",
// "topk:0.01,warmup=4", "topk:0.01,dense_below=10000", "sign", "lowrank:10". bucket is a multiple
// of 8 in [8, 2^24] (default 512); ratio is in (0, 1]; warmup is in [0, kMaxWarmup]; dense_below is
// in [0, 2^24]; rank is in [1, 64]. ef (error feedback, default on) applies to the biased codecs
// only: it is refused for the others. toString writes the canonical text (defaults left out), and
// parseCodecSpec(toString(s)) == s for every valid spec.
#pragma once

#include <cstdint>
#include <string>

#include "common/compress/payload.h"
#include "common/status.h"

namespace fedfleet::compress {

struct CodecSpec {
  std::string name = "none";   // none | fp16 | bf16 | qsgd | topk | sign | lowrank
  uint32_t bits = 8;           // qsgd: 8 or 4
  uint32_t bucket = 512;       // qsgd and sign: elements per scale
  double ratio = 0.01;         // topk: fraction of the elements kept
  bool error_feedback = true;  // topk and sign: keep a residual per client (ErrorFeedback)
  uint32_t warmup = 0;         // topk: rounds of sparsity warm-up (codecForRound); 0: off
  uint32_t dense_below = 0;    // topk: tensors of fewer elements are sent as fp16; 0: none
  uint32_t rank = 4;           // lowrank: rank of each tensor's approximation

  bool operator==(const CodecSpec&) const = default;
};

// Largest bucket a spec may name (and a payload may carry).
constexpr uint32_t kMaxBucket = 1u << 24;

// Largest dense_below a topk spec may name.
constexpr uint32_t kMaxDenseBelow = 1u << 24;

// Most warm-up rounds a topk spec may name.
constexpr uint32_t kMaxWarmup = 16;

// Parses the text above. INVALID_ARGUMENT, naming the problem and the valid choices, for an
// unknown name, a bad or out-of-range number, an unknown or repeated key, or a key that does
// not apply to the codec.
Result<CodecSpec> parseCodecSpec(const std::string& text);

// The canonical text of a valid spec (e.g. "qsgd4,bucket=256", "topk:0.01"). For an invalid
// spec the text names what it holds and parseCodecSpec refuses it.
std::string toString(const CodecSpec& spec);

// OK when `spec` names a codec with valid parameters, else INVALID_ARGUMENT saying which field.
Status validate(const CodecSpec& spec);

// True for the biased codecs (topk, sign, lowrank): decode(encode(x)) is not x even in
// expectation.
bool isBiased(const CodecSpec& spec);

// True when the sender should keep an ErrorFeedback residual: a biased codec with
// error_feedback on.
bool usesErrorFeedback(const CodecSpec& spec);

// Sparsity warm-up (Deep Gradient Compression, Lin et al. 2018): the codec the coordinator asks
// for in round `round` (1-based) of a run configured with `spec`. For topk with warmup = W > 0,
// round r <= W keeps ratio * 2^(W - r + 1) of the elements (capped at 1): with W = 4, 16x, 8x,
// 4x and 2x the configured ratio, then the ratio itself from round W + 1 on. The result is a
// concrete per-round spec (warmup = 0, so a client applies it as it is). Other codecs, and topk
// with warmup = 0, are returned unchanged. The denser early rounds cost bytes: with W = 4 about
// 26 configured rounds' worth extra in all. Off by default: on the codecs_accuracy benchmark it
// did not buy accuracy (docs/BENCHMARKS.md).
CodecSpec codecForRound(const CodecSpec& spec, uint64_t round);

// What an error-feedback residual belongs to: the spec's text without the parameters that do
// not change what the residual means (topk's ratio, warmup and dense_below, lowrank's rank), so
// a client keeps
// its residual when the coordinator only changes the ratio from one round to the next.
std::string residualKey(const CodecSpec& spec);

// True when the codec selects elements (topk): its upload is then cut one tensor a chunk (see
// client::planChunks), so the selection is per tensor and no small tensor (a bias) competes
// with a larger one for the k slots of a shared chunk. Also true for lowrank (factorsMatrices).
bool selectsPerTensor(const CodecSpec& spec);

// True when the codec reads each chunk as a matrix (lowrank): its chunks are whole tensors, or
// blocks of whole rows of one (client::planUploadChunks), and carry their row count.
bool factorsMatrices(const CodecSpec& spec);

// True when compress::DeviceCompressor encodes the codec on a GPU (all but lowrank, whose
// updates are compressed on the host).
bool encodesOnDevice(const CodecSpec& spec);

// True when a tensor of `numel` elements is sent dense, as fp16, instead of through the spec's
// codec: topk with dense_below > numel. A tensor of a few hundred or thousand elements (a bias,
// a first convolution, a classifier layer) keeps only a handful of values a round under top-k
// 1%, while sending it whole in fp16 costs little next to the large tensors' indices and
// values (docs/BENCHMARKS.md, codecs_accuracy). The chunks of such a tensor carry fp16
// payloads (client::ChunkRange::dense); with error feedback the residual then keeps only fp16's
// rounding error.
bool denseBelow(const CodecSpec& spec, uint64_t numel);

// The payload kind the spec's encoder writes (common/compress/payload.h).
CodecKind payloadKind(const CodecSpec& spec);

// True when an update for a task that asked for `spec` may hold a payload of `kind`: the
// spec's own kind, or fp16 for a topk spec with dense_below (its small tensors, denseBelow).
// The coordinator refuses any other kind, so a client cannot choose for itself which decoder
// (and what decoding cost) the coordinator runs on its bytes.
bool acceptsPayload(const CodecSpec& spec, CodecKind kind);

}  // namespace fedfleet::compress
