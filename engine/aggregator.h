// Aggregator: how a round's completed updates become the pseudo-gradient G that the server
// optimiser applies (protocol steps 6, 8a and 8 in round_engine.h). One object per run, chosen
// once from EngineOptions::aggregator; the engine keeps the running sum, the kept payloads and
// the norm bound, and asks the aggregator only what differs between methods:
//   fedavg        weights n_k; G = sum_k n_k D_k / sum_k n_k
//   fednova       d_k = D_k / a_k(tau_k, momentum), scaled by tau_eff (update_weights.h)
//   scaffold      unweighted mean of D_k, and c += |S|/N mean Dc_k; updates are 2P values long
//                 (delta, then control delta) and every task carries c
//   median,       coordinate-wise over the complete updates, unweighted (robust_aggregator.h):
//   trimmed_mean  they are buffered at completion instead of folded into the running sum
//   custom        a buffering aggregator the driver supplies (EngineOptions::custom_aggregator:
//                 the Python package's strategies); the engine's checks all apply before it
// A linear aggregator folds each update at settlement with the weight settleFoldWeight() gives;
// a buffering one receives each complete update through buffer(). The methods and their
// papers: docs/ARCHITECTURE.md. One owner: not thread-safe.
//
// What comes next fits here as objects, not branches: differential privacy (clipping and noise
// around an aggregator) and secure aggregation (masked sums) wrap or replace one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/history/records.h"
#include "common/status.h"
#include "common/wire/messages.h"
#include "engine/robust_aggregator.h"
#include "engine/update_weights.h"

namespace fedfleet::engine {

struct EngineOptions;

enum class AggregatorKind { kFedAvg, kFedNova, kScaffold, kMedian, kTrimmedMean, kCustom };
// "fedavg", "fednova", "scaffold", "median", "trimmed_mean", "custom" (the config's
// aggregation.method);
// anything else is kInvalidArgument.
Result<AggregatorKind> parseAggregatorKind(std::string_view name);
// The config name of `kind`, as the history's events spell it.
const char* aggregatorName(AggregatorKind kind);

// Median and trimmed mean: the robust aggregator `options` ask for, for updates of `n_params`.
RobustAggregatorOptions robustAggregatorOptions(const EngineOptions& options, uint64_t n_params);
// kInvalidArgument when the aggregator `options` ask for cannot be built (a robust aggregator's
// trim fraction out of range).
Status validateAggregatorOptions(const EngineOptions& options);

// What the engine knows of a round when it asks for the pseudo-gradient.
struct RoundTotals {
  double weight = 0;              // sum of the completed updates' (capped) weights
  uint32_t completed = 0;         // updates that count
  size_t registered_clients = 0;  // clients the engine knows (SCAFFOLD's N)
  uint32_t round = 0;             // the round being settled
};

// A client's federated evaluation of the model its task carried (Aggregator::
// aggregateEvaluation), and the round's as the history records it.
struct EvaluationReport {
  std::string client;
  uint64_t samples = 0;
  double loss = 0;
  std::optional<double> accuracy;
  history::Metrics metrics;
};
struct RoundEvaluation {
  std::optional<double> loss, accuracy;
  history::Metrics metrics;
};

class Aggregator;
// Builds an aggregator for a model of n values (EngineOptions::custom_aggregator). `secure`:
// secure aggregation is on, so the engine never sees an update in the clear: the aggregator
// must not buffer (buffersUpdates() false), and its pseudoGradient gets the unmasked sum of
// the survivors' weighted updates with RoundTotals::weight their total weight.
using AggregatorFactory =
    std::function<std::unique_ptr<Aggregator>(uint64_t n_params, bool secure)>;

// What the engine knows of a complete update it hands a buffering aggregator.
struct BufferedUpdate {
  std::string_view client;  // the client's id (its authenticated key's name)
  double samples = 0;       // the samples it claimed, as bounded by the engine
  uint64_t steps = 0;       // its local steps
  double weight = 0;        // its weight n_k, as its chunks declared it
};

class Aggregator {
 public:
  // The aggregator of `options` for a model of `n_params` values. Aborts on options
  // validateAggregatorOptions refuses (drivers check first).
  static std::unique_ptr<Aggregator> create(const EngineOptions& options, uint64_t n_params);
  virtual ~Aggregator() = default;

  AggregatorKind kind() const { return kind_; }
  const char* name() const { return aggregatorName(kind_); }

  // Values an update holds: the model's P (SCAFFOLD: 2P).
  virtual uint64_t updateSize() const { return n_params_; }
  // Whether complete updates go to buffer() at completion (median, trimmed mean) instead of
  // being folded into the running sum when the round settles.
  virtual bool buffersUpdates() const { return false; }
  // Whether an update beyond the norm bound may be clipped to it (SCAFFOLD: its delta and
  // control delta have no single norm to scale by, so it is rejected instead).
  virtual bool clippable() const { return true; }

  // The weight an update's chunks would be folded with, from what its first chunk declares
  // (n samples, local steps); the engine bounds the values against it. An error (its message
  // the reason) rejects the update.
  virtual Result<double> chunkFoldWeight(double n_samples, uint64_t steps) const;
  // At settlement (linear aggregators, dispatch order): the weight the update of (capped)
  // weight `weight` and `steps` local steps is folded with. Records it in the round's totals.
  virtual double settleFoldWeight(double weight, uint64_t steps) { return weight; }
  // Buffering aggregators: keeps a complete update of updateSize() values (already clipped
  // to aggregation.clip_norm when that is set). An error rejects the update.
  virtual Status buffer(const float* update, size_t n, const BufferedUpdate& facts);

