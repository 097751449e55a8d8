#include "engine/selector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fedfleet::engine {
namespace {

ParticipationFeedback fb(const std::string& client, uint32_t round, bool completed,
                         uint64_t n_samples, double sum_sq_loss, double duration_s) {
  ParticipationFeedback f;
  f.client = client;
  f.round = round;
  f.completed = completed;
  f.n_samples = n_samples;
  f.sum_sq_loss = sum_sq_loss;
  f.duration_s = duration_s;
  return f;
}

// "<prefix>00", "<prefix>01", ...: sorted as the engine sorts candidates.
std::vector<std::string> ids(const std::string& prefix, size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%02zu", i);
    out.push_back(prefix + buf);
  }
  return out;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  return a;
}

std::unique_ptr<Selector> make(const SelectorOptions& o) {
  auto s = Selector::create(o);
  EXPECT_TRUE(s.isOk()) << s.status().toString();
  return std::move(s).value();
}

SelectorOptions oortOptions() {
  SelectorOptions o;
  o.kind = SelectorKind::kOort;
  return o;
}

// Oort with no exploration, so every slot is exploited.
SelectorOptions exploitOnly() {
  SelectorOptions o = oortOptions();
  o.explore_initial = 0;
  o.explore_min = 0;
  o.preferred_duration_s = 1000;  // no duration penalty
  return o;
}

// Gives clients[i] statistical utility utilities[i] (n = 1, sum of squares U^2), at round 1,
// so that a selection for round 1 adds no staleness bonus.
void feedUtilities(Selector& s, const std::vector<std::string>& clients,
                   const std::vector<double>& utilities) {
  for (size_t i = 0; i < clients.size(); ++i) {
    s.feedback(fb(clients[i], 1, true, 1, utilities[i] * utilities[i], 1));
  }
}

// ---- Factory ----------------------------------------------------------------------------------

TEST(SelectorCreate, BuildsEachSelectorByName) {
  for (const char* name : {"uniform", "oort", "availability"}) {
    SelectorOptions o;
    o.kind = *parseSelectorKind(name);
    auto s = Selector::create(o);
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    EXPECT_STREQ((*s)->name(), name);
  }
}

TEST(SelectorCreate, UnknownNameIsAnErrorNamingTheKey) {
  auto s = parseSelectorKind("random");
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("selector.name"), std::string::npos);
  EXPECT_NE(s.status().message().find("random"), std::string::npos);
}

TEST(SelectorCreate, BadValuesAreErrorsNamingTheKey) {
  struct Case {
    const char* key;
    void (*set)(SelectorOptions&);
  };
  const Case cases[] = {
      {"explore_initial", [](SelectorOptions& o) { o.explore_initial = 1.5; }},
      {"explore_min", [](SelectorOptions& o) { o.explore_min = -0.1; }},
      {"explore_decay", [](SelectorOptions& o) { o.explore_decay = 0; }},
      {"explore_decay", [](SelectorOptions& o) { o.explore_decay = 1.01; }},
      {"alpha", [](SelectorOptions& o) { o.alpha = std::nan(""); }},
      {"preferred_duration_s", [](SelectorOptions& o) { o.preferred_duration_s = -1; }},
      {"cutoff", [](SelectorOptions& o) { o.cutoff = 0; }},
      {"pacer_window", [](SelectorOptions& o) { o.pacer_window = 0; }},
      {"pacer_step_s", [](SelectorOptions& o) { o.pacer_step_s = INFINITY; }},
      {"expected_round_s", [](SelectorOptions& o) { o.expected_round_s = -5; }},
  };
  for (const Case& c : cases) {
    SelectorOptions o = oortOptions();
    c.set(o);
    auto s = Selector::create(o);
    ASSERT_FALSE(s.isOk()) << c.key;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(std::string("selector.") + c.key), std::string::npos)
        << s.status().message();
  }
  EXPECT_TRUE(validateSelectorOptions(oortOptions()).isOk());
}

// ---- Uniform ----------------------------------------------------------------------------------

