// UpdateAssembler: an update from its chunks to the running sum (protocol steps 5, 5a, 6 and 8a
// in round_engine.h). It checks each chunk against what the engine knows (contiguous offsets
// inside the update, a stable weight, claims within the partition and the task's plan, a
// payload that decodes to finite values far from overflow), accumulates the delta's squared
// norm, and keeps the payload in the PartialLog until the engine decides the update's weight:
// then it folds the update into the running sum, hands it over whole (buffering aggregators), or
// takes it back (nothing of an update that does not count was ever folded). One owner: not
// thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/wire/messages.h"
#include "engine/aggregator.h"
#include "engine/partial_log.h"
#include "engine/participant.h"

namespace fedfleet::engine {

struct EngineOptions;

class UpdateAssembler {
 public:
  // `options` and `aggregator` outlive the assembler; updates of a model of `n_params` values.
  UpdateAssembler(const EngineOptions& options, const Aggregator& aggregator, uint64_t n_params);

  // Steps 5 and 5a: checks chunk `chunk` of participant `p` (task `token`), and on success
  // records it in `p` (offsets, weight, norm, codec) and keeps its payload. Returns why the
  // update must be rejected, or nothing.
  std::optional<std::string> addChunk(Participant& p, uint64_t token, const wire::Chunk& chunk);
  // Secure aggregation: checks masked chunk `chunk` of `p` as addChunk does (offsets, weight,
  // claims) and records it in `p`, but neither decodes nor keeps its payload, which only the
  // masked sum may see (engine/secure_aggregation.h). Returns why the update must be rejected.
  std::optional<std::string> addMaskedChunk(Participant& p, const wire::Chunk& chunk);
  // Step 5a: whether `summary` may complete `p`'s update (all values received, the chunks'
  // weight, losses in range); timings are clamped into `checked`. Returns why not, or nothing.
  std::optional<std::string> checkSummary(const Participant& p, const wire::Summary& summary,
                                          wire::Summary& checked, double now) const;

  // Folds the kept update of `token` into `sum` with weight `w`, in chunk order.
  Status fold(uint64_t token, float w, float* sum);
  // Decodes the whole kept update of `token` into `out` (updateSize() values).
  Status decode(uint64_t token, float* out);
  // Forgets the kept payloads of `token` (folded, handed over, or not counting).
  void takeBack(uint64_t token) { partial_.erase(token); }
  // Forgets every kept payload (the round is over).
  void clear() { partial_.clear(); }

 private:
  // Claims of a first chunk: samples within the partition's size (or the bound), steps within
  // what the task planned.
  std::optional<std::string> badClaims(Participant& p, const wire::Chunk& chunk) const;
  // What every chunk must satisfy before its payload is looked at: after no last chunk,
  // contiguous, inside the update, a stable weight within the claims (set on the first).
  std::optional<std::string> checkChunkPlace(Participant& p, const wire::Chunk& chunk) const;
  // A summary's losses and timings.
  std::optional<std::string> badSummary(const Participant& p, wire::Summary& s, double now) const;

  const EngineOptions& options_;
  const Aggregator& aggregator_;
  const uint64_t n_params_;
  PartialLog partial_;          // kept payloads of the round's updates, until settled
  std::vector<float> scratch_;  // one decoded chunk
};

}  // namespace fedfleet::engine
