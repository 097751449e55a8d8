#include "common/history/record_checks.h"

#include <set>
#include <string>
#include <tuple>

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

}  // namespace fedfleet::history
