#include "engine/secure_aggregation.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "engine/engine_options.h"

namespace fedfleet::engine {
namespace {

uint32_t maxCohort(const EngineOptions& o) {
  size_t want = o.clients_per_round;
  if (o.over_selection > 0) {
    want = static_cast<size_t>(std::ceil(o.clients_per_round * (1.0 + o.over_selection) - 1e-9));
  }
  return static_cast<uint32_t>(std::max<size_t>(want, 1));
}

uint32_t quantRangeOf(const EngineOptions& o) {
  if (o.secagg.quant_range > 0) return o.secagg.quant_range;
  return static_cast<uint32_t>(((uint64_t{1} << 32) - 1) / maxCohort(o));
}

}  // namespace

Status validateSecAggOptions(const EngineOptions& o) {
  const SecAggOptions& s = o.secagg;
  if (!s.enabled) return Status::ok();
  auto refuse = [](const std::string& why) {
    return invalidArgument("secure aggregation (secagg.mode = \"secagg_plus\") " + why);
  };
  if (o.aggregator != AggregatorKind::kFedAvg && o.aggregator != AggregatorKind::kFedNova &&
      o.aggregator != AggregatorKind::kCustom) {
    return refuse(std::string("sums masked updates, so aggregation.method must be fedavg (or "
                              "fedprox, which is fedavg on the coordinator), fednova or a "
                              "strategy given the unmasked sum (custom), not ") +
                  aggregatorName(o.aggregator) +
                  ": median and trimmed_mean need every update in the clear, and SCAFFOLD's "
                  "control variates are not in the masked sum");
  }
  if (o.async)
    return refuse(
        "needs synchronous rounds (every survivor unmasks together): set "
        "aggregation.async = false");
  if (o.blocks.count > 0) return refuse("does not run with [blocks]");
  if (o.sample_partitions) return refuse("needs each client to train its own partition");
  if (o.codec != "none" || !o.slow_link_codec.empty()) {
    return refuse(
        "quantises updates itself: set compression.codec = \"none\" (a top-k or "
        "quantising codec cannot be summed under masks)");
  }
  if (!(std::isfinite(s.clip_range) && s.clip_range > 0)) {
    return refuse("needs secagg.clip_range > 0");
  }
  if (!(s.stage_timeout_s > 0)) return refuse("needs secagg.stage_timeout_s > 0");
  const uint32_t cohort = maxCohort(o);
  if (cohort < 2) return refuse("needs at least 2 clients a round (coordinator.clients_per_round)");
  if (o.min_clients < 2) {
    return refuse(
        "needs coordinator.min_clients >= 2: a round of one client would show its "
        "update to the coordinator");
  }
  if (cohort > 1000000) return refuse("supports at most 1,000,000 clients a round");
  secagg::QuantizerOptions q{s.clip_range, quantRangeOf(o)};
  Status st = secagg::validateQuantizer(q, cohort);
  if (!st.isOk()) return refuse(st.message());
  if (s.neighbours != 0 || s.threshold != 0) {
    // The degree and threshold a full cohort would get.
    secagg::RoundParams p;
    p.clients = cohort;
    p.length = 1;
    p.neighbours = s.neighbours ? s.neighbours : secagg::defaultNeighbours(cohort);
    const uint32_t k = secagg::effectiveDegree(p);
    p.threshold = s.threshold ? s.threshold : secagg::defaultThreshold(k);
    st = secagg::validateRoundParams(p);
    if (!st.isOk()) return refuse(st.message());
  }
  return Status::ok();
}

SecureAggregation::SecureAggregation(const EngineOptions& options, uint64_t n_params)
    : options_(options.secagg),
      n_params_(n_params),
      max_cohort_(maxCohort(options)),
      // The assembler keeps no payload of a masked update: its budget is the masked chunks'.
      in_flight_memory_bytes_(options.partial_buffer_bytes) {
  quant_ = {options_.clip_range, quantRangeOf(options)};
  if (options.aggregator == AggregatorKind::kFedNova) {
    fednova_ = true;
    fednova_momentum_ = options.hparams.momentum;
  }
  // DP under masks: the coordinator sees no single update to clip, so each client clips its
  // own to C at weight 1 (validateDpOptions keeps C fixed). Central DP: the coordinator adds
  // the noise to the unmasked sum (RoundEngine::applyServerStep), the clients none.
  // Distributed DP: each client adds its share of it, N(0, (z C)^2 / M), M = the quorum.
  if (options.dp.central || options.dp.distributed) dp_clip_ = options.dp.clip_norm;
  if (options.dp.distributed) {
    dp_noise_stddev_ = options.dp.noise_multiplier * options.dp.clip_norm /
                       std::sqrt(static_cast<double>(std::max<uint32_t>(options.quorum, 1)));
  }
}

void SecureAggregation::startRound(uint64_t round, uint32_t cohort, uint64_t max_samples,
                                   uint64_t graph_seed, double now) {
  secagg::RoundParams p;
  p.round = round;
  p.clients = cohort;
  p.length = n_params_;
  p.graph_seed = graph_seed;
  p.neighbours = options_.neighbours ? options_.neighbours : secagg::defaultNeighbours(cohort);
  if (secagg::effectiveDegree(p) % 2 != 0 && secagg::effectiveDegree(p) < cohort - 1) {
    ++p.neighbours;  // a sparse graph needs an even degree
  }
  const uint32_t k = secagg::effectiveDegree(p);
  p.threshold =
      options_.threshold ? std::min(options_.threshold, k + 1) : secagg::defaultThreshold(k);
  if (!secagg::validateRoundParams(p).isOk()) {
    // A cohort smaller than configured (fewer idle clients): its own defaults.
    p.neighbours = secagg::defaultNeighbours(cohort);
    p.threshold = secagg::defaultThreshold(secagg::effectiveDegree(p));
  }
  server_.reset();
  index_.clear();
  tokens_.clear();
  // The engine starts no round of fewer than 2 (SynchronousRounds::startRound), and the
  // defaults hold for any cohort of 2 or more: never a round in the clear.
  FEDFLEET_CHECK(cohort >= 2 && secagg::validateRoundParams(p).isOk());
  server_ = std::make_unique<secagg::SecAggServer>(p, in_flight_memory_bytes_);
  // Differential privacy: every update weighs 1 (its sensitivity is the clip).
  weight_scale_ = dp_clip_ > 0 ? 1.0 : static_cast<double>(std::max<uint64_t>(max_samples, 1));
  stage_started_ = now;
}

wire::SecAggTask SecureAggregation::taskFor(uint64_t token) {
  wire::SecAggTask t;
  if (!server_) return t;
  const auto& p = server_->params();
  FEDFLEET_CHECK(tokens_.size() < p.clients);
  t.index = static_cast<uint32_t>(tokens_.size());
  t.clients = p.clients;
  t.neighbours = p.neighbours;
  t.threshold = p.threshold;
  t.graph_seed = p.graph_seed;
  t.clip_range = quant_.clip_range;
  t.quant_range = quant_.quant_range;
  t.weight_scale = weight_scale_;
  t.dp_clip = dp_clip_;
  t.dp_noise_stddev = dp_noise_stddev_;
  t.fednova = fednova_;
  t.fednova_momentum = fednova_momentum_;
  index_[token] = t.index;
  tokens_.push_back(token);
  return t;
}

uint32_t SecureAggregation::indexOf(uint64_t token) const {
  auto it = index_.find(token);
  return it == index_.end() ? UINT32_MAX : it->second;
}

Status SecureAggregation::onMessage(uint64_t token, const wire::SecAgg& m, double now,
                                    Outgoing& out) {
  const uint32_t i = indexOf(token);
  if (!server_ || i == UINT32_MAX) {
    return Status(StatusCode::kFailedPrecondition,
                  "secure aggregation message for a task not in it");
  }
  Status st;
  switch (m.step) {
    case wire::SecAggStep::kAdvert:
      if (m.adverts.size() != 1) return invalidArgument("a key advert carries one set of keys");
      st = server_->onAdvert(i, m.adverts[0]);
      break;
    case wire::SecAggStep::kShares:
      st = server_->onSealedShares(i, m.shares);
      break;
    case wire::SecAggStep::kReveal:
      st = server_->onRevealed(i, m.revealed);
      break;
    default:
      return invalidArgument(std::string("secure aggregation step ") +
                             wire::secAggStepName(m.step) + " is the coordinator's to send");
  }
  if (!st.isOk()) return st;
  std::vector<uint64_t> ignored;
  if (server_->stageComplete()) closeStage(now, out, ignored);
  return Status::ok();
}

wire::SecAgg SecureAggregation::toClient(uint32_t index, wire::SecAggStep step) const {
  wire::SecAgg m;
  m.task_token = tokens_[index];
  m.step = step;
  return m;
}

void SecureAggregation::closeStage(double now, Outgoing& out, std::vector<uint64_t>& left_out) {
  std::vector<bool> in(tokens_.size(), false);
  if (server_->stage() == secagg::Stage::kAdvertise) {
    for (auto& [i, adverts] : server_->closeAdvertise()) {
      wire::SecAgg m = toClient(i, wire::SecAggStep::kKeys);
      m.adverts = std::move(adverts);
      out.emplace_back(m.task_token, std::move(m));
      in[i] = true;
    }
  } else if (server_->stage() == secagg::Stage::kShareKeys) {
    for (auto& [i, shares] : server_->closeShareKeys()) {
      wire::SecAgg m = toClient(i, wire::SecAggStep::kForwarded);
      m.shares = std::move(shares);
      out.emplace_back(m.task_token, std::move(m));
      in[i] = true;
    }
  } else {
    return;
  }
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    if (!in[i]) {
      left_out.push_back(tokens_[i]);
      server_->markGone(i);
    }
  }
  stage_started_ = now;
}

