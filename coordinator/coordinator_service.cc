// The ZeroMQ coordinator: start-up (keys, data, the run's model, the history, resume), its loop
// over the transport and the engine, live metrics and a clean stop. The rest of ZmqCoordinator
// is in service_messages.cc and service_connections.cc (coordinator/service_impl.h).
#include "coordinator/coordinator_service.h"

#include "coordinator/service_impl.h"

namespace fedfleet::coordinator {
namespace internal {

Status ZmqCoordinator::init(const config::Config& config,
                            engine::AggregatorFactory custom_aggregator) {
  config_ = config;
  FEDFLEET_RETURN_IF_ERROR(config_.validate());
  if (config_.dataFormat() == data::DataFormat::kSynthetic) {
    return invalidArgument(
        "data.format = \"synthetic\" is generated per device by the simulator "
        "(fedfleet sim); a coordinator serves fashion-mnist or its clients' own files "
        "(data.partition = \"none\")");
  }
  const bool own_files = config_.readsDataFiles();
  if (own_files && config_.data.partition != config::PartitionScheme::kNone) {
    return invalidArgument("data.format = \"" + config_.dataFormatName() +
                           "\": the clients of a coordinator train the files each holds, so "
                           "set data.partition = \"none\" (the simulator splits one data set "
                           "over virtual clients: fedfleet sim)");
  }
  const auto& cc = config_.coordinator;

  // Test set (server-side evaluation), and the model built for its samples.
  at::set_num_threads(static_cast<int>(cc.threads));
  data::Dataset test_set;
  model::InputShape shape;  // Fashion-MNIST's
  // No test file of its own: federated evaluation alone (the engine's server_eval is off).
  const bool no_test_data = own_files && config_.data.test_path.empty();
  if (no_test_data) {
    FEDFLEET_ASSIGN_OR_RETURN(shape, driver::declaredInputShape(config_));
    spdlog::info(
        "no test data of its own (data.test_path): the model is evaluated by the "
        "clients on their held-out data every {} round(s)",
        cc.fed_eval_every);
  } else if (own_files) {
    FEDFLEET_ASSIGN_OR_RETURN(test_set, driver::loadTestFile(config_));
    shape = model::inputShapeOf(test_set);
  } else {
    const std::string data_dir =
        config_.data.dir.empty() ? data::defaultFashionMnistDir() : config_.data.dir;
    FEDFLEET_ASSIGN_OR_RETURN(
        test_set, data::loadFashionMnist(data_dir, /*train=*/false, config_.data.test_subset));
  }
  FEDFLEET_ASSIGN_OR_RETURN(
      auto model,
      driver::createRunModel(config_, shape, {nullptr, no_test_data ? nullptr : &test_set}));
  // model.local names tensors of this model (each client keeps them; a typo stops here).
  FEDFLEET_RETURN_IF_ERROR(model::LocalPart::of(model->layout(), config_.model.local).status());
  std::vector<float> params = model->flatParameters();
  if (const auto& bc = config_.blocks; bc.count > 0) {
    // Per-block validation and test sets from the test split (common/data/block_cyclic.h).
    FEDFLEET_ASSIGN_OR_RETURN(
        block_sets_,
        data::blockEvalIndices(test_set.labels, 10, bc.count, bc.skew, bc.validation_samples,
                               bc.test_samples, config_.run.seed));
    block_data_ = test_set;
    FEDFLEET_ASSIGN_OR_RETURN(
        block_model_, model::createModel(config_.model.name, config_.run.seed, config_.model.path));
    block_model_->setLoss(model->loss());
  }

  // Transport. Every connection costs two descriptors (libzmq's and the transport's duplicate):
  // take what the hard limit allows, and say what that is.
  const transport::DescriptorLimit before = transport::descriptorLimit();
  auto raised = transport::raiseDescriptorLimit();
  const transport::DescriptorLimit limit = raised.isOk() ? raised->after : before;
  descriptor_limit_ = limit.soft == UINT64_MAX ? 0 : limit.soft;
  auto limitText = [](uint64_t v) {
    return v == UINT64_MAX ? std::string("unlimited") : std::to_string(v);
  };
  if (!raised.isOk()) {
    spdlog::warn("coordinator: could not raise the descriptor limit: {}",
                 raised.status().toString());
  }
  transport::ServerOptions so;
  so.endpoint = cc.bind;
  so.insecure = cc.insecure;
  // One frame limit end to end: the transport refuses at its header what the decoder would.
  so.max_message_bytes = config_.clientFrameLimitBytes();
  so.admission.max_unauthenticated = cc.max_unauthenticated;
  so.admission.max_unauthenticated_per_host = cc.max_unauthenticated_per_host;
  so.admission.max_connections_per_key = cc.max_connections_per_key;
  so.handshake_timeout_ms = static_cast<int>(std::lround(cc.handshake_timeout_s * 1000));
  so.admission_seed = crypto::randomToken() | 1;
  const transport::ConnectionAdmission admission(so.admission, 1);
  spdlog::info(
      "coordinator: descriptor limit {} (soft; was {}, hard {}), {} kept for authenticated "
      "connections; before authentication at most {} connections (early drop from {}), {} per "
      "address, {:g} s for the handshake; {} connections per key; frames up to {} bytes",
      limitText(limit.soft), limitText(before.soft), limitText(limit.hard),
      descriptor_limit_ > 0 ? std::to_string(admission.reserveFor(descriptor_limit_)) : "none",
      cc.max_unauthenticated, admission.earlyDropStart(), cc.max_unauthenticated_per_host,
      cc.handshake_timeout_s, cc.max_connections_per_key, so.max_message_bytes);
  refusals_.groupAcrossHosts(kLimitEventKind);
  if (cc.max_concurrent_uploads > 0) {
    // Upload credits: only granted clients send chunks, so a short receive queue per peer
    // bounds what ZeroMQ holds for the loop (docs/ARCHITECTURE.md, Memory).
    so.receive_hwm = kCreditedReceiveHwm;
    // A full queue stops ZeroMQ reading the peer's ZMTP heartbeats too, so a loop stalled
    // longer than the heartbeat timeout (a loaded machine) would drop an uploader's connection.
    // Dead peers are found by the engine's liveness_s; the transport's timeout only needs to
    // outlast a stall.
    const double stall_ms = std::min(2 * cc.liveness_s, 3600.0) * 1000;
    so.heartbeat_timeout_ms = std::max(so.heartbeat_timeout_ms, static_cast<int>(stall_ms));
  }
  if (!cc.insecure) {
    const std::string secret = cc.keys_dir + "/coordinator.key_secret";
    Status file_ok = transport::checkSecretKeyFile(secret);
    if (file_ok.code() == StatusCode::kNotFound) {
      return notFound("no coordinator key pair in " + cc.keys_dir +
                      " (create one with `fedfleet keygen --dir " + cc.keys_dir +
                      " --coordinator --clients N`)");
    }
    FEDFLEET_RETURN_IF_ERROR(file_ok);
    FEDFLEET_RETURN_IF_ERROR(transport::checkAllowListDir(config_.allowDir()));
    FEDFLEET_ASSIGN_OR_RETURN(so.server_keys, transport::readKeyPair(cc.keys_dir, "coordinator"));
    so.allow_dir = config_.allowDir();
  } else {
    spdlog::warn(
        "--insecure: clients are who their Hello says they are; any peer can take any client "
        "id, and its claims cannot be tied to a key");
  }
  FEDFLEET_ASSIGN_OR_RETURN(server_, transport::createServer(so));

  if (config_.metrics.port > 0) {
    FEDFLEET_ASSIGN_OR_RETURN(
        metrics_,
        MetricsServer::start(config_.metrics.bind, static_cast<uint16_t>(config_.metrics.port)));
  }
  // The engine's options, checked before anything is written: a coordinator that cannot start
  // leaves no run behind (the history file is not even created).
  engine::EngineOptions eo = driver::engineOptionsFromConfig(config_, /*run_id=*/0);
  eo.max_evaluations_behind = kMaxEvaluationsBehind;
  eo.coordinator_session = session_;
  // Differential-privacy noise no client can predict (the config's seed may be known to them).
  eo.dp.noise_key = crypto::randomStreamKey();
  // What each partition holds bounds what an update may claim (the clients cut the same split).
  FEDFLEET_ASSIGN_OR_RETURN(eo.partition_sizes, driver::partitionSizes(config_, eo));
  FEDFLEET_RETURN_IF_ERROR(driver::emptyPartitionCheck(eo.partition_sizes));
  eo.custom_aggregator = std::move(custom_aggregator);
  FEDFLEET_RETURN_IF_ERROR(engine::checkEngineOptions(eo));

  // History: a new run, or the latest run of this name resumed from its checkpoint.
  FEDFLEET_ASSIGN_OR_RETURN(history_,
                            driver::openRunHistory(config_.history.db, /*in_memory_ok=*/false));
  driver_ =
      std::make_unique<driver::EngineDriver>(*history_, static_cast<driver::DriverPort&>(*this),
                                             driver::checkpointKeepFromConfig(config_), "s");
  std::string engine_state;  // from the checkpoint resumed from
  if (cc.resume) {
    FEDFLEET_ASSIGN_OR_RETURN(driver::ResumePoint point,
                              driver::findResumePoint(*history_, config_, params.size()));
    run_id_ = point.run_id;
    if (!point.already_finished.empty()) {
      already_finished_ = point.already_finished;
      return Status::ok();
    }
    if (!point.changes.empty()) {
      recordEvent("resume_changes", "", driver::changesDetail(point.changes), unixNow());
      FEDFLEET_RETURN_IF_ERROR(driver_->fatal());
      spdlog::warn("--resume-changes: {} continues with {}", point.label,
                   driver::describeChanges(point.changes));
    }
    eo.first_round = point.first_round;
    eo.evaluate_initial = point.evaluate_initial;
    if (const auto& cp = point.checkpoint) {
      std::memcpy(params.data(), cp->blob.data(), cp->blob.size());
      eo.model_version = cp->model_version;
      engine_state = cp->engine_state;
      if (point.lost_rounds > 0) {
        spdlog::warn(
            "--resume: {} round(s) after round {} changed the model but have no checkpoint "
            "(coordinator.checkpoint_every = {}); their training is lost, the run continues "
            "from round {}'s model",
            point.lost_rounds, cp->round, cc.checkpoint_every, cp->round);
      }
      spdlog::info("resuming run {} after round {} (model version {} of round {})", run_id_,
                   point.last_round, cp->model_version, cp->round);
    } else {
      spdlog::info("resuming run {} from its initial model", run_id_);
    }
  } else {
    FEDFLEET_ASSIGN_OR_RETURN(
        run_id_, history_->beginRun(driver::newRunRecord(
                     config_, "wall", model::describeModel(*model, shape, config_.model.path))));
  }

  if (cc.resume && !cc.insecure) {
    // The key each client id had in this history stays its key.
    FEDFLEET_ASSIGN_OR_RETURN(auto known, history_->clients());
    for (const auto& c : known) {
      if (!c.public_key.empty()) key_of_client_[c.client_id] = c.public_key;
    }
  }

  // Engine.
  eo.run_id = run_id_;
  FEDFLEET_RETURN_IF_ERROR(engine::checkEngineOptions(eo));  // with where a resume continues
  engine_ = std::make_unique<engine::RoundEngine>(eo, std::move(params));
  if (!engine_state.empty()) {
    // Selection continues where it stopped (generator and selector state).
    Status st = engine_->loadState(engine_state);
    if (!st.isOk()) return st.withContext("--resume: checkpoint of run " + std::to_string(run_id_));
    spdlog::info("restored the engine state (selector {}, server optimiser {})",
                 engine::selectorName(eo.selector.kind),
                 engine::serverOptimizerName(eo.server.kind));
  }
  evaluator_ = std::make_unique<BackgroundEvaluator>(std::move(model), std::move(test_set));
  metrics_snapshot_.run_id = run_id_;
  metrics_snapshot_.run_name = config_.run.name;
  metrics_snapshot_.rounds_target = config_.run.rounds;
  if (metrics_) {
    metrics_->publish(metrics_snapshot_);
    spdlog::info("coordinator: metrics on {}/metrics and {}/status", metrics_->url(),
                 metrics_->url());
  }
  spdlog::info("coordinator: run {} listening on {} ({}), {} rounds, {} clients a round", run_id_,
               server_->boundEndpoint(), cc.insecure ? "PLAIN TEXT" : "CURVE", config_.run.rounds,
               cc.clients_per_round);
  return Status::ok();
}

void ZmqCoordinator::publishMetrics(double now, bool force) {
  if (!metrics_ || (!force && now - metrics_published_at_ < 0.1)) return;
  metrics_snapshot_.round = engine_->currentRound();
  metrics_snapshot_.model_version = engine_->modelVersion();
  metrics_snapshot_.connected_clients = engine_->connectedClients();
  metrics_->publish(metrics_snapshot_);
  metrics_published_at_ = now;
}

void ZmqCoordinator::reportWaiting(double now) {
  const engine::RoundEngine::WaitingStatus w = engine_->waitingStatus();
  // Between rounds the wait is short: say nothing unless it lasts.
  if (!w.waiting || w.idle >= w.needed || now - w.since < 3.0) return;
  if (now - waiting_reported_at_ < 5.0) return;
  waiting_reported_at_ = now;
  constexpr size_t kNamed = 10;
  std::string names;
  for (size_t i = 0; i < w.connected.size() && i < kNamed; ++i) {
    names += (i ? ", " : "") + w.connected[i];
  }
  if (w.connected.size() > kNamed) {
    names += " and " + std::to_string(w.connected.size() - kNamed) + " more";
  }
  spdlog::info("waiting for clients: {} of {} connected ({}); {} of {} waited", w.connected.size(),
               w.needed, names.empty() ? "none yet" : names, formatDuration(now - w.since),
               formatDuration(config_.coordinator.wait_clients_s));
}

Status ZmqCoordinator::stopCleanly() {
  // A round whose evaluation is running is complete: let it commit (bounded; an evaluation
  // takes seconds).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    auto results = evaluator_->takeResults();
    for (auto& result : results) engine_->onEvaluated(result.round, result.outcome, unixNow());
    FEDFLEET_RETURN_IF_ERROR(carryOut());
    if (!evaluator_->busy() && results.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double now = unixNow();
  // No Bye: clients keep waiting and rejoin when the coordinator comes back (--resume).
  const uint32_t round = engine_->currentRound();
  const std::string detail = driver_->finished() ? "stopped after the run finished"
                             : engine_->waitingStatus().waiting
                                 ? "stopped between rounds, after round " + std::to_string(round)
                                 : "stopped during round " + std::to_string(round) +
                                       " (not committed: it runs again after --resume)";
  flushRefusals(now);
  recordEvent("run_interrupted", "", detail, now);
  FEDFLEET_RETURN_IF_ERROR(driver_->fatal());
  metrics_snapshot_.state = "interrupted";
  publishMetrics(now, true);
  spdlog::info("coordinator: {}; the history is consistent, continue with --resume", detail);
  return Status::ok();
}

Status ZmqCoordinator::run() {
  if (!already_finished_.empty()) {
    spdlog::info("{}", already_finished_);
    return Status::ok();
  }
  engine_->start(unixNow());
  metrics_snapshot_.state = "running";
  FEDFLEET_RETURN_IF_ERROR(carryOut());
  while (!driver_->finished()) {
    if (stop_.load()) return stopCleanly();
    double now = unixNow();
    // Poll briefly while an evaluation runs, so its result is committed promptly.
    const double max_wait_ms = evaluator_->busy() ? 5.0 : 200.0;
    int timeout_ms = static_cast<int>(max_wait_ms);
    if (auto wake = engine_->nextWakeup()) {
      timeout_ms = static_cast<int>(std::clamp((*wake - now) * 1000.0 + 1, 0.0, max_wait_ms));
    }
    auto got = server_->receive(timeout_ms);
    if (!got.isOk()) return got.status().withContext("coordinator socket");
    now = unixNow();
    if (reload_.exchange(false)) {
      spdlog::info("re-reading the allow-list {} (SIGHUP)", config_.allowDir());
      server_->reloadAllowList();
    }
    takeTransportReports(now);
    if (now - budgets_flushed_at_ >= 1.0) {
      budgets_flushed_at_ = now;
      for (auto& [client, budget] : event_budget_) flushLeftOut(client, budget, now);
    }
    if (got->has_value()) handleEnvelope(**got, now);
    // Drain what else is queued before ticking, so a burst of chunks is handled in one go.
    for (int i = 0; i < 256; ++i) {
      auto more = server_->receive(0);
      if (!more.isOk()) return more.status().withContext("coordinator socket");
      if (!more->has_value()) break;
      handleEnvelope(**more, unixNow());
    }
    now = unixNow();
    for (auto& result : evaluator_->takeResults()) {
      engine_->onEvaluated(result.round, result.outcome, now);
    }
    engine_->onTick(now);
    FEDFLEET_RETURN_IF_ERROR(carryOut());
    publishMetrics(now, false);
    reportWaiting(now);
  }
  flushRefusals(unixNow());
  metrics_snapshot_.state = driver_->runOk() ? "finished" : "failed";
  publishMetrics(unixNow(), true);
  if (!driver_->runOk()) return timeoutError(driver_->finishMessage());
  if (driver_->everyRoundFailed()) return driver_->everyRoundFailedError(config_.history.db);
  return Status::ok();
}

}  // namespace internal

using internal::ZmqCoordinator;

Result<std::unique_ptr<CoordinatorService>> CoordinatorService::create(
    const config::Config& config, engine::AggregatorFactory custom_aggregator) {
  auto service = std::make_unique<ZmqCoordinator>();
  FEDFLEET_RETURN_IF_ERROR(service->init(config, std::move(custom_aggregator)));
  return std::unique_ptr<CoordinatorService>(std::move(service));
}

}  // namespace fedfleet::coordinator