TEST(UniformSelector, EverySubsetSizeGivesDistinctSortedCandidates) {
  const auto candidates = ids("c", 7);
  UniformSelector s;
  std::mt19937_64 rng(3);
  for (size_t k = 0; k <= candidates.size() + 2; ++k) {
    for (int rep = 0; rep < 50; ++rep) {
      auto got = s.select(candidates, k, 1, 0, rng);
      ASSERT_EQ(got.size(), std::min(k, candidates.size()));
      EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
      EXPECT_EQ(std::set<std::string>(got.begin(), got.end()).size(), got.size());
      for (const auto& id : got) {
        EXPECT_TRUE(std::binary_search(candidates.begin(), candidates.end(), id));
      }
    }
  }
  EXPECT_TRUE(s.select({}, 3, 1, 0, rng).empty());
}

TEST(UniformSelector, EverySubsetEquallyLikely) {
  // 10 choose 3 = 120 subsets, 36000 draws: 300 expected each. Chi-square with 119 degrees of
  // freedom stays below 172.5 with probability 0.999; a per-client test over 10 cells below 27.9.
  const auto candidates = ids("c", 10);
  UniformSelector s;
  std::mt19937_64 rng(11);
  std::map<std::vector<std::string>, int> subsets;
  std::map<std::string, int> clients;
  const int draws = 36000;
  for (int i = 0; i < draws; ++i) {
    auto got = s.select(candidates, 3, 1, 0, rng);
    ++subsets[got];
    for (const auto& id : got) ++clients[id];
  }
  ASSERT_EQ(subsets.size(), 120u);
  double chi2 = 0;
  for (const auto& [subset, n] : subsets) chi2 += (n - 300.0) * (n - 300.0) / 300.0;
  EXPECT_LT(chi2, 172.5);
  double chi2_clients = 0;
  for (const auto& [id, n] : clients) chi2_clients += (n - 10800.0) * (n - 10800.0) / 10800.0;
  EXPECT_LT(chi2_clients, 27.9);
}

TEST(UniformSelector, StateRoundTripsAndRejectsOtherSelectors) {
  UniformSelector s;
  EXPECT_TRUE(s.loadState(s.saveState()).isOk());
  AvailabilitySelector a(SelectorOptions{});
  Status st = s.loadState(a.saveState());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.loadState("").code(), StatusCode::kCorrupt);
}

// ---- Oort: utility ----------------------------------------------------------------------------

TEST(OortSelector, UtilityFollowsTheFormula) {
  SelectorOptions o = oortOptions();
  o.preferred_duration_s = 10;
  OortSelector s(o);
  // a: n 100, sum of squares 400: 100 * sqrt(4) = 200; 5 s <= T: no penalty.
  s.feedback(fb("a", 1, true, 100, 400, 5));
  // b: 50 * sqrt(450 / 50) = 150; 20 s > T = 10: times (10 / 20)^2 = 37.5.
  s.feedback(fb("b", 2, true, 50, 450, 20));
  // c: 10 * sqrt(10 / 10) = 10, then late at round 2 with the 40 s deadline: keeps 10, times
  // (10 / 40)^2 = 0.625.
  s.feedback(fb("c", 1, true, 10, 10, 3));
  s.feedback(fb("c", 2, false, 0, 0, 40));

  EXPECT_DOUBLE_EQ(s.utility("a", 1), 200.0);  // ln(1) = 0: no bonus
  // + sqrt(0.1 ln 3 / 1)
  EXPECT_NEAR(s.utility("a", 3), 200.33145320765806, 1e-12);
  // 37.5 + sqrt(0.1 ln 4 / 2)
  EXPECT_NEAR(s.utility("b", 4), 37.76327688477342, 1e-12);
  // 0.625 + sqrt(0.1 ln 3 / 2)
  EXPECT_NEAR(s.utility("c", 3), 0.8593728107810407, 1e-12);
  EXPECT_EQ(s.utility("never", 3), -1);

  // Feedback older than what is known changes nothing.
  s.feedback(fb("b", 1, true, 1, 1, 1));
  EXPECT_NEAR(s.utility("b", 4), 37.76327688477342, 1e-12);
  // Non-finite reports count as 0.
  s.feedback(fb("d", 1, true, 4, std::nan(""), 1));
  EXPECT_DOUBLE_EQ(s.utility("d", 1), 0.0);
}

