#include "common/data/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace fedfleet::data {
namespace {

constexpr uint32_t kClasses = 10;

// 10 classes x 600 samples in a fixed scrambled order (like a small Fashion-MNIST).
std::vector<data::Label> balancedLabels(size_t per_class = 600) {
  std::vector<data::Label> labels;
  for (size_t i = 0; i < per_class * kClasses; ++i)
    labels.push_back(static_cast<uint8_t>(i % kClasses));
  std::mt19937_64 rng(1234);
  std::shuffle(labels.begin(), labels.end(), rng);
  return labels;
}

void expectDisjointSortedCover(const std::vector<std::vector<uint32_t>>& parts, size_t n,
                               bool must_cover = true) {
  std::vector<int> seen(n, 0);
  for (const auto& p : parts) {
    EXPECT_TRUE(std::is_sorted(p.begin(), p.end()));
    for (uint32_t i : p) {
      ASSERT_LT(i, n);
      ++seen[i];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_LE(seen[i], 1) << "index " << i << " in more than one partition";
    if (must_cover) {
      EXPECT_EQ(seen[i], 1) << "index " << i << " in no partition";
    }
  }
}

std::set<data::Label> labelsOf(const std::vector<uint32_t>& part,
                               const std::vector<data::Label>& labels) {
  std::set<data::Label> s;
  for (uint32_t i : part) s.insert(labels[i]);
  return s;
}

// Mean over partitions of the number of classes holding more than 5% of the partition.
double meanDominantClasses(const std::vector<std::vector<uint32_t>>& parts,
                           const std::vector<data::Label>& labels) {
  double total = 0;
  for (const auto& p : parts) {
    std::vector<size_t> counts(kClasses, 0);
    for (uint32_t i : p) ++counts[labels[i]];
    for (size_t c : counts) total += (c > 0.05 * p.size()) ? 1 : 0;
  }
  return total / parts.size();
}

PartitionSpec spec(const std::string& scheme, uint32_t parts, uint64_t seed = 7) {
  PartitionSpec s;
  s.scheme = scheme;
  s.num_partitions = parts;
  s.seed = seed;
  return s;
}

// Every scheme, over a range of partition counts: disjoint, sorted, covering, deterministic.
class PartitionSweep : public ::testing::TestWithParam<std::tuple<std::string, uint32_t>> {};

TEST_P(PartitionSweep, DisjointCoveringAndDeterministic) {
  const auto& [scheme, parts] = GetParam();
  const auto labels = balancedLabels();
  auto s = spec(scheme, parts);
  if (scheme == "quantity") {
    s.alpha = 10;  // Dir(0.5) over 100 partitions rarely gives every one 10 of 6000 samples
  }
  auto a = partitionIndices(labels, kClasses, s);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  ASSERT_EQ(a->size(), parts);
  // "labels" leaves out classes nobody holds when num_partitions * c < K; "shards" leaves out
  // the n mod (num_partitions * 2) samples that fill no whole shard.
  const bool covers = scheme == "labels"   ? parts * 2 >= kClasses
                      : scheme == "shards" ? labels.size() % (parts * 2) == 0
                                           : true;
  expectDisjointSortedCover(*a, labels.size(), covers);
  auto b = partitionIndices(labels, kClasses, s);
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(*a, *b);
  s.seed = 8;
  auto c = partitionIndices(labels, kClasses, s);
  ASSERT_TRUE(c.isOk());
  // Two partitions of two shards each can be dealt only 6 ways: seeds may agree there.
  if (parts > (scheme == "shards" ? 2u : 1u)) {
    EXPECT_NE(*a, *c);
  }
}

INSTANTIATE_TEST_SUITE_P(Schemes, PartitionSweep,
                         ::testing::Combine(::testing::Values("iid", "dirichlet", "labels",
                                                              "shards", "quantity"),
                                            ::testing::Values(1u, 2u, 10u, 37u, 100u)));

// Regression targets have no labels: iid and quantity cut them as they cut labelled samples
// (the same spec, the same partitions); a scheme that needs labels is refused, saying so.
TEST(PartitionTest, UnlabelledSamplesSplitIidOrByQuantityOnly) {
  const auto labels = balancedLabels();
  for (const char* scheme : {"iid", "quantity"}) {
    PartitionSpec s = spec(scheme, 13);
    s.alpha = 0.7;
    auto with = partitionIndices(labels, kClasses, s);
    auto without = partitionUnlabelled(labels.size(), s);
    ASSERT_TRUE(with.isOk() && without.isOk()) << scheme;
    EXPECT_EQ(*with, *without) << scheme;
  }
  for (const char* scheme : {"dirichlet", "labels", "shards"}) {
    auto r = partitionUnlabelled(labels.size(), spec(scheme, 4));
    ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument) << scheme;
    EXPECT_NE(r.status().message().find("splits by class label"), std::string::npos);
  }
  EXPECT_EQ(partitionUnlabelled(3, spec("iid", 4)).status().code(), StatusCode::kInvalidArgument);
}

TEST(PartitionTest, IidSizesDifferByAtMostOne) {
  const auto labels = balancedLabels();
  for (uint32_t parts : {1u, 7u, 13u, 6000u}) {
    auto r = partitionIndices(labels, kClasses, spec("iid", parts));
    ASSERT_TRUE(r.isOk());
    size_t lo = labels.size(), hi = 0;
    for (const auto& p : *r) {
      lo = std::min(lo, p.size());
      hi = std::max(hi, p.size());
    }
    EXPECT_LE(hi - lo, 1u) << parts;
    EXPECT_EQ(lo, labels.size() / parts);
  }
}

TEST(PartitionTest, IidPartitionsLookLikeTheWhole) {
  const auto labels = balancedLabels();
  auto r = partitionIndices(labels, kClasses, spec("iid", 10));
  ASSERT_TRUE(r.isOk());
  for (const auto& p : *r) {
    std::vector<size_t> counts(kClasses, 0);
    for (uint32_t i : p) ++counts[labels[i]];
    for (size_t c : counts) {
      EXPECT_GT(c, 30u);  // 60 expected per class; a shuffle keeps every class present
      EXPECT_LT(c, 100u);
    }
  }
}

TEST(PartitionTest, DirichletRespectsMinSamples) {
  const auto labels = balancedLabels();
  for (double alpha : {0.1, 0.5, 10.0}) {
    auto s = spec("dirichlet", 20);
    s.alpha = alpha;
    s.min_samples = 20;
    auto r = partitionIndices(labels, kClasses, s);
    ASSERT_TRUE(r.isOk()) << alpha << ": " << r.status().toString();
    for (const auto& p : *r) EXPECT_GE(p.size(), 20u) << "alpha " << alpha;
    expectDisjointSortedCover(*r, labels.size());
  }
}

TEST(PartitionTest, BalanceCapsPartitionSizes) {
  // NIID-Bench's balancing stops feeding a partition once it passes n / num_partitions, so no
  // partition can exceed that by more than one class's worth (600 here).
  const auto labels = balancedLabels();
  auto s = spec("dirichlet", 10);
  s.alpha = 0.1;
  s.balance = true;
  auto r = partitionIndices(labels, kClasses, s);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  expectDisjointSortedCover(*r, labels.size());
  for (const auto& p : *r) EXPECT_LT(p.size(), 600u + 600u);
  s.balance = false;
  auto plain = partitionIndices(labels, kClasses, s);
  ASSERT_TRUE(plain.isOk());
  EXPECT_NE(*r, *plain);
}

TEST(PartitionTest, SmallerAlphaGivesMoreSkew) {
  const auto labels = balancedLabels();
  auto skewed = spec("dirichlet", 20);
  skewed.alpha = 0.1;
  auto flat = skewed;
  flat.alpha = 100;
  auto a = partitionIndices(labels, kClasses, skewed);
  auto b = partitionIndices(labels, kClasses, flat);
  ASSERT_TRUE(a.isOk());
  ASSERT_TRUE(b.isOk());
  const double dominant_skewed = meanDominantClasses(*a, labels);
  const double dominant_flat = meanDominantClasses(*b, labels);
  EXPECT_LT(dominant_skewed, 5.0);
  EXPECT_GT(dominant_flat, 9.0);  // nearly every class everywhere
  EXPECT_LT(dominant_skewed, dominant_flat);
}

TEST(PartitionTest, DirichletFailsWhenMinSamplesUnreachable) {
  const auto labels = balancedLabels(10);  // 100 samples
  auto s = spec("dirichlet", 20);
  s.min_samples = 10;  // 200 needed
  auto r = partitionIndices(labels, kClasses, s);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  // Possible in principle, but a very skewed Dirichlet never gives 50 partitions 2 samples each
  // of a 100-sample set in 1000 draws.
  s.num_partitions = 50;
  s.min_samples = 2;
  s.alpha = 0.001;
  auto r2 = partitionIndices(labels, kClasses, s);
  ASSERT_FALSE(r2.isOk());
  EXPECT_EQ(r2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r2.status().message().find("1000"), std::string::npos);
}

TEST(PartitionTest, LabelsSchemeGivesExactlyCLabels) {
  const auto labels = balancedLabels();
  for (uint32_t c : {1u, 2u, 3u, 10u}) {
    for (uint32_t parts : {5u, 10u, 30u}) {
      auto s = spec("labels", parts);
      s.labels_per_client = c;
      auto r = partitionIndices(labels, kClasses, s);
      ASSERT_TRUE(r.isOk()) << r.status().toString();
      std::set<data::Label> held_by_someone;
      for (uint32_t i = 0; i < parts; ++i) {
        const auto held = labelsOf((*r)[i], labels);
        EXPECT_EQ(held.size(), c) << "partition " << i << " c=" << c << " parts=" << parts;
        EXPECT_TRUE(held.count(static_cast<uint8_t>(i % kClasses))) << "partition " << i;
        held_by_someone.insert(held.begin(), held.end());
      }
      const bool coverable = parts * c >= kClasses;
      EXPECT_EQ(held_by_someone.size(), coverable ? kClasses : parts * c);
      expectDisjointSortedCover(*r, labels.size(), coverable);
    }
  }
}

TEST(PartitionTest, LabelsSchemeSplitsEachClassEvenly) {
  const auto labels = balancedLabels();
  auto s = spec("labels", 10);
  s.labels_per_client = 2;
  auto r = partitionIndices(labels, kClasses, s);
  ASSERT_TRUE(r.isOk());
  // For each class, the holders' shares differ by at most one sample.
  for (uint32_t k = 0; k < kClasses; ++k) {
    std::vector<size_t> shares;
    for (const auto& p : *r) {
      size_t n = 0;
      for (uint32_t i : p) n += labels[i] == k;
      if (n > 0) shares.push_back(n);
    }
    ASSERT_FALSE(shares.empty());
    const auto [lo, hi] = std::minmax_element(shares.begin(), shares.end());
    EXPECT_LE(*hi - *lo, 1u) << "class " << k;
  }
}

TEST(PartitionTest, SchemeNamesAreAllAccepted) {
  const auto names = partitionSchemeNames();
  EXPECT_EQ(names, (std::vector<std::string>{"iid", "dirichlet", "labels", "shards", "quantity"}));
  const auto labels = balancedLabels();
  for (const auto& name : names) {
    EXPECT_TRUE(partitionIndices(labels, kClasses, spec(name, 10)).isOk()) << name;
  }
}

// Labels already sorted: 10 classes of 60 samples, 0..0 1..1 ... 9..9.
std::vector<data::Label> sortedLabels(size_t per_class = 60) {
  std::vector<data::Label> labels;
  for (uint32_t k = 0; k < kClasses; ++k) labels.insert(labels.end(), per_class, uint8_t(k));
  return labels;
}

TEST(PartitionTest, ShardsGiveWholeShardsOfAtMostSLabels) {
  // 600 samples, 10 partitions x 2 shards = 20 shards of 30: each shard lies inside one class
  // (60 = 2 shards), so a partition has 60 samples of at most 2 labels, made of two runs of 30
  // consecutive indices each starting at a multiple of 30.
  const auto labels = sortedLabels();
  auto s = spec("shards", 10);
  auto r = partitionIndices(labels, kClasses, s);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  expectDisjointSortedCover(*r, labels.size());
  size_t single_label = 0;
  for (const auto& p : *r) {
    ASSERT_EQ(p.size(), 60u);
    const auto held = labelsOf(p, labels);
    EXPECT_LE(held.size(), 2u);
    single_label += held.size() == 1;
    for (size_t run = 0; run < 2; ++run) {
      EXPECT_EQ(p[run * 30] % 30, 0u);
      for (size_t i = 1; i < 30; ++i) EXPECT_EQ(p[run * 30 + i], p[run * 30] + i);
    }
  }
  EXPECT_LT(single_label, 10u);  // the deal is random, not class by class

  // Three shards each, 5 partitions: 15 shards of 40, all 600 samples used, 120 a partition. A
  // 40-sample shard now can straddle a class boundary (classes of 60): at most 2 labels a shard,
  // so at most 6 a partition.
  s = spec("shards", 5);
  s.shards_per_client = 3;
  r = partitionIndices(labels, kClasses, s);
  ASSERT_TRUE(r.isOk());
  expectDisjointSortedCover(*r, labels.size());
  for (const auto& p : *r) {
    EXPECT_EQ(p.size(), 120u);
    EXPECT_LE(labelsOf(p, labels).size(), 6u);
  }
}

TEST(PartitionTest, ShardsOfAScrambledSetFollowTheSortedOrder) {
  // McMahan's setting in miniature: 6000 scrambled labels (600 a class), 100 partitions x 2
  // shards = 200 shards of 30; every shard lies inside one class, so <= 2 labels a partition.
  const auto labels = balancedLabels();
  auto r = partitionIndices(labels, kClasses, spec("shards", 100));
  ASSERT_TRUE(r.isOk());
  expectDisjointSortedCover(*r, labels.size());
  for (const auto& p : *r) {
    EXPECT_EQ(p.size(), 60u);
    const auto held = labelsOf(p, labels);
    EXPECT_LE(held.size(), 2u);
    std::map<uint8_t, size_t> per_label;
    for (uint32_t i : p) ++per_label[labels[i]];
    for (const auto& [label, count] : per_label) EXPECT_EQ(count % 30, 0u);
  }
  // Uneven: 6000 samples in 7 partitions x 2 = 14 shards of 428; the last 8 sorted samples (of
  // label 9) are left out.
  r = partitionIndices(labels, kClasses, spec("shards", 7));
  ASSERT_TRUE(r.isOk());
  expectDisjointSortedCover(*r, labels.size(), false);
  size_t used = 0, nines = 0;
  for (const auto& p : *r) {
    EXPECT_EQ(p.size(), 2 * 428u);
    used += p.size();
    for (uint32_t i : p) nines += labels[i] == 9;
  }
  EXPECT_EQ(used, 5992u);
  EXPECT_EQ(nines, 592u);
}

TEST(PartitionTest, QuantitySizesFollowAlpha) {
  const auto labels = balancedLabels();  // 6000
  auto sizes = [&](double alpha, uint64_t seed, uint32_t min_samples) {
    auto s = spec("quantity", 10, seed);
    s.alpha = alpha;
    s.min_samples = min_samples;
    auto r = partitionIndices(labels, kClasses, s);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    std::vector<size_t> out;
    if (!r.isOk()) return out;
    expectDisjointSortedCover(*r, labels.size());
    for (const auto& p : *r) out.push_back(p.size());
    return out;
  };
  for (uint64_t seed = 0; seed < 5; ++seed) {
    // Dir(1000) over 10 parts: each share has standard deviation sqrt(0.09 / 10001) = 0.003,
    // i.e. 18 samples around 600; 600 +- 90 is 5 sigma.
    for (size_t n : sizes(1000, seed, 10)) {
      EXPECT_GT(n, 510u);
      EXPECT_LT(n, 690u);
    }
    // Dir(0.2) over 10 parts: a few parts take most of the mass (the largest of 10 shares is
    // rarely under 0.2, i.e. 1200 samples), the smallest hover near min_samples.
    const auto skewed = sizes(0.2, seed, 10);
    ASSERT_EQ(skewed.size(), 10u);
    const auto [lo, hi] = std::minmax_element(skewed.begin(), skewed.end());
    EXPECT_GE(*lo, 10u);  // min_samples
    EXPECT_GT(*hi, 5 * *lo);
    EXPECT_GT(*hi, 1200u);
    // A large minimum is honoured too (Dir(0.5) often gives a part under 100: redrawn).
    for (size_t n : sizes(0.5, seed, 100)) EXPECT_GE(n, 100u);
  }
}

TEST(PartitionTest, QuantityKeepsLabelsIid) {
  // The shuffle is label-blind: a 1500-sample partition has ~150 of each class.
  const auto labels = balancedLabels();
  auto s = spec("quantity", 4);
  s.alpha = 1000;
  auto r = partitionIndices(labels, kClasses, s);
  ASSERT_TRUE(r.isOk());
  for (const auto& p : *r) {
    std::vector<size_t> counts(kClasses, 0);
    for (uint32_t i : p) ++counts[labels[i]];
    for (size_t c : counts) {
      EXPECT_GT(c, p.size() / 10 - 60);  // binomial sd ~ 12: 5 sigma
      EXPECT_LT(c, p.size() / 10 + 60);
    }
  }
}

TEST(PartitionTest, QuantityFailsWhenMinSamplesUnreachable) {
  const auto labels = balancedLabels(10);  // 100 samples
  auto s = spec("quantity", 50);
  s.min_samples = 2;
  s.alpha = 0.001;
  auto r = partitionIndices(labels, kClasses, s);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("1000"), std::string::npos);
}

