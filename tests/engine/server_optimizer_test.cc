#include "engine/server_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace fedfleet::engine {
namespace {

std::unique_ptr<ServerOptimizer> make(ServerOptimizerOptions o) {
  auto r = ServerOptimizer::create(o);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? std::move(r).value() : nullptr;
}

ServerOptimizerOptions named(const std::string& name) {
  ServerOptimizerOptions o;
  auto kind = parseServerOptimizerKind(name);
  EXPECT_TRUE(kind.isOk()) << name;
  if (kind.isOk()) o.kind = *kind;
  return o;
}

// One step on a single parameter.
float step(ServerOptimizer& opt, float& x, float g) {
  opt.apply(&x, &g, 1);
  return x;
}

TEST(ServerOptimizer, FedAvgAddsLrTimesThePseudoGradient) {
  ServerOptimizerOptions o = named("fedavg");
  o.lr = 0.5;
  auto opt = make(o);
  std::vector<float> x = {1.0f, 2.0f, -3.0f};
  std::vector<float> g = {0.25f, -0.5f, 4.0f};
  opt->apply(x.data(), g.data(), x.size());
  EXPECT_FLOAT_EQ(x[0], 1.125f);
  EXPECT_FLOAT_EQ(x[1], 1.75f);
  EXPECT_FLOAT_EQ(x[2], -1.0f);
}

TEST(ServerOptimizer, FedAvgMAccumulatesMomentum) {
  ServerOptimizerOptions o = named("fedavgm");
  o.momentum = 0.9;
  auto opt = make(o);
  float x = 0;
  EXPECT_FLOAT_EQ(step(*opt, x, 1.0f), 1.0f);    // m = 1
  EXPECT_FLOAT_EQ(step(*opt, x, 1.0f), 2.9f);    // m = 1.9
  EXPECT_FLOAT_EQ(step(*opt, x, -1.0f), 3.61f);  // m = 1.71 - 1 = 0.71
}

TEST(ServerOptimizer, FedAdagradSumsSquares) {
  ServerOptimizerOptions o = named("fedadagrad");
  o.lr = 0.1;
  o.beta1 = 0.9;
  o.tau = 0.5;
  auto opt = make(o);
  float x = 0;
  // v = 4, m = 0.2: x = 0.1 * 0.2 / (2 + 0.5) = 0.008
  EXPECT_FLOAT_EQ(step(*opt, x, 2.0f), 0.008f);
  // v = 8, m = 0.18 + 0.2 = 0.38
  EXPECT_FLOAT_EQ(step(*opt, x, 2.0f), static_cast<float>(0.008 + 0.038 / (std::sqrt(8.0) + 0.5)));
}

TEST(ServerOptimizer, FedAdamDecaysTheSecondMoment) {
  ServerOptimizerOptions o = named("fedadam");
  o.lr = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.99;
  o.tau = 0.5;
  auto opt = make(o);
  float x = 0;
  // v = 0.01 * 4 = 0.04 (from v = 0), m = 0.2: x = 0.1 * 0.2 / (0.2 + 0.5)
  const double x1 = 0.02 / 0.7;
  EXPECT_FLOAT_EQ(step(*opt, x, 2.0f), static_cast<float>(x1));
  // v = 0.99 * 0.04 + 0.04 = 0.0796, m = 0.18 - 0.2 = -0.02
  EXPECT_FLOAT_EQ(step(*opt, x, -2.0f),
                  static_cast<float>(x1 + 0.1 * -0.02 / (std::sqrt(0.0796) + 0.5)));
}

TEST(ServerOptimizer, FedYogiMovesVByTheSignOfVMinusGSquared) {
  ServerOptimizerOptions o = named("fedyogi");
  o.lr = 1;
  o.beta1 = 0.5;
  o.beta2 = 0.75;
  o.tau = 1;
  auto opt = make(o);
  float x = 0;
  // G = 4: v = 0 - 0.25 * 16 * sign(0 - 16) = 4, m = 2: x = 2 / (2 + 1)
  double want = 2.0 / 3.0;
  EXPECT_FLOAT_EQ(step(*opt, x, 4.0f), static_cast<float>(want));
  // G = 1: v = 4 - 0.25 * 1 * sign(4 - 1) = 3.75 (FedAdam would give 3.25), m = 1 + 0.5 = 1.5
  want += 1.5 / (std::sqrt(3.75) + 1.0);
  EXPECT_FLOAT_EQ(step(*opt, x, 1.0f), static_cast<float>(want));
  // G = 4: v = 3.75 - 0.25 * 16 * sign(3.75 - 16) = 7.75, m = 0.75 + 2 = 2.75
  want += 2.75 / (std::sqrt(7.75) + 1.0);
  EXPECT_FLOAT_EQ(step(*opt, x, 4.0f), static_cast<float>(want));
}

// Every element follows the scalar rule, whatever the vector length (vectorised loops and
// their tails), and the state is per element (the sign flips on the odd elements).
TEST(ServerOptimizer, VectorsFollowTheScalarRuleElementByElement) {
  for (const char* name : {"fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"}) {
    SCOPED_TRACE(name);
    auto scalar = make(named(name));
    auto vec = make(named(name));
    const size_t n = 37;
    std::vector<float> x(n, 0.0f), g(n);
    float xs = 0;
    for (int round = 0; round < 4; ++round) {
      const float gs = 0.3f * static_cast<float>(round + 1) * (round % 2 ? -1.0f : 1.0f);
      for (size_t i = 0; i < n; ++i) g[i] = i % 2 ? -gs : gs;
      vec->apply(x.data(), g.data(), n);
      step(*scalar, xs, gs);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(x[i], i % 2 ? -xs : xs) << "element " << i;
    }
    EXPECT_NE(xs, 0.0f);
  }
}

TEST(ServerOptimizer, NamesParseToKindsAndBack) {
  for (const char* name : {"fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"}) {
    auto kind = parseServerOptimizerKind(name);
    ASSERT_TRUE(kind.isOk()) << name;
    EXPECT_STREQ(serverOptimizerName(*kind), name);
    EXPECT_STREQ(make(named(name))->name(), name);
  }
  auto bad = parseServerOptimizerKind("fedsgd");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown name 'fedsgd'"), std::string::npos);
}

TEST(ServerOptimizer, CreateRejectsBadOptionsNamingTheKey) {
  struct Case {
    const char* key;
    ServerOptimizerOptions o;
  };
  auto with = [](auto set) {
    ServerOptimizerOptions o = named("fedadam");
    set(o);
    return o;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Case> cases = {
      {"lr", with([](auto& o) { o.lr = 0; })},
      {"lr", with([](auto& o) { o.lr = -1; })},
      {"lr", with([&](auto& o) { o.lr = nan; })},
      {"lr", with([&](auto& o) { o.lr = inf; })},
      {"beta1", with([](auto& o) { o.beta1 = 1.0; })},
      {"beta1", with([](auto& o) { o.beta1 = -0.1; })},
      {"beta2", with([](auto& o) { o.beta2 = 1.5; })},
      {"beta2", with([&](auto& o) { o.beta2 = nan; })},
      {"tau", with([](auto& o) { o.tau = 0; })},
      {"tau", with([&](auto& o) { o.tau = inf; })},
      {"momentum", with([](auto& o) { o.momentum = 1.0; })},
  };
  for (const Case& c : cases) {
    auto r = ServerOptimizer::create(c.o);
    ASSERT_FALSE(r.isOk()) << c.key;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.key), std::string::npos) << r.status().message();
  }
  // Edges that are allowed.
  ServerOptimizerOptions edge = named("fedyogi");
  edge.beta1 = 0;
  edge.beta2 = 0;
  edge.momentum = 0;
  EXPECT_TRUE(ServerOptimizer::create(edge).isOk());
}

