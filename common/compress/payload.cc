#include "common/compress/payload.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/compress/codec_spec.h"
#include "common/compress/lowrank.h"
#include "kernels/convert.h"
#include "kernels/quantize.h"
#include "kernels/sparse.h"

namespace fedfleet::compress {
namespace {

constexpr float kFloatMax = 3.40282347e38f;

uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void put32(std::string* out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, sizeof(v));
  out->append(b, sizeof(b));
}

Status sizeMismatch(CodecKind kind, size_t got, size_t want) {
  return corrupt(std::string(codecKindName(kind)) + " payload body is " + std::to_string(got) +
                 " bytes, expected " + std::to_string(want));
}

// Scales of qsgd and sign: finite, non-negative and at most `limit`, so that scale * level
// (|level| <= FLT_MAX / limit) is finite.
Status checkScales(const unsigned char* scales, size_t count, float limit, CodecKind kind) {
  for (size_t b = 0; b < count; ++b) {
    float s;
    std::memcpy(&s, scales + 4 * b, sizeof(s));
    if (!(s >= 0.0f && s <= limit)) {  // also false for NaN
      return corrupt(std::string(codecKindName(kind)) + " payload scale " + std::to_string(b) +
                     " is " + std::to_string(s) + ", not a finite non-negative value");
    }
  }
  return Status::ok();
}

// Decodes the k index varints of a topk payload into idx (kernels::decodeIndexGaps checks
// them), warming the lines of `prefetch` they name, and names the first problem.
Status decodeTopkIndices(const unsigned char* p, const unsigned char* end, size_t k, size_t n,
                         std::vector<uint32_t>* idx, const float* prefetch) {
  idx->resize(k);
  const kernels::IndexGapDecode r =
      kernels::decodeIndexGaps(p, static_cast<size_t>(end - p), k, n, idx->data(), prefetch);
  const std::string entry = std::to_string(r.entry);
  switch (r.code) {
    case kernels::IndexGapDecode::kOk:
      return Status::ok();
    case kernels::IndexGapDecode::kTruncated:
      return corrupt("topk payload ends after " + entry + " of " + std::to_string(k) +
                     " indices (truncated inside index " + entry + ")");
    case kernels::IndexGapDecode::kOverlong:
      return corrupt("topk payload index " + entry + " overlong (more than 5 bytes)");
    case kernels::IndexGapDecode::kOutOfRange:
      return corrupt("topk payload index " + entry + " is " + std::to_string(r.index) +
                     ", past the " + std::to_string(n) + " elements");
    case kernels::IndexGapDecode::kTrailing:
      break;
  }
  return corrupt("topk payload has bytes after its " + std::to_string(k) + " indices");
}

// Per-thread scratch for a topk payload's decoded indices and values: decoding is reentrant and
// allocation-free after the first payloads a thread sees.
struct TopkScratch {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};
TopkScratch& topkScratch() {
  thread_local TopkScratch scratch;
  return scratch;
}

Status decodeImpl(std::string_view payload, size_t n, float w, float* out, bool accumulate) {
  FEDFLEET_ASSIGN_OR_RETURN(const PayloadHeader h, readPayloadHeader(payload));
  if (h.n != n) {
    return corrupt(std::string(codecKindName(h.kind)) + " payload holds " + std::to_string(h.n) +
                   " elements, expected " + std::to_string(n));
  }
  const auto* body = reinterpret_cast<const unsigned char*>(payload.data()) + kPayloadHeaderBytes;
  const size_t body_bytes = payload.size() - kPayloadHeaderBytes;
  switch (h.kind) {
    case CodecKind::kNone: {
      if (body_bytes != 4 * n) return sizeMismatch(h.kind, body_bytes, 4 * n);
      const bool finite = accumulate ? kernels::accumulateFp32IfFinite(out, body, w, n)
                                     : kernels::allFiniteFp32(body, n);
      if (!finite) return corrupt("none payload holds NaN or infinity");
      if (!accumulate && n > 0) std::memcpy(out, body, 4 * n);
      return Status::ok();
    }
    case CodecKind::kFp16:
    case CodecKind::kBf16: {
      const bool fp16 = h.kind == CodecKind::kFp16;
      if (body_bytes != 2 * n) return sizeMismatch(h.kind, body_bytes, 2 * n);
      bool finite;
      if (accumulate) {
        finite = fp16 ? kernels::accumulateFp16IfFinite(out, body, w, n)
                      : kernels::accumulateBf16IfFinite(out, body, w, n);
      } else {
        finite = fp16 ? kernels::allFiniteFp16(body, n) : kernels::allFiniteBf16(body, n);
        if (finite) fp16 ? kernels::fp16ToFloat(body, n, out) : kernels::bf16ToFloat(body, n, out);
      }
      if (!finite) {
        return corrupt(std::string(codecKindName(h.kind)) + " payload holds NaN or infinity");
      }
      return Status::ok();
    }
    case CodecKind::kQsgd: {
      const size_t buckets = kernels::bucketCount(n, h.param);
      const size_t level_bytes = kernels::qsgdLevelBytes(n, h.bits);
      if (body_bytes != 4 * buckets + level_bytes) {
        return sizeMismatch(h.kind, body_bytes, 4 * buckets + level_bytes);
      }
      // |level| <= 128 (8 bits) or 8 (4 bits) for any byte, so these bounds keep every value
      // finite whatever the level bytes hold.
      const float limit = h.bits == 8 ? kFloatMax / 128.0f : kFloatMax / 8.0f;
      FEDFLEET_RETURN_IF_ERROR(checkScales(body, buckets, limit, h.kind));
      const unsigned char* levels = body + 4 * buckets;
      if (h.bits == 4 && n % 2 != 0 && (levels[level_bytes - 1] & 0xf0) != 0) {
        return corrupt("qsgd payload has a non-zero padding nibble");
      }
      if (accumulate) {
        kernels::qsgdDequantizeAccumulate(out, body, levels, n, h.bits, h.param, w);
      } else {
        kernels::qsgdDequantize(body, levels, n, h.bits, h.param, out);
      }
      return Status::ok();
    }
    case CodecKind::kSign: {
      const size_t buckets = kernels::bucketCount(n, h.param);
      const size_t sign_bytes = kernels::signBytes(n);
      if (body_bytes != 4 * buckets + sign_bytes) {
        return sizeMismatch(h.kind, body_bytes, 4 * buckets + sign_bytes);
      }
      FEDFLEET_RETURN_IF_ERROR(checkScales(body, buckets, kFloatMax, h.kind));
      const unsigned char* signs = body + 4 * buckets;
      if (n % 8 != 0 && (signs[sign_bytes - 1] >> (n % 8)) != 0) {
        return corrupt("sign payload has non-zero padding bits");
      }
      if (accumulate) {
        kernels::signDequantizeAccumulate(out, body, signs, n, h.param, w);
      } else {
        kernels::signDequantize(body, signs, n, h.param, out);
      }
      return Status::ok();
    }
    case CodecKind::kTopk: {
      const size_t k = h.param;
      if (body_bytes < 2 * k + k) {  // values, and at least one byte per index
        return corrupt("topk payload body is " + std::to_string(body_bytes) +
                       " bytes, too short for " + std::to_string(k) + " entries");
      }
      const unsigned char* values = body;
      TopkScratch& scratch = topkScratch();
      std::vector<uint32_t>& idx = scratch.indices;
      // Decoding the indices also requests the accumulator lines they name, so the scatter
      // below finds them in cache (kernels/sparse.h).
      FEDFLEET_RETURN_IF_ERROR(decodeTopkIndices(body + 2 * k, body + body_bytes, k, n, &idx, out));
      if (!kernels::allFiniteFp16(values, k)) return corrupt("topk payload holds NaN or infinity");
      if (accumulate) {
        // Converting the values in one vectorised pass and scattering floats costs less than
        // converting each value inside the scatter loop.
        scratch.values.resize(k);
        kernels::fp16ToFloat(values, k, scratch.values.data());
        kernels::scatterAdd(out, idx.data(), scratch.values.data(), w, k);
      } else {
        std::fill(out, out + n, 0.0f);
        kernels::scatterFp16(out, idx.data(), values, k);
      }
      return Status::ok();
    }
    case CodecKind::kLowrank:
      return lowrankDecode(h, body, body_bytes, n, w, out, accumulate);
  }
  return corrupt("unknown codec");  // unreachable: readPayloadHeader checked the kind
}

}  // namespace

