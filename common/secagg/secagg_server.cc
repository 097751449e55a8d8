#include "common/secagg/secagg_server.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "common/check.h"
#include "common/crypto/sha256.h"
#include "common/crypto/x25519.h"

namespace fedfleet::secagg {
namespace {

static_assert(kSealedSharesBytes == 8 + 2 * kShareBytes + 16);

NeighbourGraph graphOf(const RoundParams& p) {
  FEDFLEET_CHECK_MSG(validateRoundParams(p).isOk(), "invalid secure aggregation round");
  auto g = NeighbourGraph::build(p.clients, effectiveDegree(p), p.graph_seed);
  FEDFLEET_CHECK_MSG(g.isOk(), g.status().toString().c_str());
  return std::move(g).value();
}

Status outOfStage(const char* what, Stage stage) {
  return Status(StatusCode::kFailedPrecondition,
                std::string(what) + " during secure aggregation stage " + stageName(stage));
}

std::string name(uint32_t i) { return "client " + std::to_string(i); }

}  // namespace

const char* stageName(Stage stage) {
  switch (stage) {
    case Stage::kAdvertise:
      return "advertise keys";
    case Stage::kShareKeys:
      return "share keys";
    case Stage::kMaskedInput:
      return "masked input";
    case Stage::kUnmask:
      return "unmask";
    case Stage::kDone:
      return "done";
  }
  return "?";
}

SecAggServer::SecAggServer(const RoundParams& params, uint64_t in_flight_memory_bytes)
    : params_(params), graph_(graphOf(params)), in_flight_log_(in_flight_memory_bytes) {}

bool SecAggServer::isNeighbourIn(uint32_t i, uint32_t j,
                                 const std::map<uint32_t, KeyAdvert>& set) const {
  return graph_.adjacent(i, j) && set.count(j) > 0;
}

bool SecAggServer::stageComplete() const {
  auto waiting = [&](uint32_t i, bool answered) { return !answered && !gone_.count(i); };
  switch (stage_) {
    case Stage::kAdvertise:
      for (uint32_t i = 0; i < params_.clients; ++i) {
        if (waiting(i, adverts_.count(i) > 0)) return false;
      }
      return true;
    case Stage::kShareKeys:
      for (const auto& [i, a] : adverts_) {
        if (waiting(i, shared_.count(i) > 0)) return false;
      }
      return true;
    case Stage::kMaskedInput:
      for (const auto& [i, s] : shared_) {
        if (waiting(i, complete_.count(i) > 0)) return false;
      }
      return true;
    case Stage::kUnmask:
      for (const auto& [i, r] : requests_) {
        if (waiting(i, revealed_.count(i) > 0)) return false;
      }
      return true;
    case Stage::kDone:
      return true;
  }
  return true;
}

Status SecAggServer::onAdvert(uint32_t from, const KeyAdvert& advert) {
  if (stage_ != Stage::kAdvertise) return outOfStage("keys advertised", stage_);
  if (from >= params_.clients) return invalidArgument(name(from) + " is not in the round");
  if (advert.index != from) {
    return invalidArgument(name(from) + " advertised keys as client " +
                           std::to_string(advert.index));
  }
  if (advert.encryption_key.size() != crypto::kX25519KeyBytes ||
      advert.mask_key.size() != crypto::kX25519KeyBytes || advert.seed_digest.size() != 32) {
    return invalidArgument(name(from) + " advertised keys of the wrong size");
  }
  if (!adverts_.emplace(from, advert).second) {
    return Status(StatusCode::kFailedPrecondition, name(from) + " advertised keys twice");
  }
  return Status::ok();
}

std::vector<std::pair<uint32_t, std::vector<KeyAdvert>>> SecAggServer::closeAdvertise() {
  FEDFLEET_CHECK(stage_ == Stage::kAdvertise);
  stage_ = Stage::kShareKeys;
  std::vector<std::pair<uint32_t, std::vector<KeyAdvert>>> out;
  for (const auto& [i, a] : adverts_) {
    std::vector<KeyAdvert> keys;
    for (uint32_t j : graph_.neighbours(i)) {
      auto it = adverts_.find(j);
      if (it != adverts_.end()) keys.push_back(it->second);
    }
    out.emplace_back(i, std::move(keys));
  }
  return out;
}

Status SecAggServer::onSealedShares(uint32_t from, const std::vector<SealedShares>& shares) {
  if (stage_ != Stage::kShareKeys) return outOfStage("key shares", stage_);
  if (!adverts_.count(from)) {
    return Status(StatusCode::kFailedPrecondition,
                  name(from) + " sent key shares without having advertised keys");
  }
  if (shared_.count(from)) {
    return Status(StatusCode::kFailedPrecondition, name(from) + " sent key shares twice");
  }
  std::set<uint32_t> to;
  for (const SealedShares& s : shares) {
    if (s.from != from || !isNeighbourIn(from, s.to, adverts_) || !to.insert(s.to).second ||
        s.sealed.size() != kSealedSharesBytes) {
      return invalidArgument(name(from) + " sent key shares that are not one sealed pair of " +
                             std::to_string(kSealedSharesBytes) +
                             " bytes per neighbour it was sent keys of");
    }
  }
  // Exactly one per neighbour in U1: the pairwise masks of U2 must pair up (each end of an
  // edge masks with the other iff both hold the other's shares).
  size_t expected = 0;
  for (uint32_t j : graph_.neighbours(from)) expected += adverts_.count(j);
  if (to.size() != expected) {
    return invalidArgument(name(from) + " sent key shares for " + std::to_string(to.size()) +
                           " of its " + std::to_string(expected) + " neighbours that advertised");
  }
  shared_[from] = shares;
  return Status::ok();
}

std::vector<std::pair<uint32_t, std::vector<SealedShares>>> SecAggServer::closeShareKeys() {
  FEDFLEET_CHECK(stage_ == Stage::kShareKeys);
  stage_ = Stage::kMaskedInput;
  std::map<uint32_t, std::vector<SealedShares>> to;
  for (const auto& [i, list] : shared_) {
    for (const SealedShares& s : list) {
      if (shared_.count(s.to)) to[s.to].push_back(s);
    }
  }
  std::vector<std::pair<uint32_t, std::vector<SealedShares>>> out;
  for (const auto& [i, list] : shared_) out.emplace_back(i, std::move(to[i]));
  sum_.assign(params_.length, 0);
  return out;
}

Status SecAggServer::onMaskedChunk(uint32_t from, uint64_t offset, const uint32_t* values,
                                   size_t n) {
  if (stage_ != Stage::kMaskedInput) return outOfStage("a masked input", stage_);
  if (!shared_.count(from) || complete_.count(from)) {
    return Status(StatusCode::kFailedPrecondition,
                  name(from) + " sent a masked input it is not expected to send");
  }
  uint64_t& received = in_flight_[from];
  if (offset != received || n == 0 || n > params_.length - offset) {
    return invalidArgument(name(from) + " sent masked values [" + std::to_string(offset) + ", " +
                           std::to_string(offset + n) + "), expected the next from " +
                           std::to_string(received) + " of " + std::to_string(params_.length));
  }
  // Kept before it is added: a chunk that could not be taken back is never in the sum.
  FEDFLEET_RETURN_IF_ERROR(in_flight_log_.append(
      from, offset, n,
      std::string_view(reinterpret_cast<const char*>(values), n * sizeof(*values))));
  uint32_t* dst = sum_.data() + offset;
  for (size_t i = 0; i < n; ++i) dst[i] += values[i];
  received += n;
  return Status::ok();
}

Status SecAggServer::onMaskedDone(uint32_t from) {
  if (stage_ != Stage::kMaskedInput) return outOfStage("a masked input's end", stage_);
  auto it = in_flight_.find(from);
  if (it == in_flight_.end() || it->second != params_.length) {
    return invalidArgument(name(from) + " ended a masked input with values missing");
  }
  in_flight_.erase(it);
  in_flight_log_.erase(from);  // in the sum for good: nothing of it is kept
  complete_.insert(from);
  return Status::ok();
}

std::vector<std::pair<uint32_t, UnmaskRequest>> SecAggServer::closeMaskedInput() {
  FEDFLEET_CHECK(stage_ == Stage::kMaskedInput);
  stage_ = Stage::kUnmask;
  std::vector<uint32_t> chunk;
  for (const auto& [i, received] : in_flight_) {  // incomplete: take back what was added
    Status st = in_flight_log_.forEach(
        i, [&](uint64_t offset, uint64_t n, std::string_view bytes) -> Status {
          // As appended by onMaskedChunk, inside the input.
          FEDFLEET_CHECK(bytes.size() == n * sizeof(uint32_t) && offset + n <= params_.length);
          chunk.resize(n);
          std::memcpy(chunk.data(), bytes.data(), bytes.size());
          uint32_t* dst = sum_.data() + offset;
          for (uint64_t v = 0; v < n; ++v) dst[v] -= chunk[v];
          return Status::ok();
        });
    if (!st.isOk() && taken_back_.isOk()) {
      const std::string why = "taking back " + name(i) + "'s incomplete masked input: ";
      taken_back_ = Status(st.code(), why + st.message());
    }
  }
  in_flight_.clear();
  in_flight_log_.clear();
  std::vector<std::pair<uint32_t, UnmaskRequest>> out;
  for (uint32_t i : complete_) {
    UnmaskRequest r;
    r.survivors.push_back(i);  // its own seed share, held by itself
    for (uint32_t j : graph_.neighbours(i)) {
      // i holds j's shares iff both are in U2 (j sent to i, i was forwarded them).
      if (!shared_.count(j)) continue;
      (complete_.count(j) ? r.survivors : r.dropped).push_back(j);
    }
    requests_[i] = r;
    out.emplace_back(i, std::move(r));
  }
  return out;
}

Status SecAggServer::onRevealed(uint32_t from, const std::vector<RevealedShare>& shares) {
  if (stage_ != Stage::kUnmask) return outOfStage("revealed shares", stage_);
  auto req = requests_.find(from);
  if (req == requests_.end()) {
    return Status(StatusCode::kFailedPrecondition, name(from) + " was not asked for shares");
  }
  if (revealed_.count(from)) {
    return Status(StatusCode::kFailedPrecondition, name(from) + " revealed shares twice");
  }
  std::set<std::pair<uint32_t, bool>> asked, seen;
  for (uint32_t j : req->second.survivors) asked.insert({j, true});
  for (uint32_t j : req->second.dropped) asked.insert({j, false});
  for (const RevealedShare& s : shares) {
    if (!asked.count({s.owner, s.self_mask}) || !seen.insert({s.owner, s.self_mask}).second) {
      return invalidArgument(name(from) + " revealed a share it was not asked for (of " +
                             name(s.owner) + ")");
    }
    auto share = Share::fromBytes(s.share);
    if (!share.isOk()) return invalidArgument(name(from) + ": " + share.status().message());
    if (share->x != from + 1) {
      return invalidArgument(name(from) + " revealed a share held by another client");
    }
  }
  revealed_[from] = shares;
  return Status::ok();
}

Result<std::vector<uint32_t>> SecAggServer::finish() {
  FEDFLEET_CHECK(stage_ == Stage::kUnmask);
  stage_ = Stage::kDone;
  if (complete_.empty()) {
    return Status(StatusCode::kFailedPrecondition,
                  "no client completed its masked input: nothing to sum");
  }
  if (!taken_back_.isOk()) return taken_back_;
  // Shares of each secret, by owner and kind.
  std::map<std::pair<uint32_t, bool>, std::vector<Share>> shares;
  for (const auto& [holder, list] : revealed_) {
    for (const RevealedShare& s : list) {
      shares[{s.owner, s.self_mask}].push_back(Share::fromBytes(s.share).value());
    }
  }
  auto collect = [&](uint32_t j, bool self_mask) -> Result<std::string> {
    const auto& got = shares[{j, self_mask}];
    if (got.size() < params_.threshold) {
      return Status(StatusCode::kFailedPrecondition,
                    std::to_string(got.size()) + " neighbours of " + name(j) + " revealed its " +
                        (self_mask ? "self-mask seed" : "mask key") +
                        ", fewer than the threshold " + std::to_string(params_.threshold) +
                        ": too many clients dropped");
    }
    return combineShares(got, 32);
  };
  std::vector<uint32_t> sum = std::move(sum_);
  for (uint32_t j : complete_) {
    auto seed = collect(j, true);
    if (!seed.isOk()) return seed.status();
    const crypto::Digest d = crypto::sha256(*seed);
    if (std::string(reinterpret_cast<const char*>(d.data()), d.size()) !=
        adverts_.at(j).seed_digest) {
      return corrupt("the shares of " + name(j) +
                     "'s self-mask seed do not reconstruct it (a neighbour sent a false share)");
    }
    addMask(*seed, /*pairwise=*/false, -1, 0, sum.data(), sum.size());
  }
  for (const auto& [j, list] : shared_) {
    if (complete_.count(j)) continue;
    std::vector<uint32_t> partners;  // survivors that masked with j
    for (uint32_t i : graph_.neighbours(j)) {
      if (complete_.count(i)) partners.push_back(i);
    }
    if (partners.empty()) continue;
    auto key = collect(j, false);
    if (!key.isOk()) return key.status();
    if (crypto::x25519PublicKey(*key) != adverts_.at(j).mask_key) {
      return corrupt("the shares of " + name(j) +
                     "'s mask key do not reconstruct it (a neighbour sent a false share)");
    }
    const crypto::X25519Agreement agreement(*key);
    for (uint32_t i : partners) {
      FEDFLEET_ASSIGN_OR_RETURN(std::string secret, agreement.with(adverts_.at(i).mask_key));
      // i added +PRG(s_ij) when i < j, -PRG(s_ij) when i > j: take it back.
      addMask(pairwiseMaskSeed(secret, params_.round, i, j), /*pairwise=*/true, i < j ? -1 : +1, 0,
              sum.data(), sum.size());
    }
  }
  return sum;
}

std::vector<uint32_t> SecAggServer::survivors() const {
  return std::vector<uint32_t>(complete_.begin(), complete_.end());
}

}  // namespace fedfleet::secagg
