// PartialLog: the payloads of a round's updates, kept until the round settles.
//
// The coordinator folds an update into the round's running sum only when its weight and scale
// are final (the norm bound and weight cap need the whole round's norms and weights), so every
// chunk's payload (the compressed bytes as received) is kept here from its arrival until the
// update is folded at settlement, or dropped when the update does not complete (rejected,
// cancelled, client lost): in memory up to coordinator.partial_buffer_mib, beyond it in an
// unlinked temporary file, so a round of many uploads costs disk, not memory. It is the
// ChunkLog of common/chunk_log.h, which SecAggServer also keeps its masked chunks in (tokens
// here are task tokens).
#pragma once

#include "common/chunk_log.h"

namespace fedfleet::engine {

using PartialLog = ChunkLog;

}  // namespace fedfleet::engine