TEST(OortSelector, PreferredDurationStartsAtTheMedianObserved) {
  OortSelector s(oortOptions());  // preferred_duration_s = 0
  EXPECT_EQ(s.preferredDuration(), 0);
  s.feedback(fb("a", 1, true, 1, 1, 4));
  s.feedback(fb("b", 1, true, 1, 1, 30));
  s.feedback(fb("c", 1, true, 1, 1, 7));
  std::mt19937_64 rng(1);
  (void)s.select({"a", "b", "c"}, 1, 2, 0, rng);
  EXPECT_EQ(s.preferredDuration(), 7);
  // b: 1 * (7 / 30)^2 + sqrt(0.1 ln 2 / 1)
  EXPECT_NEAR(s.utility("b", 2), 49.0 / 900.0 + std::sqrt(0.1 * std::log(2.0)), 1e-12);
}

// ---- Oort: exploration ------------------------------------------------------------------------

TEST(OortSelector, ExplorationDecaysToItsFloor) {
  OortSelector s(oortOptions());  // 0.9, times 0.98, floor 0.2
  std::mt19937_64 rng(1);
  const auto candidates = ids("c", 5);
  EXPECT_DOUBLE_EQ(s.exploration(), 0.9);
  (void)s.select(candidates, 2, 1, 0, rng);
  EXPECT_DOUBLE_EQ(s.exploration(), 0.882);
  (void)s.select(candidates, 2, 2, 0, rng);
  EXPECT_NEAR(s.exploration(), 0.86436, 1e-15);
  for (uint32_t r = 3; r <= 74; ++r) (void)s.select(candidates, 2, r, 0, rng);
  EXPECT_NEAR(s.exploration(), 0.2018236753354033, 1e-12);  // 0.9 * 0.98^74
  (void)s.select(candidates, 2, 75, 0, rng);
  EXPECT_DOUBLE_EQ(s.exploration(), 0.2);  // 0.9 * 0.98^75 = 0.1978: floored
  for (uint32_t r = 76; r <= 200; ++r) (void)s.select(candidates, 2, r, 0, rng);
  EXPECT_DOUBLE_EQ(s.exploration(), 0.2);
  // No candidates: no round, no decay.
  SelectorOptions o = oortOptions();
  OortSelector idle(o);
  EXPECT_TRUE(idle.select({}, 5, 1, 0, rng).empty());
  EXPECT_DOUBLE_EQ(idle.exploration(), 0.9);
}

TEST(OortSelector, ExploreSlotsGoToNeverTriedClients) {
  const auto tried = ids("t", 100);
  const auto fresh = ids("n", 100);
  const auto candidates = concat(tried, fresh);
  OortSelector s(oortOptions());
  feedUtilities(s, tried, std::vector<double>(tried.size(), 5.0));
  std::mt19937_64 rng(5);
  // eps 0.9, K 10: floor(1 + 1e-9) = 1 exploited, 9 explored; then eps 0.882: 1 and 9 again.
  // After 35 rounds eps = 0.9 * 0.98^35 = 0.443: 5 and 5.
  const std::set<std::string> fresh_set(fresh.begin(), fresh.end());
  auto count_fresh = [&](const std::vector<std::string>& got) {
    return std::count_if(got.begin(), got.end(), [&](auto& id) { return fresh_set.count(id); });
  };
  EXPECT_EQ(count_fresh(s.select(candidates, 10, 2, 0, rng)), 9);
  EXPECT_EQ(count_fresh(s.select(candidates, 10, 3, 0, rng)), 9);
  for (uint32_t r = 4; r <= 36; ++r) (void)s.select(candidates, 10, r, 0, rng);
  EXPECT_NEAR(s.exploration(), 0.9 * std::pow(0.98, 35), 1e-12);
  EXPECT_EQ(count_fresh(s.select(candidates, 10, 37, 0, rng)), 5);
}

