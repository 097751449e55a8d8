#include "common/compress/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>

#include "common/check.h"
#include "common/compress/lowrank.h"
#include "kernels/convert.h"
#include "kernels/quantize.h"
#include "kernels/sparse.h"

namespace fedfleet::compress {
namespace {

// Appends `bytes` bytes to *out and returns where they start.
unsigned char* grow(std::string* out, size_t bytes) {
  const size_t at = out->size();
  out->resize(at + bytes);
  return reinterpret_cast<unsigned char*>(out->data()) + at;
}

// Per-thread scratch of topk's encoder (sample, candidates): encode stays allocation-free after
// the first chunks a thread encodes.
struct TopkScratch {
  std::vector<uint32_t> sample;
  std::vector<uint32_t> candidates;
};
TopkScratch& topkScratch() {
  thread_local TopkScratch scratch;
  return scratch;
}

class BuiltinCodec final : public Codec {
 public:
  explicit BuiltinCodec(const CodecSpec& spec) : spec_(spec), kind_(payloadKind(spec)) {}

  const CodecSpec& spec() const override { return spec_; }

  bool biased() const override { return isBiased(spec_); }

  size_t maxEncodedBytes(size_t n) const override {
    const size_t buckets = kernels::bucketCount(n, spec_.bucket);
    switch (kind_) {
      case CodecKind::kNone:
        return kPayloadHeaderBytes + 4 * n;
      case CodecKind::kFp16:
      case CodecKind::kBf16:
        return kPayloadHeaderBytes + 2 * n;
      case CodecKind::kQsgd:
        return kPayloadHeaderBytes + 4 * buckets + kernels::qsgdLevelBytes(n, spec_.bits);
      case CodecKind::kSign:
        return kPayloadHeaderBytes + 4 * buckets + kernels::signBytes(n);
      case CodecKind::kTopk:
        return kPayloadHeaderBytes + 7 * topkCount(n, spec_.ratio);  // fp16 + <= 5-byte varint
      case CodecKind::kLowrank:
        // r' (rows + cols) <= min(rows, cols) (rows + cols) <= 2n when rows * cols = n.
        return kPayloadHeaderBytes + 4 + 4 * std::min<size_t>(spec_.rank, n) + 4 * n;
    }
    return 0;
  }

  void encodeRows(const float* x, size_t n, size_t rows, uint64_t seed,
                  std::string* out) const override {
    if (kind_ != CodecKind::kLowrank) return encode(x, n, seed, out);
    FEDFLEET_CHECK_MSG(n <= kMaxPayloadElements, "encode more than 2^32 - 1 elements in chunks");
    FEDFLEET_CHECK_MSG(rows >= 1 && n % rows == 0, "lowrank rows must divide the chunk");
    lowrankEncode(x, rows, n / rows, spec_.rank, seed, out);
  }

  void encode(const float* x, size_t n, uint64_t seed, std::string* out) const override {
    FEDFLEET_CHECK_MSG(n <= kMaxPayloadElements, "encode more than 2^32 - 1 elements in chunks");
    PayloadHeader h;
    h.kind = kind_;
    h.n = static_cast<uint32_t>(n);
    switch (kind_) {
      case CodecKind::kNone: {
        appendPayloadHeader(h, out);
        if (n > 0) std::memcpy(grow(out, 4 * n), x, 4 * n);
        return;
      }
      case CodecKind::kFp16:
        appendPayloadHeader(h, out);
        kernels::floatToFp16(x, n, grow(out, 2 * n));
        return;
      case CodecKind::kBf16:
        appendPayloadHeader(h, out);
        kernels::floatToBf16(x, n, grow(out, 2 * n));
        return;
      case CodecKind::kQsgd: {
        h.bits = spec_.bits;
        h.param = spec_.bucket;
        appendPayloadHeader(h, out);
        const size_t scale_bytes = 4 * kernels::bucketCount(n, spec_.bucket);
        unsigned char* body = grow(out, scale_bytes + kernels::qsgdLevelBytes(n, spec_.bits));
        kernels::qsgdQuantize(x, n, spec_.bits, spec_.bucket, seed, body, body + scale_bytes);
        return;
      }
      case CodecKind::kSign: {
        h.param = spec_.bucket;
        appendPayloadHeader(h, out);
        const size_t scale_bytes = 4 * kernels::bucketCount(n, spec_.bucket);
        unsigned char* body = grow(out, scale_bytes + kernels::signBytes(n));
        kernels::signQuantize(x, n, spec_.bucket, body, body + scale_bytes);
        return;
      }
      case CodecKind::kTopk: {
        const size_t k = topkCount(n, spec_.ratio);
        std::vector<uint32_t>& idx = topkScratch().candidates;
        selectTopK(x, n, k, seed, &idx);
        h.param = static_cast<uint32_t>(k);
        appendPayloadHeader(h, out);
        kernels::gatherFp16(x, idx.data(), k, grow(out, 2 * k));
        appendTopkIndices(idx.data(), k, out);
        return;
      }
      case CodecKind::kLowrank:
        lowrankEncode(x, 1, n, spec_.rank, seed, out);
        return;
    }
  }

