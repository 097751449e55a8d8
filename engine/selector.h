// Client selectors: which of the idle, eligible clients take part in a round.
//
// A Selector is a policy object with no I/O and no clock. The RoundEngine hands it the round's
// candidates (connected, idle and eligible clients, sorted by id), the number it wants and its
// own seeded generator; after each round it reports how every participant fared
// (ParticipationFeedback). Given the same candidates, the same feedback and the same generator
// state, a selector returns the same clients, so a simulation with the same seed has the same
// history. saveState()/loadState() carry everything else a selector remembers, so a restarted
// coordinator that restores them (and its generator) continues with the same selections.
// A selector is owned by one thread (the engine's); nothing here locks.
//
// Selectors, by SelectorOptions::kind:
//  - "uniform": K clients uniformly without replacement (partial Fisher-Yates over the
//    candidates: the draw the engine makes for small candidate sets). Probabilistic
//    Synchronous Parallel sampling. No state.
//  - "oort": Oort's guided selection (Lai et al., OSDI 2021) as the paper states it; the
//    rule is written out step by step above OortSelector.
//  - "availability": prefers clients likely to stay online for a whole round; see
//    AvailabilitySelector.
//
// Every select() costs O(N) for N candidates (plus O(K log K) to sort the answer, and hint
// calls, one per candidate at most); nothing is quadratic in N.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace fedfleet::engine {

// What the engine reports after a round for each of its participants, completed or not.
struct ParticipationFeedback {
  std::string client;
  uint32_t round = 0;      // the round it took part in (rounds count from 1)
  bool completed = false;  // its update counted; false: late, dropped or rejected
  uint64_t n_samples = 0;  // samples it trained on (its Summary; 0 when it sent none)
  double sum_sq_loss = 0;  // sum over those samples of loss^2 (its Summary)
  double duration_s = 0;   // task sent -> summary; the deadline when late or dropped
};

// Expected duration of a round for the client, in seconds (lower is faster). A negative or
// non-finite answer means "unknown".
using SpeedHint = std::function<double(const std::string& client)>;
// Expected seconds the client stays online from `now` (a simulator reads it off its
// availability trace). A non-finite or negative answer counts as "leaves at once".
using AvailabilityHint = std::function<double(const std::string& client, double now)>;

// Which selector, and its parameters. The keys are the field names; create() names a bad one
// as "selector.<field>".
enum class SelectorKind { kUniform, kOort, kAvailability };
// "uniform", "oort", "availability" (the config's selection.selector); anything else is
// kInvalidArgument naming the key "selector.name".
Result<SelectorKind> parseSelectorKind(std::string_view name);
// The config name of `kind`; also the name a selector's saved state carries.
const char* selectorName(SelectorKind kind);

struct SelectorOptions {
  SelectorKind kind = SelectorKind::kUniform;

  // oort
  double explore_initial = 0.9;     // eps in the first round, in [0, 1]
  double explore_decay = 0.98;      // after every round eps <- max(eps * decay, explore_min)
  double explore_min = 0.2;         // floor of eps, in [0, 1]
  double alpha = 2.0;               // exponent of the duration penalty (T / t_k)^alpha
  double preferred_duration_s = 0;  // T; 0: the median duration of the clients tried so far,
                                    // taken at the first selection that has any
  double cutoff = 0.95;             // exploit among utilities >= cutoff * the cut-off utility
  uint32_t pacer_window = 20;       // rounds per pacer window
  double pacer_step_s = 0;          // the pacer raises T by this; 0: by 10% of T

  // availability
  // A client should stay online this long; 0: estimated from completed participations.
  double expected_round_s = 0;
  // Without a hint: a client that failed within this many rounds is taken only when too few
  // others remain.
  uint32_t recent_failure_rounds = 5;
};

class Selector {
 public:
  virtual ~Selector();

  // Picks min(k, candidates.size()) distinct clients of `candidates` for round `round` (>= 1)
  // at time `now`. `candidates` are the connected, idle, eligible clients, sorted by id and
  // distinct. `rng` is the engine's seeded generator; the answer depends only on the inputs,
  // the feedback so far and rng's state. Returns the ids sorted.
  virtual std::vector<std::string> select(const std::vector<std::string>& candidates, size_t k,
                                          uint32_t round, double now, std::mt19937_64& rng) = 0;

  // Records how a participant fared. Never fails: non-finite or negative numbers count as 0.
  virtual void feedback(const ParticipationFeedback& f);

  // Optional hints from the engine or simulator; a selector that has no use for one ignores
  // it. An empty function removes the hint. Hints are not part of the saved state: set them
  // again after a restart.
  virtual void setSpeedHint(SpeedHint hint);
  virtual void setAvailabilityHint(AvailabilityHint hint);

  // A compact binary blob of everything the selector remembers (not the generator, not the
  // hints), identical for identical histories.
  virtual std::string saveState() const = 0;
  // Replaces the state with a blob from saveState() of a selector of the same name. A
  // malformed blob (truncated, checksum mismatch, values out of range) is kCorrupt and one of
  // another selector kInvalidArgument; on error the state is unchanged.
  virtual Status loadState(std::string_view blob) = 0;

  // "uniform", "oort" or "availability".
  virtual const char* name() const = 0;

  // Builds the selector `o.kind`. Out-of-range values are kInvalidArgument
  // naming the key ("selector.explore_decay ...").
  static Result<std::unique_ptr<Selector>> create(const SelectorOptions& o);
};

// Checks `o` as create() does, without building anything (for config validation).
Status validateSelectorOptions(const SelectorOptions& o);