TEST(OortSelector, ExploresFastestFirstWithASpeedHint) {
  const auto tried = ids("t", 20);
  const auto fresh = ids("n", 20);
  SelectorOptions o = oortOptions();
  o.explore_initial = 0.5;  // K 10: 5 exploited, 5 explored
  OortSelector s(o);
  feedUtilities(s, tried, std::vector<double>(tried.size(), 5.0));
  // n00 takes 20 s ... n19 takes 1 s; n03 unknown (NaN) goes last.
  s.setSpeedHint([](const std::string& id) {
    if (id == "n03") return std::nan("");
    return id[0] == 'n' ? 20.0 - std::stoi(id.substr(1)) : 1.0;
  });
  std::mt19937_64 rng(2);
  auto got = s.select(concat(tried, fresh), 10, 2, 0, rng);
  std::vector<std::string> explored;
  for (const auto& id : got) {
    if (id[0] == 'n') explored.push_back(id);
  }
  EXPECT_EQ(explored, (std::vector<std::string>{"n15", "n16", "n17", "n18", "n19"}));
}

TEST(OortSelector, FillsFromTheOtherShareWhenOneRunsShort) {
  const auto tried = ids("t", 30);
  const auto fresh = ids("n", 4);
  OortSelector s(oortOptions());  // eps 0.9: 9 explore slots but only 4 never-tried
  feedUtilities(s, tried, std::vector<double>(tried.size(), 5.0));
  std::mt19937_64 rng(9);
  auto got = s.select(concat(tried, fresh), 10, 2, 0, rng);
  ASSERT_EQ(got.size(), 10u);
  EXPECT_EQ(std::count_if(got.begin(), got.end(), [](auto& id) { return id[0] == 'n'; }), 4);

  SelectorOptions o = exploitOnly();  // eps 0: 10 exploit slots but only 3 tried
  OortSelector t(o);
  feedUtilities(t, ids("t", 3), {1, 2, 3});
  auto got2 = t.select(concat(ids("t", 3), ids("n", 30)), 10, 2, 0, rng);
  ASSERT_EQ(got2.size(), 10u);
  EXPECT_EQ(std::count_if(got2.begin(), got2.end(), [](auto& id) { return id[0] == 't'; }), 3);
}

// ---- Oort: exploitation -----------------------------------------------------------------------

TEST(OortSelector, ExploitsOnlyAboveTheCutoff) {
  // Utilities 100, 99, ..., 81. K 5: cut-off = 5th best = 96; 0.95 * 96 = 91.2, so the pool is
  // 92..100 (9 clients) and 91 and below never go.
  const auto clients = ids("c", 20);
  std::vector<double> utilities;
  for (int i = 0; i < 20; ++i) utilities.push_back(100 - i);
  OortSelector s(exploitOnly());
  feedUtilities(s, clients, utilities);
  std::mt19937_64 rng(4);
  std::map<std::string, int> picked;
  for (int i = 0; i < 2000; ++i) {
    for (const auto& id : s.select(clients, 5, 1, 0, rng)) ++picked[id];
  }
  EXPECT_EQ(picked.size(), 9u);
  for (int i = 0; i < 9; ++i) EXPECT_GT(picked[clients[i]], 0) << clients[i];
  for (int i = 9; i < 20; ++i) EXPECT_EQ(picked.count(clients[i]), 0u) << clients[i];
}

