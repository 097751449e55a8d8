// RoundEngine: the coordinator's round logic as a deterministic state machine.
//
// It does no I/O and reads no clock. A driver feeds it events (a client said Hello, a chunk or
// summary arrived, time passed) together with the current time, and executes the actions it
// emits (send a task, cancel one, record an event, commit a round). The ZeroMQ driver
// (coordinator/coordinator_service.h) feeds it real messages and the system clock; a simulator
// can feed it virtual time. Given the same events at the same times and the same seed, it emits
// the same actions.
//
// The engine core keeps clients, phases, task tokens, participants, the running sum and the
// action queue; each policy is an object chosen once at construction (docs/ARCHITECTURE.md):
// RoundMode (steps 2, 7, 9: synchronous, FedBuff, or SecureRounds, synchronous rounds under
// SecAgg+ around steps 3 to 8a: engine/secure_aggregation.h), DeadlinePolicy (step 3's deadline),
// WorkSizer (the task's work), UploadCredits (step 4), UpdateAssembler (steps 5, 5a, 6),
// Aggregator and ServerOptimizer (steps 8a, 8), Selector and ClientTable (step 2), CommitPipeline
// (steps 9's evaluation, 10 and 10a, with the EvaluationBacklog of rounds awaiting their
// evaluation), BlockCoordinator (B1-B6), CentralDp (differential privacy at steps 8a and 8:
// engine/central_dp.h). The round mode and the commit pipeline reach the core through
// RoundContext (engine/round_context.h).
//
// The synchronous round protocol, step by step:
//  1. Waiting. The engine waits until `min_clients` clients are connected and idle. If that has
//     not happened within `wait_clients_s`, the run ends (RunFinished with ok = false).
//  2. Selection. It samples K = min(clients_per_round, idle clients) clients uniformly without
//     replacement among the connected, idle and eligible ones (seeded; the draw is over ranks in
//     the id order, so it does not depend on arrival order, and costs O(K log N) for N
//     registered clients: a simulator with a million clients pays per round for the K it
//     samples, not for the million). Clients in quarantine (step 8a) are left out of the draw;
//     when that leaves fewer than the quorum, the draw is made again with them in. With nobody
//     in quarantine the draw is the one it always was. In
//     "partitions" mode it also samples K distinct partitions and names one in each task;
//     otherwise each client trains the partition it was assigned when it joined.
//  3. Dispatch. Each sampled client gets a Task: the current flat model (fp32) and its SHA-256,
//     hyper-parameters with a per-(round, partition) seed, the data spec, a deadline and a fresh
//     task token from OpenSSL's CSPRNG (common/crypto/random.h), which no peer can guess. The
//     round deadline is now + deadline_s. Nothing deterministic depends on a token: the
//     participants are kept in dispatch order (ParticipantTable), and rows, the fold order,
//     events and selector feedback all follow that order.
//  4. Upload credits. A client whose update is ready sends an UploadRequest and waits for an
//     UploadGrant before its first chunk. At most max_concurrent_uploads tasks hold a grant at
//     once (0: unbounded, every request is granted at once); the others wait in the order they
//     asked. A grant is returned when its task stops being pending for any reason (completed,
//     rejected, cancelled or late, its client lost, the round or run over): after every event
//     the engine drops the grants and queued requests of tasks that are no longer pending and
//     grants the next in line, so no path can keep a credit. With credits bounded, a chunk of a
//     task without a grant rejects the update, and a granted upload that sends nothing for
//     upload_idle_s (since its grant or its last chunk) is rejected, so a stalled client cannot
//     keep the credit from the next in line.
//  5. Upload. The client streams its delta as Chunks carrying the token, in order (element
//     offsets must be contiguous), each a self-describing payload of the task's codec (or fp16
//     for a small tensor of a topk task with dense_below; common/compress/payload.h) with the
//     update's weight inputs (n_samples, steps), then a Summary. Each chunk is decoded the moment
//     it arrives, checked, and its squares added to the update's L2 norm; its payload is kept
//     (PartialLog: in memory up to partial_buffer_bytes, then spilled to a temporary file) until
//     the round settles (step 8a): nothing is folded into the running sum before its weight and
//     scale are final. Chunks with an unknown or finished token are
//     answered with an Error (once per token) and recorded as an event; they never touch the
//     model. A chunk out of order or past the model's size, a payload of another codec than
//     its task asked for (compress::acceptsPayload), a payload that does not decode (bad
//     header, wrong length, a non-finite value), values so large the sum could overflow, a
//     weight that changes between chunks or disagrees with the summary, or a summary before the
//     last chunk rejects that client's update (recorded, not aggregated).
// 5a. Claims. A client holding a valid key may still lie, so what an update says of itself is
//     bounded by what the coordinator knows, and a violation rejects it with the reason
//     (docs/ERRORS.md): n_samples in [1, the size of the partition its task named]
//     (partition_sizes; unknown: max_samples_per_update); steps in [1, what the task planned]
//     (its max_steps, else epochs x ceil(partition size / batch), the claimed samples standing
//     in for an unknown size); the summary's losses finite and in [0, max_loss] (the sum of
//     squares in [0, max(n, steps x batch) max_loss^2]; a served-model accuracy in [0, 1]); chunk
//     offsets contiguous and inside the update. Timings (compute, upload, encode seconds) are
//     clamped to [0, time since the task was sent]. Per client at most
//     events_per_client_round event rows a round are recorded, and at most events_burst at
//     once, then one every events_every_s seconds of `now` (engine/event_budget.h); the rest
//     are counted, and one "events_left_out" row at a round's end that the client's budget
//     allows says how many.
//  6. Completion. When the summary of a complete delta arrives the update counts; its payloads
//     stay kept until the round settles (median and trimmed mean: it goes to the robust
//     aggregator's buffer now). An update that does not complete (rejected, cancelled at the
//     deadline, client lost) has its kept payloads dropped: nothing of it was ever folded, so
//     nothing partial is aggregated and nothing needs taking back.
//  7. Round end: when every participant is completed, rejected or dropped, or at the deadline.
//     At the deadline, participants still working are cancelled and recorded `late`; those whose
//     connection was lost (no message for liveness_s, or Bye) are `dropped`.
// 8a. Settlement (synchronous fedavg, fednova, scaffold), once every norm and weight is known:
//     the norm bound: an update whose delta norm exceeds norm_bound x the reference norm is
//     clipped to exactly that norm (norm_bound_action clip; SCAFFOLD, whose 2P-long update has
//     no single norm to scale by, and action reject: rejected). The reference comes from the
//     rounds settled before (engine/norm_reference.h): the lower median of the last
//     norm_window rounds' lower median norms (each norm counted at most at its bound), grown by
//     at most norm_growth a round, so no update moves the bound it is judged by and a minority
//     cannot walk it up; the first round is judged against its own lower median. A clipped or
//     rejected update is a strike against its client, an update within the bound clears them;
//     quarantine_after strikes in a row keep the client out of the draw (step 2) for
//     quarantine_rounds rounds (event "client_quarantined"; engine/quarantine.h). Reference,
//     strikes and quarantines are saved with the engine state;
//     clip_norm scales to at most clip_norm; the weight cap: an n_k above weight_cap x the lower
//     median n of the updates that stay is counted as that cap (event "weight_capped"). Then
//     every completed update is decoded once more from the PartialLog and folded into the sum
//     with its final weight x scale, in dispatch order: a clip is exact, and the sum does not
//     depend on the order in which uploads arrived. (bench/fold_strategy.sh measures this
//     against folding on arrival.) FedBuff bounds each completing update against the lower
//     median of the last 2 x async_buffer completed norms (it folds at completion already;
//     its verdicts are strikes likewise);
//     median and trimmed mean take no norm bound: each coordinate's aggregate is already
//     bounded by the honest majority's values, and clip_norm applies at completion.
//  8. Aggregation. With at least `quorum` completed updates:
//     x <- x + server_lr * sum_k n_k D_k / sum_k n_k, version + 1. Otherwise the round is
//     recorded as failed and the model is unchanged. A step whose result would not be finite
//     (aggregate, model or control variate) is refused: the round is recorded failed with an
//     event "step_refused", model, server-optimiser state and control variate as before.
//  9. Next round first. The next round is selected and dispatched at once (step 1), and only
//     then is the new model evaluated: an Evaluate action asks the driver to evaluate it and
//     report back with onEvaluated(). Clients train while the server evaluates, instead of
//     waiting for it. With max_evaluations_behind = B > 0, the next round starts only while
//     fewer than B rounds before the one just ended still await their evaluation; otherwise it
//     waits for the report that brings them below B. Rounds faster than evaluation would
//     otherwise pile up without bound, each holding its commit, checkpoint and model snapshot
//     (bench/memory_soak.sh).
//     With eval_every = n > 1 only every n-th round (and the last) is evaluated; the others
//     are committed at once without test metrics.
// 10a. Refused evaluation. The model before each evaluated step is kept until its evaluation
//     is reported. An evaluation with a non-finite loss or accuracy is refused: the model,
//     server-optimiser state and control variate go back to that snapshot (as a new model
//     version, so that caches keyed by version refresh); the round and every later round still
//     awaiting its evaluation are committed failed without checkpoint (event
//     "evaluation_refused"); the round in flight, dispatched with the refused model (step 9),
//     is aborted: its pending tasks are cancelled (recorded late), its completed updates
//     refused, and it is committed failed; the next round starts from the restored model.
//     (FedBuff: the step being buffered is emptied likewise.) The dispatch is not held back
//     for the evaluation, so rounds keep overlapping it. Not rolled back: rounds already
//     committed without evaluation (eval_every > 1) and block models (z_m, y_m).
// 10. Commit. When the evaluation is reported (at once for a failed round), one CommitRound
//     action carries the round row with its test metrics, one update row per participant and
//     (every checkpoint_every rounds, and after the last) a checkpoint. After the last round's
//     commit: Bye to every client and RunFinished.
//
// Round 0 is the initial model's evaluation (status "initial"), requested by start().
//
// Blocks (block-cyclic data, EngineOptions::blocks.count = M > 0; engine/block_coordinator.h,
// engine/block_models.h):
//  B1. Before sampling a round the engine fixes its block m (from the round number, or from
//      `now` on a clock schedule). A new visit to m is recorded as a "block_started" event.
//  B2. Only clients whose partition is available in block m are sampled (and the driver's
//      eligibility still applies): partition p lives in block p mod M.
//  B3. Multichain: the rounds of a visit alternate between the shared chain x (the visit's 1st,
//      3rd, ... round) and block m's chain y_m (2nd, 4th, ...). A chain round's tasks carry y_m
//      (and its SHA-256); its step updates y_m, never x. All participants of a round train the
//      same model, and a round's updates end with it (synchronous mode), so the two never mix.
//      y_m starts as a copy of x at its first round.
//  B4. When a round ends the visit (the R-th round of it, the clock past its window, or the last
//      round), pluralistic and multichain fold x into z_m (running average of the end-of-visit
//      x), and an EvaluateBlocks action asks for x, every z_j and every y_j on block j's sets.
//      It comes before the round's own Evaluate/CommitRound, and the run finishes only after
//      its report.
//  B5. onBlocksEvaluated: multichain serves block j the one of z_j, y_j with the lower
//      validation loss; RecordBlockMetrics carries the rows (models shared, pluralistic, chain
//      and served). The block models, visit counts and choices are part of saveState().
//  B6. Serving: every task of a round in block m names block m's served model (servedModel(m):
//      single x; pluralistic z_m, x before m's first visit; multichain the last choice) in
//      Task::served: its block, kind, SHA-256 and version (the model version when that served
//      model was first sent). The engine remembers per client the SHA-256 of the served model
//      it last sent, and sends the bytes only when they differ: "unchanged" when the client has
//      it, "task model" when it is the task's own model, else "attached" (SendTask::
//      served_bytes, one shared buffer per served model, counted in the task's bytes_down).
//      A summary echoes the served model the client holds and its loss and accuracy on the
//      client's held-out data; they go into the update's served_* fields. A client that holds
//      another one (or none), reports an error about its task, or says Hello from a new
//      process is sent the served model again with its next task.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/compress/codec_spec.h"
#include "common/history/records.h"
#include "common/wire/messages.h"
#include "engine/actions.h"
#include "engine/aggregator.h"
#include "engine/block_coordinator.h"
#include "engine/block_models.h"
#include "engine/client_table.h"
#include "engine/commit_pipeline.h"
#include "engine/deadline_policy.h"
#include "engine/engine_options.h"
#include "engine/engine_state.h"
#include "engine/event_budget.h"
#include "engine/norm_reference.h"
#include "engine/partial_log.h"
#include "engine/participant.h"
#include "engine/participant_table.h"
#include "engine/partition_book.h"
#include "engine/quarantine.h"
#include "engine/recent_tokens.h"
#include "engine/robust_aggregator.h"
#include "engine/round_context.h"
#include "engine/round_mode.h"
#include "engine/selector.h"
#include "engine/server_optimizer.h"
#include "engine/update_assembler.h"
#include "engine/update_weights.h"
#include "engine/upload_credits.h"
#include "engine/work_sizer.h"

