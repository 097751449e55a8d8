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
// thirty. Every device draws from its own random streams, keyed by (seed, k, stream): one for its
// sample count, one for its parameters, one for each split's samples. Device k's data thus
// depends only on (spec, k): not on which devices were generated before, in what order, or on
// which thread; with one compiler and build flags it is bit-for-bit reproducible.
// - The sample count is a std::lognormal_distribution draw on a std::mt19937_64 seeded through
//   std::seed_seq (as in earlier versions, so device sizes did not change; the standard leaves
//   the algorithm to the library, so they may differ between standard libraries).
// - Parameters and samples are fp32 standard normals from a xoshiro256++ generator per stream
//   (its 256-bit state derived from (seed, k, stream) by chained SplitMix64 bijections, so
//   distinct streams start at distinct, well-mixed states of one 2^256 cycle), turned into
//   normals in bulk by a vectorisable Box-Muller transform with polynomial log, sqrt and sin/cos
//   (accurate to a few float ulp, and free of libm calls, whose last bits vary by C library).
//   Samples are drawn in fp32 and labelled from the stored fp32 values, the products x W_k + b_k
//   in fp32. About 0.4 us a sample at dim 60, 10 classes, on one core (2.4 us with
//   std::normal_distribution on std::mt19937_64).
// The numbers differ from NumPy's (same distributions).
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
  // Block-cyclic variant (non-IID only; common/data/block_cyclic.h): device k is in block
  // m = k mod blocks, its B_k is drawn around m * block_shift instead of 0, and its b_k gets
  // + block_shift on block m's class group (classGroup). blocks == 0: off.
  uint32_t blocks = 0;
  double block_shift = 0;
};

// A Synthetic(alpha, beta) federation: a spec plus, for the IID variant, the shared parameters.
// Cheap to copy; every method is const and safe to call from several threads at once.
class SyntheticFederation {
 public:
  // Validates `spec`: devices >= 1, dim >= 1, 2 <= num_classes <= 256, alpha
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

  // The parameters device k's samples are drawn from: x ~ N(v, diag((j+1)^-1.2)),
  // y = argmax(x W + b).
  struct DeviceParameters {
    std::vector<float> v;  // dim
    std::vector<float> w;  // dim x classes, row-major: w[j * classes + c]
    std::vector<float> b;  // classes
  };
  // Device k's parameters (the shared ones for the IID variant), as generate() uses them.
  // O(dim * num_classes). Precondition (checked, abort): k < devices().
  DeviceParameters deviceParameters(uint64_t k) const;

 private:
  explicit SyntheticFederation(const SyntheticSpec& spec) : spec_(spec) {}

  SyntheticSpec spec_;
  std::shared_ptr<const DeviceParameters> shared_;  // the IID variant's parameters; else null
};

}  // namespace fedfleet::data