TEST(OortSelector, ExploitsProportionallyToUtility) {
  // Cut-off 0.1 so that utilities 1, 2, 3, 4 are all in the pool.
  SelectorOptions o = exploitOnly();
  o.cutoff = 0.1;
  const std::vector<std::string> clients = {"a", "b", "c", "d"};
  OortSelector s(o);
  feedUtilities(s, clients, {1, 2, 3, 4});
  std::mt19937_64 rng(8);
  const int draws = 40000;
  // K 1: probabilities U / 10. Binomial standard deviation at most sqrt(0.25 / 40000) = 0.0025;
  // the tolerance is 5 of them (uniform would be 0.25 each).
  std::map<std::string, int> one;
  for (int i = 0; i < draws; ++i) ++one[s.select(clients, 1, 1, 0, rng).at(0)];
  const double p1[] = {0.1, 0.2, 0.3, 0.4};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(one[clients[i]] / double(draws), p1[i], 0.0125);
  // K 2 without replacement, drawn one after the other: P(i in) = p_i + sum_j p_j p_i / (1 - p_j).
  std::map<std::string, int> two;
  for (int i = 0; i < draws; ++i) {
    auto got = s.select(clients, 2, 1, 0, rng);
    ASSERT_EQ(got.size(), 2u);
    ASSERT_NE(got[0], got[1]);
    for (const auto& id : got) ++two[id];
  }
  const double p2[] = {0.23452380952380955, 0.4412698412698413, 0.6083333333333334,
                       0.715873015873016};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(two[clients[i]] / double(draws), p2[i], 0.0125);
}

TEST(OortSelector, LateClientsArePenalisedByTheDeadline) {
  SelectorOptions o = exploitOnly();
  o.preferred_duration_s = 10;
  OortSelector s(o);
  s.feedback(fb("fast", 1, true, 100, 100, 5));  // 100
  s.feedback(fb("slow", 1, true, 100, 400, 8));  // 200 at first ...
  s.feedback(fb("slow", 2, false, 0, 0, 60));    // ... then late: 200 * (10 / 60)^2 = 5.56
  std::mt19937_64 rng(1);
  int slow = 0;
  for (int i = 0; i < 200; ++i) slow += s.select({"fast", "slow"}, 1, 2, 0, rng).at(0) == "slow";
  EXPECT_EQ(slow, 0);  // 5.56 + bonus is far below 0.95 * 100
}

// ---- Oort: pacer ------------------------------------------------------------------------------

TEST(OortSelector, PacerRaisesTWhenUtilityStallsAndNotWhileItGrows) {
  SelectorOptions o = exploitOnly();
  o.preferred_duration_s = 10;
  o.pacer_window = 2;
  o.pacer_step_s = 5;
  OortSelector flat(o);
  flat.feedback(fb("a", 1, true, 1, 100 * 100, 1));  // exploited sum 100 every round
  std::mt19937_64 rng(1);
  std::vector<double> t;
  for (uint32_t r = 1; r <= 6; ++r) {
    (void)flat.select({"a"}, 1, r, 0, rng);
    t.push_back(flat.preferredDuration());
  }
  // Windows compared after rounds 4 and 6 (2 windows of 2 recorded, round a multiple of 2).
  EXPECT_EQ(t, (std::vector<double>{10, 10, 10, 15, 15, 20}));

  o.pacer_step_s = 0;  // by 10%
  OortSelector fraction(o);
  fraction.feedback(fb("a", 1, true, 1, 100 * 100, 1));
  for (uint32_t r = 1; r <= 4; ++r) (void)fraction.select({"a"}, 1, r, 0, rng);
  EXPECT_DOUBLE_EQ(fraction.preferredDuration(), 11);

  OortSelector growing(o);
  for (uint32_t r = 1; r <= 8; ++r) {
    const double u = 100 + 10 * r;
    growing.feedback(fb("a", r, true, 1, u * u, 1));
    (void)growing.select({"a"}, 1, r, 0, rng);
  }
  EXPECT_DOUBLE_EQ(growing.preferredDuration(), 10);
}

// ---- Oort: determinism and restart ------------------------------------------------------------

// A small fleet: client i trains 10 + i samples at a loss falling with the round, takes
// 5 + 3 (i % 10) seconds, and every fifth client misses the 30 s deadline.
void runRound(Selector& s, const std::vector<std::string>& fleet, uint32_t round,
              std::mt19937_64& rng, std::vector<std::vector<std::string>>* log) {
  auto got = s.select(fleet, 8, round, 100.0 * round, rng);
  log->push_back(got);
  for (const auto& id : got) {
    const int i = std::stoi(id.substr(1));
    const uint64_t n = 10 + i;
    const double loss = 2.0 / (1 + 0.1 * round) * (1 + (i % 7) * 0.1);
    const bool late = i % 5 == 0;
    s.feedback(fb(id, round, !late, late ? 0 : n, late ? 0 : n * loss * loss,
                  late ? 30 : 5 + 3 * (i % 10)));
  }
}

