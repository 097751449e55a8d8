// Fuzzes the payload decoders of common/compress/payload.h (readPayloadHeader, decodePayload,
// decodeAccumulatePayload), the same through a Codec (common/compress/codec.h), and the codec
// spec parser of common/compress/codec_spec.h, with the element count taken from the input.
// Beyond "no crash", it checks the contracts those headers state:
//   - a header that reads back is written back to the same 12 bytes;
//   - on CORRUPT the output or accumulator is untouched; on OK every decoded value is finite;
//   - decodeAccumulatePayload gives decodePayload followed by kernels::weightedAccumulate (values
//     compared as floats: a top-k payload leaves the elements it does not name as they were,
//     where the dense fold adds +0, which turns a -0 into +0);
//   - a Codec decodes exactly the payloads of its own kind that decodePayload decodes;
//   - a spec that parses is valid, and parseCodecSpec(toString(spec)) == spec;
//   - re-encoding decoded values of moderate magnitude (|x| <= 1e30, far from overflow) with the
//     spec's codec, as a vector and as whole rows of a matrix (encodeRows), yields a payload
//     that decodes, within maxEncodedBytes.
//
// Input layout: byte 0 control (bit 0: n is the header's element count when the header reads;
// otherwise bytes 1-4), bytes 1-4 n (little endian), bytes 5-8 w (a float; a non-finite one is
// replaced by 0.5), byte 9 the spec's length L, then L bytes of spec text, then the payload.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/compress/codec.h"
#include "common/compress/codec_spec.h"
#include "common/compress/payload.h"
#include "fuzz/fuzz_input.h"
#include "kernels/accumulate.h"