namespace fedfleet::engine {

// (The actions it emits, SendTask to RunFinished: engine/actions.h.)
class RoundEngine : private RoundContext {
 public:
  // `initial_params` is the flat model the run starts from (fresh or from a checkpoint).
  RoundEngine(EngineOptions options, std::vector<float> initial_params);

  // Asks for the starting model's evaluation (round 0, when first_round == 1) and starts
  // waiting for clients.
  void start(double now);

  // The evaluation asked for by an Evaluate action: commits that round (and, after the last
  // round, finishes the run). A round that is not waiting for its evaluation is ignored.
  void onEvaluated(uint32_t round, std::optional<EvalOutcome> outcome, double now);

  // A client said Hello. A new id is registered and assigned a partition; a known id
  // reconnecting keeps its partition (a task it had in flight is treated as lost).
  void onHello(const ClientId& id, const wire::Hello& hello, double now);
  // Any sign of life (heartbeats and every other message refresh liveness too).
  void onHeartbeat(const ClientId& id, double now);
  // The client said goodbye: it is removed; a task in flight is recorded dropped.
  void onBye(const ClientId& id, double now);
  // A chunk of an update. `frame_bytes` is the size of the frame on the wire.
  void onChunk(const ClientId& id, const wire::Chunk& chunk, uint64_t frame_bytes, double now);
  void onSummary(const ClientId& id, const wire::Summary& summary, uint64_t frame_bytes,
                 double now);
  // The client's update of task `token` is ready (protocol step 4): grant now or queue. A token
  // that is unknown, finished or someone else's is answered like a chunk of it; asking again
  // for a granted task sends the grant again, for a queued one changes nothing.
  void onUploadRequest(const ClientId& id, uint64_t token, double now);
  // A client reported an error about its task (for example a model checksum mismatch).
  void onClientError(const ClientId& id, const wire::Error& error, double now);
  // A step of secure aggregation (engine/secure_aggregation.h) for the client's task: its keys,
  // its sealed shares, or (after its update completed) the shares it reveals. A message the
  // round refuses rejects that client's update, with the reason.
  void onSecAgg(const ClientId& id, const wire::SecAgg& message, uint64_t frame_bytes, double now);
  // Registers a client without announcing it: no client row, no event, no round start. The
  // simulator registers its whole fleet this way before start() and records a client's row
  // when the client is first sampled. Same bookkeeping as onHello otherwise.
  void registerClient(const ClientId& id, const wire::Hello& hello, double now);

