// A client's side of a SecAgg+ round (secagg_server.h has the protocol, stage by stage). It
// holds the client's two X25519 key pairs, its self-mask seed, the shares its neighbours sent
// it and the key of its distributed-DP noise (shared with no one), and refuses what would leak
// its input: too few neighbours to hide behind, shares for a neighbour it was not given, and a
// second unmasking request (so a coordinator cannot learn both a neighbour's self-mask seed and
// its mask key). One owner; one object per round.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/secagg/neighbour_graph.h"
#include "common/secagg/round_params.h"
#include "common/secagg/shamir.h"

namespace fedfleet::secagg {

class SecAggClient {
 public:
  // Client `index` of a round with `params` (validateRoundParams accepted them); its secrets
  // come from the 32-byte `random_key` (crypto::randomStreamKey() in a real client, a seeded key
  // in the simulator). `noise_key` (32 bytes) keys privateStream alone: it must be independent
  // of `random_key`'s self-mask seed and mask key, which the coordinator may rebuild (a second
  // crypto::randomStreamKey() in a real client). Aborts on parameters validateRoundParams
  // refuses and on keys of another size.
  SecAggClient(const RoundParams& params, uint32_t index, std::string random_key,
               std::string noise_key);

  uint32_t index() const { return index_; }
  const std::vector<uint32_t>& neighbours() const { return graph_.neighbours(index_); }

  // Stage 1: the public keys to advertise.
  KeyAdvert advertise() const;
  // Stage 2: from the keys of the neighbours the coordinator heard from, one sealed message of
  // shares per such neighbour. kInvalidArgument for a key of a non-neighbour, a repeated one or
  // an unusable one; kFailedPrecondition when fewer than t - 1 neighbours advertised (with this
  // client as a holder too, its secrets could not be recovered: it drops out).
  Result<std::vector<SealedShares>> shareKeys(const std::vector<KeyAdvert>& adverts);
  // Stage 3, first half: the shares the neighbours sealed for this client. They fix the
  // neighbours it masks with. kCorrupt for a message that does not open or is not addressed
  // right; kFailedPrecondition when fewer than t - 1 neighbours' shares arrived.
  Status receiveShares(const std::vector<SealedShares>& sealed);
  // Stage 3, second half: adds this client's masks to values [offset, offset + n) of its
  // quantised input, in place (mod 2^32). Precondition: receiveShares succeeded.
  void mask(uint64_t offset, uint32_t* values, size_t n) const;
  // Stage 4: the shares the coordinator asks for. kFailedPrecondition on a second request;
  // kInvalidArgument when it names a neighbour this client holds no shares of, one both as
  // survivor and as dropped, or this client as dropped. A survivor reveals its own seed share.
  Result<std::vector<RevealedShare>> unmask(const UnmaskRequest& request);

  // The neighbours it masks with (after receiveShares).
  std::vector<uint32_t> maskPartners() const;
  // A stream of this client's own secret randomness for the round, stream `id`: the noise of
  // distributed differential privacy. It is keyed by the constructor's `noise_key`, which is
  // never split into shares nor sent: the coordinator rebuilds every survivor's self-mask seed
  // at unmasking (and a dropped client's mask key), so noise drawn from either could be
  // regenerated and taken out of the sum.
  crypto::KeyedStream privateStream(uint64_t id) const;

 private:
  struct Held {
    Share seed_share;
    Share key_share;
  };

  const RoundParams params_;
  const uint32_t index_;
  const NeighbourGraph graph_;
  const std::string noise_key_;  // privateStream's key: never shared, never sent
  std::string encryption_private_, encryption_public_;
  std::string mask_private_, mask_public_;
  std::string seed_;  // self-mask seed b
  crypto::KeyedStream random_;

  std::map<uint32_t, KeyAdvert> adverts_;       // neighbours that advertised
  std::map<uint32_t, std::string> pair_seeds_;  // mask partner -> pairwise mask seed
  // Neighbour -> the key its shares for this client are sealed under, derived in shareKeys from
  // the same agreement as the key this client seals its own under (one X25519 a neighbour).
  std::map<uint32_t, std::string> open_keys_;
  std::map<uint32_t, Held> held_;  // neighbour (and this client) -> its shares held here
  Held own_;                       // this client's own shares, from shareKeys
  bool shares_received_ = false;
  bool revealed_ = false;
};

}  // namespace fedfleet::secagg
