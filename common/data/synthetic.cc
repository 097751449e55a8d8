#include "common/data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <random>
#include <string>

#include "common/check.h"

namespace fedfleet::data {
namespace {

// The independent random streams of a federation. A device's stream is keyed by (seed, k, kind);
// the IID variant's shared parameters use k = 0 with their own kind.
enum class Stream : uint32_t { kCount = 0, kParameters = 1, kTrain = 2, kTest = 3, kShared = 4 };

std::mt19937_64 streamGenerator(uint64_t seed, uint64_t k, Stream stream) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32),
                    static_cast<uint32_t>(stream)};
  return std::mt19937_64(seq);
}

// Anything above this is a lognormal draw far beyond any memory (z > 15); clamped so the
// conversion to an integer is defined.
constexpr double kMaxDrawnSamples = 1e15;

}  // namespace

struct SyntheticFederation::Parameters {
  std::vector<double> v;  // mean of x, dim
  std::vector<double> w;  // dim x classes, row-major: w[j * classes + c]
  std::vector<double> b;  // classes
};

Result<SyntheticFederation> SyntheticFederation::create(const SyntheticSpec& spec) {
  auto bad = [](const std::string& what) { return invalidArgument("synthetic: " + what); };
  if (spec.devices == 0) return bad("devices must be >= 1");
  if (spec.dim == 0) return bad("dim must be >= 1");
  if (spec.num_classes < 2 || spec.num_classes > 256) {
    return bad("num_classes must be in 2..256 (labels are bytes), got " +
               std::to_string(spec.num_classes));
  }
  if (!std::isfinite(spec.alpha) || spec.alpha < 0) {
    return bad("alpha must be finite and >= 0, got " + std::to_string(spec.alpha));
  }
  if (!std::isfinite(spec.beta) || spec.beta < 0) {
    return bad("beta must be finite and >= 0, got " + std::to_string(spec.beta));
  }
  if (!(spec.train_fraction > 0 && spec.train_fraction < 1)) {
    return bad("train_fraction must lie strictly between 0 and 1, got " +
               std::to_string(spec.train_fraction));
  }
  if (spec.max_samples == 1) return bad("max_samples must be 0 (no cap) or >= 2");
  try {
    SyntheticFederation fed(spec);
    if (spec.iid) {
      // FedProx's IID variant: W ~ N(0, 1), b ~ N(0, 1), v = B * 1 with B ~ N(0, beta), shared.
      std::mt19937_64 rng = streamGenerator(spec.seed, 0, Stream::kShared);
      std::normal_distribution<double> normal(0.0, 1.0);
      auto p = std::make_shared<Parameters>();
      const double shared_b = spec.beta * normal(rng);
      p->v.assign(spec.dim, shared_b);
      p->w.resize(static_cast<size_t>(spec.dim) * spec.num_classes);
      for (auto& x : p->w) x = normal(rng);
      p->b.resize(spec.num_classes);
      for (auto& x : p->b) x = normal(rng);
      fed.shared_ = std::move(p);
    }
    return fed;
  } catch (const std::bad_alloc&) {
    return resourceExhausted("synthetic: out of memory for the shared parameters");
  }
}

uint64_t SyntheticFederation::totalSamples(uint64_t k) const {
  FEDFLEET_CHECK_MSG(k < spec_.devices, "synthetic: device index out of range");
  std::mt19937_64 rng = streamGenerator(spec_.seed, k, Stream::kCount);
  std::lognormal_distribution<double> lognormal(4.0, 2.0);
  const double drawn = std::min(std::floor(lognormal(rng)), kMaxDrawnSamples);
  const uint64_t total = static_cast<uint64_t>(drawn) + 50;
  return spec_.max_samples > 0 ? std::min(total, spec_.max_samples) : total;
}

uint64_t SyntheticFederation::trainSamples(uint64_t k) const {
  const uint64_t total = totalSamples(k);  // >= 2 (create() checks max_samples)
  const double wanted = std::round(spec_.train_fraction * static_cast<double>(total));
  return std::clamp<uint64_t>(static_cast<uint64_t>(wanted), 1, total - 1);
}

SyntheticFederation::Parameters SyntheticFederation::deviceParameters(uint64_t k) const {
  std::mt19937_64 rng = streamGenerator(spec_.seed, k, Stream::kParameters);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double u = spec_.alpha * normal(rng);     // u_k ~ N(0, alpha): mean of W and b
  const double big_b = spec_.beta * normal(rng);  // B_k ~ N(0, beta)
  Parameters p;
  p.v.resize(spec_.dim);
  for (auto& x : p.v) x = big_b + normal(rng);  // v_k ~ N(B_k, 1)
  p.w.resize(static_cast<size_t>(spec_.dim) * spec_.num_classes);
  for (auto& x : p.w) x = u + normal(rng);  // W ~ N(u_k, 1)
  p.b.resize(spec_.num_classes);
  for (auto& x : p.b) x = u + normal(rng);  // b ~ N(u_k, 1)
  return p;
}

Result<Dataset> SyntheticFederation::generate(uint64_t k, bool train) const {
  if (k >= spec_.devices) {
    return invalidArgument("synthetic: device " + std::to_string(k) + " of a " +
                           std::to_string(spec_.devices) + "-device federation");
  }
  const uint64_t total = totalSamples(k), n_train = trainSamples(k);
  const uint64_t n = train ? n_train : total - n_train;
  const size_t dim = spec_.dim, classes = spec_.num_classes;
  if (n > std::numeric_limits<size_t>::max() / dim / sizeof(float)) {
    return resourceExhausted("synthetic: device " + std::to_string(k) + "'s " + std::to_string(n) +
                             " samples do not fit in memory");
  }
  try {
    const Parameters local = shared_ ? Parameters() : deviceParameters(k);
    const Parameters& p = shared_ ? *shared_ : local;
    Dataset ds;
    ds.feature_dim = spec_.dim;
    ds.num_classes = spec_.num_classes;
    ds.features.resize(static_cast<size_t>(n) * dim);
    ds.labels.resize(static_cast<size_t>(n));

    std::vector<double> sd(dim);  // (j + 1)^-0.6: the covariance diag((j + 1)^-1.2)
    for (size_t j = 0; j < dim; ++j) sd[j] = std::pow(static_cast<double>(j + 1), -0.6);
    std::mt19937_64 rng = streamGenerator(spec_.seed, k, train ? Stream::kTrain : Stream::kTest);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> x(dim), logits(classes);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < dim; ++j) x[j] = p.v[j] + sd[j] * normal(rng);
      logits = p.b;
      for (size_t j = 0; j < dim; ++j) {
        const double* w_row = p.w.data() + j * classes;
        for (size_t c = 0; c < classes; ++c) logits[c] += x[j] * w_row[c];
      }
      const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
      ds.labels[i] = static_cast<uint8_t>(best);
      float* dst = ds.features.data() + i * dim;
      for (size_t j = 0; j < dim; ++j) dst[j] = static_cast<float>(x[j]);
    }
    return ds;
  } catch (const std::bad_alloc&) {
    return resourceExhausted("synthetic: out of memory generating device " + std::to_string(k) +
                             "'s " + std::to_string(n) + " samples");
  }
}

}  // namespace fedfleet::data
