#include "driver/run_setup.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/clock.h"
#include "common/crypto/keyed_stream.h"
#include "common/data/dataset.h"
#include "common/history/format.h"
#include "common/model/evaluate.h"
#include "common/model/export.h"
#include "common/wire/data_split.h"
#include "common/wire/messages.h"

namespace fedfleet::driver {
namespace {

// The engine's names for the config's choices (one case each: a new value of either enum is a
// compile warning here).
engine::AggregatorKind aggregatorOf(config::AggregationMethod m) {
  using M = config::AggregationMethod;
  using K = engine::AggregatorKind;
  switch (m) {
    case M::kFedAvg:
      return K::kFedAvg;
    case M::kFedNova:
      return K::kFedNova;
    case M::kScaffold:
      return K::kScaffold;
    case M::kMedian:
      return K::kMedian;
    case M::kTrimmedMean:
      return K::kTrimmedMean;
    case M::kCustom:
      return K::kCustom;
  }
  return K::kFedAvg;
}

engine::ServerOptimizerKind serverOptimizerOf(config::ServerOptimizer o) {
  using O = config::ServerOptimizer;
  using K = engine::ServerOptimizerKind;
  switch (o) {
    case O::kFedAvg:
      return K::kFedAvg;
    case O::kFedAvgM:
      return K::kFedAvgM;
    case O::kFedAdagrad:
      return K::kFedAdagrad;
    case O::kFedAdam:
      return K::kFedAdam;
    case O::kFedYogi:
      return K::kFedYogi;
  }
  return K::kFedAvg;
}

engine::NormBoundAction normBoundActionOf(config::NormBoundAction a) {
  return a == config::NormBoundAction::kReject ? engine::NormBoundAction::kReject
                                               : engine::NormBoundAction::kClip;
}

engine::DeadlineMode deadlineModeOf(config::DeadlineKind d) {
  return d == config::DeadlineKind::kPercentile ? engine::DeadlineMode::kPercentile
                                                : engine::DeadlineMode::kFixed;
}

engine::SelectorKind selectorOf(config::SelectorKind s) {
  using S = config::SelectorKind;
  using K = engine::SelectorKind;
  switch (s) {
    case S::kUniform:
      return K::kUniform;
    case S::kOort:
      return K::kOort;
    case S::kAvailability:
      return K::kAvailability;
  }
  return K::kUniform;
}

engine::BlockMode blockModeOf(config::BlocksMode b) {
  using B = config::BlocksMode;
  using K = engine::BlockMode;
  switch (b) {
    case B::kSingle:
      return K::kSingle;
    case B::kPluralistic:
      return K::kPluralistic;
    case B::kMultichain:
      return K::kMultichain;
  }
  return K::kSingle;
}

}  // namespace

engine::EngineOptions engineOptionsFromConfig(const config::Config& config, int64_t run_id) {
  const auto& cc = config.coordinator;
  engine::EngineOptions eo;
  eo.run_id = run_id;
  eo.rounds = config.run.rounds;
  eo.target_accuracy = config.run.target_accuracy;
  eo.clients_per_round = cc.clients_per_round;
  eo.min_clients = config.minClients();
  eo.quorum = config.quorum();
  eo.deadline_s = cc.deadline_s;
  eo.liveness_s = cc.liveness_s;
  eo.wait_clients_s = cc.wait_clients_s;
  eo.max_failed_rounds = cc.max_failed_rounds;
  eo.sample_partitions = cc.sample_from == config::SampleFrom::kPartitions;
  eo.num_partitions = config.partitions();
  eo.server.lr = cc.server_lr;
  eo.checkpoint_every = cc.checkpoint_every;
  eo.seed = config.run.seed;
  eo.model_name = config.model.name;
  eo.hparams.epochs = config.train.epochs;
  eo.hparams.max_steps = config.train.steps;
  eo.hparams.batch_size = config.train.batch;
  eo.hparams.lr = static_cast<float>(config.train.lr);
  eo.hparams.momentum = static_cast<float>(config.train.momentum);
  eo.hparams.optimizer = wire::parseOptimizer(config.train.optimizer).value();  // validated
  eo.hparams.loss = wire::parseLoss(config.train.loss).value();                 // validated
  eo.hparams.weight_decay = static_cast<float>(config.train.weight_decay);
  eo.data.dataset = config.dataFormatName();
  eo.data.scheme = config::choiceName(config.data.partition);
  eo.data.alpha = config.data.alpha;
  eo.data.labels_per_client = config.data.labels_per_client;
  eo.data.shards_per_client = config.data.shards_per_client;
  eo.data.seed = config.run.seed;
  eo.data.subset = config.data.train_subset;
  eo.chunk_bytes = cc.chunk_kib * 1024;
  eo.codec = cc.codec;
  eo.eval_every = cc.eval_every;
  eo.fed_eval_every = cc.fed_eval_every;
  eo.fed_eval_clients = cc.fed_eval_clients;
  // A coordinator of clients with their own files and no test file of its own evaluates
  // nothing itself: federated evaluation alone says how the model does.
  eo.server_eval = !(config.readsDataFiles() && config.data.test_path.empty());
  eo.slow_link_codec = cc.slow_link_codec;
  eo.slow_link_mbps = cc.slow_link_mbps;
  eo.partial_buffer_bytes = uint64_t{cc.partial_buffer_mib} << 20;
  eo.max_concurrent_uploads = cc.max_concurrent_uploads;
  eo.upload_idle_s = cc.upload_idle_s;
  eo.hparams.prox_mu = static_cast<float>(config.train.prox_mu);
  const auto& a = config.aggregation;
  eo.aggregator = aggregatorOf(a.method);
  eo.hparams.scaffold = a.method == config::AggregationMethod::kScaffold;
  eo.trim_fraction = a.trim_fraction;
  eo.clip_norm = a.clip_norm;
  eo.server.kind = serverOptimizerOf(a.server_optimizer);
  eo.server.momentum = a.server_momentum;
  eo.server.beta1 = a.beta1;
  eo.server.beta2 = a.beta2;
  eo.server.tau = a.tau;
  eo.robust_buffer_bytes = uint64_t{a.buffer_mib} << 20;
  eo.norm_bound = a.norm_bound;
  eo.norm_bound_action = normBoundActionOf(a.norm_bound_action);
  eo.norm_window = a.norm_window;
  eo.norm_growth = a.norm_growth;
  eo.quarantine_after = a.quarantine_after;
  eo.quarantine_rounds = a.quarantine_rounds;
  eo.weight_cap = a.weight_cap;
  eo.max_samples_per_update = cc.max_samples_per_update;
  eo.max_loss = config.limits.max_loss;
  eo.events_per_client_round = config.limits.events_per_client_round;
  eo.events_burst = config.limits.events_burst;
  eo.events_every_s = config.limits.events_every_s;
  const auto& p = config.policy;
  eo.async = p.mode == config::PolicyMode::kAsync;
  eo.deadline_mode = deadlineModeOf(p.deadline);
  eo.deadline_percentile = p.deadline_percentile;
  eo.deadline_window = p.deadline_window;
  eo.deadline_slack = p.deadline_slack;
  eo.over_selection = p.over_selection;
  eo.partial_work = p.partial_work;
  eo.adaptive_steps = p.adaptive_steps;
  eo.adaptive_target = p.adaptive_target;
  eo.adaptive_max_factor = p.adaptive_max_factor;
  eo.async_concurrency = p.async_concurrency;
  eo.async_buffer = p.async_buffer;
  eo.max_staleness = p.max_staleness;
  const auto& sel = config.selection;
  eo.selector.kind = selectorOf(sel.selector);
  eo.selector.explore_initial = sel.explore_initial;
  eo.selector.explore_decay = sel.explore_decay;
  eo.selector.explore_min = sel.explore_min;
  eo.selector.alpha = sel.alpha;
  eo.selector.preferred_duration_s = sel.preferred_duration_s;
  eo.selector.cutoff = sel.cutoff;
  eo.selector.pacer_window = sel.pacer_window;
  eo.selector.pacer_step_s = sel.pacer_step_s;
  eo.selector.expected_round_s = sel.expected_round_s;
  eo.selector.recent_failure_rounds = sel.recent_failure_rounds;
  const auto& b = config.blocks;
  eo.blocks.count = b.count;
  eo.blocks.rounds_per_block = b.rounds_per_block;
  eo.blocks.block_s = b.block_s;
  eo.blocks.anchor_s = b.anchor_s;
  eo.blocks.overlap = b.overlap;
  eo.blocks.seed = config.run.seed;
  if (b.count > 0) {
    // Clients split the data as the simulator does (common/data/block_cyclic.h): partition p
    // holds block p mod M data, whatever data.partition says.
    eo.data.scheme = "block-cyclic";
    eo.data.blocks = b.count;
    eo.data.skew = b.skew;
  }
  eo.block_mode = blockModeOf(b.mode);
  const auto& d = config.dp;
  eo.dp.central = d.mode == config::DpMode::kCentral;
  eo.dp.distributed = d.mode == config::DpMode::kDistributed;
  eo.dp.local = d.mode == config::DpMode::kLocal;
  eo.dp.noise_multiplier = d.noise_multiplier;
  eo.dp.clip_norm = d.clip_norm;
  eo.dp.adaptive_clip = d.adaptive_clip;
  eo.dp.target_quantile = d.target_quantile;
  eo.dp.clip_lr = d.clip_lr;
  eo.dp.count_stddev = d.count_stddev;
  eo.dp.delta = d.delta;
  eo.dp.target_epsilon = d.target_epsilon;
  eo.dp.population = d.population;
  // Reproducible noise from the seed (the simulator); a real coordinator replaces the key with
  // a random one, which its clients cannot know.
  eo.dp.noise_key = crypto::streamKeyFromSeed("fedfleet dp noise", config.run.seed);
  const auto& sa = config.secagg;
  eo.secagg.enabled = sa.mode == config::SecAggMode::kSecAggPlus;
  eo.secagg.neighbours = sa.neighbours;
  eo.secagg.threshold = sa.threshold;
  eo.secagg.clip_range = sa.clip_range;
  eo.secagg.quant_range = sa.quant_range;
  eo.secagg.stage_timeout_s = sa.stage_timeout_s;
  return eo;
}

Result<std::vector<uint64_t>> partitionSizes(const engine::EngineOptions& options,
                                             const data::Dataset& train) {
  wire::DataSpec spec = options.data;
  spec.num_partitions = options.num_partitions;
  FEDFLEET_ASSIGN_OR_RETURN(auto parts, wire::splitBySpec(train, spec));
  std::vector<uint64_t> sizes;
  sizes.reserve(parts.size());
  for (const auto& p : parts) sizes.push_back(p.size());
  return sizes;
}

Result<std::vector<uint64_t>> partitionSizes(const config::Config& config,
                                             const engine::EngineOptions& options) {
  if (options.data.dataset != "fashion-mnist" || options.data.scheme == "none") {
    return std::vector<uint64_t>{};  // unknown: each client's own data
  }
  const std::string dir =
      config.data.dir.empty() ? data::defaultFashionMnistDir() : config.data.dir;
  auto train = data::loadFashionMnist(dir, /*train=*/true, options.data.subset);
  if (!train.isOk()) {
    return train.status().withContext("partition sizes: the training split");
  }
  return partitionSizes(options, *train);
}

Status emptyPartitionCheck(const std::vector<uint64_t>& sizes) {
  const auto empty = std::count(sizes.begin(), sizes.end(), uint64_t{0});
  if (empty == 0) return Status::ok();
  uint64_t total = 0;
  for (uint64_t n : sizes) total += n;
  return invalidArgument(
      std::to_string(empty) + " of the " + std::to_string(sizes.size()) +
      " partitions (data.partitions) hold no training sample: " + std::to_string(total) +
      " samples do not go round. Use fewer partitions, more data (data.train_subset) or "
      "data.partition = \"iid\"");
}

CheckpointKeep checkpointKeepFromConfig(const config::Config& config) {
  return {config.coordinator.keep_checkpoints, config.coordinator.keep_best};
}

Status commitRoundToHistory(history::HistoryStore& store, const engine::CommitRound& commit,
                            CheckpointKeep keep, const char* clock_unit) {
  const auto& r = commit.round;
  Status st = store.commitRound(commit.round, commit.updates, commit.checkpoint);
  if (!st.isOk()) {
    return st.withContext("history: committing round " + std::to_string(r.round) +
                          " (the round is lost from the database; the run stops)");
  }
  // Logged once it is in the database, so a log line always means a durable round.
  const std::string metrics = history::roundMetricsText(r);
  spdlog::info("round {:>3} {:<7} {}/{} done, {} late, {} dropped, {} rejected{}{}  {:.2f} {}",
               r.round, r.status, r.completed, r.selected, r.late, r.dropped, r.rejected,
               metrics.empty() ? "" : "  ", metrics, r.end_time - r.start_time, clock_unit);
  if (commit.checkpoint && keep.last > 0) {
    Status pr = store.pruneCheckpoints(r.run_id, keep.last, keep.best);
    if (!pr.isOk()) spdlog::warn("pruning checkpoints: {}", pr.toString());
  }
  return Status::ok();
}

Status checkModelFitsConfigData(model::Model& model, const data::Dataset& ds,
                                const config::Config& config, const std::string& role) {
  std::string model_name = "'" + config.model.name + "'";
  if (!config.model.path.empty()) model_name += " (" + config.model.path + ")";
  std::string data_name = "'" + config.dataFormatName() + "'";
  const std::string& file =
      role == "test" && !config.data.test_path.empty() ? config.data.test_path : config.data.path;
  if (config.readsDataFiles() && !file.empty()) data_name += " (" + file + ")";
  data_name += ", " + role + " set";
  return model::checkModelFitsData(model, ds, model_name, data_name);
}

Result<std::unique_ptr<model::Model>> createRunModel(const config::Config& config,
                                                     const model::InputShape& shape,
                                                     const RunModelChecks& checks) {
  FEDFLEET_ASSIGN_OR_RETURN(
      auto model, model::createModel(config.model.name, config.run.seed, config.model.path, shape));
  model->setLoss(wire::parseLoss(config.train.loss).value());  // validated
  if (checks.load_init && !config.model.init.empty()) {
    FEDFLEET_RETURN_IF_ERROR(model::loadWeights(*model, config.model.init));
  }
  if (checks.training != nullptr) {
    FEDFLEET_RETURN_IF_ERROR(
        checkModelFitsConfigData(*model, *checks.training, config, "training"));
  }
  if (checks.test != nullptr) {
    FEDFLEET_RETURN_IF_ERROR(checkModelFitsConfigData(*model, *checks.test, config, "test"));
  }
  return model;
}

Result<std::unique_ptr<history::HistoryStore>> openRunHistory(const std::string& db,
                                                              bool in_memory_ok) {
  if (in_memory_ok && db == ":memory:") return history::createMemoryHistory();
  return history::openSqliteHistory(db);
}

history::RunRecord newRunRecord(const config::Config& config, const std::string& clock,
                                std::string model_json, const config::Config* recorded) {
  history::RunRecord run;
  run.name = config.run.name;
  run.config_json = (recorded ? *recorded : config).toJson().dump();
  run.started_at = unixNow();
  run.seed = config.run.seed;
  run.clock = clock;
  run.model_json = std::move(model_json);
  return run;
}

}  // namespace fedfleet::driver
