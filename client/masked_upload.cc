#include "client/masked_upload.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/fednova.h"
#include "common/privacy/gaussian_noise.h"
#include "common/secagg/quantizer.h"

namespace fedfleet::client {

double secAggWeight(const wire::SecAggTask& task, uint64_t n_samples, uint64_t steps) {
  const double scale = task.weight_scale > 0 ? task.weight_scale : 1.0;
  const double w = std::min(1.0, static_cast<double>(n_samples) / scale);
  if (!task.fednova) return w;
  if (steps == 0) return 0.0;
  return w / fedNovaNormaliser(steps, task.fednova_momentum);
}

double maskedUploadWeight(const wire::SecAggTask& task, double session_weight, const float* delta,
                          size_t n) {
  if (!(task.dp_clip > 0)) return session_weight;
  double sq = 0;
  for (size_t i = 0; i < n; ++i) sq += static_cast<double>(delta[i]) * delta[i];
  const double norm = std::sqrt(sq);
  return norm > task.dp_clip ? task.dp_clip / norm : 1.0;
}

namespace {

// Values of a chunk encoded in one piece: a multiple of 4, so that a piece starts on a block of
// both the rounding stream (2 values a block) and the mask streams (4).
constexpr size_t kPieceValues = size_t{1} << 16;

// Values a .. a + m of the chunk, weighted, quantised with the chunk's rounding stream from
// value a on, and masked, into out[0 .. m).
void encodePiece(const secagg::SecAggClient& masker, const wire::SecAggTask& task, double weight,
                 const std::string& rounding_key, const ChunkRange& r, const float* x, size_t a,
                 size_t m, uint32_t* out) {
  // The rounding stream gives 8 bytes a value, from block r.offset on (16-byte blocks).
  crypto::KeyedStream rounding(rounding_key, 0, r.offset + a / 2);
  float weighted[1024];
  for (size_t done = 0; done < m;) {
    const size_t take = std::min(m - done, sizeof(weighted) / sizeof(weighted[0]));
    for (size_t i = 0; i < take; ++i) weighted[i] = static_cast<float>(weight * x[a + done + i]);
    secagg::quantize({task.clip_range, task.quant_range}, weighted, take, rounding, out + done);
    done += take;
  }
  masker.mask(r.offset + a, out, m);
}

}  // namespace

Status encodeMaskedChunk(const secagg::SecAggClient& masker, const wire::SecAggTask& task,
                         double weight, uint64_t seed, const ChunkRange& r, const float* x,
                         std::string* payload, const RunPieces& run) {
  const size_t n = r.elements;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      return invalidArgument("update value " + std::to_string(r.offset + i) + " is not finite");
    }
  }
  const std::string rounding_key = crypto::streamKeyFromSeed("fedfleet secagg rounding", seed);
  payload->resize(n * sizeof(uint32_t));
  auto* out = reinterpret_cast<unsigned char*>(payload->data());
  if (task.dp_noise_stddev > 0) {
    // The noise is one stream over the chunk, drawn in order: one piece.
    std::vector<float> weighted(n);
    for (size_t i = 0; i < n; ++i) weighted[i] = static_cast<float>(weight * x[i]);
    privacy::GaussianStream noise(masker.privateStream(r.offset));
    noise.addTo(weighted.data(), weighted.size(), task.dp_noise_stddev);
    std::vector<uint32_t> values(n);
    encodePiece(masker, task, 1.0, rounding_key, r, weighted.data(), 0, n, values.data());
    std::memcpy(out, values.data(), payload->size());  // little-endian hosts
    return Status::ok();
  }
  const size_t pieces = (n + kPieceValues - 1) / kPieceValues;
  const auto piece = [&](size_t p) {
    // A buffer of each thread's, kept: a fresh one would cost its pages every chunk.
    thread_local std::vector<uint32_t> values;
    const size_t a = p * kPieceValues, m = std::min(kPieceValues, n - a);
    if (values.size() < m) values.resize(kPieceValues);
    encodePiece(masker, task, weight, rounding_key, r, x, a, m, values.data());
    std::memcpy(out + a * sizeof(uint32_t), values.data(), m * sizeof(uint32_t));
  };
  if (run && pieces > 1) {
    run(pieces, piece);
  } else {
    for (size_t p = 0; p < pieces; ++p) piece(p);
  }
  return Status::ok();
}

}  // namespace fedfleet::client
