#include "engine/central_dp.h"

#include <cmath>
#include <cstring>

#include "common/check.h"
#include "common/crypto/keyed_stream.h"
#include "common/privacy/gaussian_noise.h"
#include "common/privacy/rdp_accountant.h"
#include "engine/engine_options.h"

namespace fedfleet::engine {
namespace {

// Stream ids: high word the round, low word what the stream is for (kept apart so that adding
// coordinates to a model never shifts the count's draw).
constexpr uint64_t kUpdateNoise = 0;
constexpr uint64_t kCountNoise = 1ull << 62;

double sampledPerRound(const EngineOptions& o) {
  return std::ceil(o.clients_per_round * (1.0 + o.over_selection) - 1e-9);
}

uint64_t populationOf(const EngineOptions& o) {
  return o.dp.population > 0 ? o.dp.population : o.num_partitions;
}

double countStddevOf(const EngineOptions& o) {
  return o.dp.count_stddev > 0 ? o.dp.count_stddev : o.clients_per_round / 20.0;
}

Status bad(const std::string& key, const std::string& why) {
  return invalidArgument("'dp." + key + "' " + why);
}

bool positiveFinite(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

Status validateDpOptions(const EngineOptions& o) {
  const DpOptions& d = o.dp;
  if (!d.on()) return Status::ok();
  if (d.distributed && !o.secagg.enabled) {
    return bad("mode",
               "= \"distributed\" adds the noise on the clients, which only the masked "
               "sum hides: set secagg.mode = \"secagg_plus\" (or use dp.mode = \"central\")");
  }
  if (d.local && o.secagg.enabled) {
    return bad("mode",
               "= \"local\" with secure aggregation: use dp.mode = \"distributed\", "
               "which splits the noise among the clients instead of giving each all of it");
  }
  if (d.local && d.adaptive_clip) {
    return bad("adaptive_clip",
               "is not available with dp.mode = \"local\" (each client clips "
               "with the fixed dp.clip_norm)");
  }
  if (d.central && d.adaptive_clip && o.secagg.enabled) {
    return bad("adaptive_clip",
               "is not available with dp.mode = \"central\" under secure aggregation: it "
               "moves the clip by the noised count of updates within it, and the coordinator "
               "sees no update's norm (the clients clip; the count would have to travel in the "
               "masked sum, with noise of its own); use a fixed dp.clip_norm");
  }
  if (d.distributed && d.adaptive_clip) {
    return bad("adaptive_clip",
               "is not available with dp.mode = \"distributed\" (the noised "
               "count of unclipped updates would have to travel in the masked "
               "sum); use a fixed dp.clip_norm");
  }
  if (o.aggregator != AggregatorKind::kFedAvg) {
    return bad("mode", std::string("= \"central\" needs aggregation.method = \"fedavg\" (got \"") +
                           aggregatorName(o.aggregator) +
                           "\"): the noise is calibrated to a sum of clipped updates of weight "
                           "1, which FedNova's normalised, SCAFFOLD's two-part and the robust "
                           "aggregators' non-linear updates are not");
  }
  if (o.async) {
    return bad("mode",
               "= \"central\" needs policy.mode = \"sync\": the accountant counts rounds of "
               "sampled clients, not FedBuff's buffered steps");
  }
  if (o.blocks.count > 0) {
    return bad("mode", "= \"central\" does not combine with [blocks] (several models a round)");
  }
  if (o.clip_norm > 0) {
    return bad("clip_norm",
               "clips the updates under differential privacy; set aggregation.clip_norm = 0");
  }
  if (!positiveFinite(d.noise_multiplier)) return bad("noise_multiplier", "must be finite and > 0");
  if (!positiveFinite(d.clip_norm)) return bad("clip_norm", "must be finite and > 0");
  if (!(d.delta > 0 && d.delta < 1)) return bad("delta", "must be in (0, 1)");
  if (!(d.target_epsilon >= 0 && std::isfinite(d.target_epsilon))) {
    return bad("target_epsilon", "must be finite and >= 0 (0: no budget)");
  }
  if (!(d.count_stddev >= 0 && std::isfinite(d.count_stddev))) {
    return bad("count_stddev", "must be finite and >= 0 (0: clients_per_round / 20)");
  }
  if (d.adaptive_clip) {
    if (!(d.target_quantile > 0 && d.target_quantile < 1)) {
      return bad("target_quantile", "must be in (0, 1)");
    }
    if (!(d.clip_lr >= 0 && std::isfinite(d.clip_lr))) return bad("clip_lr", "must be >= 0");
    const double sb = countStddevOf(o);
    if (!(2 * sb > d.noise_multiplier)) {
      return bad("count_stddev",
                 "(" + std::to_string(sb) +
                     ") must exceed dp.noise_multiplier / 2 with adaptive clipping: the noised "
                     "count takes part of the privacy budget, and with sigma_b <= z / 2 it "
                     "would take all of it; raise count_stddev or coordinator.clients_per_round");
    }
  }
  const double sampled = sampledPerRound(o);
  const uint64_t population = populationOf(o);
  if (population == 0 || sampled > static_cast<double>(population)) {
    return bad("population",
               "(" + std::to_string(population) +
                   ") must be at least the clients sampled a round (" +
                   std::to_string(static_cast<uint64_t>(sampled)) +
                   "): it is the number of clients the accountant assumes each round samples from");
  }
  if (!(d.delta * static_cast<double>(population) < 1)) {
    return bad("delta", "(" + std::to_string(d.delta) + ") must be below 1 / dp.population (" +
                            std::to_string(population) +
                            " clients): a larger delta lets the guarantee fail outright for one "
                            "client in the population; lower dp.delta");
  }
  if (d.noise_key.size() != crypto::kStreamKeyBytes) {
    return invalidArgument("differential privacy: the noise key must be 32 bytes (driver error)");
  }
  if (d.target_epsilon > 0) {
    CentralDp dp(o);
    if (dp.stepsWithin(d.target_epsilon, 1) == 0) {
      return bad("target_epsilon",
                 "(" + std::to_string(d.target_epsilon) + ") allows no round: one round spends " +
                     "epsilon " + std::to_string(dp.epsilonAfter(1)) + " at delta " +
                     std::to_string(d.delta) +
                     "; raise the target or dp.noise_multiplier, or sample fewer clients");
    }
  }
  return Status::ok();
}

CentralDp::CentralDp(const EngineOptions& o)
    : dp_(o.dp),
      // Local DP: each release is a client's own, with no sampling to amplify it.
      q_(o.dp.local
             ? 1.0
             : sampledPerRound(o) / static_cast<double>(std::max<uint64_t>(populationOf(o), 1))),
      denominator_(o.clients_per_round),
      clip_(o.dp.clip_norm) {
  FEDFLEET_CHECK(dp_.noise_key.size() == crypto::kStreamKeyBytes);
  const double z = dp_.noise_multiplier;
  z_update_ = z;
  if (dp_.adaptive_clip) {
    count_stddev_ = countStddevOf(o);
    const double rest = 1.0 / (z * z) - 1.0 / (4.0 * count_stddev_ * count_stddev_);
    FEDFLEET_CHECK(rest > 0);  // validateDpOptions
    z_update_ = 1.0 / std::sqrt(rest);
  }
}

double CentralDp::clipScale(double norm) const {
  if (!(norm > clip_)) return 1.0;
  return clip_ / norm;
}

void CentralDp::observe(double norm) { unclipped_ += norm <= clip_ ? 1 : 0; }

void CentralDp::addNoise(float* sum, size_t n, uint32_t round) const {
  privacy::GaussianStream noise(crypto::KeyedStream(dp_.noise_key, round, kUpdateNoise));
  noise.addTo(sum, n, z_update_ * clip_);
}

void CentralDp::stepTaken(uint32_t round) {
  ++steps_;
  if (dp_.adaptive_clip) {
    privacy::GaussianStream noise(crypto::KeyedStream(dp_.noise_key, round, kCountNoise));
    const double b = (unclipped_ + count_stddev_ * noise.next()) / denominator_;
    clip_ *= std::exp(-dp_.clip_lr * (b - dp_.target_quantile));
  }
  unclipped_ = 0;
}

double CentralDp::epsilonAfter(uint64_t steps) const {
  if (steps == 0) return 0;
  auto spent = privacy::epsilonOf(q_, dp_.noise_multiplier, steps, dp_.delta);
  FEDFLEET_CHECK(spent.isOk());  // q, z and delta validated
  return spent->epsilon;
}

double CentralDp::epsilon() const { return epsilonAfter(steps_); }

uint64_t CentralDp::stepsWithin(double target, uint64_t limit) const {
  // epsilon grows with the steps: the largest T in [0, limit] with epsilon(T) <= target.
  uint64_t lo = 0, hi = limit;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (epsilonAfter(mid) <= target) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

std::string CentralDp::saveState() const {
  std::string out(16, '\0');
  std::memcpy(out.data(), &clip_, 8);
  std::memcpy(out.data() + 8, &steps_, 8);
  return out;
}

Status CentralDp::loadState(std::string_view blob) {
  if (blob.size() != 16) {
    return corrupt("engine state: the privacy section has " + std::to_string(blob.size()) +
                   " bytes, expected 16");
  }
  double clip;
  uint64_t steps;
  std::memcpy(&clip, blob.data(), 8);
  std::memcpy(&steps, blob.data() + 8, 8);
  if (!positiveFinite(clip)) return corrupt("engine state: the privacy section's clip is not > 0");
  clip_ = clip;
  steps_ = steps;
  unclipped_ = 0;
  return Status::ok();
}

}  // namespace fedfleet::engine
