// Quarantine: clients whose updates the norm bound (protocol step 8a) clipped or rejected in
// `after` of their rounds in a row are not sampled for the next `rounds` rounds.
//
// Each flagged update is a strike; an update that counts within the bound clears the client's
// strikes. A quarantine does not clear them, so a client that comes back and is flagged again
// is quarantined again at once. Rounds are the engine's round numbers (FedBuff: server steps).
// A run in which nothing is ever flagged holds no entries, and sampling is then exactly what it
// would be without a quarantine (protocol step 2). Deterministic, and saved with the engine
// state (engine/engine_state.h). One owner: not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "engine/participant.h"

namespace fedfleet::engine {

class Quarantine {
 public:
  // after: strikes in a row that start a quarantine; rounds: how long it lasts. Either 0: off
  // (flag() never quarantines).
  Quarantine(uint32_t after, uint32_t rounds) : after_(after), rounds_(rounds) {}

  // The norm bound clipped or rejected `client`'s update of round `round`. When that starts
  // (or renews) a quarantine: the first round it may be sampled in again (round + rounds + 1).
  std::optional<uint32_t> flag(const ClientId& client, uint32_t round);
  // `client`'s update counted within the bound: its strikes are cleared.
  void clear(const ClientId& client);
  // Whether `client` may not be sampled for round `round`.
  bool holds(const ClientId& client, uint32_t round) const;
  // Whether anyone is quarantined for round `round` (false: sampling need not ask).
  bool anyHeld(uint32_t round) const;
  uint32_t strikes(const ClientId& client) const;

  // The state as bytes ("QRN1", then per client its id, strikes and end round, in id order),
  // and back; load() refuses bytes that do not parse (kCorrupt) and then changes nothing.
  std::string save() const;
  Status load(std::string_view bytes);

 private:
  struct Entry {
    uint32_t strikes = 0;
    uint32_t until = 0;  // first round it may be sampled in again (0: never quarantined)
  };
  uint32_t after_;
  uint32_t rounds_;
  std::map<ClientId, Entry> entries_;  // clients with strikes or a quarantine
  uint32_t last_until_ = 0;            // the latest end of any quarantine
};

}  // namespace fedfleet::engine
