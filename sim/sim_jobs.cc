#include "sim/sim_jobs.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "client/batched_trainer.h"
#include "client/client_session.h"
#include "client/trainer.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"

namespace fedfleet::sim {

Result<c10::Device> deviceOf(const std::string& name) {
  if (name.empty() || name == "cpu") return c10::Device(c10::kCPU);
  if (name == "cuda") {
    if (!torch::cuda::is_available()) {
      return invalidArgument(
          "sim.device = \"cuda\" but this process sees no CUDA device (a CPU-only LibTorch, or "
          "no GPU): set sim.device = \"cpu\"");
    }
    return c10::Device(c10::kCUDA, 0);
  }
  return invalidArgument("sim.device: unknown device \"" + name + "\" (cpu or cuda)");
}

wire::SimModelRecipe modelRecipeOf(const config::Config& config, const model::InputShape& shape) {
  return {config.model.name,
          config.model.path,
          config.run.seed,
          shape.sample,
          shape.classes,
          wire::parseLoss(config.train.loss).value(),  // validated
          config::choiceName(config.sim.device)};
}

Result<model::Model*> workerModel(const wire::SimModelRecipe& recipe) {
  thread_local std::unique_ptr<model::Model> model;
  thread_local std::string key;
  const std::string want = recipe.name + "|" + recipe.path;
  if (!model || key != want) {
    model::InputShape shape;
    shape.sample = recipe.sample_shape;
    shape.classes = recipe.classes;
    FEDFLEET_ASSIGN_OR_RETURN(model,
                              model::createModel(recipe.name, recipe.seed, recipe.path, shape));
    key = want;
  }
  model->setLoss(recipe.loss);
  return model.get();
}

namespace {

wire::SimEvaluation evaluationOf(const Result<model::EvalResult>& e) {
  wire::SimEvaluation out;
  if (!e.isOk()) {
    out.status = e.status();
    return out;
  }
  out.n = e->n;
  out.loss = e->loss;
  out.accuracy = e->accuracy;
  out.metrics = model::namedMetrics(*e);
  return out;
}

// `params` on the held-out samples of client k. A client that holds none: n = 0 when
// `empty_is_none` (federated evaluation), else what evaluateIndices says of no samples.
wire::SimEvaluation evaluateHeldOut(model::Model& model, const FleetData& data, uint64_t k,
                                    const std::vector<float>& params, const c10::Device& device,
                                    bool empty_is_none) {
  Result<ClientShard> held = data.heldOut(k);
  if (!held.isOk()) return evaluationOf(held.status());
  if (empty_is_none && held->indices.empty()) return wire::SimEvaluation{};
  if (Status st = model.setFlatParameters(params); !st.isOk()) return evaluationOf(st);
  return evaluationOf(model::evaluateIndices(model, *held->data, held->indices, 1000, device));
}

// A train job's inputs, ready for a trainer: what runTrainJob and runTrainJobs share.
struct PreparedJob {
  c10::Device device = c10::Device(c10::kCPU);
  model::Model* model = nullptr;  // the calling thread's model for the job's recipe
  std::chrono::steady_clock::time_point t0;
  ClientShard shard;
  std::vector<float> start, server_c;
  client::TrainOptions opts;  // its SCAFFOLD controls point at server_c and job.control_ck
  wire::SimTrainResult out;   // the federated evaluation before training, when asked
};

// Everything of `job` before training, the federated evaluation included. `p` must stay where
// it is: p.opts points into it.
Status prepare(const wire::SimTrainJob& job, const FleetData& data, PreparedJob& p) {
  FEDFLEET_ASSIGN_OR_RETURN(p.device, deviceOf(job.recipe.device));
  FEDFLEET_ASSIGN_OR_RETURN(p.model, workerModel(job.recipe));
  p.t0 = std::chrono::steady_clock::now();
  FEDFLEET_ASSIGN_OR_RETURN(p.shard, data.shard(job.client));
  if (!job.start) return invalidArgument("simulator job without a start model");
  p.start = client::floatsOf(*job.start);
  if (job.fed_eval)
    p.out.fed_evaluation = evaluateHeldOut(*p.model, data, job.client, p.start, p.device, true);
  client::TrainOptions& opts = p.opts;
  static_cast<wire::LocalSgd&>(opts) = job;
  opts.precision = job.precision;
  if (job.scaffold) {
    if (!job.control_c) return invalidArgument("SCAFFOLD simulator job without the server's c");
    p.server_c = client::floatsOf(*job.control_c);
    opts.scaffold = {&p.server_c, &job.control_ck};
  }
  return Status::ok();
}

// The job's result from its training: the numbers, the wall time (`wall_seconds`, or the time
// since p.t0 when negative), then the served model's evaluation when asked.
wire::SimTrainResult complete(const wire::SimTrainJob& job, const FleetData& data, PreparedJob& p,
                              client::TrainResult r, double wall_seconds) {
  wire::SimTrainResult out = std::move(p.out);
  out.steps = r.steps;
  out.stopped_early = r.stopped_early;
  out.mean_loss = r.mean_loss;
  out.sum_sq_loss = r.sum_sq_loss;
  out.delta = std::move(r.delta);
  out.control_delta = std::move(r.control_delta);
  out.wall_seconds =
      wall_seconds >= 0
          ? wall_seconds
          : std::chrono::duration<double>(std::chrono::steady_clock::now() - p.t0).count();
  if (job.served) {
    out.served_evaluation =
        evaluateHeldOut(*p.model, data, job.client, client::floatsOf(*job.served), p.device, false);
  }
  return out;
}

Result<wire::SimTrainResult> train(const wire::SimTrainJob& job, const FleetData& data,
                                   const std::atomic<bool>* stop) {
  PreparedJob p;
  FEDFLEET_RETURN_IF_ERROR(prepare(job, data, p));
  client::Trainer trainer(p.device);
  FEDFLEET_ASSIGN_OR_RETURN(client::TrainResult r, trainer.train(*p.model, p.start, *p.shard.data,
                                                                 p.shard.indices, p.opts, stop));
  return complete(job, data, p, std::move(r), -1);
}

Result<wire::SimTrainResult> trainCustom(const wire::SimTrainJob& job, uint64_t round,
                                         const FleetData& data, const CustomTrainer& trainer,
                                         const std::atomic<bool>* stop) {
  PreparedJob p;
  FEDFLEET_RETURN_IF_ERROR(prepare(job, data, p));
  const model::Layout layout = p.model->layout();
  CustomTrainJob custom;
  custom.client = job.client;
  custom.round = round;
  custom.layout = &layout;
  custom.start = &p.start;
  custom.data = p.shard.data.get();
  custom.indices = &p.shard.indices;
  custom.options = &p.opts;
  FEDFLEET_ASSIGN_OR_RETURN(client::TrainResult r, trainer(custom, stop));
  if (r.delta.size() != p.start.size()) {
    return internalError("a custom trainer returned " + std::to_string(r.delta.size()) +
                         " values for a model of " + std::to_string(p.start.size()));
  }
  if (p.opts.usesScaffold()) {
    r.control_delta = client::scaffoldControlDelta(p.server_c, r.delta, r.steps, p.opts.lr,
                                                   client::parameterValues(layout));
  }
  return complete(job, data, p, std::move(r), -1);
}

wire::SimTrainResult failedWith(Status st) {
  wire::SimTrainResult failed;
  failed.status = std::move(st);
  return failed;
}

}  // namespace

wire::SimEvalPiece pieceOf(const model::EvalResult& r) {
  wire::SimEvalPiece p;
  const auto rn = static_cast<double>(r.n);
  p.n = r.n;
  p.loss_sum = r.loss * rn;
  if (r.accuracy) {
    p.has_accuracy = true;
    p.correct = static_cast<uint64_t>(std::llround(*r.accuracy * rn));
  }
  for (const auto& [name, v] : model::namedMetrics(r)) p.metric_sums.emplace_back(name, v * rn);
  return p;
}

wire::SimTrainResult runTrainJob(const wire::SimTrainJob& job, const FleetData& data,
                                 const std::atomic<bool>* stop) {
  Result<wire::SimTrainResult> r = train(job, data, stop);
  if (!r.isOk()) return failedWith(r.status());
  return std::move(*r);
}

wire::SimTrainResult runCustomTrainJob(const wire::SimTrainJob& job, uint64_t round,
                                       const FleetData& data, const CustomTrainer& trainer,
                                       const std::atomic<bool>* stop) {
  Result<wire::SimTrainResult> r = trainCustom(job, round, data, trainer, stop);
  if (!r.isOk()) return failedWith(r.status());
  return std::move(*r);
}

std::vector<wire::SimTrainResult> runTrainJobs(const std::vector<const wire::SimTrainJob*>& jobs,
                                               const FleetData& data,
                                               const std::vector<const std::atomic<bool>*>& stops) {
  std::vector<wire::SimTrainResult> results(jobs.size());
  if (jobs.empty()) return results;
  const wire::SimModelRecipe& recipe = jobs.front()->recipe;
  const auto same_recipe = [&](const wire::SimModelRecipe& r) {
    return r.name == recipe.name && r.path == recipe.path && r.device == recipe.device &&
           r.sample_shape == recipe.sample_shape && r.classes == recipe.classes &&
           r.loss == recipe.loss;
  };
  // The batch: the jobs of the first job's recipe (one model serves them all); any other job
  // runs on its own afterwards (the thread's model is rebuilt for it).
  std::vector<std::unique_ptr<PreparedJob>> prepared(jobs.size());
  std::vector<size_t> batch, others;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!same_recipe(jobs[i]->recipe)) {
      others.push_back(i);
      continue;
    }
    auto p = std::make_unique<PreparedJob>();
    if (Status st = prepare(*jobs[i], data, *p); !st.isOk()) {
      results[i] = failedWith(st);
      continue;
    }
    prepared[i] = std::move(p);
    batch.push_back(i);
  }
  if (!batch.empty()) {
    std::vector<client::BatchedJob> batched;
    for (size_t i : batch) {
      const PreparedJob& p = *prepared[i];
      batched.push_back({&p.start, p.shard.data.get(), &p.shard.indices, p.opts,
                         i < stops.size() ? stops[i] : nullptr});
    }
    PreparedJob& first = *prepared[batch.front()];
    client::BatchedTrainer trainer(first.device);
    std::vector<Result<client::TrainResult>> trained = trainer.train(*first.model, batched);
    for (size_t b = 0; b < batch.size(); ++b) {
      const size_t i = batch[b];
      if (!trained[b].isOk()) {
        results[i] = failedWith(trained[b].status());
        continue;
      }
      const double share = trained[b]->compute_seconds;
      results[i] = complete(*jobs[i], data, *prepared[i], std::move(*trained[b]), share);
    }
  }
  for (size_t i : others)
    results[i] = runTrainJob(*jobs[i], data, i < stops.size() ? stops[i] : nullptr);
  return results;
}

