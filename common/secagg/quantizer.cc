#include "common/secagg/quantizer.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace fedfleet::secagg {
namespace {

// KeyedStream::nextOpenUnit's draw from its 8 stream bytes (read little-endian): (k + 0.5) / 2^53
// for k the top 53 bits. quantizer_test checks the two agree.
double openUnit(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return (static_cast<double>(v >> 11) + 0.5) * 0x1.0p-53;
}

}  // namespace

Status validateQuantizer(const QuantizerOptions& o, uint64_t max_clients) {
  if (!(std::isfinite(o.clip_range) && o.clip_range > 0)) {
    return invalidArgument("secagg.clip_range must be a positive number");
  }
  if (o.quant_range == 0) return invalidArgument("secagg.quant_range must be at least 1");
  if (static_cast<unsigned __int128>(o.quant_range) * std::max<uint64_t>(max_clients, 1) >=
      (static_cast<unsigned __int128>(1) << 32)) {
    return invalidArgument(
        "secagg.quant_range " + std::to_string(o.quant_range) + " x " +
        std::to_string(max_clients) +
        " clients could overflow the 32-bit sum: lower secagg.quant_range to "
        "at most " +
        std::to_string(((uint64_t{1} << 32) - 1) / std::max<uint64_t>(max_clients, 1)));
  }
  return Status::ok();
}

void quantize(const QuantizerOptions& o, const float* values, size_t n, crypto::KeyedStream& random,
              uint32_t* out) {
  const double c = o.clip_range, q = o.quant_range;
  const double scale = q / (2 * c);
  // The draws are KeyedStream::nextOpenUnit's, 8 bytes of the stream a value in order, taken a
  // block at a time rather than one call a value (the same bits, several times faster).
  unsigned char draws[512 * 8];
  for (size_t start = 0; start < n; start += 512) {
    const size_t m = std::min<size_t>(512, n - start);
    random.fill(draws, m * 8);
    for (size_t i = 0; i < m; ++i) {
      double v = values[start + i];
      if (!(v >= -c)) v = -c;  // also NaN: the caller refuses non-finite updates before this
      if (v > c) v = c;
      const double x = std::clamp((v + c) * scale, 0.0, q);
      const double lo = std::floor(x);
      const double up = openUnit(draws + 8 * i) < x - lo ? 1 : 0;
      out[start + i] = static_cast<uint32_t>(std::min(lo + up, q));
    }
  }
}

void dequantizeSum(const QuantizerOptions& o, const uint32_t* sum, size_t n, uint64_t count,
                   float* out) {
  const double c = o.clip_range, step = 2 * c / o.quant_range;
  for (size_t i = 0; i < n; ++i) {
    out[i] =
        static_cast<float>(static_cast<double>(sum[i]) * step - static_cast<double>(count) * c);
  }
}

}  // namespace fedfleet::secagg