std::vector<float> pseudoGradient(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 0.1f);
  std::vector<float> g(n);
  for (float& v : g) v = d(rng);
  return g;
}

// Save after 5 of 10 steps, load into a fresh optimiser, continue: bit for bit the
// uninterrupted run. Without the state the continuation differs (so the check can fail).
TEST(ServerOptimizer, SaveLoadResumesBitIdentically) {
  for (const char* name : {"fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"}) {
    SCOPED_TRACE(name);
    const size_t n = 1001;
    std::mt19937 rng(7);
    std::vector<std::vector<float>> grads;
    for (int i = 0; i < 10; ++i) grads.push_back(pseudoGradient(rng, n));

    auto whole = make(named(name));
    std::vector<float> x_whole(n, 0.5f);
    for (auto& g : grads) whole->apply(x_whole.data(), g.data(), n);

    auto first = make(named(name));
    std::vector<float> x_resumed(n, 0.5f);
    for (int i = 0; i < 5; ++i) first->apply(x_resumed.data(), grads[i].data(), n);
    const std::string blob = first->saveState();
    std::vector<float> x_fresh = x_resumed;

    auto second = make(named(name));
    ASSERT_TRUE(second->loadState(blob).isOk());
    EXPECT_EQ(second->stateSize(), n);
    EXPECT_EQ(second->saveState(), blob);
    for (int i = 5; i < 10; ++i) second->apply(x_resumed.data(), grads[i].data(), n);
    EXPECT_EQ(std::memcmp(x_resumed.data(), x_whole.data(), n * sizeof(float)), 0);

    auto fresh = make(named(name));  // continuing without the state
    for (int i = 5; i < 10; ++i) fresh->apply(x_fresh.data(), grads[i].data(), n);
    const bool stateful = std::string(name) != "fedavg";
    EXPECT_EQ(std::memcmp(x_fresh.data(), x_whole.data(), n * sizeof(float)) != 0, stateful);
  }
}