const char* codecKindName(CodecKind kind) {
  switch (kind) {
    case CodecKind::kNone:
      return "none";
    case CodecKind::kFp16:
      return "fp16";
    case CodecKind::kBf16:
      return "bf16";
    case CodecKind::kQsgd:
      return "qsgd";
    case CodecKind::kTopk:
      return "topk";
    case CodecKind::kSign:
      return "sign";
    case CodecKind::kLowrank:
      return "lowrank";
  }
  return "unknown";
}

void appendPayloadHeader(const PayloadHeader& header, std::string* out) {
  const char head[4] = {static_cast<char>(kPayloadMagic), static_cast<char>(header.kind),
                        static_cast<char>(header.bits), 0};
  out->append(head, sizeof(head));
  put32(out, header.param);
  put32(out, header.n);
}

void appendTopkIndices(const uint32_t* idx, size_t k, std::string* out) {
  const size_t at = out->size();
  out->resize(at + 5 * k);  // room for the longest varints, trimmed below
  out->resize(at + kernels::encodeIndexGaps(idx, k, out->data() + at));
}

Result<PayloadHeader> readPayloadHeader(std::string_view payload) {
  if (payload.size() < kPayloadHeaderBytes) {
    return corrupt("payload of " + std::to_string(payload.size()) + " bytes is shorter than its " +
                   std::to_string(kPayloadHeaderBytes) + "-byte header");
  }
  const auto* p = reinterpret_cast<const unsigned char*>(payload.data());
  if (p[0] != kPayloadMagic) return corrupt("payload does not start with the codec magic byte");
  if (p[1] > static_cast<unsigned char>(CodecKind::kLowrank)) {
    return corrupt("payload names unknown codec " + std::to_string(p[1]));
  }
  PayloadHeader h;
  h.kind = static_cast<CodecKind>(p[1]);
  h.bits = p[2];
  h.param = load32(p + 4);
  h.n = load32(p + 8);
  const std::string name = codecKindName(h.kind);
  if (p[3] != 0) return corrupt(name + " payload has a non-zero reserved byte");
  const bool bucketed = h.kind == CodecKind::kQsgd || h.kind == CodecKind::kSign;
  if (h.kind == CodecKind::kQsgd ? (h.bits != 8 && h.bits != 4) : h.bits != 0) {
    return corrupt(name + " payload has bits " + std::to_string(h.bits));
  }
  if (bucketed && (h.param < 8 || h.param > kMaxBucket || h.param % 8 != 0)) {
    return corrupt(name + " payload has bucket " + std::to_string(h.param));
  }
  if (h.kind == CodecKind::kTopk && h.param > h.n) {
    return corrupt("topk payload keeps " + std::to_string(h.param) + " of " + std::to_string(h.n) +
                   " elements");
  }
  if (h.kind == CodecKind::kLowrank && (h.param > h.n || h.param > kMaxRank)) {
    return corrupt("lowrank payload has rank " + std::to_string(h.param) + " for " +
                   std::to_string(h.n) + " elements (at most " + std::to_string(kMaxRank) + ")");
  }
  const bool has_param = bucketed || h.kind == CodecKind::kTopk || h.kind == CodecKind::kLowrank;
  if (!has_param && h.param != 0) {
    return corrupt(name + " payload has param " + std::to_string(h.param));
  }
  return h;
}

Status decodePayload(std::string_view payload, size_t n, float* out) {
  return decodeImpl(payload, n, 0.0f, out, false);
}

Status decodeAccumulatePayload(std::string_view payload, size_t n, float w, float* acc) {
  return decodeImpl(payload, n, w, acc, true);
}

}  // namespace fedfleet::compress