namespace fedfleet::compress {
namespace {

// Larger counts are decoded as 0 elements (refused unless the header says 0): a 15-byte topk
// payload may announce 2^32 - 1 elements, which would mean a 16 GiB output. 4096 elements still
// hold many buckets of the small bucket sizes and top-k payloads of any k up to that.
constexpr size_t kMaxElements = size_t{1} << 12;

// A fixed pattern of finite values (including -0 and subnormals) that no decoder writes by
// chance, so "untouched" can be checked: the first n of kMaxElements values made once.
std::vector<float> sentinel(size_t n, int which) {
  auto make = [](uint32_t salt) {
    std::vector<float> v(kMaxElements);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ salt;
      switch (h % 5) {
        case 0:
          v[i] = -0.0f;
          break;
        case 1:
          v[i] = 1e-40f;
          break;
        default:
          v[i] = static_cast<float>(static_cast<int32_t>(h)) * 1e-6f;
      }
    }
    return v;
  };
  static const std::vector<float> a = make(0x9e3779b9u), b = make(0x85ebca6bu);
  const std::vector<float>& pattern = which == 1 ? a : b;
  return std::vector<float>(pattern.begin(), pattern.begin() + static_cast<ptrdiff_t>(n));
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void checkHeader(std::string_view payload) {
  Result<PayloadHeader> h = readPayloadHeader(payload);
  if (!h.isOk()) {
    FUZZ_CHECK(h.status().code() == StatusCode::kCorrupt, h.status().toString().c_str());
    return;
  }
  std::string again;
  appendPayloadHeader(*h, &again);
  FUZZ_CHECK(again == payload.substr(0, kPayloadHeaderBytes), "header does not write back");
}

// Decodes `payload` as n elements both ways and checks them against each other; returns whether
// it decoded, with the values in *decoded.
bool checkDecoders(std::string_view payload, size_t n, float w, std::vector<float>* decoded) {
  const std::vector<float> before = sentinel(n, 1);
  std::vector<float> out = before;
  const Status st = decodePayload(payload, n, out.data());
  if (!st.isOk()) {
    FUZZ_CHECK(st.code() == StatusCode::kCorrupt, st.toString().c_str());
    FUZZ_CHECK(sameBits(out, before), "decodePayload wrote into out and failed");
  } else {
    for (float v : out) FUZZ_CHECK(std::isfinite(v), "decodePayload gave a non-finite value");
  }

  const std::vector<float> acc_before = sentinel(n, 2);
  std::vector<float> acc = acc_before;
  const Status acc_st = decodeAccumulatePayload(payload, n, w, acc.data());
  FUZZ_CHECK(acc_st.isOk() == st.isOk(), "decodeAccumulatePayload and decodePayload disagree");
  if (!acc_st.isOk()) {
    FUZZ_CHECK(sameBits(acc, acc_before), "decodeAccumulatePayload wrote into acc and failed");
  } else {
    std::vector<float> want = acc_before;
    kernels::weightedAccumulate(want.data(), out.data(), w, n);
    for (size_t i = 0; i < n; ++i) {
      FUZZ_CHECK(acc[i] == want[i], "decodeAccumulatePayload differs from decode + accumulate");
    }
  }
  *decoded = std::move(out);
  return st.isOk();
}

// The payload through a codec made from `spec`, and the codec's encoder over `values`.
void checkCodec(const CodecSpec& spec, std::string_view payload, size_t n, float w, bool decodes,
                const std::vector<float>& values, uint64_t seed) {
  Result<std::unique_ptr<Codec>> made = makeCodec(spec);
  FUZZ_CHECK(made.isOk(), made.status().toString().c_str());
  const Codec& codec = **made;
  Result<PayloadHeader> h = readPayloadHeader(payload);
  const bool own_kind = h.isOk() && codecKindName(h->kind) == spec.name;
  std::vector<float> out(n), acc(n);
  const Status st = codec.decode(payload, n, out.data());
  FUZZ_CHECK(st.isOk() == (decodes && own_kind), "Codec::decode disagrees with decodePayload");
  const Status acc_st = codec.decodeAccumulate(payload, n, w, acc.data());
  FUZZ_CHECK(acc_st.isOk() == st.isOk(), "Codec::decodeAccumulate disagrees with Codec::decode");

  if (!decodes) return;
  bool moderate = true;
  for (float v : values) moderate &= std::fabs(v) <= 1e30f;
  std::string encoded;
  codec.encode(values.data(), n, seed, &encoded);
  FUZZ_CHECK(encoded.size() <= codec.maxEncodedBytes(n), "encode wrote past maxEncodedBytes");
  std::vector<float> again(n);
  const Status re = codec.decode(encoded, n, again.data());
  FUZZ_CHECK(re.isOk() || (!moderate && re.code() == StatusCode::kCorrupt), re.toString().c_str());
  // The same values as whole rows of a matrix (lowrank factors it; the others ignore rows).
  size_t rows = 1 + seed % 8;
  while (n % rows != 0) --rows;
  encoded.clear();
  codec.encodeRows(values.data(), n, rows, seed, &encoded);
  FUZZ_CHECK(encoded.size() <= codec.maxEncodedBytes(n), "encodeRows wrote past maxEncodedBytes");
  const Status rows_re = codec.decode(encoded, n, again.data());
  FUZZ_CHECK(rows_re.isOk() || (!moderate && rows_re.code() == StatusCode::kCorrupt),
             rows_re.toString().c_str());
}

void checkSpec(const std::string& text, std::string_view payload, size_t n, float w, bool decodes,
               const std::vector<float>& values, uint64_t seed) {
  Result<CodecSpec> spec = parseCodecSpec(text);
  if (!spec.isOk()) {
    FUZZ_CHECK(spec.status().code() == StatusCode::kInvalidArgument,
               spec.status().toString().c_str());
    return;
  }
  FUZZ_CHECK(validate(*spec).isOk(), validate(*spec).toString().c_str());
  const std::string canonical = toString(*spec);
  Result<CodecSpec> again = parseCodecSpec(canonical);
  FUZZ_CHECK(again.isOk() && *again == *spec, canonical.c_str());
  const CodecSpec round = codecForRound(*spec, seed % 32);
  FUZZ_CHECK(validate(round).isOk(), toString(round).c_str());
  (void)residualKey(*spec);
  (void)usesErrorFeedback(*spec);
  (void)selectsPerTensor(*spec);
  (void)denseBelow(*spec, n);
  (void)factorsMatrices(*spec);
  (void)encodesOnDevice(*spec);
  checkCodec(*spec, payload, n, w, decodes, values, seed);
}

}  // namespace
}  // namespace fedfleet::compress

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fedfleet::Result;
  using namespace fedfleet::compress;
  fedfleet::fuzz::FuzzInput in(data, size);
  const uint8_t control = in.u8();
  size_t n = in.u32();
  float w = in.f32();
  if (!std::isfinite(w)) w = 0.5f;
  const std::string spec_text(in.take(in.u8()));
  const std::string_view payload = in.rest();

  checkHeader(payload);
  if (control & 1) {
    Result<PayloadHeader> h = readPayloadHeader(payload);
    if (h.isOk()) n = h->n;
  }
  if (n > kMaxElements) n = 0;
  std::vector<float> values;
  const bool decodes = checkDecoders(payload, n, w, &values);
  checkSpec(spec_text, payload, n, w, decodes, values, static_cast<uint64_t>(n) * 31 + control);
  return 0;
}