  Status decode(std::string_view payload, size_t n, float* out) const override {
    FEDFLEET_RETURN_IF_ERROR(checkKind(payload));
    return decodePayload(payload, n, out);
  }

  Status decodeAccumulate(std::string_view payload, size_t n, float w, float* acc) const override {
    FEDFLEET_RETURN_IF_ERROR(checkKind(payload));
    return decodeAccumulatePayload(payload, n, w, acc);
  }

 private:
  Status checkKind(std::string_view payload) const {
    FEDFLEET_ASSIGN_OR_RETURN(const PayloadHeader h, readPayloadHeader(payload));
    if (h.kind != kind_) {
      return corrupt(std::string("payload was made by codec ") + codecKindName(h.kind) + ", not " +
                     codecKindName(kind_));
    }
    return Status::ok();
  }

  const CodecSpec spec_;
  const CodecKind kind_;
};

}  // namespace

Result<std::unique_ptr<Codec>> makeCodec(const CodecSpec& spec) {
  FEDFLEET_RETURN_IF_ERROR(validate(spec));
  return std::unique_ptr<Codec>(std::make_unique<BuiltinCodec>(spec));
}

size_t topkCount(size_t n, double ratio) {
  if (n == 0) return 0;
  const double k = std::round(ratio * static_cast<double>(n));
  if (!(k >= 1.0)) return 1;
  return k >= static_cast<double>(n) ? n : static_cast<size_t>(k);
}

void selectTopK(const float* x, size_t n, size_t k, uint64_t seed, std::vector<uint32_t>* out) {
  FEDFLEET_CHECK(k <= n);
  out->clear();
  if (k == 0) return;
  // Larger magnitude first; of equal magnitudes the lower index first.
  const auto before = [x](uint32_t a, uint32_t b) {
    const uint32_t ka = kernels::magnitudeKey(x[a]), kb = kernels::magnitudeKey(x[b]);
    return ka != kb ? ka > kb : a < b;
  };
  std::vector<uint32_t>& cand = *out;
  size_t count = 0;
  const size_t m = std::max<size_t>(1024, n / 100);
  if (k < n && m < n / 4) {
    // Estimate the threshold from a sample: the sample's r-th largest magnitude, with r set
    // about four standard deviations above the expected number of sampled elements in the top
    // k, so that at least k elements pass with high probability and not many more than k.
    std::vector<uint32_t>& sample = topkScratch().sample;
    sample.resize(m);
    kernels::sampleMagnitudeKeys(x, n, m, seed, sample.data());
    const double expected =
        static_cast<double>(m) * static_cast<double>(k) / static_cast<double>(n);
    const size_t r =
        std::min(m - 1, static_cast<size_t>(expected + 4.0 * std::sqrt(expected) + 4.0));
    std::nth_element(sample.begin(), sample.begin() + r, sample.end(), std::greater<uint32_t>());
    const float threshold = std::bit_cast<float>(sample[r]);
    const double want =
        (static_cast<double>(r) + 1.0) * static_cast<double>(n) / static_cast<double>(m);
    cand.resize(std::min(n, static_cast<size_t>(want * 1.5) + 64));
    count = kernels::selectAtLeast(x, n, threshold, cand.data(), cand.size());
    if (count > cand.size()) {
      cand.resize(count);
      count = kernels::selectAtLeast(x, n, threshold, cand.data(), cand.size());
    }
  }
  if (count < k) {  // no estimate (small n), or it passed too few: take every element
    cand.resize(n);
    for (size_t i = 0; i < n; ++i) cand[i] = static_cast<uint32_t>(i);
    count = n;
  }
  cand.resize(count);
  if (count > k) {
    std::nth_element(cand.begin(), cand.begin() + (k - 1), cand.end(), before);
    cand.resize(k);
    std::sort(cand.begin(), cand.end());
  }
}

void trimToTopK(const uint32_t* idx, const float* values, size_t count, size_t k,
                std::vector<uint32_t>* out_idx, std::vector<float>* out_values) {
  FEDFLEET_CHECK(k <= count);
  std::vector<uint32_t> order(count);
  for (size_t j = 0; j < count; ++j) order[j] = static_cast<uint32_t>(j);
  const auto before = [&](uint32_t a, uint32_t b) {
    const uint32_t ka = kernels::magnitudeKey(values[a]), kb = kernels::magnitudeKey(values[b]);
    return ka != kb ? ka > kb : idx[a] < idx[b];
  };
  if (count > k && k > 0) {
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
  }
  order.resize(k);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return idx[a] < idx[b]; });
  out_idx->resize(k);
  out_values->resize(k);
  for (size_t j = 0; j < k; ++j) {
    (*out_idx)[j] = idx[order[j]];
    (*out_values)[j] = values[order[j]];
  }
}

}  // namespace fedfleet::compress
