// data.normalize's statistics and transform (common/data/source.h) on hand-computed sets.
#include <gtest/gtest.h>

#include <cmath>

#include "common/data/source.h"

namespace fedfleet::data {
namespace {

// Plain 2-feature vectors [1, 10] and [3, 30].
Dataset twoFeatures() {
  Dataset ds;
  ds.feature_dim = 2;
  ds.num_classes = 2;
  ds.features = {1, 10, 3, 30};
  ds.labels = {0, 1};
  return ds;
}

TEST(Normalize, PlainVectorsArePerFeature) {
  Dataset ds = twoFeatures();
  auto stats = channelStats(ds);
  ASSERT_TRUE(stats.isOk()) << stats.status().toString();
  // Means 2 and 20; population standard deviations 1 and 10.
  EXPECT_EQ(stats->mean, (std::vector<double>{2, 20}));
  EXPECT_EQ(stats->stddev, (std::vector<double>{1, 10}));
  ASSERT_TRUE(normalizeFeatures(ds, *stats, "t.csv").isOk());
  EXPECT_EQ(ds.features, (std::vector<float>{-1, -1, 1, 1}));
}

TEST(Normalize, ShapedSamplesArePerChannelAndOneValueIsForAll) {
  // Two samples of shape [2, 1, 2]: channel 0 holds {0, 2} and {4, 6}, channel 1 {1, 1}, {1, 1}.
  Dataset ds;
  ds.feature_dim = 4;
  ds.sample_shape = {2, 1, 2};
  ds.features = {0, 2, 1, 1, 4, 6, 1, 1};
  ds.labels = {0, 1};
  auto stats = channelStats(ds);
  ASSERT_TRUE(stats.isOk());
  // Channel 0: mean 3, variance (9 + 1 + 1 + 9) / 4 = 5; channel 1 constant: mean 1, std 1.
  ASSERT_EQ(stats->mean.size(), 2u);
  EXPECT_DOUBLE_EQ(stats->mean[0], 3);
  EXPECT_DOUBLE_EQ(stats->stddev[0], std::sqrt(5.0));
  EXPECT_DOUBLE_EQ(stats->mean[1], 1);
  EXPECT_DOUBLE_EQ(stats->stddev[1], 1);
  Dataset one = ds;
  ASSERT_TRUE(normalizeFeatures(one, ChannelStats{{2}, {4}}, "x").isOk());
  EXPECT_EQ(one.features, (std::vector<float>{-0.5, 0, -0.25, -0.25, 0.5, 1, -0.25, -0.25}));
}

TEST(Normalize, BadInputIsAnErrorNamingTheFile) {
  Dataset ds = twoFeatures();
  Status st = normalizeFeatures(ds, ChannelStats{{0, 0, 0}, {1, 1, 1}}, "'mine.csv'");
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("'mine.csv' has 2 channels"), std::string::npos) << st.message();
  EXPECT_EQ(ds.features, twoFeatures().features) << "an error changes nothing";
  Dataset images;
  images.rows = images.cols = 2;
  images.images = {0, 1, 2, 3};
  images.labels = {0};
  EXPECT_FALSE(normalizeFeatures(images, ChannelStats{{0}, {1}}, "i").isOk());
  EXPECT_FALSE(channelStats(images).isOk());
  EXPECT_FALSE(channelStats(Dataset{}).isOk());
}

}  // namespace
}  // namespace fedfleet::data
