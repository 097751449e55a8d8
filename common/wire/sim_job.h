// The fleet simulator's worker jobs and their results, as plain structs and as bytes.
//
// A job is everything a worker needs, by value: one virtual client's local training (the model
// it starts from, its options, SCAFFOLD's controls, what to evaluate), or a stretch of the
// server's evaluation over the test set. A worker rebuilds the same data shards from the run's
// config, so a job names its client and never carries data. The in-process worker pool runs
// these structs as they are; the MPI backend (sim/mpi_workers.h) sends them between the ranks
// of one job with encodeSimJob/decodeSimJob. Ranks of one MPI job trust each other as threads
// of one process do, but decoding still never throws or aborts: a garbled job is a kCorrupt
// Status like any other frame.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::wire {

// How a worker builds the run's model (model::createModel) and on which device it trains.
struct SimModelRecipe {
  std::string name, path;  // model.name, model.path
  uint64_t seed = 0;       // run.seed: the initial weights (overwritten by every job)
  std::vector<int64_t> sample_shape;
  int64_t classes = 0;
  Loss loss = Loss::kCrossEntropy;
  std::string device = "cpu";  // sim.device
};

// One virtual client's training (client::Trainer::train) and its client-side evaluations.
// Its LocalSgd part is client::TrainOptions', which also has SCAFFOLD's pointers (below) and
// the device-delta switch.
struct SimTrainJob : LocalSgd {
  uint64_t client = 0;  // the shard trained: FleetData::shard(client)
  SimModelRecipe recipe;
  // Flat fp32 parameters it starts from (the task's model, with the client's model.local part).
  std::shared_ptr<const std::string> start;
  // SCAFFOLD: the server's c (fp32 bytes, as long as start) and the client's c_k.
  bool scaffold = false;
  std::shared_ptr<const std::string> control_c;
  std::vector<float> control_ck;
  bool fed_eval = false;  // evaluate `start` on the client's held-out data before training
  std::shared_ptr<const std::string> served;  // a served model to evaluate after (null: none)
  Precision precision = Precision::kFp32;     // sim.precision
};

// A model evaluated on a client's held-out data.
struct SimEvaluation {
  Status status;  // not OK: the evaluation failed (the numbers are unset)
  uint64_t n = 0;
  double loss = 0;
  std::optional<double> accuracy;
  std::vector<std::pair<std::string, double>> metrics;
};

struct SimTrainResult {
  Status status;  // not OK: training failed (nothing else is set)
  uint64_t steps = 0;
  bool stopped_early = false;
  double mean_loss = 0;
  double sum_sq_loss = 0;
  std::vector<float> delta;          // trained - start
  std::vector<float> control_delta;  // SCAFFOLD's Dc_k (empty otherwise)
  std::optional<SimEvaluation> fed_evaluation;
  std::optional<SimEvaluation> served_evaluation;
  double wall_seconds = 0;  // the training's host time (measured, never part of a history)
};

// The server's evaluation of `params` over test samples [begin, end), in pieces of `piece`
// samples (the last may be shorter), each piece's sums reported on its own so that the caller
// adds them in one fixed order whichever worker ran which stretch.
struct SimEvalJob {
  SimModelRecipe recipe;
  std::shared_ptr<const std::string> params;  // flat fp32
  uint64_t begin = 0, end = 0;
  uint32_t piece = 250;
};

struct SimEvalPiece {
  uint64_t n = 0;
  double loss_sum = 0;   // per-sample loss summed
  uint64_t correct = 0;  // correct predictions (has_accuracy)
  bool has_accuracy = false;
  std::vector<std::pair<std::string, double>> metric_sums;  // each metric times n
};

struct SimEvalResult {
  Status status;
  std::vector<SimEvalPiece> pieces;
};

using SimJob = std::variant<SimTrainJob, SimEvalJob>;
using SimJobResult = std::variant<SimTrainResult, SimEvalResult>;

// Bytes of a job or a result (Cap'n Proto, one message). A field over kMaxFieldBytes aborts
// (FEDFLEET_CHECK), as encode() does.
std::string encodeSimJob(const SimJob& job);
std::string encodeSimJobResult(const SimJobResult& result);
// The job or result of those bytes. kCorrupt for anything encodeSimJob / encodeSimJobResult did
// not write (truncated, a result where a job was expected, a model whose byte count is not a
// whole number of floats, an unknown loss, optimiser or precision); kResourceExhausted over limits.
Result<SimJob> decodeSimJob(std::string_view bytes, const DecodeLimits& limits = {});
Result<SimJobResult> decodeSimJobResult(std::string_view bytes, const DecodeLimits& limits = {});

}  // namespace fedfleet::wire