TEST(PartitionTest, BadSpecsAreInvalidArgument) {
  const auto labels = balancedLabels(10);
  auto expectInvalid = [&](PartitionSpec s, uint32_t classes, const std::string& needle) {
    auto r = partitionIndices(labels, classes, s);
    ASSERT_FALSE(r.isOk()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expectInvalid(spec("pathological", 2), kClasses, "unknown scheme");
  expectInvalid(spec("iid", 0), kClasses, "num_partitions");
  expectInvalid(spec("iid", 101), kClasses, "num_partitions");
  auto s = spec("dirichlet", 2);
  s.alpha = 0;
  expectInvalid(s, kClasses, "alpha");
  s.alpha = -1;
  expectInvalid(s, kClasses, "alpha");
  auto l = spec("labels", 2);
  l.labels_per_client = 0;
  expectInvalid(l, kClasses, "labels_per_client");
  l.labels_per_client = 11;
  expectInvalid(l, kClasses, "labels_per_client");
  auto sh = spec("shards", 20);
  sh.shards_per_client = 0;
  expectInvalid(sh, kClasses, "shards_per_client");
  sh.shards_per_client = 6;  // 120 shards of 100 samples
  expectInvalid(sh, kClasses, "shards_per_client");
  auto q = spec("quantity", 2);
  q.alpha = 0;
  expectInvalid(q, kClasses, "alpha");
  q.alpha = std::numeric_limits<double>::infinity();
  expectInvalid(q, kClasses, "alpha");
  q = spec("quantity", 11);  // 11 partitions of at least 10 samples need 110 > 100
  expectInvalid(q, kClasses, "quantity");
  expectInvalid(spec("iid", 2), 5, "num_classes");  // labels up to 9 with 5 classes
  EXPECT_FALSE(partitionIndices({}, kClasses, spec("iid", 1)).isOk());
}

}  // namespace
}  // namespace fedfleet::data