void SecureAggregation::onTick(double now, Outgoing& out, std::vector<uint64_t>& left_out) {
  if (!server_) return;
  // Two passes at most: the advert stage may close and the share stage with it.
  for (int pass = 0; pass < 2; ++pass) {
    const auto stage = server_->stage();
    if (stage != secagg::Stage::kAdvertise && stage != secagg::Stage::kShareKeys) return;
    if (!server_->stageComplete() && now < stage_started_ + options_.stage_timeout_s) return;
    closeStage(now, out, left_out);
  }
}

std::optional<double> SecureAggregation::nextDeadline() const {
  if (!server_) return std::nullopt;
  const auto stage = server_->stage();
  if (stage == secagg::Stage::kAdvertise || stage == secagg::Stage::kShareKeys ||
      stage == secagg::Stage::kUnmask) {
    return stage_started_ + options_.stage_timeout_s;
  }
  return std::nullopt;
}

Status SecureAggregation::onMaskedChunk(uint64_t token, uint64_t offset, const std::string& payload,
                                        uint64_t elements) {
  const uint32_t i = indexOf(token);
  if (!server_ || i == UINT32_MAX) {
    return Status(StatusCode::kFailedPrecondition,
                  "a masked chunk for a task not in secure "
                  "aggregation");
  }
  if (payload.size() != elements * sizeof(uint32_t)) {
    return invalidArgument("masked chunk of " + std::to_string(payload.size()) + " bytes for " +
                           std::to_string(elements) + " values (4 bytes each)");
  }
  std::vector<uint32_t> values(elements);
  std::memcpy(values.data(), payload.data(), payload.size());  // little-endian hosts
  return server_->onMaskedChunk(i, offset, values.data(), values.size());
}

