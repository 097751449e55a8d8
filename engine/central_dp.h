// CentralDp: differentially private federated averaging with a trusted coordinator (DP-FedAvg,
// McMahan et al., ICLR 2018), with fixed or adaptive clipping (Andrew et al., NeurIPS 2021), and
// the accountant of common/privacy/rdp_accountant.h. The round engine asks it three things:
//   settlement   each completed update D_k is scaled to L2 norm at most C (clipScale), weighs 1,
//                and is counted if its norm was at most C (observe);
//   server step  the sum gets Gaussian noise of standard deviation z_D C in every coordinate and
//                is divided by the fixed K = clients_per_round (not by the updates that came:
//                a client's presence must not change the denominator);
//                G = (sum_k clip(D_k) + N(0, (z_D C)^2 I)) / K;
//   after it     the step is counted for the accountant, and with adaptive clipping
//                C <- C exp(-eta (b - gamma)), b = (sum_k 1[|D_k| <= C] + N(0, sigma_b^2)) / K.
// The noise multiplier z of the accountant is the run's dp.noise_multiplier. Adaptive clipping
// releases the noised count too, so the update noise gets the rest of the budget (Andrew et al.,
// Theorem 1): z_D = (z^-2 - (2 sigma_b)^-2)^(-1/2).
// Every noise draw comes from the keyed stream of (noise key, round): reproducible in the
// simulator (key from the seed), unpredictable for clients of a real coordinator (a random key).
// One owner: not thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace fedfleet::engine {

struct EngineOptions;

struct DpOptions {
  bool central = false;  // dp.mode = "central"
  // dp.mode = "distributed": under secure aggregation each client clips its own update to C and
  // adds N(0, (z C)^2 / M), M = the quorum, so that a round of at least M survivors carries
  // the central mechanism's noise or more; the coordinator adds none.
  bool distributed = false;
  // dp.mode = "local": each client clips its update to C and adds N(0, (z C)^2) itself, and the
  // accountant counts releases per client (sampling rate 1: a client's own view); the epsilon
  // recorded is that of the client with the most releases.
  bool local = false;
  bool on() const { return central || distributed || local; }
  double noise_multiplier = 1.0;  // z
  double clip_norm = 1.0;         // C (adaptive: the first round's)
  bool adaptive_clip = false;
  double target_quantile = 0.5;  // gamma
  double clip_lr = 0.2;          // eta
  double count_stddev = 0;       // sigma_b; 0: K / 20 (the paper's choice)
  double delta = 1e-5;
  double target_epsilon = 0;  // > 0: the run has no more rounds than keep epsilon within it
  uint64_t population = 0;    // N the clients are sampled from; 0: the run's partitions
  std::string noise_key;      // crypto::kStreamKeyBytes bytes (the driver sets it)
};

// kInvalidArgument (naming the dp.* key) when `options` ask for central DP that cannot work.
Status validateDpOptions(const EngineOptions& options);

class CentralDp {
 public:
  // For a run of `options` (validateDpOptions passed).
  explicit CentralDp(const EngineOptions& options);

  // The sampling rate q = ceil(K (1 + over_selection)) / N the accountant assumes.
  double samplingRate() const { return q_; }
  double noiseMultiplier() const { return dp_.noise_multiplier; }
  // z_D: the update noise's multiplier (z without adaptive clipping).
  double updateNoiseMultiplier() const { return z_update_; }
  double countStddev() const { return count_stddev_; }
  double clip() const { return clip_; }
  uint64_t steps() const { return steps_; }

  // The scale that brings an update of L2 norm `norm` within clip(): min(1, C / norm).
  double clipScale(double norm) const;
  // Counts an update of L2 norm `norm` at settlement (adaptive clipping).
  void observe(double norm);
  // Adds the round's noise, N(0, (z_D C)^2), to the `n` values of `sum`.
  void addNoise(float* sum, size_t n, uint32_t round) const;
  // The denominator of the average: K.
  double denominator() const { return denominator_; }
  // The round's noised sum became the model: counted, and the clip adapts. Forgets the count.
  void stepTaken(uint32_t round);
  // Forgets the round's count (a round that failed releases nothing).
  void clearRound() { unclipped_ = 0; }

  // Local DP: the most releases any client has made so far (the steps counted).
  void releasesObserved(uint64_t most) { steps_ = std::max(steps_, most); }
  // epsilon at dp.delta after the steps taken so far.
  double epsilon() const;
  // epsilon after `steps` steps.
  double epsilonAfter(uint64_t steps) const;
  // The most steps, at most `limit`, whose epsilon stays within `target`.
  uint64_t stepsWithin(double target, uint64_t limit) const;

  // (clip, steps) for the engine state; loadState refuses (kCorrupt) a blob of another size, a
  // clip that is not finite and > 0; nothing changes then.
  std::string saveState() const;
  Status loadState(std::string_view blob);

 private:
  DpOptions dp_;  // the run's: noise key, z, delta, adaptive clipping's gamma and eta
  double q_ = 0;
  double z_update_ = 0;
  double count_stddev_ = 0;
  double denominator_ = 1;
  double clip_ = 0;
  uint64_t steps_ = 0;
  uint32_t unclipped_ = 0;
};

}  // namespace fedfleet::engine
