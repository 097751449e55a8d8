// The fleet simulator: start-up (the fleet, its data, the run's model, the history), the event loop
// that advances virtual time, and the summary. The other parts of the Simulator class are in
// virtual_clients.cc, sim_training.cc and sim_evaluation.cc (sim/simulator_impl.h).
#include "sim/fleet_simulator.h"

#include "common/model/blas_core.h"
#include "sim/simulator_impl.h"

namespace fedfleet::sim {
namespace internal {
namespace {

// Whether this machine's CPUs report native bf16 arithmetic (the avx512_bf16 or amx_bf16 flag
// of /proc/cpuinfo; false where that file is missing).
bool cpuHasFastBf16() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    return line.find(" avx512_bf16") != std::string::npos ||
           line.find(" amx_bf16") != std::string::npos;
  }
  return false;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

wire::Hello Simulator::helloFor(uint64_t k, const ClientProfile& p, uint64_t session) const {
  wire::Hello h;
  h.client_id = idOf(k);
  h.device_kind = p.gpu ? wire::DeviceKind::kCuda : wire::DeviceKind::kCpu;
  h.device_name = fleet_->tiers()[p.tier].name;
  h.cores = 1;
  h.memory_bytes = static_cast<uint64_t>(p.memory_mib * 1024 * 1024);
  h.data_size = data_->shardSize(k);
  h.requested_partition = static_cast<int32_t>(std::min<uint64_t>(k, INT32_MAX));
  h.session = session;
  return h;
}

Status Simulator::init(const config::Config& config, Extensions extensions) {
  config_ = config;
  remote_ = std::move(extensions.remote);
  custom_trainer_ = std::move(extensions.custom_trainer);
  if (custom_trainer_ && remote_) {
    return invalidArgument(
        "a simulation with clients of your own code (client_fn) runs on this host: run it "
        "without MPI ranks");
  }
  FEDFLEET_RETURN_IF_ERROR(config_.validate());
  // A device this process cannot use fails here, once (the MPI ranks check their own).
  FEDFLEET_RETURN_IF_ERROR(deviceOf(config::choiceName(config_.sim.device)).status());
  const auto& sc = config_.sim;
  if (config_.data.partition == config::PartitionScheme::kNone) {
    return invalidArgument(
        "data.partition = \"none\" means each client trains the files it holds (a client process "
        "with its own data.path); the simulator splits one data set over its virtual clients: "
        "choose iid, dirichlet, labels, shards or quantity");
  }
  if (sc.clients > static_cast<uint64_t>(INT32_MAX)) {
    return invalidArgument("sim.clients must be at most " + std::to_string(INT32_MAX));
  }
  AvailabilityOptions avail;
  avail.mode = sc.availability;
  avail.online_hours = sc.online_hours;
  avail.dropout = sc.dropout;
  FEDFLEET_ASSIGN_OR_RETURN(Fleet fleet,
                            Fleet::create(sc.fleet, sc.clients, config_.run.seed, avail));
  fleet_.emplace(std::move(fleet));
  FEDFLEET_ASSIGN_OR_RETURN(data_, FleetData::create(config_, sc.clients));

  // The initial model (the same seed gives the same weights as a real coordinator's).
  // Start-up check: a model that does not fit the data fails here, once, not in every round.
  FEDFLEET_ASSIGN_OR_RETURN(const ClientShard first, data_->shard(0));
  FEDFLEET_ASSIGN_OR_RETURN(auto model,
                            driver::createRunModel(config_, data_->inputShape(),
                                                   {first.data.get(), data_->testSet().get()}));
  FEDFLEET_ASSIGN_OR_RETURN(model::LocalPart local_part,
                            model::LocalPart::of(model->layout(), config_.model.local));
  local_part_ = std::move(local_part);
  local_states_ = std::make_unique<PerClient<model::LocalState>>([part = local_part_] {
    return model::LocalState{part, {}, ""};
  });
  std::vector<float> params = model->flatParameters();
  num_params_ = params.size();
  layout_ = std::make_shared<const model::Layout>(model->layout());
  ref_samples_per_s_ =
      sc.reference_gflops * 1e9 / trainFlopsPerSample(config_.model.name, num_params_);

  FEDFLEET_RETURN_IF_ERROR(
      openHistory(model::describeModel(*model, data_->inputShape(), config_.model.path)));
  driver_ = std::make_unique<driver::EngineDriver>(
      *history_, static_cast<driver::DriverPort&>(*this), driver::checkpointKeepFromConfig(config_),
      "s virtual");

  engine::EngineOptions eo = driver::engineOptionsFromConfig(config_, run_id_);
  eo.server_eval = true;  // the simulator always holds a test set (a file or a hold-out)
  eo.liveness_s = 0;      // virtual clients send no heartbeats; losses are reported as goodbyes
  eo.sample_partitions = false;
  eo.num_partitions = static_cast<uint32_t>(sc.clients);
  eo.min_clients = static_cast<uint32_t>(std::min<uint64_t>(config_.minClients(), sc.clients));
  eo.bye_on_finish = false;
  // Upload credits (coordinator.max_concurrent_uploads) run as configured: each virtual
  // client's session asks for its grant and waits for it, in virtual time.
  ingress_bytes_per_s_ = sc.coordinator_ingress_mbps * 1e6 / 8;
  if (sc.attackers > 0) {
    FEDFLEET_ASSIGN_OR_RETURN(Attack attack, parseAttack(sc.attack));
    attack_ = attack;
    attackers_ =
        static_cast<uint64_t>(std::llround(sc.attackers * static_cast<double>(sc.clients)));
  }
  // Client k trains partition k: its shard's size bounds the samples its updates may claim.
  eo.partition_sizes.resize(sc.clients);
  for (uint64_t k = 0; k < sc.clients; ++k) eo.partition_sizes[k] = data_->shardSize(k);
  eo.custom_aggregator = std::move(extensions.custom_aggregator);
  FEDFLEET_RETURN_IF_ERROR(engine::checkEngineOptions(eo));
  hparams_ = eo.hparams;
  engine_ = std::make_unique<engine::RoundEngine>(eo, std::move(params));
  engine_->setEligibility([this](const engine::ClientId& id, double t) {
    return fleet_->online(fleet_->profile(indexOf(id)), t);
  });
  // What a deployment learns by asking devices (or from history), the simulator knows from
  // the profile: the expected task duration at the configured work, and how long a client
  // stays online.
  engine_->setSelectorHints(
      [this](const std::string& id) {
        const uint64_t k = indexOf(id);
        const ClientProfile p = fleet_->profile(k);
        const double bytes = static_cast<double>(num_params_ * sizeof(float));
        const double samples = static_cast<double>(plannedSamples(data_->shardSize(k), hparams_));
        return 2 * p.latency_s + bytes / p.down_bytes_per_s + bytes / p.up_bytes_per_s +
               samples / (p.speed * ref_samples_per_s_);
      },
      [this](const std::string& id, double t) {
        return fleet_->onlineUntil(fleet_->profile(indexOf(id)), t) - t;
      });

  id_width_ = std::to_string(sc.clients - 1).size();
  for (uint64_t k = 0; k < sc.clients; ++k) {
    engine_->registerClient(idOf(k), helloFor(k, fleet_->profile(k), 1), 0.0);
  }
  FEDFLEET_ASSIGN_OR_RETURN(auto storage, compress::parseResidualStorage(sc.residual_storage));
  residuals_ = std::make_unique<Residuals>(
      [n = num_params_, storage] { return compress::ErrorFeedback(n, storage); });
  residual_storage_ = storage;
  FEDFLEET_ASSIGN_OR_RETURN(precision_, wire::parsePrecision(sc.precision));
  if (precision_ == wire::Precision::kBf16 && sc.device == config::SimDevice::kCpu &&
      !cpuHasFastBf16()) {
    spdlog::warn(
        "sim.precision = \"bf16\" on a CPU without avx512_bf16 or amx_bf16: LibTorch emulates "
        "bf16 here, slower than fp32 and, in its fallback matrix product, summing in bf16");
  }
  pool_ = std::make_unique<WorkerPool>(sc.workers);
  progress_ = std::make_unique<ProgressDisplay>(sc.progress, config_.run.rounds);
  const std::string workers =
      remote_ ? remote_->describe() : std::to_string(pool_->size()) + " workers";
  // The kernels of the CPU's fp32 products (model/blas_core.h), where OpenBLAS does them.
  const std::string blas = model::openblasCoreName();
  spdlog::info(
      "sim: run {}: {} clients ({} fleet, {} availability), {} a round, {} rounds, model {} "
      "({} parameters), {} on {}{}; reference device {:.0f} samples/s",
      run_id_, sc.clients, sc.fleet, sc.availability.name(), config_.coordinator.clients_per_round,
      config_.run.rounds, config_.model.name, num_params_, workers, config_.sim.device.name(),
      blas.empty() ? "" : " (OpenBLAS " + blas + " kernels)", ref_samples_per_s_);
  return Status::ok();
}

Status Simulator::openHistory(const std::string& model_json) {
  const std::string& db = config_.history.db;
  if (!config_.coordinator.resume) {
    FEDFLEET_ASSIGN_OR_RETURN(history_, driver::openRunHistory(db, /*in_memory_ok=*/true));
    // data.normalize = "computed": the statistics used, recorded with the run's config.
    config::Config recorded = config_;
    if (config_.data.normalize == config::Normalization::kComputed) {
      recorded.data.mean = data_->normalization().mean;
      recorded.data.stddev = data_->normalization().stddev;
    }
    FEDFLEET_ASSIGN_OR_RETURN(run_id_, history_->beginRun(driver::newRunRecord(
                                           config_, "virtual", model_json, &recorded)));
    return Status::ok();
  }
  if (db == ":memory:") {
    return invalidArgument(
        "--resume continues the run recorded in a history file: give it with --db (history.db "
        "is :memory:, which keeps nothing)");
  }
  FEDFLEET_ASSIGN_OR_RETURN(file_, history::openSqliteHistory(db));
  // Changes are never accepted here (a replay needs the recorded config), so they are listed
  // to be refused with that reason.
  config::Config listing = config_;
  listing.coordinator.resume_changes = true;
  FEDFLEET_ASSIGN_OR_RETURN(driver::ResumePoint point, driver::findResumableRun(*file_, listing));
  if (!point.changes.empty()) {
    return failedPrecondition(
        "--resume: this config changes " + point.label + ": " +
        driver::describeChanges(point.changes) +
        ". A simulation continues by replaying its recorded rounds, so it resumes only with the "
        "run's own config; to run with these changes, give the run another run.name");
  }
  run_id_ = point.run_id;
  if (!point.already_finished.empty()) {
    already_finished_ = point.label + " already finished (its last round is " +
                        std::to_string(point.last_round) +
                        " of run.rounds = " + std::to_string(config_.run.rounds) + " in " + db +
                        "); nothing to resume. To simulate it again, give the run another "
                        "run.name";
  }
  FEDFLEET_ASSIGN_OR_RETURN(auto replay, ReplayHistory::create(*file_, run_id_));
  replay_ = replay.get();
  history_ = std::move(replay);
  spdlog::info("sim: resuming {} of {}: replaying its {} recorded round(s), then continuing",
               point.label, db, point.last_round);
  return Status::ok();
}

std::string Simulator::fleetStateNote() const {
  const auto w = engine_->waitingStatus(now_);
  if (w.available >= w.needed) return "";  // not a run that waited for its cohort
  const uint64_t away = offline_.size();
  uint64_t unavailable = 0;  // connected, but offline by the availability model now
  if (config_.sim.availability != config::AvailabilityMode::kAlways) {
    for (uint64_t k = 0; k < config_.sim.clients && k < 100000; ++k) {
      if (!offline_.count(k) && !fleet_->online(fleet_->profile(k), now_)) ++unavailable;
    }
  }
  std::string note = ". The cohort needs " + std::to_string(w.needed) +
                     " idle clients (coordinator.min_clients, default clients_per_round); " +
                     std::to_string(w.available) +
                     " are idle and online at t=" + fmt::format("{:.1f}", now_) + " s of " +
                     std::to_string(config_.sim.clients) + " (sim.clients)";
  if (away > 0) {
    note += "; " + std::to_string(away) + " dropped out (sim.dropout) and come back " +
            fmt::format("{:g}", config_.sim.rejoin_s) + " s after they left (sim.rejoin_s)";
  }
  if (unavailable > 0) {
    note += "; " + std::to_string(unavailable) + " are offline now (sim.availability)";
  }
  note += ". Lower coordinator.min_clients, register more clients (sim.clients), ";
  note += away > 0 ? "lower sim.rejoin_s below coordinator.wait_clients_s or raise "
                     "coordinator.wait_clients_s"
                   : "or raise coordinator.wait_clients_s";
  return note;
}

void Simulator::goOffline(uint64_t k) {
  offline_.insert(k);  // what was on its way to or from it is lost
  engine_->onBye(idOf(k), now_);
  push(now_ + config_.sim.rejoin_s, EventKind::kRejoin, 0, k);
}

void Simulator::handle(const Event& e) {
  if (e.kind == EventKind::kSecAggUp || e.kind == EventKind::kSecAggDown) {
    auto mail = secagg_mail_.find(e.token);
    if (mail == secagg_mail_.end()) return;
    const wire::SecAgg m = std::move(mail->second.second);
    secagg_mail_.erase(mail);
    if (offline_.count(e.client)) return;
    if (e.kind == EventKind::kSecAggDown && m.step == wire::SecAggStep::kUnmask &&
        unmask_drops_.erase(m.task_token)) {
      spdlog::debug("sim: client {}: drops out at the unmasking, after its masked upload",
                    idOf(e.client));
      goOffline(e.client);  // its update is in the sum; its self mask must be rebuilt
      return;
    }
    if (e.kind == EventKind::kSecAggUp) {
      engine_->onSecAgg(idOf(e.client), m, wire::encode(wire::Message(m)).size(), now_);
    } else {
      tell(idOf(e.client), [&](client::ClientSession& s) { s.onSecAgg(m, now_); });
    }
    return;
  }
  if (e.kind == EventKind::kRejoin) {
    const ClientProfile p = fleet_->profile(e.client);
    const double back = fleet_->nextOnline(p, now_);
    if (back > now_) {
      push(back, EventKind::kRejoin, 0, e.client);
      return;
    }
    offline_.erase(e.client);
    engine_->onHello(idOf(e.client), helloFor(e.client, p, next_session_++), now_);
    return;
  }
  auto it = in_flight_.find(e.token);
  if (it == in_flight_.end()) return;  // cancelled or rejected: nothing more arrives
  InFlight& f = it->second;
  switch (e.kind) {
    case EventKind::kTrainDone:
      onTrainDone(e.token, f);
      break;
    case EventKind::kChunk: {
      wire::Chunk c = std::move(f.chunks[e.chunk]);
      f.chunks[e.chunk] = wire::Chunk();
      const auto t0 = std::chrono::steady_clock::now();
      const std::pair<uint32_t, engine::ClientId> key{f.round, f.id};
      engine_->onChunk(f.id, c, f.frame_bytes[e.chunk], now_);  // may erase f (rejected)
      decode_wall_[key] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      break;
    }
    case EventKind::kSummary: {
      const wire::Summary s = f.summary;
      const uint64_t bytes = f.summary_bytes;
      const engine::ClientId id = f.id;
      const uint64_t k = f.client;
      in_flight_.erase(it);
      sessionOf(k).onSummaryDelivered(e.token);  // SCAFFOLD: c_k += Dc_k
      runSession(k);
      engine_->onSummary(id, s, bytes, now_);
      break;
    }
    case EventKind::kClientError: {
      const wire::Error error = f.error;
      const engine::ClientId id = f.id;
      in_flight_.erase(it);
      engine_->onClientError(id, error, now_);
      break;
    }
    case EventKind::kDropOut: {
      const uint64_t k = f.client;
      unmask_drops_.erase(e.token);
      in_flight_.erase(it);
      goOffline(k);
      break;
    }
    case EventKind::kRejoin:
    case EventKind::kSecAggUp:
    case EventKind::kSecAggDown:
      break;  // handled above
  }
}

Result<SimSummary> Simulator::run() {
  if (!already_finished_.empty()) return failedPrecondition(already_finished_);
  const auto wall0 = std::chrono::steady_clock::now();
  // The bar says what the per-round lines would; the caller's level comes back however run()
  // ends.
  struct RestoreLevel {
    spdlog::level::level_enum level;
    ~RestoreLevel() { spdlog::set_level(level); }
  } restore{spdlog::get_level()};
  if (progress_->active()) spdlog::set_level(spdlog::level::warn);
  engine_->start(now_);
  FEDFLEET_RETURN_IF_ERROR(carryOut());
  while (!driver_->finished()) {
    if (stop_.load()) {
      progress_->finish();
      return unavailable("interrupted in round " + std::to_string(engine_->currentRound()) +
                         "; the history holds every row written so far. Continue the run with "
                         "`fedfleet sim --resume --db " +
                         config_.history.db +
                         "` (it reads the run's stored config; flags given are checked "
                         "changes)");
    }
    collectEvaluations(/*block=*/false);
    FEDFLEET_RETURN_IF_ERROR(carryOut());
    if (driver_->finished()) break;
    if (in_flight_.empty() && !evals_.empty()) {
      // No task is in flight, so what the engine does next waits on these evaluations, which
      // take no virtual time: finish them before the clock moves on. After the last round this
      // ends the run at that round's end, not at a dropped client's rejoin long after it.
      collectEvaluations(/*block=*/true);
      FEDFLEET_RETURN_IF_ERROR(carryOut());
      continue;
    }
    const double t_event = events_.empty() ? INFINITY : events_.top().time;
    const auto wake = engine_->nextWakeup();
    const double t_wake = wake ? *wake : INFINITY;
    if (!std::isfinite(t_event) && !std::isfinite(t_wake)) {
      if (evals_.empty()) {
        progress_->finish();
        const auto w = engine_->waitingStatus(now_);
        return failedPrecondition(
            "simulation stopped in round " + std::to_string(engine_->currentRound()) +
            ": nothing scheduled can change its state (" +
            (w.waiting ? std::to_string(w.available) + " of the " + std::to_string(w.needed) +
                             " idle clients a round needs (coordinator.min_clients)"
                       : std::string("no task in flight, no deadline")) +
            ")" + fleetStateNote());
      }
      collectEvaluations(/*block=*/true);
    } else if (t_event <= t_wake) {
      const Event e = events_.top();
      events_.pop();
      now_ = std::max(now_, e.time);
      handle(e);
    } else {
      // The engine asked to be woken at t_wake: a tick there must change something, or the
      // loop would wake it at the same time for ever. (A wakeup that is never acted on is an
      // engine defect; it ends the run with its cause rather than spinning.)
      idle_ticks_ = (t_wake == last_tick_at_ && next_seq_ == seq_at_last_tick_ &&
                     engine_->currentRound() == round_at_last_tick_)
                        ? idle_ticks_ + 1
                        : 0;
      last_tick_at_ = t_wake;
      seq_at_last_tick_ = next_seq_;
      round_at_last_tick_ = engine_->currentRound();
      if (idle_ticks_ > kMaxIdleTicks) {
        progress_->finish();
        return internalError(
            "simulation stalled in round " + std::to_string(engine_->currentRound()) +
            ": the engine asked to "
            "be woken at t=" +
            std::to_string(t_wake) + " s and did nothing there " + std::to_string(kMaxIdleTicks) +
            " times; please report this with the config");
      }
      now_ = std::max(now_, t_wake);
      engine_->onTick(now_);
    }
    FEDFLEET_RETURN_IF_ERROR(carryOut());
  }
  progress_->finish();
  summary_.run_id = run_id_;
  summary_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  summary_.median_round_virtual_s = median(round_virtual_s_);
  summary_.median_round_wall_s = median(round_wall_s_);
  summary_.registered_clients = config_.sim.clients;
  summary_.distinct_participants = participants_.size();
  summary_.db_path = config_.history.db;
  if (replay_ && replay_->rowsToMatch() > 0) {
    return failedPrecondition("--resume: the replayed run ended with " +
                              std::to_string(replay_->rowsToMatch()) +
                              " recorded rows it never wrote: the file is not this simulation's");
  }
  if (!driver_->runOk()) {
    return failedPrecondition("run failed: " + driver_->finishMessage() + fleetStateNote());
  }
  if (driver_->everyRoundFailed()) return driver_->everyRoundFailedError(config_.history.db);
  return summary_;
}

}  // namespace internal

using internal::Simulator;

Result<std::unique_ptr<FleetSimulator>> FleetSimulator::create(const config::Config& config,
                                                               Extensions extensions) {
  auto sim = std::make_unique<Simulator>();
  FEDFLEET_RETURN_IF_ERROR(sim->init(config, std::move(extensions)));
  return std::unique_ptr<FleetSimulator>(std::move(sim));
}

std::string formatSummary(const SimSummary& s) {
  auto pct = [](std::optional<double> v) {
    char buf[32];
    if (!v) return std::string("-");
    std::snprintf(buf, sizeof(buf), "%.2f%%", 100 * *v);
    return std::string(buf);
  };
  // A run with a test accuracy says it and its best; others (a regression, federated
  // evaluation alone) their latest metrics.
  std::string evaluation =
      "test accuracy " + pct(s.final_accuracy) + " (best " + pct(s.best_accuracy) + ")";
  if (!s.final_accuracy) {
    evaluation = s.last_metrics.empty()
                     ? std::string("no evaluation")
                     : "round " + std::to_string(s.last_metrics_round) + ": " + s.last_metrics;
  }
  char buf[1024];
  std::snprintf(
      buf, sizeof(buf),
      "run %lld: %u rounds (%u failed), %s\n"
      "time: %s virtual (median round %s), %s wall (median round %.3f s)\n"
      "updates: %llu completed, %llu late, %llu dropped, %llu rejected; %llu of %llu clients "
      "took part\n"
      "bytes: %.1f MiB up, %.1f MiB down\n",
      static_cast<long long>(s.run_id), s.rounds, s.failed_rounds, evaluation.c_str(),
      ProgressDisplay::duration(s.virtual_seconds).c_str(),
      ProgressDisplay::duration(s.median_round_virtual_s).c_str(),
      ProgressDisplay::duration(s.wall_seconds).c_str(), s.median_round_wall_s,
      static_cast<unsigned long long>(s.completed), static_cast<unsigned long long>(s.late),
      static_cast<unsigned long long>(s.dropped), static_cast<unsigned long long>(s.rejected),
      static_cast<unsigned long long>(s.distinct_participants),
      static_cast<unsigned long long>(s.registered_clients), s.bytes_up / 1048576.0,
      s.bytes_down / 1048576.0);
  return buf;
}

}  // namespace fedfleet::sim