Status SecureAggregation::onCompleted(uint64_t token) {
  const uint32_t i = indexOf(token);
  if (!server_ || i == UINT32_MAX) {
    return Status(StatusCode::kFailedPrecondition, "not in secure aggregation");
  }
  return server_->onMaskedDone(i);
}

void SecureAggregation::markGone(uint64_t token) {
  const uint32_t i = indexOf(token);
  if (server_ && i != UINT32_MAX) server_->markGone(i);
}

void SecureAggregation::beginUnmasking(double now, Outgoing& out) {
  if (!server_ || server_->stage() != secagg::Stage::kMaskedInput) return;
  for (auto& [i, request] : server_->closeMaskedInput()) {
    wire::SecAgg m = toClient(i, wire::SecAggStep::kUnmask);
    m.request = std::move(request);
    out.emplace_back(m.task_token, std::move(m));
  }
  stage_started_ = now;
}

bool SecureAggregation::unmaskingDone(double now) const {
  return server_ && server_->stage() == secagg::Stage::kUnmask &&
         (server_->stageComplete() || now >= stage_started_ + options_.stage_timeout_s);
}

std::vector<uint64_t> SecureAggregation::survivors() const {
  std::vector<uint64_t> out;
  if (!server_) return out;
  for (uint32_t i : server_->survivors()) out.push_back(tokens_[i]);
  return out;
}

Status SecureAggregation::finish(std::vector<float>& sum) {
  if (!server_ || server_->stage() != secagg::Stage::kUnmask) {
    clear();
    return Status(StatusCode::kFailedPrecondition, "no secure aggregation to finish");
  }
  const size_t count = server_->survivors().size();
  auto masked_sum = server_->finish();
  if (!masked_sum.isOk()) {
    Status st = masked_sum.status();
    clear();
    return st;
  }
  sum.assign(n_params_, 0.0f);
  secagg::dequantizeSum(quant_, masked_sum->data(), masked_sum->size(), count, sum.data());
  for (float& v : sum) v = static_cast<float>(v * weight_scale_);
  clear();
  return Status::ok();
}

void SecureAggregation::clear() {
  server_.reset();
  index_.clear();
  tokens_.clear();
}

}  // namespace fedfleet::engine
