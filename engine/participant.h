// Participant: one task of a round as the engine tracks it, from dispatch to its end
// (round_engine.h protocol steps 3-8): what the task carried and planned, what its chunks and
// summary declared, and when each thing happened. A plain value; the engine's participant table
// holds one per task token, in dispatch order; updateRecord() is the history row it ends as.
#pragma once

#include <cstdint>
#include <string>

#include "common/compress/codec_spec.h"
#include "common/history/records.h"
#include "common/wire/messages.h"

namespace fedfleet::engine {

using ClientId = std::string;

// Where a task stands: pending until its update completes, or it is rejected, cancelled at a
// deadline (late) or lost with its client (dropped).
enum class UpdateState { kPending, kCompleted, kLate, kDropped, kRejected };

struct Participant {
  ClientId client;
  uint32_t partition = 0;
  UpdateState state = UpdateState::kPending;
  uint64_t next_offset = 0;  // next element offset expected
  bool weight_set = false;   // the first chunk declared n_samples and steps
  uint64_t steps = 0;
  std::string codec;            // codec of the payload of the most elements so far
  uint64_t codec_elements = 0;  // elements of that payload
  bool last_chunk = false;
  uint64_t bytes_up = 0;
  uint64_t bytes_down = 0;
  double first_chunk_at = -1;
  double last_chunk_at = -1;
  double finished_at = -1;  // summary, rejection, cancellation or loss
  wire::Summary summary;
  double weight = 0;           // n_k, as the chunks declare it
  double agg_weight = 0;       // n_k as aggregated: capped at settlement (step 8a)
  uint64_t max_steps = 0;      // the most local steps its task planned (0: not known yet)
  wire::HyperParams planned;   // the hyper-parameters its task carried
  compress::CodecSpec asked;   // the codec its task asked for (its chunks' payloads must match)
  double fold_weight = 0;      // what its chunks are folded into the running sum with
  uint64_t start_version = 0;  // model version the task carried
  double sent_at = 0;
  double deadline = 0;          // this task's deadline (the round's, or its own when async)
  uint32_t staleness = 0;       // async: versions behind when it completed
  double sq_norm = 0;           // squared L2 norm of the delta part received so far
  wire::ServedModel served;     // blocks: what the task named (no bytes)
  uint64_t served_bytes = 0;    // served-model bytes the task carried
  bool fed_eval = false;        // the task asked for a federated evaluation of its model
  double upload_asked_at = -1;  // UploadRequest received (-1: not yet)
  double granted_at = -1;       // UploadGrant sent (-1: not yet)
};

// How the history spells `state` (UpdateRecord::status).
const char* stateName(UpdateState state);
// The history row of participant `p` of round `round` of run `run_id`, seen at `now` (its end
// time while it is still pending); `weight` is its share of the aggregate, recorded only for a
// completed update.
history::UpdateRecord updateRecord(const Participant& p, int64_t run_id, uint32_t round,
                                   double weight, double now);

}  // namespace fedfleet::engine
