// The upload of an update under secure aggregation (engine/secure_aggregation.h): each chunk's
// values, weighted by n_k / weight_scale (FedNova: and by 1 / a_k), clipped to the task's clip
// range, quantised by stochastic rounding (seeded per chunk, so the same task gives the same
// upload) and masked by the client's SecAgg+ state, as little-endian uint32 values. The coordinator
// only adds them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "client/upload_pipeline.h"
#include "common/secagg/secagg_client.h"
#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::client {

// The weight a client of `n_samples` applies to an update of `steps` local steps:
// min(1, n_samples / weight_scale), and under FedNova (task.fednova) that divided by
// a = fedNovaNormaliser(steps, task.fednova_momentum) (a >= 1, so the weight stays <= 1); the
// coordinator adds the update's n_k and a_k to FedNova's totals itself (from the steps the
// update declares). 0 for an update of 0 steps under FedNova (the coordinator refuses it).
double secAggWeight(const wire::SecAggTask& task, uint64_t n_samples, uint64_t steps);

// The weight the driver applies to the whole update: `session_weight` (secAggWeight), or under
// differential privacy (task.dp_clip > 0: dp.mode "central" or "distributed") min(1, dp_clip /
// ||delta||_2), the clip at weight 1.
double maskedUploadWeight(const wire::SecAggTask& task, double session_weight, const float* delta,
                          size_t n);

// Runs piece(0) .. piece(pieces - 1), possibly several at once on other threads, and returns
// when every call has returned.
using RunPieces =
    std::function<void(size_t pieces, const std::function<void(size_t piece)>& piece)>;

// Encodes values x[0 .. r.elements) (the delta's range `r`) into `payload`: weighted, plus (under
// distributed DP; central DP's noise is the coordinator's) N(0, dp_noise_stddev^2) from the
// masker's private stream for this range (keyed by its noise key, which no share reveals:
// SecAggClient::privateStream), clipped, quantised and masked. kInvalidArgument when a value is not
// finite (nothing is encoded). With `run`, a chunk of more than 65,536 values is encoded in
// pieces of that many through it (without DP noise, whose stream is drawn in order); the payload
// is the same to the bit either way.
Status encodeMaskedChunk(const secagg::SecAggClient& masker, const wire::SecAggTask& task,
                         double weight, uint64_t seed, const ChunkRange& r, const float* x,
                         std::string* payload, const RunPieces& run = nullptr);

}  // namespace fedfleet::client
