// RoundContext: the engine core as its collaborators see it. The round modes
// (engine/round_mode.h) and the commit pipeline (engine/commit_pipeline.h) are handed one at
// construction and reach the engine only through it: the round state they change (RoundState),
// the policy objects they consult, and the steps of the protocol they ask the core to take
// (dispatch a task, expire one, record an event, step the model). RoundEngine implements it;
// nothing else of the engine (its clients, tokens, credits, events budget, selection) is
// visible to them. One owner: not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/history/records.h"
#include "engine/actions.h"
#include "engine/evaluation_backlog.h"
#include "engine/participant.h"
#include "engine/participant_table.h"

namespace fedfleet::engine {

class Aggregator;
class BlockCoordinator;
class CentralDp;
class CommitPipeline;
class DeadlinePolicy;
class NormReference;
class RoundMode;
class ServerOptimizer;
class UpdateAssembler;
struct EngineOptions;

// A model's evaluation, as the driver reports it (RoundEngine::onEvaluated).
struct EvalOutcome {
  double loss = 0;
  std::optional<double> accuracy;  // none: a regression (no classes to get right)
  // Further metrics by name: "mse" and "mae" for float targets, then the model's own.
  std::vector<std::pair<std::string, double>> metrics;
};

// kDraining: the last round awaits its commit; nothing new starts.
enum class EnginePhase { kIdle, kWaiting, kRunning, kDraining, kFinished };

// The round in flight, which the core, the round mode and the commit pipeline all change.
struct RoundState {
  EnginePhase phase = EnginePhase::kIdle;
  uint32_t round = 0;      // the round (or asynchronous server step) in flight, or the last one
  uint64_t version = 0;    // the model's version: one more per accepted step (and roll-back)
  double wait_since = 0;   // when the wait for clients began
  double round_start = 0;  // when the round in flight began
  ParticipantTable<Participant> participants;  // by task token, in dispatch order
  std::vector<float> sum;                      // running sum of the round's weighted updates
  double sum_weight = 0;
  bool sum_tainted = false;  // a kept update failed to fold: the sum is not usable
};

class RoundContext {
 public:
  // ---- What they read and change ---------------------------------------------------------
  virtual const EngineOptions& options() const = 0;
  virtual RoundState& state() = 0;
  // The current model (x; block-cyclic runs: the shared chain).
  virtual const std::vector<float>& params() const = 0;
  // Selection's generator (seeded; partitions drawn per round or per task).
  virtual std::mt19937_64& rng() = 0;

  // ---- Policy objects (engine/round_engine.h lists what each decides) --------------------
  virtual Aggregator& aggregator() = 0;
  virtual const ServerOptimizer& optimizer() const = 0;
  virtual UpdateAssembler& assembler() = 0;
  virtual DeadlinePolicy& deadlines() = 0;
  virtual NormReference& normReference() = 0;
  virtual RoundMode& mode() = 0;
  virtual CommitPipeline& commits() = 0;
  // Null when the run has no such policy.
  virtual CentralDp* dp() = 0;
  virtual BlockCoordinator* blocks() = 0;
  // Values an update holds: the model's P, or 2P with SCAFFOLD (delta, then control delta).
  virtual uint64_t updateSize() const = 0;

