#include "engine/engine_options.h"

#include "common/compress/codec_spec.h"

namespace fedfleet::engine {

Result<NormBoundAction> parseNormBoundAction(const std::string& name) {
  if (name == "clip") return NormBoundAction::kClip;
  if (name == "reject") return NormBoundAction::kReject;
  return invalidArgument("norm bound action '" + name + "': expected \"clip\" or \"reject\"");
}

Status checkEngineOptions(const EngineOptions& options) {
  if (options.max_samples_per_update == 0 && options.partition_sizes.empty()) {
    return invalidArgument(
        "config [coordinator]: max_samples_per_update = 0 (no bound on the samples an update "
        "claims) needs the partition sizes, which are not known");
  }
  if (auto codec = compress::parseCodecSpec(options.codec); !codec.isOk()) {
    return codec.status().withContext("config [coordinator] codec");
  }
  if (!options.slow_link_codec.empty()) {
    if (auto codec = compress::parseCodecSpec(options.slow_link_codec); !codec.isOk()) {
      return codec.status().withContext("config [coordinator] slow_link_codec");
    }
  }
  Status st = validateSelectorOptions(options.selector);
  if (!st.isOk()) return st.withContext("config [selection]");
  auto opt = ServerOptimizer::create(options.server);
  if (!opt.isOk()) return opt.status().withContext("config [aggregation]");
  st = validateAggregatorOptions(options);
  if (!st.isOk()) return st.withContext("config [aggregation]");
  st = validateDeadlineOptions(options);
  if (!st.isOk()) return st.withContext("config [policy]");
  st = validateDpOptions(options);
  if (!st.isOk()) return st.withContext("config [dp]");
  st = validateSecAggOptions(options);
  if (!st.isOk()) return st.withContext("config [secagg]");
  if (!options.server_eval && options.fed_eval_every == 0) {
    return invalidArgument(
        "config [coordinator]: without test data of its own the coordinator cannot evaluate the "
        "model; set coordinator.fed_eval_every (the clients evaluate it on their held-out data) "
        "or give the coordinator data.test_path");
  }
  if (!options.server_eval && options.target_accuracy > 0) {
    return invalidArgument(
        "config [run]: run.target_accuracy is judged by the coordinator's test set, which "
        "this coordinator does not have; give it data.test_path or leave target_accuracy 0");
  }
  const auto& b = options.blocks;
  if (b.count > 0 && options.fed_eval_every > 0) {
    return invalidArgument(
        "config [coordinator]: fed_eval_every with [blocks]: block-cyclic runs evaluate the "
        "served models on the clients' held-out data already; leave fed_eval_every 0");
  }
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
         options.server.kind != ServerOptimizerKind::kFedAvg)) {
      return invalidArgument(
          "config [blocks]: multichain needs aggregation without state across rounds (no "
          "scaffold, server_optimizer fedavg)");
    }
  }
  return Status::ok();
}

}  // namespace fedfleet::engine