SelectorOptions restartOptions(const std::string& name) {
  SelectorOptions o;
  o.kind = *parseSelectorKind(name);
  o.explore_decay = 0.9;
  o.pacer_window = 3;
  o.recent_failure_rounds = 3;
  return o;
}

// Hints that differ between clients and, for availability, over time.
void setHints(Selector& s) {
  s.setSpeedHint([](const std::string& id) { return 1.0 + (std::stoi(id.substr(1)) * 7) % 13; });
  s.setAvailabilityHint([](const std::string& id, double now) {
    return std::fmod(std::stoi(id.substr(1)) * 37.0 + now, 300.0);
  });
}

class SelectorRestart : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(SelectorRestart, SameSeedSameHistory) {
  const auto [name, hint] = GetParam();
  const auto fleet = ids("c", 60);
  auto a = make(restartOptions(name));
  auto b = make(restartOptions(name));
  if (hint) {
    setHints(*a);
    setHints(*b);
  }
  std::mt19937_64 ra(77), rb(77);
  std::vector<std::vector<std::string>> la, lb;
  for (uint32_t r = 1; r <= 40; ++r) {
    runRound(*a, fleet, r, ra, &la);
    runRound(*b, fleet, r, rb, &lb);
  }
  EXPECT_EQ(la, lb);
  EXPECT_EQ(a->saveState(), b->saveState());

  auto c = make(restartOptions(name));
  if (hint) setHints(*c);
  std::mt19937_64 rc(78);
  std::vector<std::vector<std::string>> lc;
  for (uint32_t r = 1; r <= 40; ++r) runRound(*c, fleet, r, rc, &lc);
  EXPECT_NE(la, lc);  // another seed, another history
}

TEST_P(SelectorRestart, RestoredSelectorContinuesIdentically) {
  const auto [name, hint] = GetParam();
  const auto fleet = ids("c", 60);
  auto a = make(restartOptions(name));
  if (hint) setHints(*a);
  std::mt19937_64 rng(5);
  std::vector<std::vector<std::string>> la, lb;
  for (uint32_t r = 1; r <= 17; ++r) runRound(*a, fleet, r, rng, &la);

  // "Restart": a fresh selector from the saved state and a copy of the engine's generator.
  const std::string blob = a->saveState();
  auto b = make(restartOptions(name));
  ASSERT_TRUE(b->loadState(blob).isOk());
  EXPECT_EQ(b->saveState(), blob);
  if (hint) setHints(*b);
  std::mt19937_64 rng_b = rng;
  la.clear();
  for (uint32_t r = 18; r <= 45; ++r) {
    runRound(*a, fleet, r, rng, &la);
    runRound(*b, fleet, r, rng_b, &lb);
  }
  EXPECT_EQ(la, lb);
  EXPECT_EQ(a->saveState(), b->saveState());
  if (name == "oort") {
    auto* oa = static_cast<OortSelector*>(a.get());
    EXPECT_NEAR(oa->exploration(), std::max(0.9 * std::pow(0.9, 45), 0.2), 1e-12);
    EXPECT_GT(oa->preferredDuration(), 0);
  }
}