  // Which idle clients may be sampled at `now` (for example: online in the simulator's
  // availability trace). Must be a pure function of its arguments, so selection stays
  // deterministic. Unset: every connected idle client.
  using Eligibility = std::function<bool(const ClientId& id, double now)>;
  void setEligibility(Eligibility eligible) { eligible_ = std::move(eligible); }

  // Hints for the selector (engine/selector.h); ignored by uniform selection.
  void setSelectorHints(SpeedHint speed, AvailabilityHint availability);

  // State that must survive a restart besides the model: the selection generator, the
  // selector's learned state, which partition each client was assigned, the norm bound's
  // reference and the quarantine (saved with every checkpoint, as
  // CheckpointRecord::engine_state).
  std::string saveState() const;
  // Restores saveState()'s blob (when resuming). A corrupt blob or one of another selector is
  // an error and changes nothing. The partition assignments it holds are kept for the clients'
  // return: a client that says Hello again trains the partition it had, and no newcomer is
  // given a partition another client holds.
  Status loadState(std::string_view blob);

  // Block-cyclic runs: the outcomes an EvaluateBlocks action asked for. Multichain chooses each
  // evaluated block's served model by validation loss; then one RecordBlockMetrics carries a
  // row per outcome and a "served" row per block (the served model's numbers). A round with no
  // evaluation pending is ignored.
  void onBlocksEvaluated(uint32_t round, const std::vector<BlockEvalOutcome>& outcomes, double now);
  // The block of the current round (0 without blocks), and the model block m is served for
  // evaluation and inference (the shared model without blocks).
  uint32_t currentBlock() const { return blocks_ ? blocks_->currentBlock() : 0; }
  const std::vector<float>& servedModel(uint32_t block) const;
  const BlockModels* blockModels() const { return blocks_ ? &blocks_->models() : nullptr; }

