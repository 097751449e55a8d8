#include "engine/update_assembler.h"

#include <algorithm>
#include <cmath>

#include "common/compress/codec_spec.h"
#include "common/compress/payload.h"
#include "engine/engine_options.h"
#include "engine/update_weights.h"
#include "kernels/accumulate.h"

namespace fedfleet::engine {

UpdateAssembler::UpdateAssembler(const EngineOptions& options, const Aggregator& aggregator,
                                 uint64_t n_params)
    : options_(options),
      aggregator_(aggregator),
      n_params_(n_params),
      partial_(options.partial_buffer_bytes) {}

std::optional<std::string> UpdateAssembler::checkChunkPlace(Participant& p,
                                                            const wire::Chunk& chunk) const {
  if (p.last_chunk) return std::string("chunk after the last chunk");
  const uint64_t n = chunk.elements;
  const uint64_t size = aggregator_.updateSize();
  if (n == 0) return std::string("chunk of 0 elements");
  if (chunk.offset != p.next_offset) {
    return "chunk at offset " + std::to_string(chunk.offset) + ", expected " +
           std::to_string(p.next_offset);
  }
  if (n > size - chunk.offset) {
    return "chunk ends at " + std::to_string(chunk.offset + n) + ", past the update's " +
           std::to_string(size) + " values";
  }
  // `last` says what the offsets already say: the chunk that ends the update, and only it.
  if (chunk.last != (n == size - chunk.offset)) {
    return std::string(chunk.last ? "last chunk" : "chunk not marked last") + " ends at " +
           std::to_string(chunk.offset + n) + " of the update's " + std::to_string(size) +
           " values";
  }
  if (chunk.n_samples == 0) return std::string("chunk reports 0 samples");
  if (!p.weight_set) {
    if (auto why = badClaims(p, chunk)) return why;
    p.weight = static_cast<double>(chunk.n_samples);
    p.steps = chunk.steps;
    Result<double> fold = aggregator_.chunkFoldWeight(p.weight, chunk.steps);
    if (!fold.isOk()) return fold.status().message();
    p.fold_weight = *fold;
    p.weight_set = true;
  } else if (static_cast<double>(chunk.n_samples) != p.weight || chunk.steps != p.steps) {
    return "chunk declares " + std::to_string(chunk.n_samples) + " samples and " +
           std::to_string(chunk.steps) + " steps, earlier chunks " +
           std::to_string(static_cast<uint64_t>(p.weight)) + " and " + std::to_string(p.steps);
  }
  return std::nullopt;
}

std::optional<std::string> UpdateAssembler::addMaskedChunk(Participant& p,
                                                           const wire::Chunk& chunk) {
  if (auto why = checkChunkPlace(p, chunk)) return why;
  p.codec = "secagg";
  p.codec_elements = chunk.elements;
  p.next_offset += chunk.elements;
  p.last_chunk = chunk.last;
  return std::nullopt;
}

std::optional<std::string> UpdateAssembler::addChunk(Participant& p, uint64_t token,
                                                     const wire::Chunk& chunk) {
  if (auto why = checkChunkPlace(p, chunk)) return why;
  const uint64_t n = chunk.elements;
  auto header = compress::readPayloadHeader(chunk.payload);
  if (!header.isOk()) return "chunk payload: " + header.status().message();
  if (!compress::acceptsPayload(p.asked, header->kind)) {
    return std::string("chunk payload made by codec ") + compress::codecKindName(header->kind) +
           ", the task asked for " + compress::toString(p.asked);
  }
  scratch_.resize(n);
  Status st = compress::decodePayload(chunk.payload, n, scratch_.data());
  if (!st.isOk()) return "chunk payload: " + st.message();
  // w * x must stay far from overflow in the running sum: a client cannot poison the round.
  float max_abs = 0;
  for (float v : scratch_) max_abs = std::max(max_abs, std::fabs(v));
  if (chunk.offset < n_params_) {  // the delta part (not SCAFFOLD's control delta)
    const uint64_t m = std::min<uint64_t>(n, n_params_ - chunk.offset);
    for (uint64_t i = 0; i < m; ++i) p.sq_norm += static_cast<double>(scratch_[i]) * scratch_[i];
  }
  if (static_cast<double>(max_abs) * std::max({p.weight, p.fold_weight, 1.0}) > 1e30) {
    return std::string("delta values too large to aggregate");
  }
  st = partial_.append(token, chunk.offset, n, chunk.payload);
  if (!st.isOk()) return "coordinator: " + st.message();
  // The update's codec as the history names it: that of its largest payload (a topk update
  // with dense_below has fp16 chunks for its small tensors).
  if (p.codec.empty() || n > p.codec_elements) {
    p.codec = compress::codecKindName(header->kind);
    p.codec_elements = n;
  }
  // Nothing is folded yet: the weight and scale of an update are known only when the round
  // settles (synchronous), or when it completes (asynchronous, robust aggregators).
  p.next_offset += n;
  p.last_chunk = chunk.last;
  return std::nullopt;
}

std::optional<std::string> UpdateAssembler::checkSummary(const Participant& p,
                                                         const wire::Summary& summary,
                                                         wire::Summary& checked, double now) const {
  const uint64_t size = aggregator_.updateSize();
  if (!p.last_chunk || p.next_offset != size) {
    return "summary after " + std::to_string(p.next_offset) + " of " + std::to_string(size) +
           " values" + (p.last_chunk ? "" : " (no last chunk)");
  }
  if (summary.n_samples == 0) return std::string("summary reports 0 samples");
  if (static_cast<double>(summary.n_samples) != p.weight || summary.steps != p.steps) {
    return "summary reports " + std::to_string(summary.n_samples) + " samples and " +
           std::to_string(summary.steps) + " steps, the chunks " +
           std::to_string(static_cast<uint64_t>(p.weight)) + " and " + std::to_string(p.steps);
  }
  checked = summary;
  return badSummary(p, checked, now);
}

std::optional<std::string> UpdateAssembler::badClaims(Participant& p,
                                                      const wire::Chunk& chunk) const {
  const uint64_t n = chunk.n_samples;
  if (p.partition < options_.partition_sizes.size()) {
    const uint64_t size = options_.partition_sizes[p.partition];
    if (n > size) {
      return "claims " + std::to_string(n) + " samples, partition " + std::to_string(p.partition) +
             " holds " + std::to_string(size);
    }
  } else if (options_.max_samples_per_update > 0 && n > options_.max_samples_per_update) {
    return "claims " + std::to_string(n) + " samples, more than " +
           "coordinator.max_samples_per_update = " +
           std::to_string(options_.max_samples_per_update);
  }
  if (chunk.steps == 0) return std::string("claims 0 local steps");
  if (p.max_steps == 0) {
    p.max_steps = plannedSteps(p.planned.epochs, p.planned.max_steps, p.planned.batch_size, n);
  }
  if (chunk.steps > p.max_steps) {
    return "claims " + std::to_string(chunk.steps) + " local steps, its task planned at most " +
           std::to_string(p.max_steps);
  }
  return std::nullopt;
}

std::optional<std::string> UpdateAssembler::badSummary(const Participant& p, wire::Summary& s,
                                                       double now) const {
  const double max_loss = options_.max_loss;
  auto inRange = [](double v, double hi) { return std::isfinite(v) && v >= 0 && v <= hi; };
  if (!inRange(s.mean_loss, max_loss)) {
    return "summary's mean loss " + std::to_string(s.mean_loss) + " is not in [0, " +
           std::to_string(max_loss) + "]";
  }
  // Each per-sample loss is in [0, max_loss], and the task saw at most max(n, steps x batch)
  // samples, so their squares sum to at most that many max_loss^2.
  const double seen = std::max(static_cast<double>(s.n_samples),
                               static_cast<double>(s.steps) * std::max(p.planned.batch_size, 1u));
  const double sq_bound = seen * max_loss * max_loss;
  if (!inRange(s.sum_sq_loss, sq_bound)) {
    return "summary's sum of squared losses " + std::to_string(s.sum_sq_loss) + " is not in [0, " +
           std::to_string(sq_bound) + "]";
  }
  if (s.served_samples > 0) {
    // Held-out samples, bounded as a federated evaluation's are (the coordinator does not
    // know how many a client holds).
    const uint64_t bound = options_.max_samples_per_update;
    if (bound > 0 && s.served_samples > bound) {
      return "summary's served-model evaluation claims " + std::to_string(s.served_samples) +
             " held-out samples, more than coordinator.max_samples_per_update = " +
             std::to_string(bound);
    }
    if (!inRange(s.served_loss, max_loss) || !inRange(s.served_accuracy, 1.0)) {
      return "summary's served-model loss " + std::to_string(s.served_loss) + " or accuracy " +
             std::to_string(s.served_accuracy) + " is out of range";
    }
  }
  if (s.eval_samples > 0) {
    if (!p.fed_eval) {
      return "summary reports a federated evaluation (" + std::to_string(s.eval_samples) +
             " samples) its task did not ask for";
    }
    const uint64_t bound = options_.max_samples_per_update;
    if (bound > 0 && s.eval_samples > bound) {
      return "summary's federated evaluation claims " + std::to_string(s.eval_samples) +
             " held-out samples, more than coordinator.max_samples_per_update = " +
             std::to_string(bound);
    }
    if (!inRange(s.eval_loss, max_loss) || !inRange(s.eval_accuracy, 1.0)) {
      return "summary's federated evaluation loss " + std::to_string(s.eval_loss) +
             " or accuracy " + std::to_string(s.eval_accuracy) + " is out of range";
    }
    if (!s.eval_has_accuracy &&
        (s.eval_accuracy != 0 || options_.hparams.loss == wire::Loss::kCrossEntropy)) {
      return "summary's federated evaluation claims no accuracy, which a model trained by "
             "cross-entropy has (or gives one anyway)";
    }
    for (const auto& [name, value] : s.eval_metrics) {
      if (!(std::abs(value) <= max_loss)) {
        return "summary's federated evaluation metric '" + name + "' = " + std::to_string(value) +
               " is not finite or beyond coordinator.max_loss";
      }
    }
  }
  // Timings: each within [0, the time since the task was sent] (NaN counts as 0).
  const double elapsed = std::max(0.0, now - p.sent_at);
  for (double* t : {&s.compute_seconds, &s.upload_seconds, &s.encode_seconds}) {
    *t = std::isnan(*t) ? 0.0 : std::clamp(*t, 0.0, elapsed);
  }
  return std::nullopt;
}

Status UpdateAssembler::fold(uint64_t token, float w, float* sum) {
  return partial_.forEach(
      token, [&](uint64_t offset, uint64_t elements, std::string_view payload) -> Status {
        scratch_.resize(elements);
        FEDFLEET_RETURN_IF_ERROR(compress::decodePayload(payload, elements, scratch_.data()));
        kernels::weightedAccumulate(sum + offset, scratch_.data(), w, elements);
        return Status::ok();
      });
}

Status UpdateAssembler::decode(uint64_t token, float* out) {
  return partial_.forEach(
      token, [&](uint64_t offset, uint64_t elements, std::string_view payload) -> Status {
        return compress::decodePayload(payload, elements, out + offset);
      });
}

}  // namespace fedfleet::engine
