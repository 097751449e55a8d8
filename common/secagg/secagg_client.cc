#include "common/secagg/secagg_client.h"

#include <set>

#include "common/check.h"
#include "common/crypto/aes_gcm.h"
#include "common/crypto/sha256.h"
#include "common/crypto/x25519.h"

namespace fedfleet::secagg {
namespace {

NeighbourGraph graphOf(const RoundParams& p) {
  auto g = NeighbourGraph::build(p.clients, effectiveDegree(p), p.graph_seed);
  FEDFLEET_CHECK_MSG(g.isOk(), g.status().toString().c_str());
  return std::move(g).value();
}

std::string take(crypto::KeyedStream& s, size_t n) {
  std::string out(n, '\0');
  s.fill(out.data(), n);
  return out;
}

void putU32(std::string& s, uint32_t v) {
  for (int b = 0; b < 4; ++b) s.push_back(static_cast<char>(v >> (8 * b)));
}
uint32_t getU32(std::string_view s, size_t at) {
  uint32_t v = 0;
  for (int b = 0; b < 4; ++b)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(s[at + b])) << (8 * b);
  return v;
}

std::string digestOf(std::string_view seed) {
  const crypto::Digest d = crypto::sha256(seed);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace

SecAggClient::SecAggClient(const RoundParams& params, uint32_t index, std::string random_key,
                           std::string noise_key)
    : params_(params),
      index_(index),
      graph_(graphOf(params)),
      noise_key_(std::move(noise_key)),
      random_(random_key, 0x5ec466c1, params.round) {
  FEDFLEET_CHECK_MSG(validateRoundParams(params).isOk(), "invalid secure aggregation round");
  FEDFLEET_CHECK(index < params.clients);
  FEDFLEET_CHECK_MSG(noise_key_.size() == crypto::kStreamKeyBytes,
                     "the distributed-DP noise key is 32 bytes");
  encryption_private_ = take(random_, crypto::kX25519KeyBytes);
  encryption_public_ = crypto::x25519PublicKey(encryption_private_);
  mask_private_ = take(random_, crypto::kX25519KeyBytes);
  mask_public_ = crypto::x25519PublicKey(mask_private_);
  seed_ = take(random_, 32);
}

KeyAdvert SecAggClient::advertise() const {
  return {index_, encryption_public_, mask_public_, digestOf(seed_)};
}

Result<std::vector<SealedShares>> SecAggClient::shareKeys(const std::vector<KeyAdvert>& adverts) {
  std::map<uint32_t, KeyAdvert> got;
  for (const KeyAdvert& a : adverts) {
    if (a.index >= params_.clients || !graph_.adjacent(index_, a.index)) {
      return invalidArgument("keys of client " + std::to_string(a.index) +
                             ", not a neighbour of client " + std::to_string(index_));
    }
    if (a.seed_digest.size() != 32) return invalidArgument("a seed digest is 32 bytes");
    if (!got.emplace(a.index, a).second) {
      return invalidArgument("keys of client " + std::to_string(a.index) + " twice");
    }
  }
  if (got.size() + 1 < params_.threshold) {
    return Status(StatusCode::kFailedPrecondition,
                  std::to_string(got.size()) +
                      " neighbours advertised keys: with this client, "
                      "fewer holders than the threshold " +
                      std::to_string(params_.threshold));
  }
  // Holders: the neighbours that advertised, then this client itself (its own shares stay here).
  std::vector<uint32_t> xs;
  for (const auto& [j, a] : got) xs.push_back(j + 1);
  xs.push_back(index_ + 1);
  FEDFLEET_ASSIGN_OR_RETURN(auto seed_shares, splitSecret(seed_, params_.threshold, xs, random_));
  FEDFLEET_ASSIGN_OR_RETURN(auto key_shares,
                            splitSecret(mask_private_, params_.threshold, xs, random_));
  std::vector<SealedShares> out;
  std::map<uint32_t, std::string> pair_seeds, open_keys;
  const crypto::X25519Agreement encryption(encryption_private_), masking(mask_private_);
  size_t h = 0;
  for (const auto& [j, a] : got) {
    FEDFLEET_ASSIGN_OR_RETURN(std::string enc_secret, encryption.with(a.encryption_key));
    FEDFLEET_ASSIGN_OR_RETURN(std::string mask_secret, masking.with(a.mask_key));
    pair_seeds[j] = pairwiseMaskSeed(mask_secret, params_.round, index_, j);
    std::string plain;
    putU32(plain, index_);
    putU32(plain, j);
    plain += seed_shares[h].toBytes();
    plain += key_shares[h].toBytes();
    ++h;
    const std::string key = shareKey(enc_secret, params_.round, index_, j);
    open_keys[j] = shareKey(enc_secret, params_.round, j, index_);
    out.push_back({index_, j,
                   crypto::aesGcmSeal(key, shareNonce(index_, j),
                                      shareAad(params_.round, index_, j), plain)});
  }
  own_ = {seed_shares[h], key_shares[h]};
  adverts_ = std::move(got);
  pair_seeds_ = std::move(pair_seeds);
  open_keys_ = std::move(open_keys);
  return out;
}

Status SecAggClient::receiveShares(const std::vector<SealedShares>& sealed) {
  if (shares_received_) {
    return Status(StatusCode::kFailedPrecondition, "shares already received this round");
  }
  std::map<uint32_t, Held> held;
  for (const SealedShares& s : sealed) {
    auto a = adverts_.find(s.from);
    if (s.to != index_ || a == adverts_.end()) {
      return corrupt("shares from client " + std::to_string(s.from) + " to " +
                     std::to_string(s.to) + " cannot be for client " + std::to_string(index_));
    }
    if (held.count(s.from) || s.from == index_)
      return corrupt("shares from client " + std::to_string(s.from) + " twice");
    const std::string& key = open_keys_.at(s.from);  // every advertiser has one
    FEDFLEET_ASSIGN_OR_RETURN(
        std::string plain, crypto::aesGcmOpen(key, shareNonce(s.from, index_),
                                              shareAad(params_.round, s.from, index_), s.sealed));
    if (plain.size() != 8 + 2 * kShareBytes || getU32(plain, 0) != s.from ||
        getU32(plain, 4) != index_) {
      return corrupt("shares from client " + std::to_string(s.from) + " are not addressed right");
    }
    FEDFLEET_ASSIGN_OR_RETURN(Share seed_share,
                              Share::fromBytes(std::string_view(plain).substr(8, kShareBytes)));
    FEDFLEET_ASSIGN_OR_RETURN(Share key_share,
                              Share::fromBytes(std::string_view(plain).substr(8 + kShareBytes)));
    if (seed_share.x != index_ + 1 || key_share.x != index_ + 1) {
      return corrupt("shares from client " + std::to_string(s.from) + " are for another holder");
    }
    held[s.from] = {seed_share, key_share};
  }
  if (held.size() + 1 < params_.threshold) {
    return Status(StatusCode::kFailedPrecondition,
                  std::to_string(held.size()) +
                      " neighbours shared keys: with this client, fewer "
                      "than the threshold " +
                      std::to_string(params_.threshold) + " (too few to hide behind)");
  }
  // Mask only with the neighbours that shared: the others will not be unmasked for.
  for (auto it = pair_seeds_.begin(); it != pair_seeds_.end();) {
    it = held.count(it->first) ? std::next(it) : pair_seeds_.erase(it);
  }
  held_ = std::move(held);
  held_[index_] = own_;
  shares_received_ = true;
  return Status::ok();
}

void SecAggClient::mask(uint64_t offset, uint32_t* values, size_t n) const {
  FEDFLEET_CHECK(shares_received_);
  FEDFLEET_CHECK(offset + n <= params_.length);
  addMask(seed_, /*pairwise=*/false, +1, offset, values, n);
  for (const auto& [j, seed] : pair_seeds_) {
    addMask(seed, /*pairwise=*/true, index_ < j ? +1 : -1, offset, values, n);
  }
}

crypto::KeyedStream SecAggClient::privateStream(uint64_t id) const {
  return crypto::KeyedStream(noise_key_, 0x707269763176, id);
}

std::vector<uint32_t> SecAggClient::maskPartners() const {
  std::vector<uint32_t> out;
  for (const auto& [j, seed] : pair_seeds_) out.push_back(j);
  return out;
}

Result<std::vector<RevealedShare>> SecAggClient::unmask(const UnmaskRequest& request) {
  if (revealed_) {
    return Status(StatusCode::kFailedPrecondition,
                  "a second unmasking request in one round (refused: it could reveal both "
                  "kinds of a neighbour's secret)");
  }
  if (!shares_received_) {
    return Status(StatusCode::kFailedPrecondition, "unmasking before shares were received");
  }
  for (uint32_t j : request.dropped) {
    if (j == index_) {
      return invalidArgument("unmasking request names client " + std::to_string(j) +
                             " itself as dropped");
    }
  }
  std::set<uint32_t> named;
  for (const auto* list : {&request.survivors, &request.dropped}) {
    for (uint32_t j : *list) {
      if (!held_.count(j)) {
        return invalidArgument("unmasking request names client " + std::to_string(j) +
                               ", whose shares client " + std::to_string(index_) +
                               " does not hold");
      }
      if (!named.insert(j).second) {
        return invalidArgument("unmasking request names client " + std::to_string(j) + " twice");
      }
    }
  }
  revealed_ = true;
  std::vector<RevealedShare> out;
  for (uint32_t j : request.survivors) out.push_back({j, true, held_[j].seed_share.toBytes()});
  for (uint32_t j : request.dropped) out.push_back({j, false, held_[j].key_share.toBytes()});
  return out;
}

}  // namespace fedfleet::secagg
