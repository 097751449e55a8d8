// ServerOptimizer: how the coordinator turns a round's pseudo-gradient into a model step.
//
// The aggregator (streaming weighted sum, FedNova, robust) produces the pseudo-gradient
// G = sum_k p_k D_k, already averaged; the server optimiser applies it to the global model x.
// The rules are those of Reddi et al. ("Adaptive Federated Optimization", ICLR 2021), with
// eta_g = `lr`:
//   fedavg      x += lr G
//   fedavgm     m = momentum m + G;                              x += lr m
//   fedadagrad  v += G^2;                                        m = beta1 m + (1 - beta1) G
//   fedadam     v = beta2 v + (1 - beta2) G^2;                   m = beta1 m + (1 - beta1) G
//   fedyogi     v = v - (1 - beta2) G^2 sign(v - G^2);           m = beta1 m + (1 - beta1) G
//   (the three adaptive ones then) x += lr m / (sqrt(v) + tau)
// Everything is element-wise, in fp32, in plain loops the compiler vectorises; there is no bias
// correction (the paper has none). Reddi et al. start from v_{-1} >= tau^2; fedfleet starts
// from v = 0 (with v = 0 the first adaptive step is lr (1 - beta1) G /
// (sqrt((1 - beta2) G^2) + tau) for fedadam).
//
// The state (m and/or v, one fp32 per parameter) is sized on the first apply() and travels in
// the checkpoint through saveState()/loadState(), so a resumed run continues bit for bit as an
// uninterrupted one would (same binary). One owner: not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace fedfleet::engine {

enum class ServerOptimizerKind { kFedAvg, kFedAvgM, kFedAdagrad, kFedAdam, kFedYogi };
// "fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi" (the config's
// aggregation.server_optimizer); anything else is kInvalidArgument naming the expected ones.
Result<ServerOptimizerKind> parseServerOptimizerKind(std::string_view name);
// The config name of `kind`; also the name saveState() writes into its blob.
const char* serverOptimizerName(ServerOptimizerKind kind);

struct ServerOptimizerOptions {
  ServerOptimizerKind kind = ServerOptimizerKind::kFedAvg;
  double lr = 1.0;        // eta_g, > 0
  double beta1 = 0.9;     // adaptive: first-moment decay, in [0, 1)
  double beta2 = 0.99;    // fedadam, fedyogi: second-moment decay, in [0, 1)
  double tau = 1e-3;      // adaptive: degree of adaptivity, > 0
  double momentum = 0.9;  // fedavgm: server momentum beta, in [0, 1)
};

class ServerOptimizer {
 public:
  // Checks every option whatever the kind (a value out of range is a config error even when
  // that optimiser ignores it). kInvalidArgument naming the key for lr <= 0,
  // beta1 / beta2 / momentum outside [0, 1), tau <= 0 or any non-finite value.
  static Result<std::unique_ptr<ServerOptimizer>> create(const ServerOptimizerOptions& options);

  virtual ~ServerOptimizer() = default;

  // x <- step(x, G) for the n parameters, per the rule of this optimiser; updates its state.
  // The first call sizes the state to n (zeros); later calls must pass the same n (aborts
  // otherwise: the model does not change size within a run). `params` and `pseudo_grad` must not
  // overlap. Never fails; G is expected finite (the caller rejects non-finite updates).
  void apply(float* params, const float* pseudo_grad, size_t n);

  // The optimiser's state as a self-checking little-endian blob: magic "FFSO", format version,
  // the optimiser's name, the state size n (0 before the first apply) and the state buffers
  // (n fp32 each). Hyper-parameters are not included: they come from the run's config.
  std::string saveState() const;
  // Restores a blob from saveState(). kCorrupt for a blob that is not one (bad magic, unknown
  // version, truncated, trailing bytes, sizes that do not add up); kInvalidArgument for the blob
  // of another optimiser (name differs). On failure the current state is left unchanged.
  // Callers should compare stateSize() with the model's size after loading.
  Status loadState(std::string_view blob);

  const char* name() const { return serverOptimizerName(options_.kind); }
  const ServerOptimizerOptions& options() const { return options_; }
  // Parameters the state is sized for: 0 before the first apply() (or after loading such state).
  uint64_t stateSize() const { return state_size_; }

 protected:
  ServerOptimizer(ServerOptimizerOptions options, size_t buffers)
      : options_(std::move(options)), buffers_(buffers) {}
  // One step on sized state: buffers_[i] each hold n floats.
  virtual void step(float* params, const float* g, size_t n) = 0;

  ServerOptimizerOptions options_;
  std::vector<std::vector<float>> buffers_;  // m and/or v, per subclass; none for fedavg

 private:
  uint64_t state_size_ = 0;
};

}  // namespace fedfleet::engine
