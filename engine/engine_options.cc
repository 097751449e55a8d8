#include "engine/engine_options.h"

namespace fedfleet::engine {

Result<NormBoundAction> parseNormBoundAction(const std::string& name) {
  if (name == "clip") return NormBoundAction::kClip;
  if (name == "reject") return NormBoundAction::kReject;
  return invalidArgument("norm bound action '" + name + "': expected \"clip\" or \"reject\"");
}

ServerOptimizerOptions serverOptimizerOptions(const EngineOptions& o) {
  ServerOptimizerOptions so;
  so.kind = o.server_optimizer;
  so.lr = o.server_lr;
  so.beta1 = o.beta1;
  so.beta2 = o.beta2;
  so.tau = o.tau;
  so.momentum = o.server_momentum;
  return so;
}

Status checkEngineOptions(const EngineOptions& options) {
  if (options.max_samples_per_update == 0 && options.partition_sizes.empty()) {
    return invalidArgument(
        "config [coordinator]: max_samples_per_update = 0 (no bound on the samples an update "
        "claims) needs the partition sizes, which are not known");
  }
  Status st = validateSelectorOptions(options.selector);
  if (!st.isOk()) return st.withContext("config [selection]");
  auto opt = ServerOptimizer::create(serverOptimizerOptions(options));
  if (!opt.isOk()) return opt.status().withContext("config [aggregation]");
  st = validateAggregatorOptions(options);
  if (!st.isOk()) return st.withContext("config [aggregation]");
  st = validateDeadlineOptions(options);
  if (!st.isOk()) return st.withContext("config [policy]");
  const auto& b = options.blocks;
  if (b.count > 0) {
    if ((b.rounds_per_block > 0) == (b.block_s > 0)) {
      return invalidArgument("config [blocks]: set exactly one of rounds_per_block and block_s");
    }
    if (options.async || options.sample_partitions) {
      return invalidArgument(
          "config [blocks]: blocks need synchronous rounds and sample_from = \"clients\"");
    }
    if (options.block_mode == BlockMode::kMultichain &&
        (options.aggregator == AggregatorKind::kScaffold ||
         options.server_optimizer != ServerOptimizerKind::kFedAvg)) {
      return invalidArgument(
          "config [blocks]: multichain needs aggregation without state across rounds (no "
          "scaffold, server_optimizer fedavg)");
    }
  }
  return Status::ok();
}

}  // namespace fedfleet::engine
