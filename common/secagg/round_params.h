// What the coordinator and every client of a SecAgg+ round agree on before it starts, and the
// key derivations both sides share. The messages of its four stages are plain structs of the
// wire layer (common/wire/secagg_messages.h), which carries them. The protocol itself:
// secagg_server.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/wire/secagg_messages.h"  // kMaxNeighbours and the stage messages

namespace fedfleet::secagg {

struct RoundParams {
  uint64_t round = 0;       // bound into every derived key, nonce and ciphertext
  uint32_t clients = 0;     // n: the round's cohort, indices 0 .. n - 1 in dispatch order
  uint32_t neighbours = 0;  // k: the graph's degree (k >= n - 1: every pair, plain SecAgg)
  uint32_t threshold = 0;   // t: shares (of the k + 1 held) that reconstruct a client's secrets
  uint64_t length = 0;      // values in each masked vector
  uint64_t graph_seed = 0;  // the random relabelling of the neighbour graph
};

// The degree the graph actually has: min(k, n - 1).
uint32_t effectiveDegree(const RoundParams& params);
// kInvalidArgument, with the reason, when the round cannot run safely: no clients, no values,
// a degree the graph cannot have, or a threshold outside ((k + 1) / 2, k + 1] (at or below
// (k + 1) / 2 the coordinator could gather both kinds of share of one client and unmask it).
Status validateRoundParams(const RoundParams& params);


// ---- Key derivations both sides compute ----------------------------------------------------

// The 32-byte seed of the pairwise mask of clients i and j from their X25519 secret.
std::string pairwiseMaskSeed(std::string_view shared_secret, uint64_t round, uint32_t i,
                             uint32_t j);
// The AES-256-GCM key for shares between clients i and j, and the nonce of the message from
// `from` to `to` (distinct per direction, so one key never seals twice under one nonce).
std::string shareKey(std::string_view shared_secret, uint64_t round, uint32_t i, uint32_t j);
std::string shareNonce(uint32_t from, uint32_t to);
std::string shareAad(uint64_t round, uint32_t from, uint32_t to);

// values[0..n) += sign x the mask stream of `seed` (32 bytes) at positions offset .. offset+n,
// mod 2^32; `pairwise` selects the pairwise stream (else the self mask's). sign is +1 or -1.
void addMask(std::string_view seed, bool pairwise, int sign, uint64_t offset, uint32_t* values,
             size_t n);

}  // namespace fedfleet::secagg