  // Time passed: fires deadlines, liveness expiries and the wait-for-clients limit.
  void onTick(double now);

  // The next time at which onTick has something to do (std::nullopt: nothing scheduled).
  std::optional<double> nextWakeup() const;

  // Returns and clears the actions emitted so far.
  std::vector<Action> takeActions();

  bool finished() const { return state_.phase == Phase::kFinished; }
  bool isKnown(const ClientId& id) const { return clients_.contains(id); }
  // The token of the task `id` holds while nothing of its upload has come (no chunk, no upload
  // request) and no secure aggregation runs: a task its driver may send again, unchanged, to a
  // connection that replaced the one the task went to (the client may never have received it).
  // 0 when there is none.
  uint64_t unstartedTask(const ClientId& id) const;
  uint32_t currentRound() const { return state_.round; }
  uint64_t modelVersion() const { return state_.version; }
  const std::vector<float>& params() const override { return params_; }
  size_t connectedClients() const;
  // Waiting for clients (between rounds, before the first): how many idle connected clients
  // there are of the `needed` a round starts with, and who is connected. `waiting` is false
  // while a round runs or after the run ended.
  struct WaitingStatus {
    bool waiting = false;
    size_t idle = 0;
    size_t available = 0;  // of the idle, those that may be sampled (online, in the block)
    size_t needed = 0;
    double since = 0;                 // when the wait began
    std::vector<ClientId> connected;  // ordered by id
  };
  // `now`: the time availability is judged at (the last event's when unknown).
  WaitingStatus waitingStatus(std::optional<double> now = std::nullopt) const;
  // The partition `id` trains (-1: unknown client, or partitions are sampled per task).
  int32_t partitionOf(const ClientId& id) const override;
  // The bound the next synchronous settlement judges an update's delta norm against: norm_bound
  // x the reference norm of the rounds settled before (protocol step 8a). None before the first
  // round settled (it is judged against its own lower median) or with the bound off. For tests
  // and the simulator's attacking clients (sim.attack = "inside_bound").
  std::optional<double> normBound() const;
  // Whether `id` is in quarantine for the next round a task is sent for (protocol step 2).
  bool quarantined(const ClientId& id) const;
  // Upload credits: tasks holding a grant now, requests waiting for one, and the most grants
  // ever held at once in this run.
  size_t uploadsInFlight() const { return credits_.inFlight(); }
  size_t uploadsWaiting() const { return credits_.waiting(); }
  size_t peakUploadsInFlight() const { return credits_.peakInFlight(); }
  // Task tokens remembered as answered (stale or unknown): bounded by the tasks of recent rounds
  // and kUnknownTokensKept, whatever clients send.
  size_t answeredTokens() const { return answered_stale_.size() + answered_unknown_.size(); }

