// The CUDA compression kernels against their CPU references, bit for bit (the set of selected
// indices for selectAtLeastDevice, whose order is unspecified). Skipped, with the reason, on a
// machine without a CUDA device; built wherever nvcc is found, so it must compile and link there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/accumulate_cuda.h"
#include "kernels/compress_cuda.h"
#include "kernels/convert.h"
#include "kernels/error_feedback.h"
#include "kernels/quantize.h"
#include "kernels/sparse.h"
#include "tests/kernels/gpu_test_util.h"

namespace fedfleet::kernels {
namespace {

template <typename T>
size_t mismatches(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t count = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    count += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  }
  return count;
}

class GpuCompressTest : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    if (!cuda::deviceAvailable()) GTEST_SKIP() << "no CUDA device visible to the CUDA runtime";
  }
};

TEST_P(GpuCompressTest, HalfConversionsAndFusedAccumulate) {
  const size_t n = GetParam();
  std::vector<float> x = gaussian(n, 1);
  for (size_t i = 0; i < n; i += 101) x[i] *= 1e5f;  // some beyond fp16's range: saturate
  const std::vector<float> acc0 = gaussian(n, 2);
  std::vector<uint16_t> h(n), b(n);
  floatToFp16(x.data(), n, h.data());
  floatToBf16(x.data(), n, b.data());
  std::vector<float> acc_h = acc0, acc_b = acc0;
  accumulateFp16(acc_h.data(), h.data(), 0.3f, n);
  accumulateBf16(acc_b.data(), b.data(), 0.3f, n);
  std::vector<float> hf(n), bf(n);
  fp16ToFloat(h.data(), n, hf.data());
  bf16ToFloat(b.data(), n, bf.data());

  DeviceArray<float> dx(x), dacc_h(acc0), dacc_b(acc0), dhf(n), dbf(n);
  DeviceArray<uint16_t> dh(n), db(n);
  ASSERT_EQ(cuda::floatToFp16Device(dx.get(), n, dh.get(), nullptr), 0);
  ASSERT_EQ(cuda::floatToBf16Device(dx.get(), n, db.get(), nullptr), 0);
  ASSERT_EQ(cuda::fp16ToFloatDevice(dh.get(), n, dhf.get(), nullptr), 0);
  ASSERT_EQ(cuda::bf16ToFloatDevice(db.get(), n, dbf.get(), nullptr), 0);
  ASSERT_EQ(cuda::accumulateFp16Device(dacc_h.get(), dh.get(), 0.3f, n, nullptr), 0);
  ASSERT_EQ(cuda::accumulateBf16Device(dacc_b.get(), db.get(), 0.3f, n, nullptr), 0);
  EXPECT_EQ(mismatches(dh.toHost(), h), 0u);
  EXPECT_EQ(mismatches(db.toHost(), b), 0u);
  EXPECT_EQ(mismatches(dhf.toHost(), hf), 0u);
  EXPECT_EQ(mismatches(dbf.toHost(), bf), 0u);
  EXPECT_EQ(mismatches(dacc_h.toHost(), acc_h), 0u);
  EXPECT_EQ(mismatches(dacc_b.toHost(), acc_b), 0u);
}