  // Turns the round's running sum (updateSize() values) into G, in place in its first P
  // values. False, with `failure` saying why, when it is not usable; then no state changed.
  virtual bool pseudoGradient(float* sum, const RoundTotals& totals, std::string* failure) = 0;
  // The model took the step with the last G: state that follows it (SCAFFOLD's c) moves on.
  virtual void stepTaken() {}
  // Forgets the round's totals and buffered updates (after every round).
  virtual void clearRound() {}

  // Adds what every task must carry for this aggregator (SCAFFOLD: c).
  virtual void prepareTask(wire::Task& /*task*/) const {}
  // Per-client settings (a strategy's configure_fit). roundStarting: a synchronous round's
  // clients, in dispatch order, before its tasks go out. configureTask: each task's
  // hyper-parameters, after the config's and before the engine sizes the work and bounds the
  // steps it will accept by them. An aggregator that fails in either fails the round through
  // its pseudoGradient (the model unchanged, the reason recorded).
  virtual void roundStarting(uint32_t /*round*/, const std::vector<std::string>& /*clients*/) {}
  virtual void configureTask(const std::string& /*client*/, wire::HyperParams& /*hp*/) {}
  // After the engine computed the round's federated evaluation from the completed updates'
  // reports (`evaluation`: the samples-weighted means), the aggregator may replace it (a
  // strategy's aggregate_evaluate). An error leaves it as it was; the engine records why.
  virtual Status aggregateEvaluation(uint32_t /*round*/,
                                     const std::vector<EvaluationReport>& /*reports*/,
                                     RoundEvaluation& /*evaluation*/) {
    return Status::ok();
  }

  // State across rounds (SCAFFOLD's c as fp32 bytes; empty for the others): the engine state's
  // control section and the model snapshot kept for a refused evaluation.
  virtual std::string saveState() const { return {}; }
  // kCorrupt when a non-empty `blob` is not a state of this aggregator; changes nothing.
  Status checkState(std::string_view blob) const;
  // Restores a blob checkState() accepted; an empty blob changes nothing.
  virtual void loadState(std::string_view /*blob*/) {}

 protected:
  Aggregator(AggregatorKind kind, uint64_t n_params) : kind_(kind), n_params_(n_params) {}
  // Bytes of saveState() (0: stateless).
  virtual size_t stateBytes() const { return 0; }

  const AggregatorKind kind_;
  const uint64_t n_params_;
};

// x += eta_g sum_k n_k D_k / sum_k n_k.
class FedAvgAggregator : public Aggregator {
 public:
  explicit FedAvgAggregator(uint64_t n_params) : Aggregator(AggregatorKind::kFedAvg, n_params) {}
  bool pseudoGradient(float* sum, const RoundTotals& totals, std::string* failure) override;
};

// FedNova (update_weights.h): each update folded with n_k / a_k, G scaled by tau_eff / N.
class FedNovaAggregator : public Aggregator {
 public:
  // `momentum`: the clients' SGD momentum rho, in [0, 1).
  FedNovaAggregator(uint64_t n_params, double momentum)
      : Aggregator(AggregatorKind::kFedNova, n_params), momentum_(momentum) {}
  Result<double> chunkFoldWeight(double n_samples, uint64_t steps) const override;
  double settleFoldWeight(double weight, uint64_t steps) override;
  bool pseudoGradient(float* sum, const RoundTotals& totals, std::string* failure) override;
  void clearRound() override { totals_.clear(); }

 private:
  const double momentum_;
  FedNovaAccumulator totals_;
};

// SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates: updates are delta D_k
// then control delta Dc_k; x += eta_g mean_k D_k and c += (|S| / N) mean_k Dc_k = sum Dc_k / N.
class ScaffoldAggregator : public Aggregator {
 public:
  explicit ScaffoldAggregator(uint64_t n_params);
  uint64_t updateSize() const override { return 2 * n_params_; }
  bool clippable() const override { return false; }
  Result<double> chunkFoldWeight(double, uint64_t) const override { return 1.0; }
  double settleFoldWeight(double, uint64_t) override { return 1; }  // unweighted
  bool pseudoGradient(float* sum, const RoundTotals& totals, std::string* failure) override;
  void stepTaken() override;
  void prepareTask(wire::Task& task) const override { task.control_bytes = control_bytes_; }
  std::string saveState() const override { return control_bytes_; }
  void loadState(std::string_view blob) override;

  const std::vector<float>& control() const { return control_; }

 protected:
  size_t stateBytes() const override { return control_bytes_.size(); }

 private:
  std::vector<float> control_;  // c
  std::string control_bytes_;   // c as sent in tasks
  std::vector<float> next_;     // c after the step whose G was computed last
};

// Coordinate-wise median or trimmed mean of the complete updates (robust_aggregator.h).
class RobustMeanAggregator : public Aggregator {
 public:
  RobustMeanAggregator(AggregatorKind kind, std::unique_ptr<RobustAggregator> robust,
                       uint64_t n_params)
      : Aggregator(kind, n_params), robust_(std::move(robust)) {}
  bool buffersUpdates() const override { return true; }
  Status buffer(const float* update, size_t n, const BufferedUpdate& /*facts*/) override {
    return robust_->add(update, n);
  }
  bool pseudoGradient(float* sum, const RoundTotals& totals, std::string* failure) override;
  void clearRound() override { robust_->clear(); }

 private:
  std::unique_ptr<RobustAggregator> robust_;
};

}  // namespace fedfleet::engine
