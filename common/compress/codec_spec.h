// Which codec compresses an update, as configs, tasks and the history name it.
//
// A spec is written as text in configs and on the command line:
//
//   spec := name [":" ratio] ("," key "=" value)*
//   none | fp32       32-bit floats, lossless
//   fp16 | bf16       16-bit floats, round to nearest even
//   qsgd8 | qsgd4     QSGD, 127 or 7 levels per sign, in buckets; key bucket=N
//   topk[:ratio]      top-k by magnitude, k = ratio * n (default 0.01); key ef=on|off
//   sign              scaled sign, 1 bit a value, a scale per bucket; keys bucket=N, ef=on|off
//
// e.g. "none", "fp16", "qsgd8", "qsgd4,bucket=256", "topk:0.01", "topk:0.001,ef=off", "sign".
// bucket is a multiple of 8 in [8, 2^24] (default 512); ratio is in (0, 1]. ef (error feedback,
// default on) applies to the biased codecs only: it is refused for the others.
// toString writes the canonical text (defaults left out), and parseCodecSpec(toString(s)) == s
// for every valid spec.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace fedfleet::compress {

struct CodecSpec {
  std::string name = "none";   // none | fp16 | bf16 | qsgd | topk | sign
  uint32_t bits = 8;           // qsgd: 8 or 4
  uint32_t bucket = 512;       // qsgd and sign: elements per scale
  double ratio = 0.01;         // topk: fraction of the elements kept
  bool error_feedback = true;  // topk and sign: keep a residual per client (ErrorFeedback)

  bool operator==(const CodecSpec&) const = default;
};

// Largest bucket a spec may name (and a payload may carry).
constexpr uint32_t kMaxBucket = 1u << 24;

// Parses the text above. INVALID_ARGUMENT, naming the problem and the valid choices, for an
// unknown name, a bad or out-of-range number, an unknown or repeated key, or a key that does
// not apply to the codec.
Result<CodecSpec> parseCodecSpec(const std::string& text);

// The canonical text of a valid spec (e.g. "qsgd4,bucket=256", "topk:0.01"). For an invalid
// spec the text names what it holds and parseCodecSpec refuses it.
std::string toString(const CodecSpec& spec);

// OK when `spec` names a codec with valid parameters, else INVALID_ARGUMENT saying which field.
Status validate(const CodecSpec& spec);

// True for the biased codecs (topk, sign): decode(encode(x)) is not x even in expectation.
bool isBiased(const CodecSpec& spec);

// True when the sender should keep an ErrorFeedback residual: a biased codec with
// error_feedback on.
bool usesErrorFeedback(const CodecSpec& spec);

}  // namespace fedfleet::compress