TEST_P(GpuCompressTest, QsgdBytesAndDequantizationMatch) {
  const size_t n = GetParam();
  const std::vector<float> x = gaussian(n, 3);
  const std::vector<float> acc0 = gaussian(n, 4);
  for (uint32_t bits : {8u, 4u}) {
    for (uint32_t bucket : {8u, 512u, 4096u}) {
      const size_t scale_bytes = 4 * bucketCount(n, bucket), level_bytes = qsgdLevelBytes(n, bits);
      std::vector<uint8_t> scales(scale_bytes), levels(level_bytes);
      qsgdQuantize(x.data(), n, bits, bucket, 1234, scales.data(), levels.data());
      std::vector<float> dense(n), acc = acc0;
      qsgdDequantize(scales.data(), levels.data(), n, bits, bucket, dense.data());
      qsgdDequantizeAccumulate(acc.data(), scales.data(), levels.data(), n, bits, bucket, -0.4f);

      DeviceArray<float> dx(x), ddense(n), dacc(acc0);
      DeviceArray<uint8_t> dscales(scale_bytes), dlevels(level_bytes);
      ASSERT_EQ(cuda::qsgdQuantizeDevice(dx.get(), n, bits, bucket, 1234, dscales.get(),
                                         dlevels.get(), nullptr),
                0);
      // Decode the CPU's bytes on the GPU, so each comparison checks one kernel.
      DeviceArray<uint8_t> cpu_scales(scales), cpu_levels(levels);
      ASSERT_EQ(cuda::qsgdDequantizeDevice(cpu_scales.get(), cpu_levels.get(), n, bits, bucket,
                                           ddense.get(), nullptr),
                0);
      ASSERT_EQ(cuda::qsgdDequantizeAccumulateDevice(dacc.get(), cpu_scales.get(), cpu_levels.get(),
                                                     n, bits, bucket, -0.4f, nullptr),
                0);
      EXPECT_EQ(mismatches(dscales.toHost(), scales), 0u) << bits << " bits, bucket " << bucket;
      EXPECT_EQ(mismatches(dlevels.toHost(), levels), 0u) << bits << " bits, bucket " << bucket;
      EXPECT_EQ(mismatches(ddense.toHost(), dense), 0u) << bits << " bits, bucket " << bucket;
      EXPECT_EQ(mismatches(dacc.toHost(), acc), 0u) << bits << " bits, bucket " << bucket;
    }
  }
}

TEST_P(GpuCompressTest, SignBytesAndDequantizationMatch) {
  const size_t n = GetParam();
  std::vector<float> x = gaussian(n, 5);
  if (n > 3) x[1] = 0.0f, x[2] = -0.0f;
  const std::vector<float> acc0 = gaussian(n, 6);
  for (uint32_t bucket : {8u, 512u}) {
    const size_t scale_bytes = 4 * bucketCount(n, bucket), sign_bytes = signBytes(n);
    std::vector<uint8_t> scales(scale_bytes), signs(sign_bytes);
    signQuantize(x.data(), n, bucket, scales.data(), signs.data());
    std::vector<float> acc = acc0;
    signDequantizeAccumulate(acc.data(), scales.data(), signs.data(), n, bucket, 0.7f);

    DeviceArray<float> dx(x), dacc(acc0);
    DeviceArray<uint8_t> dscales(scale_bytes), dsigns(sign_bytes);
    ASSERT_EQ(cuda::signQuantizeDevice(dx.get(), n, bucket, dscales.get(), dsigns.get(), nullptr),
              0);
    DeviceArray<uint8_t> cpu_scales(scales), cpu_signs(signs);
    ASSERT_EQ(cuda::signDequantizeAccumulateDevice(dacc.get(), cpu_scales.get(), cpu_signs.get(), n,
                                                   bucket, 0.7f, nullptr),
              0);
    EXPECT_EQ(mismatches(dscales.toHost(), scales), 0u) << "bucket " << bucket;
    EXPECT_EQ(mismatches(dsigns.toHost(), signs), 0u) << "bucket " << bucket;
    EXPECT_EQ(mismatches(dacc.toHost(), acc), 0u) << "bucket " << bucket;
  }
}