  // ---- Steps of the protocol the core takes ------------------------------------------------
  virtual void emit(Action action) = 0;
  // An event row (within the client's event budget).
  virtual void event(const std::string& kind, const ClientId& client, const std::string& detail,
                     double now) = 0;
  // Starts a round when the engine may (step 1: enough idle clients, no evaluation behind).
  virtual void tryStartRound(double now) = 0;
  virtual void finishRun(bool ok, const std::string& message, double now) = 0;
  // Up to k idle clients that may be sampled at `now`, quarantine honoured down to at_least.
  virtual std::vector<ClientId> sampleIdle(size_t k, double now, size_t at_least) = 0;
  // Whether `id` is known and connected.
  virtual bool connected(const ClientId& id) const = 0;
  // The partition `id` was assigned (-1: none).
  virtual int32_t partitionOf(const ClientId& id) const = 0;
  // Secure aggregation: the samples that scale the cohort's weights, the largest a client of
  // `cohort` may hold (its partition's size where known, else its bounded claim).
  virtual uint64_t cohortSampleScale(const std::vector<ClientId>& cohort) const = 0;
  // Builds and emits one task for `id` (idle) and registers it as a participant.
  virtual void dispatch(const ClientId& id, uint32_t partition, double deadline_s, double now) = 0;
  // Ends a still-pending participant: late (cancelled) when connected, else dropped.
  virtual void expire(Participant& p, uint64_t token, const std::string& why, double now) = 0;
  // Rejects pending or completed participant `p`'s update with `why` (recorded, its client told,
  // its task ended: the mode's taskEnded and slotFreed follow).
  virtual void rejectUpdate(Participant& p, uint64_t token, const std::string& why, double now) = 0;
  // Tells the selector how a finished participant fared.
  virtual void feedback(const Participant& p, double now) = 0;
  // The history row of a finished participant; `weight` is its share of the aggregate.
  virtual history::UpdateRecord updateRecord(const Participant& p, double weight,
                                             double now) const = 0;
  // The norm bound's verdict on an update (the scale to apply; nothing: reject it), and the
  // strike or clearance it is for its client.
  virtual std::optional<double> normBoundScale(double norm, double median,
                                               bool clippable) const = 0;
  virtual void noteNormVerdict(const ClientId& client, bool flagged, double now) = 0;
  // An update of this round was rejected for `why` (a failed round's message names the most
  // frequent reason).
  virtual void countRejection(const std::string& why) = 0;
  // Server steps: on this round's chain (blocks) or on x; `stepModel` on x with the
  // pseudo-gradient g. False when refused (stepFailure() says why); nothing changed then.
  virtual bool applyRoundStep(uint32_t completed) = 0;
  virtual bool stepModel(const float* g) = 0;
  virtual const std::string& stepFailure() const = 0;
  // A new model version's bytes and SHA-256 (after a step or a roll-back).
  virtual void refreshModelBytes() = 0;
  // Local differential privacy: every participant that sent anything was a release of its
  // client's; the most releases of any client go to the privacy accountant.
  virtual void countLocalDpReleases() = 0;
  // The end of round `round`: its failure (if it failed) is recorded ("round_failed"), its
  // rejection counts and norm-bound flags are closed, and the event rows its clients' budgets
  // left out are counted in one row each.
  virtual void roundFailed(uint32_t round, const std::string& detail, double now) = 0;
  virtual void closeRound(uint32_t round) = 0;
  virtual void flushLeftOutEvents(double now) = 0;

  // ---- For the commit pipeline -----------------------------------------------------------
  // Task tokens of rounds long past are forgotten (stale-token answers stay bounded).
  virtual void ageTokens(uint32_t round) = 0;
  // The checkpoint of the current model and engine state.
  virtual history::CheckpointRecord checkpoint() const = 0;
  // The model, optimiser and aggregator state before a step, and a return to it.
  virtual ModelSnapshot snapshotModel() const = 0;
  virtual void restoreModel(const ModelSnapshot& snapshot) = 0;
  // The run ends early: every pending task is cancelled with `reason`, participants cleared.
  virtual void cancelPending(const std::string& reason) = 0;
  // The client rows of a round's participants, seen up to their last message or update.
  virtual void upsertClientsOf(const CommitRound& c) = 0;
  // Block-cyclic runs: a block evaluation is still to be reported.
  virtual bool blocksPending() const = 0;
  // Counts a committed round failed or not, in round order (max_failed_rounds).
  virtual void countRoundOutcome(uint32_t round, bool failed, double now) = 0;

 protected:
  ~RoundContext() = default;
};

}  // namespace fedfleet::engine
