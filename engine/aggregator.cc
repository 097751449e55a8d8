#include "engine/aggregator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "engine/engine_options.h"
#include "kernels/accumulate.h"

namespace fedfleet::engine {

Result<AggregatorKind> parseAggregatorKind(std::string_view name) {
  for (AggregatorKind k :
       {AggregatorKind::kFedAvg, AggregatorKind::kFedNova, AggregatorKind::kScaffold,
        AggregatorKind::kMedian, AggregatorKind::kTrimmedMean, AggregatorKind::kCustom}) {
    if (name == aggregatorName(k)) return k;
  }
  return invalidArgument("aggregation method '" + std::string(name) +
                         "': expected fedavg, fednova, scaffold, median, trimmed_mean or custom");
}

const char* aggregatorName(AggregatorKind kind) {
  switch (kind) {
    case AggregatorKind::kFedAvg:
      return "fedavg";
    case AggregatorKind::kFedNova:
      return "fednova";
    case AggregatorKind::kScaffold:
      return "scaffold";
    case AggregatorKind::kMedian:
      return "median";
    case AggregatorKind::kTrimmedMean:
      return "trimmed_mean";
    case AggregatorKind::kCustom:
      return "custom";
  }
  return "unknown";
}

namespace {

bool isRobust(AggregatorKind kind) {
  return kind == AggregatorKind::kMedian || kind == AggregatorKind::kTrimmedMean;
}

}  // namespace

RobustAggregatorOptions robustAggregatorOptions(const EngineOptions& o, uint64_t n_params) {
  RobustAggregatorOptions ro;
  ro.kind =
      o.aggregator == AggregatorKind::kMedian ? RobustKind::kMedian : RobustKind::kTrimmedMean;
  ro.trim_fraction = o.trim_fraction;
  ro.n_params = std::max<uint64_t>(n_params, 1);
  ro.memory_bound_bytes = o.robust_buffer_bytes;
  const char* tmp = std::getenv("TMPDIR");
  ro.spill_dir = tmp && *tmp ? tmp : "/tmp";
  return ro;
}

Status validateAggregatorOptions(const EngineOptions& options) {
  if (options.aggregator == AggregatorKind::kCustom && !options.custom_aggregator) {
    return invalidArgument(
        "aggregation.method = \"custom\" is a strategy given from Python "
        "(fedfleet.simulate(..., strategy=...)); the fedfleet command has none: choose fedavg, "
        "fednova, scaffold, median or trimmed_mean");
  }
  if (isRobust(options.aggregator)) {
    auto agg = RobustAggregator::create(robustAggregatorOptions(options, 1));
    if (!agg.isOk()) return agg.status();
  }
  return Status::ok();
}

std::unique_ptr<Aggregator> Aggregator::create(const EngineOptions& options, uint64_t n_params) {
  switch (options.aggregator) {
    case AggregatorKind::kFedAvg:
      return std::make_unique<FedAvgAggregator>(n_params);
    case AggregatorKind::kFedNova:
      return std::make_unique<FedNovaAggregator>(n_params, options.hparams.momentum);
    case AggregatorKind::kScaffold:
      return std::make_unique<ScaffoldAggregator>(n_params);
    case AggregatorKind::kMedian:
    case AggregatorKind::kTrimmedMean: {
      auto robust = RobustAggregator::create(robustAggregatorOptions(options, n_params));
      FEDFLEET_CHECK(robust.isOk());  // validateAggregatorOptions() at start-up says why
      return std::make_unique<RobustMeanAggregator>(options.aggregator, std::move(*robust),
                                                    n_params);
    }
    case AggregatorKind::kCustom:
      FEDFLEET_CHECK(options.custom_aggregator);  // validateAggregatorOptions() says why
      return options.custom_aggregator(n_params, options.secagg.enabled);
  }
  FEDFLEET_CHECK_MSG(false, "unknown aggregator kind");
  return nullptr;
}

Result<double> Aggregator::chunkFoldWeight(double n_samples, uint64_t /*steps*/) const {
  return n_samples;
}

Status Aggregator::buffer(const float* /*update*/, size_t /*n*/, const BufferedUpdate& /*facts*/) {
  FEDFLEET_CHECK_MSG(false, "buffer() on an aggregator that folds into the running sum");
  return Status::ok();
}

Status Aggregator::checkState(std::string_view blob) const {
  if (!blob.empty() && blob.size() != stateBytes()) {
    return corrupt("engine state: control variate of " + std::to_string(blob.size()) +
                   " bytes, expected " + std::to_string(stateBytes()));
  }
  return Status::ok();
}

bool FedAvgAggregator::pseudoGradient(float* sum, const RoundTotals& totals,
                                      std::string* /*failure*/) {
  kernels::scale(sum, static_cast<float>(1.0 / totals.weight), n_params_);
  return true;
}

Result<double> FedNovaAggregator::chunkFoldWeight(double n_samples, uint64_t steps) const {
  if (steps == 0) {
    return invalidArgument("FedNova needs the update's local steps (chunk says 0)");
  }
  return totals_.foldWeight(n_samples, fedNovaNormaliser(steps, momentum_));
}

double FedNovaAggregator::settleFoldWeight(double weight, uint64_t steps) {
  const double a = fedNovaNormaliser(steps, momentum_);
  const double fold = totals_.foldWeight(weight, a);
  totals_.add(weight, a);
  return fold;
}

bool FedNovaAggregator::pseudoGradient(float* sum, const RoundTotals& /*totals*/,
                                       std::string* /*failure*/) {
  kernels::scale(sum, static_cast<float>(totals_.finalScale()), n_params_);
  return true;
}

ScaffoldAggregator::ScaffoldAggregator(uint64_t n_params)
    : Aggregator(AggregatorKind::kScaffold, n_params),
      control_(n_params, 0.0f),
      control_bytes_(n_params * sizeof(float), '\0') {}

bool ScaffoldAggregator::pseudoGradient(float* sum, const RoundTotals& totals,
                                        std::string* failure) {
  // x += eta_g mean_k D_k; c += (|S| / N) mean_k Dc_k = sum_k Dc_k / N.
  const size_t n = n_params_;
  const float total = static_cast<float>(std::max<size_t>(totals.registered_clients, 1));
  next_ = control_;
  kernels::weightedAccumulate(next_.data(), sum + n, 1.0f / total, n);
  if (!kernels::allFinite(next_.data(), n)) {
    *failure = "the control variate would not be finite";
    next_.clear();
    return false;
  }
  kernels::scale(sum, 1.0f / static_cast<float>(totals.completed), n);
  return true;
}

void ScaffoldAggregator::stepTaken() {
  if (next_.empty()) return;
  control_ = std::move(next_);
  next_.clear();
  std::memcpy(control_bytes_.data(), control_.data(), n_params_ * sizeof(float));
}

void ScaffoldAggregator::loadState(std::string_view blob) {
  if (blob.empty()) return;
  control_bytes_.assign(blob);
  std::memcpy(control_.data(), control_bytes_.data(), control_bytes_.size());
}

bool RobustMeanAggregator::pseudoGradient(float* sum, const RoundTotals& /*totals*/,
                                          std::string* failure) {
  if (Status st = robust_->aggregate(sum); !st.isOk()) {
    *failure = "the robust aggregate failed: " + st.message();
    return false;
  }
  return true;
}

}  // namespace fedfleet::engine
