#include "engine/block_coordinator.h"

#include <cstring>
#include <map>
#include <utility>

#include "common/crypto/sha256.h"

namespace fedfleet::engine {

BlockCoordinator::BlockCoordinator(const BlockScheduleOptions& schedule, BlockMode mode)
    : schedule_(schedule), models_(mode, schedule.count), served_(schedule.count) {}

std::optional<std::string> BlockCoordinator::prepareRound(uint32_t round, double now,
                                                          const std::vector<float>& x) {
  const uint32_t m = schedule_.blockAt(round, now);
  const int64_t visit = schedule_.visitAt(round, now);
  const bool new_visit = m != block_ || (visit_ != INT64_MIN && visit != visit_);
  visit_ = visit;
  std::optional<std::string> started;
  if (new_visit) {
    block_ = m;
    first_round_ = round;
    started = "block " + std::to_string(m) + " from round " + std::to_string(round) + " (" +
              blockModeName(models_.mode()) + ")";
  }
  round_chain_ = -1;
  if (models_.mode() == BlockMode::kMultichain && (round - first_round_) % 2 == 1) {
    round_chain_ = static_cast<int32_t>(m);
    const std::vector<float>& y = models_.chain(m, x);
    auto bytes = std::make_shared<std::string>(y.size() * sizeof(float), '\0');
    std::memcpy(bytes->data(), y.data(), bytes->size());
    chain_sha_ = crypto::sha256(*bytes);
    chain_bytes_ = std::move(bytes);
  }
  return started;
}

bool BlockCoordinator::available(int32_t partition) const {
  if (partition < 0) return false;
  return schedule_.available(static_cast<uint32_t>(partition), block_);
}

std::optional<EvaluateBlocks> BlockCoordinator::endRound(uint32_t round, bool last, double now,
                                                         const std::vector<float>& x) {
  round_chain_ = -1;
  const uint32_t m = block_;
  if (!last && !schedule_.endsAfter(round, visit_, now)) return std::nullopt;
  models_.endVisit(m, x);
  EvaluateBlocks ev;
  ev.round = round;
  ev.ended_block = m;
  auto shared = std::make_shared<const std::vector<float>>(x);
  for (uint32_t j = 0; j < models_.blocks(); ++j) {
    ev.models.push_back({j, "shared", shared});
    if (!models_.average(j).empty()) {
      ev.models.push_back(
          {j, "pluralistic", std::make_shared<const std::vector<float>>(models_.average(j))});
    }
    if (!models_.chain(j).empty()) {
      ev.models.push_back(
          {j, "chain", std::make_shared<const std::vector<float>>(models_.chain(j))});
    }
  }
  awaiting_.insert(round);
  return ev;
}

std::optional<RecordBlockMetrics> BlockCoordinator::onEvaluated(
    uint32_t round, const std::vector<BlockEvalOutcome>& outcomes, int64_t run_id) {
  if (awaiting_.erase(round) == 0) return std::nullopt;
  auto row = [&](const BlockEvalOutcome& o, const std::string& model) {
    history::BlockMetricRecord b;
    b.run_id = run_id;
    b.round = round;
    b.block = std::to_string(o.block);
    b.model = model;
    b.accuracy = o.accuracy;
    b.loss = o.loss;
    return b;
  };
  RecordBlockMetrics rec;
  std::map<std::pair<uint32_t, std::string>, const BlockEvalOutcome*> found;
  for (const BlockEvalOutcome& o : outcomes) {
    if (o.block >= models_.blocks()) continue;
    found[{o.block, o.model}] = &o;
    rec.rows.push_back(row(o, o.model));
  }
  auto lookup = [&](uint32_t j, const char* model) -> const BlockEvalOutcome* {
    auto it = found.find({j, model});
    return it == found.end() ? nullptr : it->second;
  };
  for (uint32_t j = 0; j < models_.blocks(); ++j) {
    if (models_.mode() == BlockMode::kMultichain) {
      const BlockEvalOutcome* z = lookup(j, "pluralistic");
      const BlockEvalOutcome* y = lookup(j, "chain");
      models_.choose(j, z ? z->validation_loss : std::nullopt,
                     y ? y->validation_loss : std::nullopt);
    }
    if (const BlockEvalOutcome* s = lookup(j, BlockModels::servedName(models_.served(j)))) {
      rec.rows.push_back(row(*s, "served"));
    }
  }
  ++served_epoch_;  // multichain may serve another model now
  return rec;
}

std::shared_ptr<const std::string> BlockCoordinator::serve(std::optional<wire::Sha256>& client_has,
                                                           wire::Task& task, const SharedModel& x) {
  const uint32_t m = currentBlock();
  ServedBuffer& s = served_.at(m);
  if (s.epoch != served_epoch_) {
    s.epoch = served_epoch_;
    const std::vector<float>& params = servedModel(m, x.params);
    std::shared_ptr<const std::string> bytes = x.bytes;
    wire::Sha256 sha = x.sha;
    if (&params != &x.params) {
      auto b = std::make_shared<std::string>(params.size() * sizeof(float), '\0');
      std::memcpy(b->data(), params.data(), b->size());
      sha = crypto::sha256(*b);
      bytes = std::move(b);
    }
    if (!s.bytes || sha != s.sha) {
      s.bytes = std::move(bytes);
      s.sha = sha;
      s.version = x.version;
    }
    s.model = BlockModels::servedName(models_.served(m));
  }
  wire::ServedModel& sv = task.served;
  sv.block = m;
  sv.model = s.model;
  sv.version = s.version;
  sv.sha256 = s.sha;
  std::shared_ptr<const std::string> attach;
  if (client_has == s.sha) {
    sv.source = wire::ServedSource::kUnchanged;
  } else if (s.sha == task.model_sha256) {
    sv.source = wire::ServedSource::kTaskModel;
  } else {
    sv.source = wire::ServedSource::kAttached;
    attach = s.bytes;
  }
  client_has = s.sha;
  return attach;
}

std::optional<std::string> BlockCoordinator::servedMismatch(const wire::ServedModel& named,
                                                            const wire::Sha256& held) {
  if (named.source == wire::ServedSource::kNone) return std::nullopt;
  if (held == named.sha256) return std::nullopt;
  // The client does not hold the model the task named (it lost it, or never got it).
  const bool none = held == wire::Sha256{};
  return "task named served model " + crypto::toHex(named.sha256).substr(0, 12) +
         ", the client holds " + (none ? "none" : crypto::toHex(held).substr(0, 12));
}

std::string BlockCoordinator::save() const {
  std::string b(8, '\0');
  std::memcpy(b.data(), &block_, 4);
  std::memcpy(b.data() + 4, &first_round_, 4);
  return b + models_.save();
}

Result<BlockCoordinator::SavedState> BlockCoordinator::parse(std::string_view blob,
                                                             size_t n_params) const {
  if (blob.size() < 8) return corrupt("engine state: truncated blocks");
  uint32_t block = UINT32_MAX, first_round = 0;
  std::memcpy(&block, blob.data(), 4);
  std::memcpy(&first_round, blob.data() + 4, 4);
  BlockModels models(models_.mode(), models_.blocks());
  FEDFLEET_RETURN_IF_ERROR(models.load(blob.substr(8), n_params));
  return SavedState{block, first_round, std::move(models)};
}

void BlockCoordinator::restore(SavedState state) {
  models_ = std::move(state.models);
  block_ = state.block;
  first_round_ = state.first_round;
  visit_ = schedule_.byRounds() ? schedule_.visitAt(first_round_, 0) : INT64_MIN;
  ++served_epoch_;
}

}  // namespace fedfleet::engine