TEST_P(GpuCompressTest, ThresholdSelectGatherAndScatterMatch) {
  const size_t n = GetParam();
  const std::vector<float> x = gaussian(n, 7);
  const float threshold = 2.0f;  // about 4.6% of a standard normal
  std::vector<uint32_t> want(n);
  want.resize(selectAtLeast(x.data(), n, threshold, want.data(), n));

  DeviceArray<float> dx(x);
  DeviceArray<unsigned long long> dcount(1);
  ASSERT_EQ(cuda::countAtLeastDevice(dx.get(), n, threshold, dcount.get(), nullptr), 0);
  EXPECT_EQ(dcount.toHost()[0], want.size());
  DeviceArray<uint32_t> didx(n + 1);
  ASSERT_EQ(cuda::selectAtLeastDevice(dx.get(), n, threshold, didx.get(), n, dcount.get(), nullptr),
            0);
  ASSERT_EQ(dcount.toHost()[0], want.size());
  std::vector<uint32_t> got = didx.toHost();
  got.resize(want.size());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  // A capacity below the count: the count is still the total, and only capacity slots are used.
  if (want.size() > 2) {
    const size_t capacity = want.size() / 2;
    std::vector<uint32_t> guard(n + 1, 0xffffffffu);
    DeviceArray<uint32_t> dsmall(guard);
    ASSERT_EQ(cuda::selectAtLeastDevice(dx.get(), n, threshold, dsmall.get(), capacity,
                                        dcount.get(), nullptr),
              0);
    EXPECT_EQ(dcount.toHost()[0], want.size());
    const std::vector<uint32_t> small = dsmall.toHost();
    for (size_t j = 0; j < capacity; ++j) {
      EXPECT_TRUE(std::binary_search(want.begin(), want.end(), small[j])) << j;
    }
    EXPECT_EQ(small[capacity], 0xffffffffu) << "wrote past capacity";
  }

  // Gather the selected values as fp16 and scatter-add them into an accumulator.
  const size_t k = want.size();
  std::vector<uint16_t> values(k);
  gatherFp16(x.data(), want.data(), k, values.data());
  std::vector<float> acc = gaussian(n, 8), acc32 = acc;
  const std::vector<float> acc0 = acc;
  scatterAddFp16(acc.data(), want.data(), values.data(), 1.5f, k);
  std::vector<float> v32(k);
  for (size_t j = 0; j < k; ++j) v32[j] = x[want[j]];
  scatterAdd(acc32.data(), want.data(), v32.data(), 1.5f, k);

  DeviceArray<uint32_t> dwant(want);
  DeviceArray<uint16_t> dvalues(k);
  DeviceArray<float> dacc(acc0), dacc32(acc0), dv32(v32);
  ASSERT_EQ(cuda::gatherFp16Device(dx.get(), dwant.get(), k, dvalues.get(), nullptr), 0);
  DeviceArray<uint16_t> cpu_values(values);
  ASSERT_EQ(cuda::scatterAddFp16Device(dacc.get(), dwant.get(), cpu_values.get(), 1.5f, k, nullptr),
            0);
  ASSERT_EQ(cuda::scatterAddDevice(dacc32.get(), dwant.get(), dv32.get(), 1.5f, k, nullptr), 0);
  EXPECT_EQ(mismatches(dvalues.toHost(), values), 0u);
  EXPECT_EQ(mismatches(dacc.toHost(), acc), 0u);
  EXPECT_EQ(mismatches(dacc32.toHost(), acc32), 0u);
}

TEST_P(GpuCompressTest, ErrorFeedbackFuseMatches) {
  const size_t n = GetParam();
  const std::vector<float> x = gaussian(n, 9), r = gaussian(n, 10), d = gaussian(n, 11);
  std::vector<uint16_t> rb(n), rh(n);
  floatToBf16(r.data(), n, rb.data());
  floatToFp16(r.data(), n, rh.data());
  std::vector<float> p32(n), pb(n), ph(n), r32(n);
  std::vector<uint16_t> sb(n), sh(n);
  addResidualFp32(p32.data(), x.data(), r.data(), n);
  addResidualBf16(pb.data(), x.data(), rb.data(), n);
  addResidualFp16(ph.data(), x.data(), rh.data(), n);
  storeResidualFp32(r32.data(), p32.data(), d.data(), n);
  storeResidualBf16(sb.data(), p32.data(), d.data(), n);
  storeResidualFp16(sh.data(), p32.data(), d.data(), n);

  DeviceArray<float> dx(x), dr(r), dd(d), dp32(n), dpb(n), dph(n), dr32(n), dcpu_p(p32);
  DeviceArray<uint16_t> drb(rb), drh(rh), dsb(n), dsh(n);
  ASSERT_EQ(cuda::addResidualFp32Device(dp32.get(), dx.get(), dr.get(), n, nullptr), 0);
  ASSERT_EQ(cuda::addResidualBf16Device(dpb.get(), dx.get(), drb.get(), n, nullptr), 0);
  ASSERT_EQ(cuda::addResidualFp16Device(dph.get(), dx.get(), drh.get(), n, nullptr), 0);
  ASSERT_EQ(cuda::storeResidualFp32Device(dr32.get(), dcpu_p.get(), dd.get(), n, nullptr), 0);
  ASSERT_EQ(cuda::storeResidualBf16Device(dsb.get(), dcpu_p.get(), dd.get(), n, nullptr), 0);
  ASSERT_EQ(cuda::storeResidualFp16Device(dsh.get(), dcpu_p.get(), dd.get(), n, nullptr), 0);
  EXPECT_EQ(mismatches(dp32.toHost(), p32), 0u);
  EXPECT_EQ(mismatches(dpb.toHost(), pb), 0u);
  EXPECT_EQ(mismatches(dph.toHost(), ph), 0u);
  EXPECT_EQ(mismatches(dr32.toHost(), r32), 0u);
  EXPECT_EQ(mismatches(dsb.toHost(), sb), 0u);
  EXPECT_EQ(mismatches(dsh.toHost(), sh), 0u);
}