 private:
  using Phase = EnginePhase;
  using UpdateState = engine::UpdateState;

  using ClientState = engine::ClientState;
  using Participant = engine::Participant;

  // Runs settleCredits() when an entry point returns, whichever way it returns.
  class SettleCreditsOnExit {
   public:
    SettleCreditsOnExit(RoundEngine* engine, double now) : engine_(engine), now_(now) {}
    ~SettleCreditsOnExit() {
      engine_->mode_->afterEvent(now_);
      engine_->settleCredits(now_);
    }
    SettleCreditsOnExit(const SettleCreditsOnExit&) = delete;
    SettleCreditsOnExit& operator=(const SettleCreditsOnExit&) = delete;

   private:
    RoundEngine* engine_;
    double now_;
  };

  // ---- RoundContext (engine/round_context.h): what the round modes and the commit pipeline
  // (engine/round_mode.h, engine/commit_pipeline.h) see of the engine ----
  const EngineOptions& options() const override { return options_; }
  RoundState& state() override { return state_; }
  std::mt19937_64& rng() override { return rng_; }
  Aggregator& aggregator() override { return *aggregator_; }
  const ServerOptimizer& optimizer() const override { return *optimizer_; }
  UpdateAssembler& assembler() override { return assembler_; }
  DeadlinePolicy& deadlines() override { return *deadline_; }
  NormReference& normReference() override { return norm_ref_; }
  RoundMode& mode() override { return *mode_; }
  CommitPipeline& commits() override { return commits_; }
  CentralDp* dp() override { return dp_.get(); }
  BlockCoordinator* blocks() override { return blocks_.get(); }
  uint64_t cohortSampleScale(const std::vector<ClientId>& cohort) const override;
  void countRejection(const std::string& why) override { ++round_rejections_[why]; }
  const std::string& stepFailure() const override { return step_failure_; }
  void countLocalDpReleases() override;
  void closeRound(uint32_t round) override;
  void ageTokens(uint32_t round) override;
  history::CheckpointRecord checkpoint() const override;
  ModelSnapshot snapshotModel() const override;
  void restoreModel(const ModelSnapshot& snapshot) override;
  void cancelPending(const std::string& reason) override;
  void upsertClientsOf(const CommitRound& c) override;

