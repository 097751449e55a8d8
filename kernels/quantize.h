// Quantisation kernels of the QSGD and scaled-sign codecs (common/compress/), CPU reference;
// kernels/compress_cuda.h has the GPU versions, which produce the same bytes.
//
// Layout. Elements are cut into buckets of `bucket` elements (the last one may be shorter);
// bucket b holds elements [b * bucket, min(n, (b + 1) * bucket)). Every bucket has one fp32
// scale (`scales`, 4 bytes each, little-endian). `bucket` must be a positive multiple of 8
// (a violation aborts), so 4-bit pairs never straddle two buckets and every bucket's sign bits
// start a byte.
//
// QSGD with s levels (Alistarh et al., 2017), s = 127 for 8 bits and 7 for 4 bits: for a bucket
// v with norm ||v||_2 (summed in double in the fixed order of kernels/scalar.h), scale =
// ||v|| / s, and element i gets the signed level q_i = sign(v_i) * l_i, l_i = floor(|v_i| s /
// ||v||) or that plus one, with the probability that makes E[l_i] = |v_i| s / ||v||, so
// E[scale * q_i] = v_i (unbiased up to float rounding). The random number of element i is a
// pure function of (seed, i): the same seed gives the same bytes on every machine and device.
// 8-bit levels are one int8 each ([-127, 127]); 4-bit levels are two's-complement nibbles
// ([-7, 7]), element 2j in the low nibble of byte j, element 2j + 1 in the high one.
// Decoding: value_i = scale * q_i (one rounding).
//
// Scaled sign (EF-signSGD, Karimireddy et al., 2019) per bucket: scale = mean |v| over the
// bucket (summed in double in the same fixed order), bit i set when v_i < 0 (so +-0 and
// positive values decode to +scale), bit i in byte i / 8 at position i % 8 (LSB first).
// Decoding: value_i = bit_i ? -scale : scale.
//
// Inputs to the quantisers must be finite: a NaN or an infinity (or a bucket norm beyond the
// float range) yields a non-finite scale, which the codecs' decoders reject. Packed buffers may
// have any alignment. n == 0 is accepted (then pointers may be null); nothing here fails.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fedfleet::kernels {

// Number of buckets (scales) for n elements: ceil(n / bucket).
size_t bucketCount(size_t n, uint32_t bucket);
// Bytes of packed QSGD levels for n elements: n for 8 bits, ceil(n / 2) for 4 bits.
size_t qsgdLevelBytes(size_t n, uint32_t bits);
// The number of levels s: 127 for 8 bits, 7 for 4 bits.
int32_t qsgdLevels(uint32_t bits);

// Writes bucketCount(n, bucket) scales and qsgdLevelBytes(n, bits) bytes of levels.
// bits is 8 or 4 (checked: anything else aborts).
void qsgdQuantize(const float* x, size_t n, uint32_t bits, uint32_t bucket, uint64_t seed,
                  void* scales, void* levels);
// out[i] = scale of i's bucket * q_i.
void qsgdDequantize(const void* scales, const void* levels, size_t n, uint32_t bits,
                    uint32_t bucket, float* out);
// acc[i] = fma(w, scale * q_i, acc[i]): the same bits as qsgdDequantize then
// weightedAccumulate, in one pass and without the dense array.
void qsgdDequantizeAccumulate(float* acc, const void* scales, const void* levels, size_t n,
                              uint32_t bits, uint32_t bucket, float w);

// Bytes of packed sign bits for n elements: ceil(n / 8).
size_t signBytes(size_t n);
// Writes bucketCount(n, bucket) scales and signBytes(n) bytes of sign bits (unused high bits of
// the last byte are zero).
void signQuantize(const float* x, size_t n, uint32_t bucket, void* scales, void* signs);
// out[i] = bit_i ? -scale : scale.
void signDequantize(const void* scales, const void* signs, size_t n, uint32_t bucket, float* out);
// acc[i] = fma(w, bit_i ? -scale : scale, acc[i]).
void signDequantizeAccumulate(float* acc, const void* scales, const void* signs, size_t n,
                              uint32_t bucket, float w);

}  // namespace fedfleet::kernels