TEST_P(SelectorRestart, CorruptStateIsAnErrorAndChangesNothing) {
  const auto [name, hint] = GetParam();
  const auto fleet = ids("c", 30);
  auto a = make(restartOptions(name));
  std::mt19937_64 rng(5);
  std::vector<std::vector<std::string>> log;
  for (uint32_t r = 1; r <= 6; ++r) runRound(*a, fleet, r, rng, &log);
  const std::string blob = a->saveState();

  auto b = make(restartOptions(name));
  for (uint32_t r = 1; r <= 2; ++r) runRound(*b, fleet, r, rng, &log);
  const std::string before = b->saveState();
  ASSERT_NE(before, blob);
  for (size_t len = 0; len < blob.size(); ++len) {  // every truncation
    EXPECT_FALSE(b->loadState(std::string_view(blob).substr(0, len)).isOk()) << len;
  }
  for (size_t i = 0; i < blob.size(); ++i) {  // every single-byte change
    std::string bad = blob;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    Status st = b->loadState(bad);
    EXPECT_FALSE(st.isOk()) << i;
  }
  EXPECT_FALSE(b->loadState(blob + "x").isOk());
  EXPECT_EQ(b->saveState(), before);
  UniformSelector u;
  EXPECT_EQ(b->loadState(u.saveState()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->saveState(), before);
  EXPECT_TRUE(b->loadState(blob).isOk());
  EXPECT_EQ(b->saveState(), blob);
}

INSTANTIATE_TEST_SUITE_P(Selectors, SelectorRestart,
                         ::testing::Combine(::testing::Values("oort", "availability"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_hinted" : "_plain");
                         });

// ---- Availability -----------------------------------------------------------------------------

TEST(AvailabilitySelector, NeverPicksAClientLeavingTooSoonWhenEnoughStay) {
  SelectorOptions o;
  o.kind = SelectorKind::kAvailability;
  o.expected_round_s = 50;
  AvailabilitySelector s(o);
  // Even clients stay 100 s, odd ones 10 s (the engine's clock: remaining time shrinks).
  s.setAvailabilityHint([](const std::string& id, double now) {
    return (std::stoi(id.substr(1)) % 2 == 0 ? 100.0 : 10.0) + 0 * now;
  });
  const auto candidates = ids("c", 100);
  std::mt19937_64 rng(6);
  std::map<std::string, int> picked;
  for (uint32_t r = 1; r <= 300; ++r) {
    auto got = s.select(candidates, 20, r, r * 60.0, rng);
    ASSERT_EQ(got.size(), 20u);
    for (const auto& id : got) ++picked[id];
  }
  for (const auto& [id, n] : picked) EXPECT_EQ(std::stoi(id.substr(1)) % 2, 0) << id;
  // Uniform among the 50 that stay: 300 * 20 / 50 = 120 each; chi-square, 49 degrees of freedom,
  // stays below 85.4 with probability 0.999.
  ASSERT_EQ(picked.size(), 50u);
  double chi2 = 0;
  for (const auto& [id, n] : picked) chi2 += (n - 120.0) * (n - 120.0) / 120.0;
  EXPECT_LT(chi2, 85.4);
}

TEST(AvailabilitySelector, FallsBackToTheLongestStayingWhenTooFewQualify) {
  SelectorOptions o;
  o.kind = SelectorKind::kAvailability;
  o.expected_round_s = 50;
  AvailabilitySelector s(o);
  // c00..c04 stay 100 s; the others i seconds (c05 5 s ... c19 19 s).
  s.setAvailabilityHint([](const std::string& id, double) {
    const int i = std::stoi(id.substr(1));
    return i < 5 ? 100.0 : double(i);
  });
  std::mt19937_64 rng(6);
  auto got = s.select(ids("c", 20), 8, 1, 0, rng);
  EXPECT_EQ(got,
            (std::vector<std::string>{"c00", "c01", "c02", "c03", "c04", "c17", "c18", "c19"}));
}

TEST(AvailabilitySelector, WithoutAHintRecentFailuresWaitTheirTurn) {
  SelectorOptions o;
  o.kind = SelectorKind::kAvailability;
  o.recent_failure_rounds = 3;
  AvailabilitySelector s(o);
  const auto candidates = ids("c", 10);
  s.feedback(fb("c01", 5, false, 0, 0, 30));  // dropped in round 5
  s.feedback(fb("c02", 6, false, 0, 0, 30));  // late in round 6
  s.feedback(fb("c03", 4, false, 0, 0, 30));
  s.feedback(fb("c03", 5, true, 10, 1, 12));  // ... but completed since
  std::mt19937_64 rng(3);
  for (int rep = 0; rep < 200; ++rep) {  // round 7: c01 and c02 failed within 3 rounds
    auto got = s.select(candidates, 8, 7, 0, rng);
    ASSERT_EQ(got.size(), 8u);
    EXPECT_EQ(std::count(got.begin(), got.end(), "c01"), 0);
    EXPECT_EQ(std::count(got.begin(), got.end(), "c02"), 0);
  }
  // K 9 needs one of them: the older failure (c01) comes first.
  for (int rep = 0; rep < 50; ++rep) {
    auto got = s.select(candidates, 9, 7, 0, rng);
    EXPECT_EQ(std::count(got.begin(), got.end(), "c01"), 1);
    EXPECT_EQ(std::count(got.begin(), got.end(), "c02"), 0);
  }
  // Round 9: c01's failure (round 5) is 4 rounds old, no longer recent; c02's (6) still is.
  for (int rep = 0; rep < 200; ++rep) {
    auto got = s.select(candidates, 9, 9, 0, rng);
    EXPECT_EQ(std::count(got.begin(), got.end(), "c02"), 0);
  }
  // A completion clears the failure.
  s.feedback(fb("c02", 7, true, 10, 1, 20));
  int c02 = 0;
  for (int rep = 0; rep < 200; ++rep) {
    auto got = s.select(candidates, 5, 8, 0, rng);
    c02 += std::count(got.begin(), got.end(), "c02");
  }
  EXPECT_GT(c02, 60);  // 200 * 5 / 10 = 100 expected
}

TEST(AvailabilitySelector, EstimatesTheRoundDurationFromCompletions) {
  SelectorOptions o;
  o.kind = SelectorKind::kAvailability;
  AvailabilitySelector s(o);
  EXPECT_EQ(s.requiredOnlineSeconds(), 0);
  s.feedback(fb("a", 1, true, 1, 1, 10));
  EXPECT_DOUBLE_EQ(s.requiredOnlineSeconds(), 10);
  s.feedback(fb("b", 1, true, 1, 1, 20));
  EXPECT_DOUBLE_EQ(s.requiredOnlineSeconds(), 12);  // 0.8 * 10 + 0.2 * 20
  s.feedback(fb("c", 1, false, 0, 0, 60));          // failures do not count
  EXPECT_DOUBLE_EQ(s.requiredOnlineSeconds(), 12);
  o.expected_round_s = 45;
  AvailabilitySelector fixed(o);
  fixed.feedback(fb("a", 1, true, 1, 1, 10));
  EXPECT_DOUBLE_EQ(fixed.requiredOnlineSeconds(), 45);
}

// ---- Cost -------------------------------------------------------------------------------------

// CPU seconds of this thread: unlike wall time, not inflated by other work on the machine.
double threadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

TEST(SelectorCost, LinearInTheCandidates) {
  // 100k candidates, half tried. Linear work is a few milliseconds; anything quadratic would be
  // 10^10 steps. The bound leaves room for a slow machine and a debug build.
  const size_t n = 100000;
  std::vector<std::string> candidates;
  for (size_t i = 0; i < n; ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "c%06zu", i);
    candidates.push_back(buf);
  }
  for (const char* name : {"uniform", "oort", "availability"}) {
    SelectorOptions o;
    o.kind = *parseSelectorKind(name);
    auto s = make(o);
    for (size_t i = 0; i < n; i += 2) {
      s->feedback(fb(candidates[i], 1, i % 6 != 0, 10 + i % 50, double(i % 97), 1.0 + i % 30));
    }
    s->setSpeedHint([](const std::string& id) { return double(id[6] - '0'); });
    std::mt19937_64 rng(1);
    const double start = threadCpuSeconds();
    for (uint32_t r = 2; r <= 4; ++r) {
      ASSERT_EQ(s->select(candidates, 1000, r, 0, rng).size(), 1000u);
    }
    const double s_per_round = (threadCpuSeconds() - start) / 3;
    EXPECT_LT(s_per_round, 0.5) << name;
    std::printf("%s: %.1f ms of CPU a round for %zu candidates\n", name, 1e3 * s_per_round, n);
  }
}

}  // namespace
}  // namespace fedfleet::engine