  void emit(Action action) override { actions_.push_back(std::move(action)); }
  // Upload credits (engine/upload_credits.h): drops the grants and queued requests of tasks no
  // longer pending, then grants queued requests in order while credits are free.
  void settleCredits(double now);
  // The last sign of an upload in progress of a pending task: its grant or its last chunk
  // (nothing: no such pending task).
  std::optional<double> lastUploadActivity(uint64_t token) const;
  void event(const std::string& kind, const ClientId& client, const std::string& detail,
             double now) override;
  void tryStartRound(double now) override;
  // Starts a round (or, asynchronous, a server step's tasks): RoundMode::startRound.
  void startRound(double now);
  // The client row of `id` as the history keeps it, seen last at `now`.
  history::ClientRecord clientRecord(const ClientId& id, const ClientState& c, double now) const;
  // The samples client `c` may be taken to hold (work sizing, its history row): what its Hello
  // says (data_size; 0: unknown), never above its partition's size where the coordinator knows
  // it, else never above max_samples_per_update.
  uint64_t dataSizeOf(const ClientState& c) const;
  void finishRun(bool ok, const std::string& message, double now) override;
  void rejectUpdate(Participant& p, uint64_t token, const std::string& why, double now) override;
  bool connected(const ClientId& id) const override;
  // Drops the kept payloads of an update that will not count (nothing of it was folded).
  void takeBack(Participant& p, uint64_t token, double now);
  void loseClient(const ClientId& id, const std::string& why, double now);
  // Builds and emits one task for `id` (idle) and registers it as a participant.
  void dispatch(const ClientId& id, uint32_t partition, double deadline_s, double now) override;
  // Tells the selector how a finished participant fared.
  void feedback(const Participant& p, double now) override;
  // History row of a finished participant; `weight` is its share of the aggregate.
  history::UpdateRecord updateRecord(const Participant& p, double weight,
                                     double now) const override {
    return engine::updateRecord(p, options_.run_id, state_.round, weight, now);
  }
  // Ends a still-pending participant at `now`: late (cancelled) when connected, else dropped.
  void expire(Participant& p, uint64_t token, const std::string& why, double now) override;
  // The norm bound's verdict on an update of L2 norm `norm` against the median `median`:
  // the scale to apply (1: within the bound), or nullopt when it must be rejected.
  std::optional<double> normBoundScale(double norm, double median, bool clippable) const override;
  // Events: the rows of one client past its budget (engine/event_budget.h) are left out and
  // counted; at the end of a round (or server step) one "events_left_out" row per such client
  // whose budget allows it.
  void flushLeftOutEvents(double now) override;
  // Values an update holds: the model's P, or 2P with SCAFFOLD (delta, then control delta).
  uint64_t updateSize() const override { return aggregator_->updateSize(); }
  // Median and trimmed mean: a completed update goes to the aggregator's buffer (clip_norm
  // applied). An error (a spill that failed, a log that cannot be read back) is returned for
  // rejection.
  Status bufferComplete(Participant& p, uint64_t token);
  // x <- server optimiser step on this round's pseudo-gradient; false when it is not usable
  // (step_failure_ says why): an aggregate that is not finite, or a step that would make the
  // model (or SCAFFOLD's control variate) non-finite. Refused, it changes nothing: model,
  // optimiser state and control variate are as before.
  bool applyServerStep(uint32_t completed);
  // x <- optimiser step on the pseudo-gradient g (P values), unless the result is not finite:
  // then model and optimiser state are restored, step_failure_ says so, and false.
  bool stepModel(const float* g) override;
  // Learns a completed client's speed (adaptive steps) and durations (percentile deadline).
  void learnFromCompletion(ClientState& c, const Participant& p, double now);
  Participant* participantFor(const ClientId& id, uint64_t token, double now);
  // Up to k idle clients that may be sampled at `now`, clients in quarantine left out; when
  // that leaves fewer than min(k, at_least), the draw is made again with them in (a quarantine
  // never keeps a round from its quorum).
  std::vector<ClientId> sampleIdle(size_t k, double now, size_t at_least) override;
  void refreshIdle(const ClientId& id, const ClientState& c);
  // Keeps assigned_partitions_ in step with `c`'s partition and Hello.
  void notePartition(const ClientId& id, const ClientState& c);
  ClientState& addClient(const ClientId& id, const wire::Hello& hello, double now);
  void refreshModelBytes() override;
  uint64_t newToken();
  // Whether the next task dispatched asks for a federated evaluation of its model (the round's
  // number and how many of its tasks asked already; fed_eval_every, fed_eval_clients).
  bool fedEvalDue();

