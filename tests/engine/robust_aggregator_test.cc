#include "engine/robust_aggregator.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace fedfleet::engine {
namespace {

using Updates = std::vector<std::vector<float>>;

RobustAggregatorOptions options(RobustKind kind, double trim, uint64_t n) {
  RobustAggregatorOptions o;
  o.kind = kind;
  o.trim_fraction = trim;
  o.n_params = n;
  o.spill_dir = FEDFLEET_TEST_TMP;
  return o;
}

std::unique_ptr<RobustAggregator> make(const RobustAggregatorOptions& o) {
  auto r = RobustAggregator::create(o);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? std::move(r).value() : nullptr;
}

std::vector<float> run(const RobustAggregatorOptions& o, const Updates& updates) {
  auto agg = make(o);
  for (const auto& u : updates) {
    Status st = agg->add(u.data(), u.size());
    EXPECT_TRUE(st.isOk()) << st.toString();
  }
  std::vector<float> out(o.n_params, -12345.0f);
  Status st = agg->aggregate(out.data());
  EXPECT_TRUE(st.isOk()) << st.toString();
  return out;
}

std::vector<float> median(const Updates& u) {
  return run(options(RobustKind::kMedian, 0, u[0].size()), u);
}
std::vector<float> trimmed(double beta, const Updates& u) {
  return run(options(RobustKind::kTrimmedMean, beta, u[0].size()), u);
}

// One update per value: m updates of one coordinate.
Updates column(const std::vector<float>& values) {
  Updates u;
  for (float v : values) u.push_back({v});
  return u;
}

TEST(RobustAggregator, MedianByHand) {
  using V = std::vector<float>;
  EXPECT_EQ(median({{1.5f, -2.0f}}), (V{1.5f, -2.0f}));   // m = 1
  EXPECT_EQ(median({{1, -3}, {4, 5}}), (V{2.5f, 1.0f}));  // m = 2: the mean of the two
  // m = 3 with ties and negative values: per coordinate {5, -2, 0}, {-1, -1, 7}, {2, 2, 1}.
  EXPECT_EQ(median({{5, -1, 2}, {-2, -1, 2}, {0, 7, 1}}), (V{0, -1, 2}));
  // m = 4: {4, 1, 3, 2} -> 2.5, {-1, -1, -1, 10} -> -1, {-5, -4, -3, -2} -> -3.5.
  EXPECT_EQ(median({{4, -1, -2}, {1, 10, -5}, {3, -1, -3}, {2, -1, -4}}), (V{2.5f, -1, -3.5f}));
  EXPECT_EQ(median(column({7, 1, 100, -50, 3})), V{3});
}

TEST(RobustAggregator, TrimmedMeanByHand) {
  using V = std::vector<float>;
  // m = 4, beta = 0.25: t = 1. {4, 1, 3, 2} -> (2 + 3) / 2, {-1, -1, -1, 10} -> -1,
  // {10, 0, 0, -100} -> 0.
  EXPECT_EQ(trimmed(0.25, {{4, -1, 10}, {1, -1, 0}, {3, -1, 0}, {2, 10, -100}}), (V{2.5f, -1, 0}));
  EXPECT_EQ(trimmed(0.2, column({1, 2, 3, 4, 100})), V{3});   // t = 1: (2 + 3 + 4) / 3
  EXPECT_EQ(trimmed(0.1, column({1, 2, 3, 4, 100})), V{22});  // t = floor(0.5) = 0: the mean
  EXPECT_EQ(trimmed(0.0, column({1, 2, 3, 4, 100})), V{22});  // beta = 0: the mean
  EXPECT_EQ(trimmed(0.4, column({-7.5f})), V{-7.5f});         // m = 1
  EXPECT_EQ(trimmed(0.49, column({-1, 4})), V{1.5f});         // m = 2: t = 0, the mean
  EXPECT_EQ(trimmed(0.34, column({9, -6, 1})), V{1});         // m = 3: t = 1, the middle
  EXPECT_EQ(trimmed(0.4, column({2, 2, 2, 9, -9})), V{2});    // t = 2, ties
  // t = 2 of m = 6 keeps the middle two: {-3, -2} of {-10, -5, -3, -2, 50, 60}.
  EXPECT_EQ(trimmed(0.45, column({60, -2, -10, 50, -3, -5})), V{-2.5f});
}

// Which zero an odd median picks must not depend on the order of the updates: always +0.
TEST(RobustAggregator, SignedZerosGiveThePositiveZero) {
  for (size_t m : {3u, 4u, 65u, 66u}) {  // the sorting network and the nth_element path
    for (int first_negative = 0; first_negative < 2; ++first_negative) {
      std::vector<float> values(m, 0.0f);
      for (size_t k = first_negative; k < m; k += 2) values[k] = -0.0f;
      const float got = median(column(values))[0];
      EXPECT_EQ(got, 0.0f);
      EXPECT_FALSE(std::signbit(got)) << "m " << m;
    }
  }
}

// floor(beta m) for a decimal beta: 0.29 * 100 is 28.999999999999996 in double, yet 29 values
// are trimmed at each end. Values i^2 for i = 1..100 keep i = 30..71: (sum i^2) / 42 =
// (121836 - 8555) / 42 = 113281 / 42 (trimming 28 would give 119306 / 44 = 2711.5).
TEST(RobustAggregator, TrimCountIsFloorOfBetaTimesMForDecimalBetas) {
  std::vector<float> values;
  for (int i = 100; i >= 1; --i) values.push_back(static_cast<float>(i * i));
  EXPECT_EQ(trimmed(0.29, column(values)), std::vector<float>{static_cast<float>(113281.0 / 42)});
}

Updates randomUpdates(size_t m, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-3, 3);
  Updates u(m, std::vector<float>(n));
  for (auto& v : u) {
    for (size_t i = 0; i < n; ++i) v[i] = (i % 5 == 0) ? static_cast<float>(small(rng)) : d(rng);
  }
  return u;  // every fifth coordinate is a small integer: plenty of ties
}

