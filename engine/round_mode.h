// RoundMode: how rounds begin and end (protocol steps 2, 7 and 9 in round_engine.h), chosen
// once from EngineOptions::async and secagg.enabled:
//   SynchronousRounds    a round samples K clients (over-selected when asked), gives them the
//                        DeadlinePolicy's deadline, and ends when every participant is done, at
//                        the K-th completion with over-selection, or at the deadline; the round
//                        settled (step 8a: norm bound, clip_norm, weight cap, then every kept
//                        update folded in dispatch order) and stepped; the next round starts
//                        once this one ended.
//   BufferedAsyncRounds  FedBuff (Nguyen et al., AISTATS 2022): at most async_concurrency tasks
//                        in flight, each with its own deadline; a completed update is weighed by
//                        its staleness and folded at once; every async_buffer updates make one
//                        server step, recorded as a "round".
//   SecureRounds         synchronous rounds under secure aggregation (SecAgg+): key stages
//                        while the clients train, masked chunks into a masked sum, an
//                        unmasking stage after the uploads; the round settles on the unmasked
//                        sum of the survivors.
// The engine core keeps the clients, participants, tokens and actions and calls the mode at the
// points where they differ. A mode reaches the engine through its RoundContext
// (engine/round_context.h): it works on the round's participants and running sum there
// (RoundState) rather than on copies of them, and asks the core to dispatch, expire and step.
// A further mode (an evaluation-only round, say) is a further subclass. One owner: not
// thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/history/records.h"
#include "common/status.h"
#include "engine/actions.h"
#include "engine/participant.h"
#include "engine/round_context.h"
#include "engine/secure_aggregation.h"

namespace fedfleet::engine {

struct EngineOptions;

class RoundMode {
 public:
  // The mode of `options` for the engine behind `context` (which outlives it).
  static std::unique_ptr<RoundMode> create(RoundContext& context, const EngineOptions& options);
  explicit RoundMode(RoundContext& context) : ctx_(context), s_(context.state()) {}
  virtual ~RoundMode() = default;
  RoundMode(const RoundMode&) = delete;
  RoundMode& operator=(const RoundMode&) = delete;

  // The engine may start a round (it waits, enough clients are idle): starts one at `now`.
  virtual void startRound(double now) = 0;
  // A client became idle and connected while a round runs (asynchronous: a task can go out).
  virtual void clientsAvailable(double /*now*/) {}
  // The round number the selector is told for a task sent now.
  virtual uint32_t selectionRound() const = 0;
  // Task `token` (pending until a moment ago) was dropped or rejected: its record and feedback
  // where the mode keeps them at once (asynchronous), which may end the participant.
  virtual void taskEnded(uint64_t /*token*/, double /*now*/) {}
  // A task's slot is free (a task ended, a client left): refill (asynchronous) or see whether
  // the round is over (synchronous).
  virtual void slotFreed(double now) = 0;
  // Synchronous: ends the round when no participant is pending, or at the K-th completion with
  // over-selection.
  virtual void finishIfDone(double /*now*/) {}
  // A summary completed task `token`'s update (its client already idle again): counts it.
  virtual void completed(uint64_t token, double now) = 0;
  // Whether a completed update goes to a buffering aggregator at once (synchronous rounds).
  virtual bool buffersCompleted() const = 0;
  // Time passed while running: deadlines.
  virtual void onTick(double now) = 0;
  // The next deadline while running (nothing: none).
  virtual std::optional<double> nextDeadline() const = 0;
  // A server step ended, and the run goes on: the next round (or step) begins.
  virtual void afterStep(double now) = 0;
  // The model the running round trained from was refused (step 10a): abort it with `reason`.
  virtual void abort(const std::string& reason, double now) = 0;