Result<std::vector<wire::SimEvalPiece>> evaluateTestPieces(const wire::SimModelRecipe& recipe,
                                                           const std::vector<float>& params,
                                                           const data::Dataset& test,
                                                           uint64_t begin, uint64_t end,
                                                           uint32_t piece) {
  FEDFLEET_ASSIGN_OR_RETURN(const c10::Device device, deviceOf(recipe.device));
  FEDFLEET_ASSIGN_OR_RETURN(model::Model * model, workerModel(recipe));
  FEDFLEET_RETURN_IF_ERROR(model->setFlatParameters(params));
  if (end > test.size() || begin > end || piece == 0) {
    return invalidArgument("simulator evaluation job: samples [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ") of a test set of " +
                           std::to_string(test.size()));
  }
  std::vector<wire::SimEvalPiece> out;
  for (uint64_t b = begin; b < end; b += piece) {
    const uint64_t e = std::min<uint64_t>(end, b + piece);
    std::vector<uint32_t> idx(e - b);
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<uint32_t>(b + i);
    FEDFLEET_ASSIGN_OR_RETURN(model::EvalResult r,
                              model::evaluateIndices(*model, test, idx, idx.size(), device));
    out.push_back(pieceOf(r));
  }
  return out;
}

wire::SimEvalResult runEvalJob(const wire::SimEvalJob& job, const data::Dataset& test) {
  wire::SimEvalResult out;
  if (!job.params) {
    out.status = invalidArgument("simulator evaluation job without a model");
    return out;
  }
  auto pieces = evaluateTestPieces(job.recipe, client::floatsOf(*job.params), test, job.begin,
                                   job.end, job.piece);
  if (pieces.isOk()) {
    out.pieces = std::move(*pieces);
  } else {
    out.status = pieces.status();
  }
  return out;
}

wire::SimJobResult runJob(const wire::SimJob& job, const FleetData& data) {
  if (const auto* t = std::get_if<wire::SimTrainJob>(&job)) return runTrainJob(*t, data);
  const auto& e = std::get<wire::SimEvalJob>(job);
  if (!data.testSet()) {
    wire::SimEvalResult none;
    none.status = failedPrecondition("simulator evaluation job on a worker without a test set");
    return none;
  }
  return runEvalJob(e, *data.testSet());
}

}  // namespace fedfleet::sim