// Reference by full sort, written independently of the implementation's nth_element path.
std::vector<float> reference(RobustKind kind, double beta, const Updates& u) {
  const size_t m = u.size(), n = u[0].size();
  std::vector<float> out(n), col(m);
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < m; ++k) col[k] = u[k][i];
    std::sort(col.begin(), col.end());
    const size_t t = kind == RobustKind::kMedian ? 0 : static_cast<size_t>(beta * m + 1e-9);
    if (kind == RobustKind::kMedian || 2 * t >= m) {
      out[i] = m % 2 ? col[m / 2]
                     : static_cast<float>((double(col[m / 2 - 1]) + double(col[m / 2])) / 2);
    } else {
      double s = 0;
      for (size_t k = t; k < m - t; ++k) s += col[k];
      out[i] = static_cast<float>(s / double(m - 2 * t));
    }
  }
  return out;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Spilled, partly spilled and in-memory runs agree bit for bit with a full-sort reference, for
// several block sizes (with a partial last block) and update counts, in any order of adding.
TEST(RobustAggregator, SpillingGivesIdenticalResults) {
  const size_t n = 1000;
  for (RobustKind kind : {RobustKind::kMedian, RobustKind::kTrimmedMean}) {
    for (double beta : {0.0, 0.1, 0.25, 0.4}) {
      if (kind == RobustKind::kMedian && beta > 0) continue;
      for (size_t m : {1u, 2u, 5u, 8u, 11u, 20u, 33u, 64u, 65u, 70u}) {
        SCOPED_TRACE(::testing::Message()
                     << "kind " << int(kind) << " beta " << beta << " m " << m);
        Updates u = randomUpdates(m, n, static_cast<uint32_t>(m * 31 + 7));
        const std::vector<float> want = reference(kind, beta, u);
        RobustAggregatorOptions o = options(kind, beta, n);
        o.block_elements = 64;  // 15 full blocks and one of 40
        const std::vector<float> memory = run(o, u);
        EXPECT_TRUE(sameBits(memory, want));
        o.memory_bound_bytes = 0;  // everything spills
        EXPECT_TRUE(sameBits(run(o, u), want));
        o.memory_bound_bytes = 2 * n * sizeof(float);  // two in memory, the rest spilled
        o.block_elements = 1 << 16;                    // one block
        EXPECT_TRUE(sameBits(run(o, u), want));
        std::reverse(u.begin(), u.end());
        EXPECT_TRUE(sameBits(run(o, u), want));  // the order of the updates does not matter
      }
    }
  }
}

TEST(RobustAggregator, CountsMemoryAndSpilledBytesAndClears) {
  const size_t n = 100;
  RobustAggregatorOptions o = options(RobustKind::kMedian, 0, n);
  o.memory_bound_bytes = 3 * n * sizeof(float);
  auto agg = make(o);
  Updates u = randomUpdates(7, n, 3);
  for (const auto& v : u) ASSERT_TRUE(agg->add(v.data(), n).isOk());
  EXPECT_EQ(agg->count(), 7u);
  EXPECT_EQ(agg->memoryBytes(), 3 * n * sizeof(float));
  EXPECT_EQ(agg->spilledBytes(), 4 * n * sizeof(float));
  std::vector<float> out(n);
  ASSERT_TRUE(agg->aggregate(out.data()).isOk());
  EXPECT_TRUE(sameBits(out, reference(RobustKind::kMedian, 0, u)));

  agg->clear();
  EXPECT_EQ(agg->count(), 0u);
  EXPECT_EQ(agg->memoryBytes(), 0u);
  EXPECT_EQ(agg->spilledBytes(), 0u);
  EXPECT_EQ(agg->aggregate(out.data()).code(), StatusCode::kFailedPrecondition);
  // The next round reuses the spill file from its start.
  Updates next = randomUpdates(5, n, 4);
  for (const auto& v : next) ASSERT_TRUE(agg->add(v.data(), n).isOk());
  EXPECT_EQ(agg->spilledBytes(), 2 * n * sizeof(float));
  ASSERT_TRUE(agg->aggregate(out.data()).isOk());
  EXPECT_TRUE(sameBits(out, reference(RobustKind::kMedian, 0, next)));
}

