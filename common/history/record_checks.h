// Argument checks shared by the history backends, so that both reject the same inputs with the
// same codes. Internal to common/history/.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/history/history.h"
#include "common/status.h"

namespace fedfleet::history {

// The values RoundRecord::status may take. The SQLite schema has the same list in a CHECK.
bool isRoundStatus(std::string_view status);
// The values UpdateRecord::status may take. The SQLite schema has the same list in a CHECK.
bool isUpdateStatus(std::string_view status);

// kInvalidArgument when an update or the checkpoint names another (run_id, round) than `round`.
// Status values are not checked here: SQLite enforces them inside the transaction (so a bad row
// exercises the rollback), the memory backend checks them itself.
Status checkCommitArguments(const RoundRecord& round, const std::vector<UpdateRecord>& updates,
                            const std::optional<CheckpointRecord>& checkpoint);

// kInvalidArgument for a block_metrics row with an empty block or model, or two rows with the
// same (run_id, round, block, model).
Status checkBlockMetricRows(const std::vector<BlockMetricRecord>& rows);

// kInvalidArgument for a peer_iterations row with a negative or non-finite time or duration, or
// t_end < t_start, or two rows with the same (run_id, peer, iteration).
Status checkPeerIterationRows(const std::vector<PeerIterationRecord>& rows);

// kInvalidArgument for a peer_evals row with a negative or non-finite time_s, or an accuracy
// outside [0, 1] (NaN passes: no accuracy).
Status checkPeerEval(const PeerEvalRecord& row);

// "commitRound(run 3, round 7)": the context prefix of commitRound's messages.
std::string commitContext(const RoundRecord& round);

}  // namespace fedfleet::history
