// Update weights: the per-update factors the coordinator applies while folding updates into the
// round's running sum (FedNova normalisers, FedBuff staleness weights, norm clipping), and the
// FedNova bookkeeping that lets it stream. FedNova: Wang et al., "Tackling the Objective
// Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS 2020.
//
// FedNova, streamed. With p_k = n_k / N and N = sum_k n_k, the server step is
//   x <- x + eta_g * tau_eff * sum_k p_k D_k / a_k,   tau_eff = sum_k p_k a_k.
// Both sums factor into per-update terms, so nothing needs all updates at once:
//   1. Each chunk of update k is folded into the running sum S with weight
//      foldWeight(n_k, a_k) = n_k / a_k (a_k = fedNovaNormaliser(tau_k, rho) from the update's
//      steps tau_k and the task's client momentum rho). A chunk taken back out (partial update)
//      is subtracted with the same weight.
//   2. When the update counts (its summary arrived, step 5 of the round protocol), add(n_k, a_k)
//      records it: N += n_k and sum_k n_k a_k.
//   3. At aggregation G = finalScale() * S, with finalScale() = (sum n_k a_k / N) / N =
//      tau_eff / N; G is the FedNova pseudo-gradient and goes to the server optimiser
//      (x += eta_g G for fedavg; fedavgm/fedadam/... apply their rule to it).
// With equal tau_k every a_k is the same a, so G = (a N / N) / N * sum n_k D_k / a =
// sum_k p_k D_k: FedAvg.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/fednova.h"

namespace fedfleet::engine {

// FedNova's normaliser a_k (common/fednova.h): shared with the client, which applies it itself
// under secure aggregation.
using fedfleet::fedNovaNormaliser;

// FedBuff's staleness weight w(s) = 1 / sqrt(1 + s): w(0) = 1, w(3) = 0.5.
double stalenessWeight(uint64_t staleness);

// The factor that clips an update of L2 norm `norm` to `clip`: min(1, clip / norm). clip <= 0
// means no clipping (1). A norm of 0 gives 1; a non-finite norm gives 0 (callers reject
// non-finite updates before; this keeps such an update from getting through regardless).
double clipScale(double norm, double clip);

// The L2 norm of x[0..n), in double: sqrt of kernels::squaredNorm (each square exact, summed in
// a fixed order), so the same on every machine and build. NaN or infinity if some x[i] is.
// Streaming clipping needs the norm of the complete update before its first chunk is folded
// with weight w * clipScale(norm, S), so the client reports it (or the coordinator buffers the
// update); for chunk c of an update, the squares add: norm^2 = sum_c l2Norm(c)^2.
double l2Norm(const float* x, size_t n);

// The lower median of `values`: the element of rank floor((n - 1) / 2) in ascending order (of
// two values, the smaller), 0 when empty. The robust bounds use it as "the round's typical
// update": with one honest and one hostile update it is the honest one, where the midpoint of
// the two would be half the hostile one.
double lowerMedian(std::vector<double> values);

// The most local steps a task can run (the bound on the steps an update may claim): max_steps
// when it is set, else epochs full passes over `samples` in batches of `batch_size`
// (epochs x ceil(samples / batch_size)); batch_size 0 counts as 1.
uint64_t plannedSteps(uint32_t epochs, uint32_t max_steps, uint32_t batch_size, uint64_t samples);

// FedNova's running totals for one round (see the top of this file). Plain value type.
class FedNovaAccumulator {
 public:
  // The weight to fold update k's chunks into the running sum with: n_k / a_k. Requires
  // n_k >= 0 and a_k > 0 (an update with 0 steps must be rejected before; aborts otherwise).
  double foldWeight(double n_k, double a_k) const;
  // Records a completed update (once per update, when it counts).
  void add(double n_k, double a_k);
  // G = finalScale() * (running sum): tau_eff / N. 0 when nothing was added.
  double finalScale() const;

  // tau_eff = sum n_k a_k / sum n_k (0 when nothing was added); N = sum n_k.
  double effectiveSteps() const;
  double totalWeight() const { return sum_n_; }
  uint64_t count() const { return count_; }
  void clear() { *this = FedNovaAccumulator(); }

 private:
  double sum_n_ = 0;
  double sum_na_ = 0;
  uint64_t count_ = 0;
};

}  // namespace fedfleet::engine