// 1100017 is past one grid's worth of threads (4096 blocks x 256) and of warps, so every
// grid-stride loop runs more than once; 33 and 1000 leave partial warps and buckets.
INSTANTIATE_TEST_SUITE_P(Sizes, GpuCompressTest,
                         ::testing::Values(size_t{1}, size_t{33}, size_t{1000}, size_t{65536},
                                           size_t{1100017}));

TEST(GpuCompress, EveryFp16PatternDecodesAsOnTheCpu) {
  if (!cuda::deviceAvailable()) GTEST_SKIP() << "no CUDA device visible to the CUDA runtime";
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> cpu16(65536), cpub(65536);
  fp16ToFloat(all.data(), all.size(), cpu16.data());
  bf16ToFloat(all.data(), all.size(), cpub.data());
  DeviceArray<uint16_t> dall(all);
  DeviceArray<float> d16(65536), db(65536);
  ASSERT_EQ(cuda::fp16ToFloatDevice(dall.get(), all.size(), d16.get(), nullptr), 0);
  ASSERT_EQ(cuda::bf16ToFloatDevice(dall.get(), all.size(), db.get(), nullptr), 0);
  EXPECT_EQ(mismatches(d16.toHost(), cpu16), 0u);
  EXPECT_EQ(mismatches(db.toHost(), cpub), 0u);
  // And back: every float that is an fp16/bf16 value (NaNs included) encodes as on the CPU.
  std::vector<uint16_t> back16(65536), backb(65536);
  floatToFp16(cpu16.data(), cpu16.size(), back16.data());
  floatToBf16(cpub.data(), cpub.size(), backb.data());
  DeviceArray<float> dcpu16(cpu16), dcpub(cpub);
  DeviceArray<uint16_t> dback16(65536), dbackb(65536);
  ASSERT_EQ(cuda::floatToFp16Device(dcpu16.get(), 65536, dback16.get(), nullptr), 0);
  ASSERT_EQ(cuda::floatToBf16Device(dcpub.get(), 65536, dbackb.get(), nullptr), 0);
  EXPECT_EQ(mismatches(dback16.toHost(), back16), 0u);
  EXPECT_EQ(mismatches(dbackb.toHost(), backb), 0u);
}

TEST(GpuCompress, RefusesBadArgumentsWithoutLaunching) {
  if (!cuda::deviceAvailable()) GTEST_SKIP() << "no CUDA device visible to the CUDA runtime";
  EXPECT_NE(cuda::qsgdQuantizeDevice(nullptr, 16, 8, 512, 1, nullptr, nullptr, nullptr), 0);
  EXPECT_NE(cuda::qsgdQuantizeDevice(nullptr, 0, 3, 512, 1, nullptr, nullptr, nullptr), 0);
  EXPECT_NE(
      cuda::qsgdDequantizeAccumulateDevice(nullptr, nullptr, nullptr, 0, 8, 12, 1.0f, nullptr), 0);
  EXPECT_EQ(cuda::qsgdQuantizeDevice(nullptr, 0, 8, 512, 1, nullptr, nullptr, nullptr), 0);
  EXPECT_NE(cuda::scatterAddFp16Device(nullptr, nullptr, nullptr, 1.0f, 5, nullptr), 0);
  EXPECT_EQ(cuda::scatterAddFp16Device(nullptr, nullptr, nullptr, 1.0f, 0, nullptr), 0);
  EXPECT_NE(cuda::countAtLeastDevice(nullptr, 0, 1.0f, nullptr, nullptr), 0);
}

TEST(GpuCompress, DeviceMemoryHelpersReportErrorsWithoutADevice) {
  // Runs everywhere: without a GPU the helpers fail with a message, never crash.
  if (cuda::deviceAvailable()) GTEST_SKIP() << "a device is present; covered by the tests above";
  void* ptr = nullptr;
  std::string error;
  EXPECT_FALSE(cuda::deviceAlloc(&ptr, 64, &error));
  EXPECT_FALSE(error.empty());
  std::printf("without a device, deviceAlloc reports: %s\n", error.c_str());
}

}  // namespace
}  // namespace fedfleet::kernels
