#include "engine/aggregator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "engine/engine_options.h"

namespace fedfleet::engine {
namespace {

using V = std::vector<float>;

std::unique_ptr<Aggregator> make(AggregatorKind kind, uint64_t n_params, double trim = 0.1) {
  EngineOptions o;
  o.aggregator = kind;
  o.trim_fraction = trim;
  o.hparams.momentum = 0;
  return Aggregator::create(o, n_params);
}

// The running sum as the engine builds it: each update folded with its weight.
void fold(V& sum, const V& update, double w) {
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += static_cast<float>(w) * update[i];
}

TEST(Aggregator, NamesParseToKindsAndBack) {
  for (const char* name : {"fedavg", "fednova", "scaffold", "median", "trimmed_mean", "custom"}) {
    auto kind = parseAggregatorKind(name);
    ASSERT_TRUE(kind.isOk()) << name;
    EXPECT_STREQ(aggregatorName(*kind), name);
    // custom needs a driver's factory (ACustomAggregatorComesFromTheDriversFactory).
    if (*kind != AggregatorKind::kCustom) EXPECT_STREQ(make(*kind, 2)->name(), name);
  }
  EXPECT_EQ(parseAggregatorKind("krum").status().code(), StatusCode::kInvalidArgument);
}

TEST(Aggregator, FedAvgIsTheSampleWeightedMean) {
  auto agg = make(AggregatorKind::kFedAvg, 2);
  EXPECT_EQ(agg->updateSize(), 2u);
  EXPECT_FALSE(agg->buffersUpdates());
  EXPECT_EQ(*agg->chunkFoldWeight(3, 7), 3.0);
  V sum(2, 0.0f);
  fold(sum, {1, 2}, agg->settleFoldWeight(1, 4));
  fold(sum, {3, 4}, agg->settleFoldWeight(3, 9));
  std::string failure;
  ASSERT_TRUE(agg->pseudoGradient(sum.data(), RoundTotals{4, 2, 10}, &failure));
  // (1 x (1, 2) + 3 x (3, 4)) / 4 = (2.5, 3.5)
  EXPECT_EQ(sum, (V{2.5f, 3.5f}));
  EXPECT_TRUE(agg->saveState().empty());
}

TEST(Aggregator, FedNovaNormalisesByLocalSteps) {
  auto agg = make(AggregatorKind::kFedNova, 1);
  EXPECT_FALSE(agg->chunkFoldWeight(1, 0).isOk());  // FedNova needs the steps
  EXPECT_EQ(*agg->chunkFoldWeight(2, 4), 0.5);      // n / a = 2 / 4 (no momentum: a = tau)
  // n = (1, 1), tau = (1, 3), D = (2, 6): tau_eff = 2, G = 2 x (0.5 x 2 / 1 + 0.5 x 6 / 3) = 4.
  V sum(1, 0.0f);
  fold(sum, {2}, agg->settleFoldWeight(1, 1));
  fold(sum, {6}, agg->settleFoldWeight(1, 3));
  std::string failure;
  ASSERT_TRUE(agg->pseudoGradient(sum.data(), RoundTotals{2, 2, 2}, &failure));
  EXPECT_FLOAT_EQ(sum[0], 4.0f);
  // A new round starts from empty totals: one update of tau = 2 is plain FedAvg.
  agg->clearRound();
  V next(1, 0.0f);
  fold(next, {6}, agg->settleFoldWeight(3, 2));
  ASSERT_TRUE(agg->pseudoGradient(next.data(), RoundTotals{3, 1, 2}, &failure));
  EXPECT_FLOAT_EQ(next[0], 6.0f);
}

TEST(Aggregator, ScaffoldAveragesUnweightedAndMovesTheControlVariateAfterTheStep) {
  auto agg = make(AggregatorKind::kScaffold, 2);
  auto* scaffold = static_cast<ScaffoldAggregator*>(agg.get());
  EXPECT_EQ(agg->updateSize(), 4u);
  EXPECT_FALSE(agg->clippable());
  EXPECT_EQ(agg->settleFoldWeight(50, 3), 1.0);
  EXPECT_EQ(agg->saveState(), std::string(2 * sizeof(float), '\0'));
  // Two updates: deltas sum (2, 4), control deltas sum (8, 12); 4 registered clients.
  V sum = {2, 4, 8, 12};
  std::string failure;
  ASSERT_TRUE(agg->pseudoGradient(sum.data(), RoundTotals{2, 2, 4}, &failure));
  EXPECT_EQ(sum[0], 1.0f);  // mean delta
  EXPECT_EQ(sum[1], 2.0f);
  EXPECT_EQ(scaffold->control(), (V{0, 0}));  // not before the model took the step
  agg->stepTaken();
  EXPECT_EQ(scaffold->control(), (V{2, 3}));  // c += sum Dc / N
  wire::Task task;
  agg->prepareTask(task);
  V sent(2);
  ASSERT_EQ(task.control_bytes.size(), 2 * sizeof(float));
  std::memcpy(sent.data(), task.control_bytes.data(), task.control_bytes.size());
  EXPECT_EQ(sent, (V{2, 3}));

  // A control variate that would not be finite refuses the step and changes nothing.
  V huge = {0, 0, std::numeric_limits<float>::infinity(), 0};
  EXPECT_FALSE(agg->pseudoGradient(huge.data(), RoundTotals{1, 1, 4}, &failure));
  EXPECT_NE(failure.find("control variate"), std::string::npos);
  agg->stepTaken();
  EXPECT_EQ(scaffold->control(), (V{2, 3}));
}

TEST(Aggregator, ScaffoldStateRoundTripsAndWrongSizesAreCorrupt) {
  auto agg = make(AggregatorKind::kScaffold, 2);
  V c = {0.5f, -1.5f};
  std::string blob(reinterpret_cast<const char*>(c.data()), c.size() * sizeof(float));
  EXPECT_TRUE(agg->checkState(blob).isOk());
  EXPECT_TRUE(agg->checkState("").isOk());
  EXPECT_EQ(agg->checkState("abc").code(), StatusCode::kCorrupt);
  agg->loadState(blob);
  EXPECT_EQ(static_cast<ScaffoldAggregator*>(agg.get())->control(), c);
  EXPECT_EQ(agg->saveState(), blob);
  // A stateless aggregator accepts only an empty control section.
  EXPECT_EQ(make(AggregatorKind::kFedAvg, 2)->checkState(blob).code(), StatusCode::kCorrupt);
}

TEST(Aggregator, MedianAndTrimmedMeanAreCoordinateWiseOverBufferedUpdates) {
  auto median = make(AggregatorKind::kMedian, 2);
  EXPECT_TRUE(median->buffersUpdates());
  for (const V& u : {V{1, 10}, V{5, -2}, V{2, 3}})
    ASSERT_TRUE(median->buffer(u.data(), 2, {}).isOk());
  V g(2);
  std::string failure;
  ASSERT_TRUE(median->pseudoGradient(g.data(), RoundTotals{3, 3, 3}, &failure));
  EXPECT_EQ(g, (V{2, 3}));

  auto trimmed = make(AggregatorKind::kTrimmedMean, 1, 0.25);
  for (float v : {1.0f, 2.0f, 3.0f, 100.0f}) ASSERT_TRUE(trimmed->buffer(&v, 1, {}).isOk());
  ASSERT_TRUE(trimmed->pseudoGradient(g.data(), RoundTotals{4, 4, 4}, &failure));
  EXPECT_EQ(g[0], 2.5f);  // one value dropped at each end: (2 + 3) / 2
  // After clearRound the next round starts empty.
  trimmed->clearRound();
  float one = 7;
  ASSERT_TRUE(trimmed->buffer(&one, 1, {}).isOk());
  ASSERT_TRUE(trimmed->pseudoGradient(g.data(), RoundTotals{1, 1, 4}, &failure));
  EXPECT_EQ(g[0], 7.0f);
}

// A driver's own aggregator (the Python package's strategies): built by its factory, refused
// without one, and handed each complete update with what the engine knows of it.
class RecordingAggregator : public Aggregator {
 public:
  explicit RecordingAggregator(uint64_t n) : Aggregator(AggregatorKind::kCustom, n) {}
  bool buffersUpdates() const override { return true; }
  Status buffer(const float* update, size_t n, const BufferedUpdate& facts) override {
    clients.emplace_back(facts.client);
    samples += facts.samples;
    last.assign(update, update + n);
    return Status::ok();
  }
  bool pseudoGradient(float* sum, const RoundTotals& totals, std::string* failure) override {
    if (totals.round == 13) {
      *failure = "unlucky";
      return false;
    }
    std::copy(last.begin(), last.end(), sum);
    return true;
  }
  std::vector<std::string> clients;
  double samples = 0;
  V last;
};

TEST(Aggregator, ACustomAggregatorComesFromTheDriversFactory) {
  EngineOptions o;
  o.aggregator = AggregatorKind::kCustom;
  EXPECT_EQ(parseAggregatorKind("custom").value(), AggregatorKind::kCustom);
  Status refused = validateAggregatorOptions(o);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("the fedfleet command has none"), std::string::npos)
      << refused.message();
  uint64_t asked = 0;
  o.custom_aggregator = [&](uint64_t n, bool secure) {
    EXPECT_FALSE(secure);
    asked = n;
    return std::make_unique<RecordingAggregator>(n);
  };
  EXPECT_TRUE(validateAggregatorOptions(o).isOk());
  auto agg = Aggregator::create(o, 3);
  EXPECT_EQ(asked, 3u);
  EXPECT_EQ(agg->kind(), AggregatorKind::kCustom);
  EXPECT_STREQ(agg->name(), "custom");
  const V u{1, 2, 3};
  BufferedUpdate facts;
  facts.client = "client-7";
  facts.samples = 40;
  ASSERT_TRUE(agg->buffer(u.data(), 3, facts).isOk());
  auto* rec = static_cast<RecordingAggregator*>(agg.get());
  EXPECT_EQ(rec->clients, std::vector<std::string>{"client-7"});
  EXPECT_EQ(rec->samples, 40);
  V g(3);
  std::string failure;
  RoundTotals totals;
  totals.round = 2;
  ASSERT_TRUE(agg->pseudoGradient(g.data(), totals, &failure));
  EXPECT_EQ(g, u);
  totals.round = 13;
  EXPECT_FALSE(agg->pseudoGradient(g.data(), totals, &failure));
  EXPECT_EQ(failure, "unlucky");
}

TEST(Aggregator, ValidationRefusesATrimFractionOutOfRange) {
  EngineOptions o;
  o.aggregator = AggregatorKind::kTrimmedMean;
  o.trim_fraction = 0.6;
  EXPECT_EQ(validateAggregatorOptions(o).code(), StatusCode::kInvalidArgument);
  o.aggregator = AggregatorKind::kFedAvg;  // not used: not checked
  EXPECT_TRUE(validateAggregatorOptions(o).isOk());
}

}  // namespace
}  // namespace fedfleet::engine