TEST(RobustAggregator, RejectsBadUpdatesAndOptions) {
  auto agg = make(options(RobustKind::kMedian, 0, 3));
  std::vector<float> short_update = {1, 2};
  EXPECT_EQ(agg->add(short_update.data(), 2).code(), StatusCode::kInvalidArgument);
  std::vector<float> nan = {1, std::numeric_limits<float>::quiet_NaN(), 3};
  EXPECT_EQ(agg->add(nan.data(), 3).code(), StatusCode::kInvalidArgument);
  std::vector<float> inf = {1, 2, -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(agg->add(inf.data(), 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(agg->count(), 0u);
  std::vector<float> out(3);
  EXPECT_EQ(agg->aggregate(out.data()).code(), StatusCode::kFailedPrecondition);

  for (double beta : {0.5, -0.1, 0.7, std::numeric_limits<double>::quiet_NaN()}) {
    auto r = RobustAggregator::create(options(RobustKind::kTrimmedMean, beta, 3));
    ASSERT_FALSE(r.isOk()) << beta;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("trim_fraction"), std::string::npos);
  }
  EXPECT_EQ(RobustAggregator::create(options(RobustKind::kMedian, 0, 0)).status().code(),
            StatusCode::kInvalidArgument);
  RobustAggregatorOptions no_block = options(RobustKind::kMedian, 0, 3);
  no_block.block_elements = 0;
  EXPECT_EQ(RobustAggregator::create(no_block).status().code(), StatusCode::kInvalidArgument);
}

// (The tests run as root here, so a read-only directory would still be writable: a directory
// that does not exist and a path that is a file stand in for an unwritable spill_dir.)
TEST(RobustAggregator, AnUnwritableSpillDirIsAnIoError) {
  const std::string file_path = std::string(FEDFLEET_TEST_TMP) + "/robust_not_a_dir";
  std::FILE* f = std::fopen(file_path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  for (const std::string& dir : {std::string(FEDFLEET_TEST_TMP) + "/no/such/dir", file_path}) {
    SCOPED_TRACE(dir);
    RobustAggregatorOptions o = options(RobustKind::kMedian, 0, 4);
    o.memory_bound_bytes = 4 * sizeof(float);  // one update in memory
    o.spill_dir = dir;
    auto agg = make(o);
    std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
    ASSERT_TRUE(agg->add(a.data(), 4).isOk());  // in memory: the directory is not needed yet
    Status st = agg->add(b.data(), 4);
    EXPECT_EQ(st.code(), StatusCode::kIoError);
    EXPECT_NE(st.message().find(dir), std::string::npos) << st.message();
    EXPECT_EQ(agg->count(), 1u);  // not kept, and said so
    EXPECT_EQ(agg->spilledBytes(), 0u);
    std::vector<float> out(4);
    ASSERT_TRUE(agg->aggregate(out.data()).isOk());
    EXPECT_EQ(out, a);
  }
  std::remove(file_path.c_str());
}

// A write that fails part way (here: the file size limit, as a full disk would) is an error;
// the update is not kept, the file is cut back, and later updates spill fine.
TEST(RobustAggregator, AFailedSpillWriteIsAnErrorAndLosesNothingElse) {
  const size_t n = 1000;  // 4000 bytes an update
  RobustAggregatorOptions o = options(RobustKind::kMedian, 0, n);
  o.memory_bound_bytes = 0;
  auto agg = make(o);
  Updates u = randomUpdates(3, n, 9);
  ASSERT_TRUE(agg->add(u[0].data(), n).isOk());

  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 6000;  // the second update would end at 8000
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  Status st = agg->add(u[1].data(), n);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.toString();
  EXPECT_EQ(agg->count(), 1u);
  EXPECT_EQ(agg->spilledBytes(), n * sizeof(float));
  ASSERT_TRUE(agg->add(u[1].data(), n).isOk());
  ASSERT_TRUE(agg->add(u[2].data(), n).isOk());
  std::vector<float> out(n);
  ASSERT_TRUE(agg->aggregate(out.data()).isOk());
  EXPECT_TRUE(sameBits(out, reference(RobustKind::kMedian, 0, u)));
}

}  // namespace
}  // namespace fedfleet::engine
