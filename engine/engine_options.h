// EngineOptions: everything a RoundEngine is built from, as typed values. A driver fills them
// from the config (driver/run_setup.h engineOptionsFromConfig), where each config string
// becomes an enum once (parseAggregatorKind, parseDeadlineMode, parseNormBoundAction,
// parseBlockMode); the engine and its policies never compare config strings. Each policy
// checks its own options (validateSelectorOptions, validateAggregatorOptions, ...), and
// checkEngineOptions runs them all before an engine is built.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/wire/messages.h"
#include "engine/aggregator.h"
#include "engine/block_models.h"
#include "engine/central_dp.h"
#include "engine/deadline_policy.h"
#include "engine/secure_aggregation.h"
#include "engine/selector.h"
#include "engine/server_optimizer.h"

namespace fedfleet::engine {

// What the norm bound does to an update beyond it (EngineOptions::norm_bound).
enum class NormBoundAction { kClip, kReject };
// "clip" / "reject"; anything else is kInvalidArgument.
Result<NormBoundAction> parseNormBoundAction(const std::string& name);

struct EngineOptions {
  int64_t run_id = 0;
  uint32_t rounds = 1;
  uint32_t first_round = 1;  // > 1 when resuming
  uint64_t model_version = 0;
  uint32_t clients_per_round = 1;
  uint32_t min_clients = 1;
  uint32_t quorum = 1;
  double deadline_s = 60;
  double liveness_s = 6;  // <= 0: no liveness tracking (the simulator reports losses itself)
  double wait_clients_s = 300;
  // The coordinator process's session, stamped on its tasks (Task::coordinator_session; 0: none,
  // the simulator). A client whose Hello names another one worked for an earlier process of the
  // run: until a frame of one of this engine's tasks comes from it, tokens this engine does not
  // know are answered but not recorded (its upload of the earlier task was on its way).
  uint64_t coordinator_session = 0;
  // The run ends (not ok) when this many rounds in a row have failed, with the latest one's
  // reason: a diverged model or a persistent fault fails every later round the same way
  // (0: never).
  uint32_t max_failed_rounds = 0;
  bool sample_partitions = false;
  uint32_t num_partitions = 1;
  uint32_t checkpoint_every = 1;
  uint64_t seed = 0;
  std::string model_name = "mlp";
  wire::HyperParams hparams;  // seed is derived per task
  wire::DataSpec data;        // index is set per task
  uint32_t chunk_bytes = 1 << 20;
  std::string codec = "none";   // codec spec every task asks for (common/compress/codec_spec.h)
  std::string slow_link_codec;  // when set: the codec for clients whose last measured uplink
  double slow_link_mbps = 0;    // was below slow_link_mbps
  uint64_t partial_buffer_bytes = 64ull << 20;  // payloads of the round's updates kept in
                                                // memory until it settles; beyond this they
                                                // spill to a temporary file
  // Upload credits (protocol step 4): tasks whose client may send chunks at once (0: unbounded).
  // Only granted tasks send chunks, so at most this many uploads are received at once.
  uint32_t max_concurrent_uploads = 0;
  // With credits bounded: a granted upload that sends nothing for this long (since its grant or
  // its last chunk) is rejected, and its credit goes to the next in line (0: never).
  double upload_idle_s = 30;
  bool evaluate_initial = true;  // round 0 (false when resuming a run whose round 0 is recorded)
  uint32_t eval_every = 1;       // evaluate after every this many rounds (and after the last)
  // false: the coordinator has no test data; rounds are committed at once without test metrics
  // (federated evaluation alone says how the model does).
  bool server_eval = true;
  // Federated evaluation: the tasks of round r ask their clients to evaluate the model they
  // carry on their held-out data before training when (r - 1) % fed_eval_every == 0 (the model
  // after rounds 0, n, 2n, ...; 0: never). fed_eval_clients > 0: only the first that many tasks
  // of such a round (in dispatch order) ask; 0: every task.
  uint32_t fed_eval_every = 0;
  uint32_t fed_eval_clients = 0;
  double target_accuracy = 0;  // > 0: the run ends at the first evaluation reaching it
  bool bye_on_finish = true;   // say Bye to every connected client when the run ends (the
                               // simulator's virtual clients need no goodbye)
  // Rounds before the last one awaiting evaluation at which no new synchronous round starts
  // (protocol step 9; 0: no bound, for the simulator, which reports evaluations in virtual time).
  uint32_t max_evaluations_behind = 0;

  // ---- Claims (protocol step 5a): what an update may say about itself ----
  // partition_sizes[p]: the samples partition p holds, as clients cut it (run_setup.h
  // partitionSizes); an update of partition p may claim at most that many. Empty (or too short
  // for p): unknown, and max_samples_per_update bounds the claim instead (0: no bound, allowed
  // only with sizes known: checkEngineOptions).
  std::vector<uint64_t> partition_sizes;
  uint64_t max_samples_per_update = 1000000;
  double max_loss = 1e6;                  // a summary's losses must lie in [0, max_loss]
  uint32_t events_per_client_round = 20;  // event rows per client and round (then one
                                          // "events_left_out" row)
  // And per client in time (engine/event_budget.h): events_burst rows at once, then one every
  // events_every_s seconds of the engine's `now` (either 0: no budget in time).
  double events_burst = 30;
  double events_every_s = 10;

