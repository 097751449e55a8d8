// SecureAggregation: the round engine's side of SecAgg+ (common/secagg/secagg_server.h has the
// protocol stage by stage). One object per run; a SecAggServer per round. The coordinator sees
// the sum of the round's masked updates only: no code path here reads one client's upload for
// anything but adding it to that sum.
//
// How a synchronous round runs with it (engine/round_mode.cc):
//  - each task carries the client's place in the cohort (its index, in dispatch order), the
//    graph and threshold, and what to quantise by: (n_k / weight_scale) D_k clipped to
//    [-clip_range, clip_range], weight_scale the largest partition in the cohort, so the
//    weighted sum sum_k n_k D_k comes out of the masked sum; under FedNova the client also
//    divides by its a_k (common/fednova.h), so the sum is FedNova's sum_k n_k D_k / a_k, and
//    the engine records n_k and a_k from the update's declared steps at settlement;
//  - stages 1 and 2 (keys, shares) run while the clients train, each closing when every client
//    still in has answered or stage_timeout_s after it began; a client left out of U2 cannot
//    mask, and its task is rejected at once;
//  - stage 3 is the round's upload: masked chunks (uint32 payloads) go into the sum as they
//    arrive, under the engine's usual checks of offsets and claims; a summary completes one.
//    The chunks of an upload not yet complete are kept to take them back should it never
//    complete: in memory up to partial_buffer_bytes (coordinator.partial_buffer_mib, whose
//    PartialLog holds nothing of a masked update), beyond it in a temporary file;
//  - when the round's uploads end (every task completed or ended, the deadline, or the K-th
//    completion with over-selection), stage 4 asks the survivors for shares, closing when all
//    answered or stage_timeout_s later; then the sum is unmasked, decoded, and the round steps
//    like any FedAvg (or FedNova) round. Too few holders for some client: the round fails (event
//    "secagg_failed"), the model unchanged.
// Differential privacy under masks (engine/central_dp.h): the task carries the DP clip C, and
// each client clips its update to C at weight 1 before quantising (client/masked_upload.h); the
// unmasked sum is then a sum of clipped updates. dp.mode = "central": the coordinator adds
// N(0, (z C)^2) to it at the server step, as in the clear; "distributed": each client adds
// N(0, (z C)^2 / quorum) before masking, and the coordinator none.
// Not available with it (checkEngineOptions says why): robust aggregators and SCAFFOLD (no
// single masked sum), asynchronous rounds, blocks, adaptive clipping, codecs other than "none",
// sampled partitions.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/secagg/quantizer.h"
#include "common/secagg/secagg_server.h"
#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::engine {

struct EngineOptions;

struct SecAggOptions {
  bool enabled = false;      // secagg.mode = "secagg_plus"
  uint32_t neighbours = 0;   // k; 0: 2 ceil(log2 n) for a cohort of n
  uint32_t threshold = 0;    // t; 0: floor((k + 1) / 2) + 1
  double clip_range = 8.0;   // c: each weighted value clipped to [-c, c]
  uint32_t quant_range = 0;  // q; 0: the largest that K clients cannot overflow
  double stage_timeout_s = 30;
};

// kInvalidArgument (naming the option and why) when `options` ask for secure aggregation with
// something it cannot work with.
Status validateSecAggOptions(const EngineOptions& options);

class SecureAggregation {
 public:
  // For a run of `options` (validateSecAggOptions passed) on a model of `n_params` values.
  SecureAggregation(const EngineOptions& options, uint64_t n_params);

  // A message for the client of task `token`.
  using Outgoing = std::vector<std::pair<uint64_t, wire::SecAgg>>;

  // A new round of a cohort of `cohort` clients whose partitions hold at most `max_samples`
  // samples each; `graph_seed` relabels the neighbour graph.
  void startRound(uint64_t round, uint32_t cohort, uint64_t max_samples, uint64_t graph_seed,
                  double now);
  // The task fields for the next task dispatched (its index is the next in dispatch order).
  wire::SecAggTask taskFor(uint64_t token);
  bool active() const { return server_ != nullptr; }
  // The round's weight scale: a client weighs min(n_k, weight_scale) in the masked sum.
  double weightScale() const { return weight_scale_; }
  // The stage the round is in (kDone: no round).
  secagg::Stage stage() const { return server_ ? server_->stage() : secagg::Stage::kDone; }

  // A client's message for task `token` (its sender already matched to the task). An error
  // says why it is refused; the caller rejects that update.
  Status onMessage(uint64_t token, const wire::SecAgg& message, double now, Outgoing& out);
  // A masked chunk of task `token`: its payload as little-endian uint32 values.
  Status onMaskedChunk(uint64_t token, uint64_t offset, const std::string& payload,
                       uint64_t elements);
  // The update of task `token` completed (its summary passed the engine's checks).
  Status onCompleted(uint64_t token);
  // Task `token` will send nothing more (ended, or its client is gone): not waited for.
  void markGone(uint64_t token);
  // Whether task `token` takes part in the round's secure aggregation.
  bool holds(uint64_t token) const { return index_.count(token) > 0; }
  // Stages 1 and 2 at their deadline or complete: closes them, and returns in `out` what the
  // clients must be sent and in `left_out` the tasks that can no longer take part.
  void onTick(double now, Outgoing& out, std::vector<uint64_t>& left_out);
  // The next time onTick or the unmasking has something to do.
  std::optional<double> nextDeadline() const;
  // Whether the key stages are over (uploads can be taken).
  bool keysDone() const { return stage() == secagg::Stage::kMaskedInput; }

  // Stage 3 ends: the survivors are asked for their shares (in `out`).
  void beginUnmasking(double now, Outgoing& out);
  bool unmasking() const { return stage() == secagg::Stage::kUnmask; }
  // Whether every survivor has answered (or the unmasking deadline passed at `now`).
  bool unmaskingDone(double now) const;
  // Ends the round: the sum of the survivors' (n_k / weight_scale) D_k decoded and scaled back
  // to sum_k n_k D_k into `sum` (P values), or why not (the round fails). The round is over
  // either way.
  Status finish(std::vector<float>& sum);
  // Tasks whose masked input is in the sum (valid between beginUnmasking and finish).
  std::vector<uint64_t> survivors() const;
  // Drops the round (aborted).
  void clear();

 private:
  uint32_t indexOf(uint64_t token) const;
  wire::SecAgg toClient(uint32_t index, wire::SecAggStep step) const;
  void closeStage(double now, Outgoing& out, std::vector<uint64_t>& left_out);

  // Constant after construction.
  const SecAggOptions options_;
  const uint64_t n_params_;
  const uint32_t max_cohort_;
  const uint64_t in_flight_memory_bytes_;  // SecAggServer's in-memory budget of masked chunks
  double dp_clip_ = 0;          // central or distributed DP: each client's L2 clip (0: off)
  double dp_noise_stddev_ = 0;  // distributed DP: the standard deviation of the noise it adds
  bool fednova_ = false;        // clients divide their weight by FedNova's a_k
  double fednova_momentum_ = 0;

  // The round's.
  std::unique_ptr<secagg::SecAggServer> server_;
  secagg::QuantizerOptions quant_;
  double weight_scale_ = 1;
  std::map<uint64_t, uint32_t> index_;  // task token -> index
  std::vector<uint64_t> tokens_;        // index -> task token
  double stage_started_ = 0;
};

}  // namespace fedfleet::engine