  // ---- Rounds of several message exchanges (secure aggregation: SecureRounds) --------------
  // Fills in what task `task` (its token set) needs of the round beyond the model.
  virtual void prepareTask(wire::Task& /*task*/) {}
  // Whether a pending, unstarted task may be sent again, unchanged, to a new connection of its
  // client (not when the round's key stages went to the old one).
  virtual bool resendsTasks() const { return true; }
  // Whether task `token`'s chunks are masked: the mode takes them (onMaskedChunk), not the
  // assembler's clear-text fold.
  virtual bool masks(uint64_t /*token*/) const { return false; }
  // A masked chunk of participant `p` (task `token`), checked by the assembler already: the
  // reason to reject the update, or nothing.
  virtual std::optional<std::string> onMaskedChunk(Participant& p, uint64_t token,
                                                   const wire::Chunk& chunk);
  // The summary of task `token` was accepted: the reason to reject the update, or nothing.
  virtual std::optional<std::string> onSummaryAccepted(uint64_t /*token*/) { return {}; }
  // A secure-aggregation message for pending participant `p`: the reason to reject its update,
  // or nothing.
  virtual std::optional<std::string> onSecAgg(Participant& p, const wire::SecAgg& message,
                                              double now);
  // Shares `id` revealed for its completed task (the task is finished but its round is being
  // unmasked). Refused (an event) when no such task is being unmasked.
  virtual void onReveal(const ClientId& id, const wire::SecAgg& message, uint64_t frame_bytes,
                        double now);
  // After every event the engine handled, before the credits settle.
  virtual void afterEvent(double /*now*/) {}

 protected:
  RoundContext& ctx_;
  RoundState& s_;  // ctx_.state()
};

class SynchronousRounds : public RoundMode {
 public:
  explicit SynchronousRounds(RoundContext& context) : RoundMode(context) {}
  void startRound(double now) override;
  uint32_t selectionRound() const override;
  void slotFreed(double now) override { finishIfDone(now); }
  void finishIfDone(double now) override;
  void completed(uint64_t token, double now) override;
  bool buffersCompleted() const override { return true; }
  void onTick(double now) override;
  std::optional<double> nextDeadline() const override;
  void afterStep(double now) override;
  void abort(const std::string& reason, double now) override;

 protected:
  // Ends the round in flight (steps 7, 8a, 8): expires what is pending, settles, steps and
  // hands the commit to the engine. With `abort_reason` every update (completed ones too) is
  // refused with that reason and the round fails.
  void finish(double now, const std::string* abort_reason = nullptr);
  // The fewest clients a round starts with.
  virtual size_t minCohort() const { return 1; }
  // The round's cohort `cohort` was sampled and the round state reset; its tasks go out next.
  virtual void cohortChosen(const std::vector<ClientId>& /*cohort*/, double /*now*/) {}
  // Settles the round's completed updates into the running sum (step 8a), unless it is
  // aborted: false when the round cannot end yet (its settlement waits for more messages);
  // `failure` set when the sum cannot be had (the round fails, the model unchanged).
  virtual bool settleRound(double now, const std::string* abort_reason, std::string* failure);
  // Linear aggregators, at the round's end (step 8a): norm bound, clip_norm and weight cap over
  // the completed updates, then every kept update folded into the running sum in dispatch order
  // with its final weight. An update the norm bound rejects is rejected here.
  void settle(double now);
  // settle() under differential privacy (engine/central_dp.h): each update clipped to the DP
  // clip and folded with weight 1; neither the norm bound nor the weight cap applies.
  void settlePrivately(double now);
  // Folds kept update `token` with weight `fold` into the running sum, adds its agg_weight to
  // the sum's weight, and gives its payload back.
  void foldKept(Participant& p, uint64_t token, double fold, double now);
  // A rejection at settlement: like RoundEngine::rejectUpdate, but the round is being settled
  // already.
  void rejectAtSettlement(Participant& p, uint64_t token, const std::string& why, double now);