  // ---- Block-cyclic training (engine/block_coordinator.h; round_engine.cc, section "Blocks") --
  bool blocksOn() const { return blocks_ != nullptr; }
  // Whether `id` may train in the current block.
  bool inCurrentBlock(const ClientId& id) const;
  // Records `round`'s failure (event "round_failed" with `detail`) and keeps why, with the
  // round's rejections, for the run's stop after max_failed_rounds in a row.
  void roundFailed(uint32_t round, const std::string& detail, double now) override;
  // After a round's row is committed: counts it failed or not, in round order, and ends the run
  // (RunFinished with ok = false) when options_.max_failed_rounds rounds in a row have failed,
  // naming the clients whose updates were clipped or rejected most in those rounds.
  void countRoundOutcome(uint32_t round, bool failed, double now) override;
  // The norm bound's verdict on `client`'s update (protocol step 8a; FedBuff at completion):
  // `flagged` (clipped or rejected) is a strike that may start a quarantine (event
  // "client_quarantined"), an update within the bound clears the client's strikes.
  void noteNormVerdict(const ClientId& client, bool flagged, double now) override;
  // `client`'s update of this round was clipped or rejected (the suspects of a run's stop).
  void noteFlagged(const ClientId& client) { ++round_flagged_[client]; }
  // At the end of round `round`: keeps its flagged clients until the round is counted.
  void closeFlagged(uint32_t round);
  // Idle clients that may be sampled at `now` (eligible, in the current block).
  size_t availableIdle(double now) const;
  // The server step of this round, applied to the chain the round trains.
  bool applyRoundStep(uint32_t completed) override;
  bool blocksPending() const override { return blocks_ && blocks_->pending(); }
  // Serving (protocol step B6): names the current block's served model in `task` and, when
  // client `c` does not have it and it is not the task's model, returns its bytes to attach.
  std::shared_ptr<const std::string> serve(Participant& p, wire::Task& task);
  // A summary's report on the served model: into the participant's summary, or, when the
  // client holds another one, forget what it was sent (it gets it again next time).
  void takeServedReport(Participant& p, const wire::Summary& summary, double now);

  EngineOptions options_;
  std::vector<float> params_;
  std::mt19937_64 rng_;  // selection (task tokens come from crypto::randomToken)

  RoundState state_;  // phase, round, version, participants, running sum

