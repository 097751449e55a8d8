// Error-feedback fuse kernels (common/compress/error_feedback.h keeps the residual): before
// encoding, compensate the update with the residual, p = x + r; after encoding, keep what the
// codec lost, r = p - decode(encode(p)). The residual may be stored as fp32, or as bf16 / fp16
// to halve the memory of many virtual clients (round to nearest even, saturating; see
// kernels/convert.h). CPU reference; kernels/compress_cuda.h has the GPU versions.
//
// p[i] = x[i] + r[i] and r[i] = round(p[i] - d[i]) are one rounding each (plus the storage
// rounding), the same on every machine. Packed residuals (uint16_t arrays) are ordinary
// aligned arrays here: the residual is in memory, not on the wire. n == 0 is accepted (then
// pointers may be null); nothing here fails. p may be the same array as x, and, in
// storeResidualFp32, r may be the same array as p or d; nothing else may overlap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fedfleet::kernels {

// p[i] = x[i] + r[i], r read from fp32 / bf16 / fp16 storage.
void addResidualFp32(float* p, const float* x, const float* r, size_t n);
void addResidualBf16(float* p, const float* x, const uint16_t* r, size_t n);
void addResidualFp16(float* p, const float* x, const uint16_t* r, size_t n);

// r[i] = p[i] - d[i], stored as fp32 / bf16 / fp16.
void storeResidualFp32(float* r, const float* p, const float* d, size_t n);
void storeResidualBf16(uint16_t* r, const float* p, const float* d, size_t n);
void storeResidualFp16(uint16_t* r, const float* p, const float* d, size_t n);

}  // namespace fedfleet::kernels
