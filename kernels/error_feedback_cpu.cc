// The CPU reference of kernels/error_feedback.h, built per instruction set
// (kernels/clones.h), with the conversions of kernels/scalar.h.

#include <cstdint>

#include "kernels/clones.h"
#include "kernels/error_feedback.h"
#include "kernels/scalar.h"

namespace fedfleet::kernels {

FEDFLEET_KERNEL_CLONES
void addResidualFp32(float* p, const float* x, const float* r, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = x[i] + r[i];
}

FEDFLEET_KERNEL_CLONES
void addResidualBf16(float* p, const float* x, const uint16_t* r, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = x[i] + scalar::bf16ToFloat(r[i]);
}

FEDFLEET_KERNEL_CLONES
void addResidualFp16(float* p, const float* x, const uint16_t* r, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = x[i] + scalar::fp16ToFloat(r[i]);
}

FEDFLEET_KERNEL_CLONES
void storeResidualFp32(float* r, const float* p, const float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) r[i] = p[i] - d[i];
}

FEDFLEET_KERNEL_CLONES
void storeResidualBf16(uint16_t* r, const float* p, const float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) r[i] = scalar::floatToBf16(p[i] - d[i]);
}

FEDFLEET_KERNEL_CLONES
void storeResidualFp16(uint16_t* r, const float* p, const float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) r[i] = scalar::floatToFp16(p[i] - d[i]);
}

}  // namespace fedfleet::kernels
