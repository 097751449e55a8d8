// The CPU reference of kernels/accumulate.h. Plain loops written so that GCC vectorises them
// at -O2/-O3 without fast-math: no reassociation is needed (element-wise work, or sums whose
// order is spelled out in the code).

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/accumulate.h"
#include "kernels/clones.h"

// One build per instruction set (kernels/clones.h). In the x86-64-v3 build fmaf is one vfmadd
// instruction per lane; the default build calls libm's correctly rounded fmaf per element:
// slower, same results.

namespace fedfleet::kernels {

FEDFLEET_KERNEL_CLONES
void weightedAccumulate(float* acc, const float* x, float w, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = std::fma(w, x[i], acc[i]);
}

FEDFLEET_KERNEL_CLONES
void scale(float* x, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

FEDFLEET_KERNEL_CLONES
bool allFinite(const float* x, size_t n) {
  // A float is NaN or infinite exactly when its exponent bits are all ones. The test is done on
  // the bits (an integer OR reduction vectorises; an early exit per element would not) and the
  // loop stops at the end of the first block that holds a bad value.
  constexpr size_t kBlock = 4096;
  constexpr uint32_t kExponent = 0x7f800000u;
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = (n - start < kBlock) ? n : start + kBlock;
    uint32_t bad = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &x[i], sizeof(bits));
      bad |= static_cast<uint32_t>((bits & kExponent) == kExponent);
    }
    if (bad != 0) return false;
  }
  return true;
}

FEDFLEET_KERNEL_CLONES
double squaredNorm(const float* x, size_t n) {
  // Eight partial sums: lane j takes the elements i with i % 8 == j (the compiler maps them to
  // vector lanes), the remainder goes to `tail`. The order is fixed by this code, not by the
  // instruction set, so every build returns the same double.
  constexpr size_t kLanes = 8;
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      lanes[j] += v * v;
    }
  }
  double tail = 0;
  for (; i < n; ++i) {
    const double v = x[i];
    tail += v * v;
  }
  return (((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
          ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))) +
         tail;
}

}  // namespace fedfleet::kernels
