// FedProx's Synthetic(alpha, beta) federation (Li et al., MLSys 2020), generated lazily, one
// device at a time.
//
// Device k draws u_k ~ N(0, alpha) and B_k ~ N(0, beta) (second arguments are standard
// deviations, as in the authors' np.random.normal(0, alpha)), v_k ~ N(B_k, 1) per dimension,
// W_k ~ N(u_k, 1) (dim x classes) and b_k ~ N(u_k, 1) (classes); its samples are
// x ~ N(v_k, diag((j+1)^-1.2)), i.e. dimension j has standard deviation (j+1)^-0.6, labelled
// y = argmax(x W_k + b_k) (the first maximum on a tie). It holds floor(lognormal(4, 2)) + 50
// samples. The IID variant (FedProx's Synthetic IID) draws one W ~ N(0, 1), b ~ N(0, 1) and
// v = B * 1 with B ~ N(0, beta) for the whole federation instead (alpha is then unused).
//
// Nothing is stored per device: a federation of a million devices costs as much memory as one of
// thirty. Every device draws from its own std::mt19937_64 streams, seeded through std::seed_seq
// from (seed, k, stream): one for its sample count, one for its parameters, one for each split's
// samples. Device k's data thus depends only on (spec, k): not on which devices were generated
// before, in what order, or on which thread. Draws use std::normal_distribution and
// std::lognormal_distribution, so the numbers differ from NumPy's (same distributions) and, since
// the standard leaves those algorithms to the library, may differ between standard libraries;
// with one library they are bit-for-bit reproducible.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/data/dataset.h"
#include "common/status.h"

namespace fedfleet::data {

struct SyntheticSpec {
  double alpha = 1;  // std of u_k (FedProx's generator uses np.random.normal(0, alpha): a std)
  double beta = 1;   // std of B_k
  uint64_t devices = 30;
  uint32_t dim = 60;
  uint32_t num_classes = 10;
  uint64_t seed = 0;
  double train_fraction = 0.9;
  uint64_t max_samples = 0;  // > 0: cap a device's total samples (the lognormal tail is heavy)
  bool iid = false;          // FedProx's Synthetic IID variant: one shared W, b, v for all devices
};

// A Synthetic(alpha, beta) federation: a spec plus, for the IID variant, the shared parameters.
// Cheap to copy; every method is const and safe to call from several threads at once.
class SyntheticFederation {
 public:
  // Validates `spec`: devices >= 1, dim >= 1, 2 <= num_classes <= 256 (labels are bytes), alpha
  // and beta finite and >= 0, 0 < train_fraction < 1, max_samples == 0 or >= 2 (a device needs a
  // train and a test sample). kInvalidArgument saying which otherwise. O(dim * num_classes) time
  // and memory (the IID variant's shared parameters), whatever the device count.
  static Result<SyntheticFederation> create(const SyntheticSpec& spec);

  const SyntheticSpec& spec() const { return spec_; }
  uint64_t devices() const { return spec_.devices; }

  // Device k's sample count: floor(lognormal(4, 2)) + 50, capped at max_samples when that is > 0.
  // O(1): draws one number, generates no data. Precondition (checked, abort): k < devices().
  uint64_t totalSamples(uint64_t k) const;
  // The train split's size: round(train_fraction * totalSamples(k)), kept within
  // [1, totalSamples(k) - 1] so that both splits hold at least one sample; the test split holds
  // the rest. Precondition (checked, abort): k < devices().
  uint64_t trainSamples(uint64_t k) const;

  // Generates device k's train split (train = true, trainSamples(k) samples) or test split
  // (totalSamples(k) - trainSamples(k) samples) as a feature-vector Dataset: feature_dim = dim,
  // num_classes = num_classes, rows = cols = 0. The two splits are independent draws from the same
  // device distribution (the same W_k, b_k, v_k). O(samples * dim * num_classes) time,
  // O(samples * dim) memory; the same (spec, k, train) always gives the same bytes.
  // Failures: k >= devices() -> kInvalidArgument; the split does not fit in memory ->
  // kResourceExhausted.
  Result<Dataset> generate(uint64_t k, bool train) const;

 private:
  struct Parameters;  // v (dim), W (dim x classes, row-major), b (classes)

  explicit SyntheticFederation(const SyntheticSpec& spec) : spec_(spec) {}
  Parameters deviceParameters(uint64_t k) const;

  SyntheticSpec spec_;
  std::shared_ptr<const Parameters> shared_;  // the IID variant's parameters; null otherwise
};

}  // namespace fedfleet::data
