// The simulator's worker jobs (common/wire/sim_job.h), run.
//
// One function per kind of job, pure apart from the calling thread's model (built from the
// job's recipe on first use and reused by every later job on that thread: each job sets the
// parameters it needs first, so nothing carries over). The in-process worker pool and the MPI
// worker ranks (sim/mpi_workers.h) call the same functions on the same job descriptions, so a
// job computes the same bits wherever it runs (one LibTorch thread per worker, both ways).
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"
#include "common/wire/sim_job.h"
#include "sim/fleet_data.h"

namespace fedfleet::sim {

// One virtual client's local training from job.start on its shard of `data` (with the
// federated evaluation before it and the served model's evaluation after it when the job asks).
// A failure is the result's status (kInvalidArgument for a device this build cannot use).
// `stop`, when non-null, ends training early as client::Trainer::train says (the in-process
// pool's abandoned tasks; an MPI worker runs each job to its end).
wire::SimTrainResult runTrainJob(const wire::SimTrainJob& job, const FleetData& data,
                                 const std::atomic<bool>* stop = nullptr);

// A virtual client's training by the caller's own code (a Python client's fit) in place of
// client::Trainer: what the code is given. The references live until it returns.
struct CustomTrainJob {
  uint64_t client = 0;  // the virtual client's index
  uint64_t round = 0;
  const model::Layout* layout = nullptr;  // the model's flat layout (names, shapes, offsets)
  const std::vector<float>* start = nullptr;
  const data::Dataset* data = nullptr;  // the client's shard: samples `indices` of `data`
  const std::vector<uint32_t>* indices = nullptr;
  const client::TrainOptions* options = nullptr;  // epochs, lr, prox_mu, seed, SCAFFOLD's c, c_k
};
// Returns the delta (trained - start, in the layout), steps, mean_loss and n_samples; the
// simulator adds SCAFFOLD's control delta (client::scaffoldControlDelta of the steps). Called
// on a worker thread; `stop`, when non-null, asks it to end early.
using CustomTrainer = std::function<Result<client::TrainResult>(const CustomTrainJob& job,
                                                                const std::atomic<bool>* stop)>;
// runTrainJob with `trainer` in place of client::Trainer (the evaluations before and after
// are the same).
wire::SimTrainResult runCustomTrainJob(const wire::SimTrainJob& job, uint64_t round,
                                       const FleetData& data, const CustomTrainer& trainer,
                                       const std::atomic<bool>* stop);

// Several virtual clients' jobs trained together (client::BatchedTrainer: one batched
// computation for the jobs of one recipe; sim.batch_clients), results in the order of `jobs`,
// each what runTrainJob would return up to float rounding (its evaluations before and after
// run per client, as runTrainJob runs them). stops[i] (may be null, or `stops` shorter) is job
// i's stop flag. A job of another recipe than the first runs on its own through runTrainJob.
// wall_seconds of a batched job is its share of the batch's training time (see
// BatchedTrainer::train).
std::vector<wire::SimTrainResult> runTrainJobs(const std::vector<const wire::SimTrainJob*>& jobs,
                                               const FleetData& data,
                                               const std::vector<const std::atomic<bool>*>& stops);

// The server's evaluation of job.params over test samples [job.begin, job.end) of `test`, in
// pieces of job.piece samples.
wire::SimEvalResult runEvalJob(const wire::SimEvalJob& job, const data::Dataset& test);
// The same with the parameters as floats (the in-process pool's jobs share the engine's copy).
Result<std::vector<wire::SimEvalPiece>> evaluateTestPieces(const wire::SimModelRecipe& recipe,
                                                           const std::vector<float>& params,
                                                           const data::Dataset& test,
                                                           uint64_t begin, uint64_t end,
                                                           uint32_t piece);

// The calling thread's model for `recipe`, built on first use and reused by every later job on
// that thread (each sets the parameters it needs first).
Result<model::Model*> workerModel(const wire::SimModelRecipe& recipe);
// The device a recipe names ("cpu", "cuda"); kInvalidArgument for one this process cannot use.
Result<c10::Device> deviceOf(const std::string& name);
// The recipe of the run's model (config [model], run.seed, train.loss, sim.device) for data of
// `shape`: what a worker builds its model from.
wire::SimModelRecipe modelRecipeOf(const config::Config& config, const model::InputShape& shape);

// Either, as the job says (the worker ranks' entry point).
wire::SimJobResult runJob(const wire::SimJob& job, const FleetData& data);

// Sums of one piece's evaluation (loss and correct answers times n, each metric times n).
wire::SimEvalPiece pieceOf(const model::EvalResult& r);

}  // namespace fedfleet::sim