TEST(ServerOptimizer, StateBeforeTheFirstStepIsEmptyAndLoads) {
  auto a = make(named("fedadam"));
  const std::string blob = a->saveState();
  auto b = make(named("fedadam"));
  ASSERT_TRUE(b->loadState(blob).isOk());
  EXPECT_EQ(b->stateSize(), 0u);
  float x = 0;
  EXPECT_NE(step(*b, x, 1.0f), 0.0f);  // sizes its state on the first step as usual
  EXPECT_EQ(b->stateSize(), 1u);
}

TEST(ServerOptimizer, CorruptStateIsAnErrorAndLeavesTheStateAlone) {
  auto opt = make(named("fedadam"));
  std::vector<float> x(4, 0.0f), g = {1, 2, 3, 4};
  opt->apply(x.data(), g.data(), 4);
  const std::string good = opt->saveState();
  // magic 4 + version 4 + name length 4 + "fedadam" 7 + n 8 + buffers 4 + 2 x 4 floats
  ASSERT_EQ(good.size(), 4u + 4 + 4 + 7 + 8 + 4 + 2 * 4 * 4);

  auto target = make(named("fedadam"));
  std::vector<float> y(4, 0.0f);
  target->apply(y.data(), g.data(), 4);
  target->apply(y.data(), g.data(), 4);
  const std::string before = target->saveState();

  for (size_t len = 0; len < good.size(); ++len) {  // every truncation
    Status st = target->loadState(std::string_view(good).substr(0, len));
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << "length " << len << ": " << st.toString();
  }
  std::string longer = good + "x";
  EXPECT_EQ(target->loadState(longer).code(), StatusCode::kCorrupt);
  std::string magic = good;
  magic[0] = 'X';
  EXPECT_EQ(target->loadState(magic).code(), StatusCode::kCorrupt);
  std::string version = good;
  version[4] = 2;
  EXPECT_EQ(target->loadState(version).code(), StatusCode::kCorrupt);
  std::string size = good;
  size[4 + 4 + 4 + 7] = 5;  // n = 5 with 4 floats per buffer following
  EXPECT_EQ(target->loadState(size).code(), StatusCode::kCorrupt);
  std::string huge_name = good;
  huge_name[8] = static_cast<char>(0xff);
  huge_name[9] = static_cast<char>(0xff);
  EXPECT_EQ(target->loadState(huge_name).code(), StatusCode::kCorrupt);

  auto yogi = make(named("fedyogi"));
  Status other = yogi->loadState(good);
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("fedadam"), std::string::npos) << other.message();

  EXPECT_EQ(target->saveState(), before);  // untouched by every failed load
  EXPECT_TRUE(target->loadState(good).isOk());
  EXPECT_EQ(target->saveState(), good);
}

TEST(ServerOptimizerDeathTest, AModelOfAnotherSizeAborts) {
  auto opt = make(named("fedadam"));
  std::vector<float> x(4, 0.0f), g(4, 1.0f);
  opt->apply(x.data(), g.data(), 4);
  EXPECT_DEATH(opt->apply(x.data(), g.data(), 3), "changed size");
}

}  // namespace
}  // namespace fedfleet::engine
