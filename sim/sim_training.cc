// The fleet simulator's training jobs: on the worker pool or the MPI ranks, batched
// (sim.batch_clients) or one by one, and their results back to the virtual clients.
#include "sim/simulator_impl.h"

namespace fedfleet::sim::internal {

namespace {

// A client-side evaluation as a worker job reports it, as the client's session takes it.
Result<client::ServedEvaluation> servedEvaluationOf(const wire::SimEvaluation& e) {
  if (!e.status.isOk()) return e.status;
  return client::ServedEvaluation{e.n, e.loss, e.accuracy, e.metrics};
}

}  // namespace

void Simulator::submitTraining(uint64_t token, InFlight& f, const client::TrainingRequest& r) {
  f.task_seed = r.task.hparams.seed;
  if (!std::isfinite(f.done_at)) return;  // a dropping straggler: it never reports
  f.stop = std::make_shared<std::atomic<bool>>(false);
  const uint64_t k = f.client;
  compress::ErrorFeedback* residual =
      compress::usesErrorFeedback(r.codec->spec()) ? &residuals_->of(k) : nullptr;
  model::LocalState* local = local_part_.empty() ? nullptr : &local_states_->of(k);
  auto request = std::make_shared<const client::TrainingRequest>(r);

  // The job: what a worker needs, by value (sim/sim_jobs.h), here or on an MPI rank.
  auto job = std::make_shared<wire::SimTrainJob>();
  job->client = k;
  job->recipe = modelRecipe();
  const client::TrainOptions& o = f.options;
  static_cast<wire::LocalSgd&>(*job) = o;
  job->precision = o.precision;
  if (local != nullptr) {  // the task's model with the client's own local part
    std::vector<float> start = client::floatsOf(*r.model_bytes);
    local->applyTo(start);
    job->start = std::make_shared<const std::string>(reinterpret_cast<const char*>(start.data()),
                                                     start.size() * sizeof(float));
  } else {
    job->start = r.model_bytes;
  }
  if (r.task.hparams.scaffold) {
    job->scaffold = true;
    job->control_c = r.control_c;
    job->control_ck = r.control_ck;
  }
  job->fed_eval = r.task.fed_eval;
  job->served = r.served_to_evaluate;

  // What the client does with its trained delta, on this process: its model.local part, then
  // compressing as a client's encoder does (the same chunks and per-chunk seeds,
  // client/upload_pipeline.h) through its error-feedback residual, which never leaves here.
  const uint64_t run_seed = config_.run.seed;
  // An attacking client (sim.attack): the bound it aims inside is the one known now.
  std::optional<Attack> attack;
  std::optional<double> bound;
  if (attack_ && k < attackers_) {
    attack = attack_;
    bound = engine_->normBound();
  }
  auto finish = [job, request, residual, local, run_seed, k, attack, bound,
                 layout = layout_](wire::SimTrainResult t) -> Result<TrainOutcome> {
    FEDFLEET_RETURN_IF_ERROR(t.status);
    const client::TrainingRequest& req = *request;
    const bool scaffold = req.task.hparams.scaffold;
    if (local != nullptr) {
      FEDFLEET_RETURN_IF_ERROR(local->absorb(client::floatsOf(*job->start), t.delta));
    }
    TrainOutcome out;
    if (t.fed_evaluation) out.session.fed_evaluation = servedEvaluationOf(*t.fed_evaluation);
    if (t.served_evaluation) {
      out.session.served_evaluation = servedEvaluationOf(*t.served_evaluation);
    }
    out.session.steps = t.steps;
    out.session.stopped_early = t.stopped_early;
    out.session.mean_loss = t.mean_loss;
    out.session.sum_sq_loss = t.sum_sq_loss;
    out.session.control_delta = t.control_delta;
    out.wall_seconds = t.wall_seconds;
    const auto t1 = std::chrono::steady_clock::now();
    client::TrainResult trained;
    trained.delta = std::move(t.delta);
    trained.control_delta = std::move(t.control_delta);
    std::vector<float> delta = client::takeUpload(trained);
    if (req.task.local_dp.on()) {  // the client's own noise, seeded by (seed, round, client)
      client::applyLocalDp(
          req.task.local_dp, delta.data(), delta.size(),
          crypto::KeyedStream(
              crypto::streamKeyFromSeed("fedfleet sim local dp", mix(run_seed, req.task.round, k)),
              0, 0));
    }
    if (attack) applyAttack(*attack, bound, delta.data(), delta.size());
    const auto plan =
        client::planUploadChunks(*layout, req.task.chunk_bytes, scaffold, req.codec->spec());
    if (req.task.secagg.on()) {  // masked once the key stages let it (Simulator::maskUpload)
      out.delta = std::move(delta);
      out.plan = plan;
    }
    for (size_t j = 0; j < plan.size() && !req.task.secagg.on(); ++j) {
      client::EncodedChunk c;
      c.index = j;
      c.range = plan[j];
      c.last = j + 1 == plan.size();
      const uint64_t seed = client::chunkSeed(req.task.hparams.seed, j);
      FEDFLEET_RETURN_IF_ERROR(client::encodeUploadChunk(
          *req.codec, plan[j], delta.data() + plan[j].offset, residual, seed, &c.payload));
      out.chunks.push_back(std::move(c));
    }
    out.encode_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    return out;  // the delta is gone: only the payloads travel on
  };

  if (remote_) {
    auto reply = std::make_shared<std::future<Result<std::string>>>(
        remote_->submit(wire::encodeSimJob(*job)));
    f.result = pool_->submit([reply, finish]() -> Result<TrainOutcome> {
      FEDFLEET_ASSIGN_OR_RETURN(wire::SimTrainResult t,
                                awaitRemote<wire::SimTrainResult>(*reply, "a training job"));
      return finish(std::move(t));
    });
  } else if (custom_trainer_) {
    const FleetData* data = data_.get();
    f.result = pool_->submit([job, data, stop = f.stop, finish, round = f.round,
                              trainer = custom_trainer_]() -> Result<TrainOutcome> {
      return finish(runCustomTrainJob(*job, round, *data, trainer, stop.get()));
    });
  } else if (config_.sim.batch_clients) {
    auto promise = std::make_shared<std::promise<Result<TrainOutcome>>>();
    f.result = promise->get_future();
    pending_training_.push_back({job, f.stop, finish, std::move(promise)});
  } else {
    const FleetData* data = data_.get();
    f.result = pool_->submit([job, data, stop = f.stop, finish]() -> Result<TrainOutcome> {
      return finish(runTrainJob(*job, *data, stop.get()));
    });
  }
  push(f.done_at, EventKind::kTrainDone, token, k);
}

void Simulator::flushTraining() {
  if (pending_training_.empty()) return;
  std::vector<PendingTraining> pending = std::move(pending_training_);
  pending_training_.clear();
  // Contiguous groups of near-equal size, one per worker, so that every worker has work.
  const size_t groups = std::min(pool_->size(), pending.size());
  const FleetData* data = data_.get();
  size_t begin = 0;
  for (size_t g = 0; g < groups; ++g) {
    const size_t end = begin + (pending.size() - begin) / (groups - g);
    auto group = std::make_shared<std::vector<PendingTraining>>(
        std::make_move_iterator(pending.begin() + static_cast<std::ptrdiff_t>(begin)),
        std::make_move_iterator(pending.begin() + static_cast<std::ptrdiff_t>(end)));
    pool_->submit([group, data] {
      std::vector<const wire::SimTrainJob*> jobs;
      std::vector<const std::atomic<bool>*> stops;
      for (const auto& p : *group) {
        jobs.push_back(p.job.get());
        stops.push_back(p.stop.get());
      }
      size_t done = 0;
      try {
        std::vector<wire::SimTrainResult> results = runTrainJobs(jobs, *data, stops);
        for (; done < group->size(); ++done) {
          PendingTraining& p = (*group)[done];
          p.promise->set_value(p.finish(std::move(results[done])));
        }
      } catch (const std::exception& e) {  // no exception leaves a worker: the loop waits on these
        for (; done < group->size(); ++done) {
          (*group)[done].promise->set_value(
              internalError(std::string("batched training: ") + e.what()));
        }
      }
    });
    begin = end;
  }
}

void Simulator::onTrainDone(uint64_t token, InFlight& f) {
  flushTraining();  // (a no-op unless sim.batch_clients left jobs waiting)
  Result<TrainOutcome> got = f.result.get();
  const uint64_t k = f.client;
  if (!got.isOk()) {
    spdlog::warn("sim: client {} round {}: training failed: {}", f.id, f.round,
                 got.status().toString());
    client::TrainingOutcome failed;
    failed.status = got.status().withContext("training failed");
    sessionOf(k).onTrainingDone(token, std::move(failed), now_);
    runSession(k);
    return;
  }
  TrainOutcome& out = *got;
  wall_compute_[{f.round, f.id}] = out.wall_seconds;
  f.encoded = std::move(out.chunks);
  f.encode_seconds = out.encode_seconds;
  f.delta = std::move(out.delta);
  f.plan = std::move(out.plan);
  // What the profile says, not the host: the virtual compute time, the data the client holds.
  out.session.compute_seconds = f.compute_s;
  out.session.partition_size = data_->shardSize(k);
  sessionOf(k).onTrainingDone(token, std::move(out.session), now_);
  runSession(k);
}

}  // namespace fedfleet::sim::internal