  // ---- Aggregation (the methods and their papers: docs/ARCHITECTURE.md) ----
  // fedavg: weights n_k; fednova: d_k = D_k / a_k(tau_k, momentum), scaled by tau_eff;
  // scaffold: unweighted mean of D_k, and c += |S|/N mean Dc_k (updates are 2P values long);
  // median, trimmed_mean: coordinate-wise over complete updates, unweighted (buffered within
  // robust_buffer_bytes, spilled to a temporary file beyond).
  AggregatorKind aggregator = AggregatorKind::kFedAvg;  // engine/aggregator.h
  // kCustom: builds the run's aggregator for a model of n values (a buffering one: its
  // buffersUpdates() is true; with secure aggregation a linear one, given the unmasked sum).
  // Supplied by the driver; the engine calls it once.
  AggregatorFactory custom_aggregator;
  double trim_fraction = 0.1;
  double clip_norm = 0;  // > 0: each update is scaled to at most this L2 norm before averaging
  // Norm bound (protocol step 8a): an update whose delta norm exceeds norm_bound x the
  // reference norm is clipped to that norm, or rejected (0: off). The reference comes from the
  // rounds settled before (engine/norm_reference.h): the lower median of the last norm_window
  // rounds' lower median norms, growing by at most norm_growth a round; the first round is
  // judged against its own lower median.
  double norm_bound = 5;
  NormBoundAction norm_bound_action = NormBoundAction::kClip;
  uint32_t norm_window = 5;
  double norm_growth = 2;
  // Quarantine (engine/quarantine.h): a client whose updates the norm bound clipped or rejected
  // in quarantine_after of its rounds in a row is not sampled for quarantine_rounds rounds
  // (either 0: off).
  uint32_t quarantine_after = 2;
  uint32_t quarantine_rounds = 10;
  // Weight cap (step 8a): no update weighs more than weight_cap x the median sample count of
  // the round's completed updates; a larger claim is capped to it (0: off).
  double weight_cap = 10;
  // Server optimiser on the pseudo-gradient G (engine/server_optimizer.h): its kind, learning
  // rate eta_g (server.lr, coordinator.server_lr), moment decays, adaptivity and momentum.
  ServerOptimizerOptions server;
  uint64_t robust_buffer_bytes = 256ull << 20;

  // ---- Client selection ----
  // uniform: the O(K log N) rank sampling of round_engine.h (protocol step 2). Others
  // (engine/selector.h) see every idle eligible client and learn from each participant's outcome.
  SelectorOptions selector;

  // ---- Straggler policies (synchronous mode) ----
  // Round deadline: fixed (deadline_s), or percentile: the deadline_percentile quantile of
  // the task durations (task sent -> summary) completed in the last deadline_window rounds,
  // times deadline_slack, never more than deadline_s (deadline_s until enough durations, one
  // round's worth, are known).
  DeadlineMode deadline_mode = DeadlineMode::kFixed;  // engine/deadline_policy.h
  double deadline_percentile = 0.9;
  uint32_t deadline_window = 5;
  double deadline_slack = 1.2;
  // Over-selection: select ceil(K (1 + b)) and aggregate the first K to complete; the rest are
  // cancelled and recorded late.
  double over_selection = 0;
  // Partial work: tasks say stop_after_s (the deadline less the client's expected upload time,
  // from its measured uplink) so a slow client uploads what it did by then with its true steps.
  bool partial_work = false;
  // Heterogeneity-aware work: each task's max_steps is sized from the client's measured speed
  // (steps per compute second, and its non-compute overhead) so that it finishes at
  // adaptive_target x the deadline; at most adaptive_max_factor x the configured work; clients
  // not yet measured get the configured work.
  bool adaptive_steps = false;
  double adaptive_target = 0.8;
  double adaptive_max_factor = 1.0;

  // ---- Asynchronous buffered aggregation (FedBuff) ----
  // async: at most async_concurrency clients train at once, each from the version it pulled;
  // every async_buffer completed updates, x += server_lr (1/K) sum w(s_i) D_i with
  // w(s) = 1/sqrt(1 + s), s = versions since the task's; staler than max_staleness: rejected.
  // A "round" is one such server step. Each task has its own deadline (deadline_s).
  bool async = false;
  uint32_t async_concurrency = 10;
  uint32_t async_buffer = 5;
  uint32_t max_staleness = 10;

  // ---- Block-cyclic data (engine/block_models.h; protocol "Blocks" above) ----
  // blocks.count == 0: off. Synchronous rounds, sample_partitions off, and (multichain) an
  // aggregation without state across rounds (no SCAFFOLD, server optimiser fedavg).
  BlockScheduleOptions blocks;
  BlockMode block_mode = BlockMode::kSingle;

  // ---- Differential privacy (engine/central_dp.h) ----
  // dp.central: updates clipped to dp.clip_norm at settlement, weighing 1, Gaussian noise on the
  // sum, divided by clients_per_round; norm_bound and weight_cap do not apply (each is decided
  // from the other updates of the round, which a client's privacy must not depend on).
  DpOptions dp;

  // ---- Secure aggregation (engine/secure_aggregation.h) ----
  SecAggOptions secagg;
};

// What the engine's constructor would otherwise abort on: selector, server optimiser,
// aggregator, deadline and block options it cannot build (kInvalidArgument naming the config
// section). Drivers call it before constructing the engine.
Status checkEngineOptions(const EngineOptions& options);

}  // namespace fedfleet::engine
