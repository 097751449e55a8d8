#include "common/history/record_checks.h"

#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <utility>

namespace fedfleet::history {

bool isRoundStatus(std::string_view status) {
  return status == "initial" || status == "ok" || status == "failed";
}

bool isUpdateStatus(std::string_view status) {
  return status == "completed" || status == "late" || status == "dropped" || status == "rejected";
}

std::string commitContext(const RoundRecord& round) {
  return "commitRound(run " + std::to_string(round.run_id) + ", round " +
         std::to_string(round.round) + ")";
}

Status checkCommitArguments(const RoundRecord& round, const std::vector<UpdateRecord>& updates,
                            const std::optional<CheckpointRecord>& checkpoint) {
  for (size_t i = 0; i < updates.size(); ++i) {
    const UpdateRecord& u = updates[i];
    if (u.run_id != round.run_id || u.round != round.round) {
      return invalidArgument(commitContext(round) + ": update " + std::to_string(i) + " (client '" +
                             u.client_id + "') is for run " + std::to_string(u.run_id) +
                             ", round " + std::to_string(u.round));
    }
  }
  if (checkpoint && (checkpoint->run_id != round.run_id || checkpoint->round != round.round)) {
    return invalidArgument(commitContext(round) + ": checkpoint is for run " +
                           std::to_string(checkpoint->run_id) + ", round " +
                           std::to_string(checkpoint->round));
  }
  return Status::ok();
}

Status checkBlockMetricRows(const std::vector<BlockMetricRecord>& rows) {
  std::set<std::tuple<int64_t, uint32_t, std::string, std::string>> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    const BlockMetricRecord& b = rows[i];
    if (b.block.empty() || b.model.empty()) {
      return invalidArgument("block metric row " + std::to_string(i) +
                             ": block and model must not be empty");
    }
    if (!seen.emplace(b.run_id, b.round, b.block, b.model).second) {
      return invalidArgument("block metric row " + std::to_string(i) + " repeats (round " +
                             std::to_string(b.round) + ", block " + b.block + ", model " + b.model +
                             ")");
    }
  }
  return Status::ok();
}

Status checkPeerIterationRows(const std::vector<PeerIterationRecord>& rows) {
  std::set<std::tuple<int64_t, uint32_t, uint64_t>> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    const PeerIterationRecord& r = rows[i];
    const std::string where = "peer iteration row " + std::to_string(i) + " (run " +
                              std::to_string(r.run_id) + ", peer " + std::to_string(r.peer) +
                              ", iteration " + std::to_string(r.iteration) + ")";
    for (const auto& [name, value] :
         {std::pair{"t_start", r.t_start}, std::pair{"t_end", r.t_end},
          std::pair{"compute_s", r.compute_s}, std::pair{"comm_s", r.comm_s},
          std::pair{"wait_s", r.wait_s}}) {
      if (!std::isfinite(value) || value < 0) {
        return invalidArgument(where + ": " + name + " is " + std::to_string(value) +
                               ", not a finite non-negative number of seconds");
      }
    }
    if (r.t_end < r.t_start) {
      return invalidArgument(where + ": t_end " + std::to_string(r.t_end) + " is before t_start " +
                             std::to_string(r.t_start));
    }
    if (!seen.emplace(r.run_id, r.peer, r.iteration).second) {
      return invalidArgument(where + " repeats");
    }
  }
  return Status::ok();
}

Status checkPeerEval(const PeerEvalRecord& row) {
  const std::string where = "peer evaluation (run " + std::to_string(row.run_id) + ", time " +
                            std::to_string(row.time_s) + ")";
  if (!std::isfinite(row.time_s) || row.time_s < 0) {
    return invalidArgument(where + ": time_s must be a finite non-negative number of seconds");
  }
  if (!std::isnan(row.accuracy) && !(row.accuracy >= 0 && row.accuracy <= 1)) {
    return invalidArgument(where + ": accuracy " + std::to_string(row.accuracy) +
                           " is outside [0, 1]");
  }
  return Status::ok();
}

}  // namespace fedfleet::history
