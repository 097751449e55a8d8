// The messages of SecAgg+'s four stages as plain structs, and the bound on a client's
// neighbours that bounds them. The wire layer carries them (common/wire/messages.h); the
// protocol (common/secagg/) builds and reads them. They are defined here, below both, so that
// the wire format does not depend on the protocol's code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fedfleet::secagg {

// The most neighbours a client may have (and so the most entries of a secure-aggregation
// message): bounds what a peer can make the other side allocate.
inline constexpr uint32_t kMaxNeighbours = 65535;

// Stage 1, client to coordinator, forwarded to the client's neighbours.
struct KeyAdvert {
  uint32_t index = 0;
  std::string encryption_key;  // X25519 public key for sealing shares (32 bytes)
  std::string mask_key;        // X25519 public key for pairwise masks (32 bytes)
  std::string seed_digest;     // SHA-256 of the self-mask seed, to check its reconstruction
};

// Stage 2, client to coordinator, forwarded to `to`: the sender's shares of its self-mask seed
// and mask private key for `to`, sealed with AES-256-GCM under a key only the two share.
inline constexpr size_t kSealedSharesBytes = 8 + 2 * 44 + 16;  // ids, two shares, GCM tag
struct SealedShares {
  uint32_t from = 0;
  uint32_t to = 0;
  std::string sealed;
};

// Stage 4, coordinator to a surviving client: whose shares it must reveal. `survivors`: the
// neighbours whose masked input is in the sum (their self-mask seed share); `dropped`: those
// that shared keys but sent no complete masked input (their mask-key share).
struct UnmaskRequest {
  std::vector<uint32_t> survivors;
  std::vector<uint32_t> dropped;
};

// Stage 4, client to coordinator.
struct RevealedShare {
  uint32_t owner = 0;      // whose secret this is a share of
  bool self_mask = false;  // the self-mask seed's share (else the mask key's)
  std::string share;       // Share::toBytes()
};

}  // namespace fedfleet::secagg
