// Fixed-point encoding of float updates for secure aggregation: each value is clipped to
// [-c, c] (secagg.clip_range) and mapped onto the integers 0 .. q (secagg.quant_range) by
// stochastic rounding, so that the encoding is unbiased: E[decode(encode(v))] = clip(v). Sums
// of up to floor((2^32 - 1) / q) encodings are exact mod 2^32 and decode to the sum of the
// clipped values with an error per value of at most 2c/q per client (each rounding moves a
// value by less than one step of 2c/q), of standard deviation at most sqrt(n) c / q for n
// clients (each rounding's variance is at most a quarter step squared).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/crypto/keyed_stream.h"
#include "common/status.h"

namespace fedfleet::secagg {

struct QuantizerOptions {
  double clip_range = 8.0;          // c
  uint32_t quant_range = 1u << 22;  // q
};

// kInvalidArgument when c is not finite and positive, q is 0, or `max_clients` encodings could
// overflow 2^32 (q x max_clients >= 2^32), with what to change.
Status validateQuantizer(const QuantizerOptions& options, uint64_t max_clients);

// out[i] = the encoding of values[i]; the rounding draws come from `random` (seeded: the same
// stream gives the same encoding).
void quantize(const QuantizerOptions& options, const float* values, size_t n,
              crypto::KeyedStream& random, uint32_t* out);
// The sum of `count` clients' clipped values from the sum of their encodings mod 2^32.
void dequantizeSum(const QuantizerOptions& options, const uint32_t* sum, size_t n, uint64_t count,
                   float* out);

}  // namespace fedfleet::secagg