  double round_deadline_ = 0;
};

// Synchronous rounds under secure aggregation (SecAgg+: engine/secure_aggregation.h, which this
// mode owns). A round is several message exchanges around the upload: the key stages while the
// clients train (each task names the round's graph and the client's neighbours), the masked
// chunks added to the masked sum, then, when the uploads are over, the unmasking stage, whose
// revealed shares give the sum of the survivors' updates; only then does the round settle and
// step. A round needs two clients (one client's masked sum would be its update). A stage that
// passes its deadline (secagg.stage_timeout_s) leaves out the clients it lacks.
class SecureRounds : public SynchronousRounds {
 public:
  explicit SecureRounds(RoundContext& context);
  void finishIfDone(double now) override;
  void onTick(double now) override;
  std::optional<double> nextDeadline() const override;
  void prepareTask(wire::Task& task) override;
  bool resendsTasks() const override { return !secagg_.active(); }
  bool masks(uint64_t token) const override { return secagg_.holds(token); }
  std::optional<std::string> onMaskedChunk(Participant& p, uint64_t token,
                                           const wire::Chunk& chunk) override;
  std::optional<std::string> onSummaryAccepted(uint64_t token) override;
  std::optional<std::string> onSecAgg(Participant& p, const wire::SecAgg& message,
                                      double now) override;
  void onReveal(const ClientId& id, const wire::SecAgg& message, uint64_t frame_bytes,
                double now) override;
  // Tasks that ended are no longer waited for, key stages close at their deadlines (tasks left
  // out are rejected), and a finished unmasking ends the round.
  void afterEvent(double now) override;

 private:
  size_t minCohort() const override { return 2; }
  void cohortChosen(const std::vector<ClientId>& cohort, double now) override;
  bool settleRound(double now, const std::string* abort_reason, std::string* failure) override;
  // The unmasked sum of the survivors' updates, weighted by their claimed n_k; false, with
  // `failure` saying why, when it cannot be had.
  bool settleSecurely(double now, std::string* failure);
  // Sends the protocol's messages to the participants they are for.
  void send(SecureAggregation::Outgoing& out);

  SecureAggregation secagg_;
};

class BufferedAsyncRounds : public RoundMode {
 public:
  explicit BufferedAsyncRounds(RoundContext& context) : RoundMode(context) {}
  void startRound(double now) override;
  void clientsAvailable(double now) override { refill(now); }
  uint32_t selectionRound() const override;
  void taskEnded(uint64_t token, double now) override;
  void slotFreed(double now) override { refill(now); }
  void completed(uint64_t token, double now) override;
  bool buffersCompleted() const override { return false; }
  void onTick(double now) override;
  std::optional<double> nextDeadline() const override;
  void afterStep(double now) override;
  void abort(const std::string& reason, double now) override;

 private:
  // Keeps async_concurrency tasks in flight.
  void refill(double now);
  // The norm bound on a completing update against the last 2 x async_buffer completed norms:
  // its scale, or nothing to reject it (recorded either way).
  std::optional<double> normBound(uint64_t token, double now);
  // One server step from the buffer.
  void flush(double now);

  uint32_t buffered_ = 0;  // updates folded into the running sum
  CommitRound window_;     // its updates and states: those that ended during this step
  double window_start_ = 0;
  double window_loss_ = 0;           // sum of w(s) x mean loss of the buffered
  std::deque<double> recent_norms_;  // norms of the last completed updates
  // Since when no task is in flight and no client could be given one (unset: tasks run). No
  // client for wait_clients_s ends the run, as a synchronous run's wait for its cohort does.
  std::optional<double> starved_since_;
  // Tasks in a row that ended without an update the buffer took (late, dropped, rejected), and
  // how the latest ended: max_failed_rounds x async_buffer of them end the run, as that many
  // failed rounds end a synchronous one.
  void noteTaskEnd(const Participant& p, const std::string& how, double now);
  uint64_t unproductive_ = 0;
};

}  // namespace fedfleet::engine
