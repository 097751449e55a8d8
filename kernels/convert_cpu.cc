// The CPU reference of kernels/convert.h: loops over the shared scalar conversions
// (kernels/scalar.h), built per instruction set (kernels/clones.h). Packed values are read and
// written with memcpy, which GCC turns into plain (unaligned) vector loads and stores.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/clones.h"
#include "kernels/convert.h"
#include "kernels/scalar.h"

namespace fedfleet::kernels {
namespace {

inline uint16_t load16(const unsigned char* p, size_t i) {
  uint16_t v;
  std::memcpy(&v, p + 2 * i, sizeof(v));
  return v;
}

inline void store16(unsigned char* p, size_t i, uint16_t v) {
  std::memcpy(p + 2 * i, &v, sizeof(v));
}

inline uint32_t load32(const unsigned char* p, size_t i) {
  uint32_t v;
  std::memcpy(&v, p + 4 * i, sizeof(v));
  return v;
}

// Finiteness of packed values: an OR reduction, which vectorises, over four segments of the
// input at once. One sequential stream of loads is latency-bound at about a third of what a core
// can pull from memory; four streams (the hardware prefetcher follows each) check a cold payload
// about 2.5 times as fast, which is what makes check-then-fold cost little more than the fold.
// The loop stops at the end of the first block that holds a bad value.
template <size_t kBytes>
inline __attribute__((always_inline)) bool allFiniteSegments(const unsigned char* p, size_t n,
                                                             uint32_t mask) {
  constexpr size_t kSegments = 4, kBlock = 1024;
  const auto bad = [&](size_t i) {
    const uint32_t v = kBytes == 4 ? load32(p, i) : load16(p, i);
    return static_cast<uint32_t>((v & mask) == mask);
  };
  const size_t seg = (n / kSegments) & ~size_t{15};  // segment length
  for (size_t start = 0; start < seg; start += kBlock) {
    const size_t end = (seg - start < kBlock) ? seg : start + kBlock;
    uint32_t any = 0;
    for (size_t i = start; i < end; ++i) {
      any |= bad(i) | bad(seg + i) | bad(2 * seg + i) | bad(3 * seg + i);
    }
    if (any != 0) return false;
  }
  uint32_t any = 0;
  for (size_t i = kSegments * seg; i < n; ++i) any |= bad(i);
  return any == 0;
}

}  // namespace

FEDFLEET_KERNEL_CLONES
void floatToFp16(const float* x, size_t n, void* out) {
  auto* o = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) store16(o, i, scalar::floatToFp16(x[i]));
}

FEDFLEET_KERNEL_CLONES
void fp16ToFloat(const void* in, size_t n, float* out) {
  const auto* p = static_cast<const unsigned char*>(in);
  for (size_t i = 0; i < n; ++i) out[i] = scalar::fp16ToFloat(load16(p, i));
}

FEDFLEET_KERNEL_CLONES
void floatToBf16(const float* x, size_t n, void* out) {
  auto* o = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) store16(o, i, scalar::floatToBf16(x[i]));
}

FEDFLEET_KERNEL_CLONES
void bf16ToFloat(const void* in, size_t n, float* out) {
  const auto* p = static_cast<const unsigned char*>(in);
  for (size_t i = 0; i < n; ++i) out[i] = scalar::bf16ToFloat(load16(p, i));
}

FEDFLEET_KERNEL_CLONES
void accumulateFp32(float* acc, const void* in, float w, size_t n) {
  const auto* p = static_cast<const unsigned char*>(in);
  for (size_t i = 0; i < n; ++i) acc[i] = std::fma(w, scalar::floatOf(load32(p, i)), acc[i]);
}

FEDFLEET_KERNEL_CLONES
void accumulateFp16(float* acc, const void* in, float w, size_t n) {
  const auto* p = static_cast<const unsigned char*>(in);
  for (size_t i = 0; i < n; ++i) acc[i] = std::fma(w, scalar::fp16ToFloat(load16(p, i)), acc[i]);
}

FEDFLEET_KERNEL_CLONES
void accumulateBf16(float* acc, const void* in, float w, size_t n) {
  const auto* p = static_cast<const unsigned char*>(in);
  for (size_t i = 0; i < n; ++i) acc[i] = std::fma(w, scalar::bf16ToFloat(load16(p, i)), acc[i]);
}

FEDFLEET_KERNEL_CLONES
bool accumulateFp32IfFinite(float* acc, const void* in, float w, size_t n) {
  const auto* p = static_cast<const unsigned char*>(in);
  if (!allFiniteSegments<4>(p, n, 0x7f800000u)) return false;
  for (size_t i = 0; i < n; ++i) acc[i] = std::fma(w, scalar::floatOf(load32(p, i)), acc[i]);
  return true;
}

FEDFLEET_KERNEL_CLONES
bool accumulateFp16IfFinite(float* acc, const void* in, float w, size_t n) {
  const auto* p = static_cast<const unsigned char*>(in);
  if (!allFiniteSegments<2>(p, n, 0x7c00u)) return false;
  for (size_t i = 0; i < n; ++i) acc[i] = std::fma(w, scalar::fp16ToFloat(load16(p, i)), acc[i]);
  return true;
}

FEDFLEET_KERNEL_CLONES
bool accumulateBf16IfFinite(float* acc, const void* in, float w, size_t n) {
  const auto* p = static_cast<const unsigned char*>(in);
  if (!allFiniteSegments<2>(p, n, 0x7f80u)) return false;
  for (size_t i = 0; i < n; ++i) acc[i] = std::fma(w, scalar::bf16ToFloat(load16(p, i)), acc[i]);
  return true;
}

FEDFLEET_KERNEL_CLONES
bool allFiniteFp32(const void* in, size_t n) {
  return allFiniteSegments<4>(static_cast<const unsigned char*>(in), n, 0x7f800000u);
}

FEDFLEET_KERNEL_CLONES
bool allFiniteFp16(const void* in, size_t n) {
  return allFiniteSegments<2>(static_cast<const unsigned char*>(in), n, 0x7c00u);
}

FEDFLEET_KERNEL_CLONES
bool allFiniteBf16(const void* in, size_t n) {
  return allFiniteSegments<2>(static_cast<const unsigned char*>(in), n, 0x7f80u);
}

}  // namespace fedfleet::kernels