class UniformSelector final : public Selector {
 public:
  std::vector<std::string> select(const std::vector<std::string>& candidates, size_t k,
                                  uint32_t round, double now, std::mt19937_64& rng) override;
  std::string saveState() const override;
  Status loadState(std::string_view blob) override;
  const char* name() const override { return "uniform"; }
};

// Oort, one round of select(candidates, K, round):
//  1. A client is "tried" once feedback for it has arrived (the engine reports every
//     participant, completed or not); the others are "never tried".
//  2. T: preferred_duration_s, or when that is 0 the median recorded duration of the tried
//     clients at the first selection that has one; the pacer (6) raises it later. While T is
//     unknown there is no duration penalty.
//  3. Utility of a tried client k, from its last participation (n_k samples, sum of squared
//     losses L_k, duration t_k, round r_k):
//       U_k = n_k * sqrt(L_k / n_k)                       (0 when n_k = 0)
//       U_k *= (T / t_k)^alpha            when t_k > T
//       U_k += sqrt(0.1 * ln(round) / r_k)                (staleness bonus)
//     A client that was late or dropped keeps the samples and losses of its last completed
//     participation (none: 0) and gets the deadline as its duration, so the penalty hits it.
//     The statistical part is not normalised, as the algorithm is stated (Oort's code scales it
//     to [0, 1] before adding the bonus); the penalty applies to it before the bonus is added.
//  4. Slots: exploit floor((1 - eps) K) (plus a 1e-9 tolerance), explore the rest; when there
//     are too few never-tried candidates the exploit share takes the spare slots, and the
//     other way round.
//  5. Exploit E slots: the cut-off c is the E-th best utility among the tried candidates; the
//     pool is every tried candidate with U >= cutoff * c; E of the pool are drawn without
//     replacement with probability proportional to U (successive sampling, done in O(N) with
//     Efraimidis-Spirakis keys log(u) / U).
//     Explore X slots among never-tried candidates: with a speed hint, the X fastest (ties by
//     id; unknown speed last); without one, X uniformly at random (an order by id would favour
//     whatever the naming scheme correlates with).
//  6. eps <- max(eps * explore_decay, explore_min). The pacer appends the summed statistical
//     utility (n_k * sqrt(L_k / n_k), no penalty or bonus) of the exploited clients; every
//     pacer_window rounds, once 2 windows are recorded, if the last window's sum is not above
//     the window before it, T grows by pacer_step_s (0: by 10%). Oort's lowering of T on a
//     sharp change is left out.
// A select() that returns nobody (no candidates, or k = 0) changes no state.
class OortSelector final : public Selector {
 public:
  explicit OortSelector(const SelectorOptions& o);

  std::vector<std::string> select(const std::vector<std::string>& candidates, size_t k,
                                  uint32_t round, double now, std::mt19937_64& rng) override;
  void feedback(const ParticipationFeedback& f) override;
  void setSpeedHint(SpeedHint hint) override { speed_hint_ = std::move(hint); }
  std::string saveState() const override;
  Status loadState(std::string_view blob) override;
  const char* name() const override { return "oort"; }

  // eps for the next selection.
  double exploration() const { return eps_; }
  // T in seconds; 0 while unknown.
  double preferredDuration() const { return preferred_s_; }
  // U_k as step 3 computes it for `round` with the current T; -1 for a never-tried client.
  double utility(const std::string& client, uint32_t round) const;

 private:
  struct Record {
    uint32_t last_round = 0;
    uint64_t n_samples = 0;
    double sum_sq_loss = 0;
    double duration_s = 0;
  };
  double statisticalUtility(const Record& r) const;
  double utilityOf(const Record& r, uint32_t round) const;
  void initPreferredDuration();

  SelectorOptions options_;
  SpeedHint speed_hint_;
  std::unordered_map<std::string, Record> records_;
  double eps_;
  double preferred_s_;
  uint64_t selections_ = 0;            // rounds selected so far
  std::vector<double> pacer_history_;  // the last <= 2 * pacer_window exploit sums
};

// Availability-aware: prefers clients likely to stay online for the whole round.
//  - The duration a client must stay: expected_round_s, or when that is 0 an exponential
//    moving average (weight 0.2) of the durations of completed participations (0, so every
//    client passes, until one completes).
//  - With an availability hint, a candidate is preferred when hint(id, now) >= that duration.
//    Without one the selector estimates from its feedback: a candidate is preferred unless it
//    failed (late, dropped or rejected) within the last recent_failure_rounds rounds and has
//    not completed since.
//  - K preferred candidates are drawn uniformly without replacement. When fewer than K are
//    preferred all are taken, and the rest are filled from the others in order of priority:
//    the longest hinted time online, or without a hint the oldest failure (ties at random).
class AvailabilitySelector final : public Selector {
 public:
  explicit AvailabilitySelector(const SelectorOptions& o);

  std::vector<std::string> select(const std::vector<std::string>& candidates, size_t k,
                                  uint32_t round, double now, std::mt19937_64& rng) override;
  void feedback(const ParticipationFeedback& f) override;
  void setAvailabilityHint(AvailabilityHint hint) override { hint_ = std::move(hint); }
  std::string saveState() const override;
  Status loadState(std::string_view blob) override;
  const char* name() const override { return "availability"; }

  // The duration a client is asked to stay online for, in seconds (step 1).
  double requiredOnlineSeconds() const;

 private:
  SelectorOptions options_;
  AvailabilityHint hint_;
  std::unordered_map<std::string, uint32_t> last_failure_;  // clients with a failure not
                                                            // followed by a completion
  double mean_duration_s_ = 0;  // EWMA of completed durations; 0: none yet
};

}  // namespace fedfleet::engine