  ClientTable clients_;  // every client known, and the uniform draw among the idle ones
  // Blocks: the served model each client was last sent (erased when it may have lost it).
  std::map<ClientId, std::optional<wire::Sha256>> served_sha_;
  // The clients of clients_ whose partition the coordinator chose rather than the one their
  // Hello asked for, with it (notePartition): what a checkpoint keeps of them, without walking
  // a fleet of millions every round.
  std::map<ClientId, int32_t> assigned_partitions_;
  PartitionBook partitions_{options_.num_partitions};  // assigned at Hello, kept over restarts
  Eligibility eligible_;
  std::unique_ptr<Selector> selector_;  // null: uniform rank sampling
  std::unique_ptr<ServerOptimizer> optimizer_;
  std::unique_ptr<Aggregator> aggregator_;
  std::unique_ptr<DeadlinePolicy> deadline_;
  std::unique_ptr<RoundMode> mode_;  // synchronous or buffered asynchronous rounds
  // Tokens of ended tasks (stale), and stale tokens already answered once: of the last
  // kStaleTokenRounds rounds only (engine/recent_tokens.h).
  static constexpr uint32_t kStaleTokenRounds = 32;
  RecentTokens finished_tokens_{kStaleTokenRounds};
  RecentTokens answered_stale_{kStaleTokenRounds};
  // Tokens this engine never issued, answered once each: of the current round only, and at
  // most kUnknownTokensKept of them (a client inventing tokens is answered every time beyond
  // that, within its event budget, rather than growing the set).
  static constexpr size_t kUnknownTokensKept = 4096;
  RecentTokens answered_unknown_{1};
  UpdateAssembler assembler_;  // chunk checks and the kept payloads, until settled
  UploadCredits credits_;
  WorkSizer work_;  // adaptive steps, partial work
  // options_.codec and options_.slow_link_codec, parsed once (checkEngineOptions refuses
  // ones that do not parse); a task's codec is its round's form of one of them.
  compress::CodecSpec codec_spec_;
  std::optional<compress::CodecSpec> slow_link_codec_spec_;

  EventBudget event_budget_{options_.events_per_client_round, options_.events_burst,
                            options_.events_every_s};
  // The norm bound's reference from the rounds settled before, and the clients it flagged in a
  // row (both saved with the engine state).
  NormReference norm_ref_{options_.norm_window, options_.norm_growth};
  Quarantine quarantine_{options_.quarantine_after, options_.quarantine_rounds};
  // Updates clipped or rejected, by client: this round's; each round's until it is counted;
  // and those of the failed rounds in a row, which a stop after max_failed_rounds names.
  std::map<ClientId, uint32_t> round_flagged_;
  std::map<uint32_t, std::map<ClientId, uint32_t>> flagged_by_round_;
  std::map<ClientId, uint32_t> flagged_in_row_;
  uint32_t fed_eval_round_ = 0;  // the round fed_eval_asked_ counts the tasks of
  uint32_t fed_eval_asked_ = 0;  // its tasks that asked for a federated evaluation
  std::string step_failure_;     // why the last server step was refused
  // Rounds that failed one after another, and why the latest did (max_failed_rounds ends the
  // run); this round's rejected updates, counted by reason, for that message.
  uint32_t failed_in_row_ = 0;
  std::string last_failure_;
  std::map<std::string, uint32_t> round_rejections_;
  // Rounds are counted in round order, whatever order their rows are committed in (a failed
  // round is committed at once, an ok one after its evaluation): outcomes waiting for the
  // rounds before them, and the next round to count.
  std::map<uint32_t, std::pair<bool, std::string>> outcomes_waiting_;
  uint32_t next_round_counted_ = 0;

  // params_ as bytes; a new buffer per model version (never changed in place: sent tasks may
  // still reference the old one).
  std::shared_ptr<const std::string> model_bytes_;
  wire::Sha256 model_sha_{};
  std::vector<Action> actions_;

  std::unique_ptr<BlockCoordinator> blocks_;  // null: no blocks
  std::unique_ptr<CentralDp> dp_;             // null: no differential privacy
  uint32_t configured_rounds_ = 0;            // run.rounds before the privacy budget's limit
  // Local DP after a resume: the most releases of any client before it, counted for every
  // client (their own counts were not kept), so no client's epsilon is under-stated.
  uint64_t dp_release_floor_ = 0;
  // Evaluations awaited, snapshots, commits and roll-backs (steps 9, 10, 10a).
  CommitPipeline commits_{*this, options_};
};

}  // namespace fedfleet::engine
