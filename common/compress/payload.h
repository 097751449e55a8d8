// The bytes of one encoded element range ("payload"), and decoding them.
//
// A payload is self-describing: a 12-byte header says which codec made it, its parameters and
// how many elements it holds, so a receiver can decode any payload without knowing the
// sender's codec (decodePayload below), and a payload of the wrong codec, length or shape is
// refused instead of misread. All integers are little-endian; floats are IEEE binary32 /
// binary16 / bfloat16, little-endian; the body follows the header without padding, and nothing
// in it is aligned.
//
//   offset size  field
//   0      1     magic 0xf1 (fedfleet payload, format 1)
//   1      1     codec: 0 none, 1 fp16, 2 bf16, 3 qsgd, 4 topk, 5 sign, 6 lowrank
//   2      1     bits: 8 or 4 for qsgd, 0 otherwise
//   3      1     0 (reserved)
//   4      4     param: bucket for qsgd and sign, k for topk, the rank for lowrank, 0 otherwise
//   8      4     n, the number of elements
//   12     ...   body:
//     none  n fp32
//     fp16  n fp16;  bf16  n bf16
//     qsgd  ceil(n / bucket) fp32 scales, then the levels: n int8 (bits 8) or ceil(n / 2) bytes
//           of two int4 (bits 4; element 2j in the low nibble of byte j); kernels/quantize.h
//     topk  k fp16 values, then k indices as LEB128 varints in increasing order: the first index,
//           then each gap minus one (index[j] - index[j-1] - 1); the varints end the payload
//     sign  ceil(n / bucket) fp32 scales, then ceil(n / 8) bytes of sign bits (bit i of the
//           stream set when element i is negative, LSB first); kernels/quantize.h
//     lowrank  the row count, r fp32 scales, then two fp16 factors; common/compress/lowrank.h
//
// Decoding checks everything before it writes anything: magic, codec, parameters, that the
// header's n equals the n the caller expects, the exact byte length, every topk index (in
// range, increasing, each varint at most 5 bytes and fitting 32 bits, none missing or extra),
// and that no decoded value can be NaN or infinite (fp32/fp16/bf16 values; qsgd and sign scales
// finite, non-negative and small enough that scale * level cannot overflow; lowrank's shape,
// rank, scales and factor values, lowrank.h). A payload that
// fails is CORRUPT and the output (or accumulator) is left untouched, so the caller can reject
// the update without having folded part of it. A decoded value is therefore always finite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace fedfleet::compress {

// The codec byte of the header: 0 none, 1 fp16, 2 bf16, 3 qsgd, 4 topk, 5 sign, 6 lowrank.
enum class CodecKind : uint8_t { kNone, kFp16, kBf16, kQsgd, kTopk, kSign, kLowrank };

// "none", "fp16", "bf16", "qsgd", "topk", "sign", "lowrank" (the CodecSpec names).
const char* codecKindName(CodecKind kind);

constexpr size_t kPayloadHeaderBytes = 12;
constexpr uint8_t kPayloadMagic = 0xf1;
// Elements per payload are counted in 32 bits: encode larger tensors in chunks.
constexpr size_t kMaxPayloadElements = 0xffffffffu;

struct PayloadHeader {
  CodecKind kind = CodecKind::kNone;
  uint32_t bits = 0;   // qsgd: 8 or 4
  uint32_t param = 0;  // bucket (qsgd, sign), k (topk) or rank (lowrank)
  uint32_t n = 0;
};

// Appends the 12 header bytes to *out.
void appendPayloadHeader(const PayloadHeader& header, std::string* out);

// Appends the index part of a topk body: idx[0, k) (increasing) as LEB128 gap varints.
void appendTopkIndices(const uint32_t* idx, size_t k, std::string* out);

// Reads and checks a header: CORRUPT when the payload is shorter than a header, the magic or
// the codec byte is unknown, or the parameters are impossible (qsgd bits not 8 or 4; bucket
// not a multiple of 8 in [8, 2^24]; topk k > n; lowrank rank > n or > kMaxRank). Does not look
// at the body.
Result<PayloadHeader> readPayloadHeader(std::string_view payload);

// Decodes a payload of any codec holding exactly n elements into out[0, n) (dense; elements a
// topk payload does not name are 0). CORRUPT as described above; out is untouched on error.
Status decodePayload(std::string_view payload, size_t n, float* out);

// acc[i] = fma(w, value_i, acc[i]) for the n decoded values, without materialising them where
// the codec allows (scatter-add for topk, fused dequantise-and-fma for qsgd and sign, convert-
// and-fma for fp16/bf16): the same bits as decodePayload followed by
// kernels::weightedAccumulate. CORRUPT as described above; acc is untouched on error.
Status decodeAccumulatePayload(std::string_view payload, size_t n, float w, float* acc);

}  // namespace fedfleet::compress
