// EventBudget: the per-client cap on event rows in a round (limits.events_per_client_round).
// A client that keeps provoking events (bad chunks, stale tokens) cannot grow the history
// without bound: its rows past the cap are counted instead of written, and at the end of the
// round (or server step) one "events_left_out" row per such client says how many. Rows that
// name no client are never capped. One owner: not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/history/records.h"
#include "engine/participant.h"

namespace fedfleet::engine {

class EventBudget {
 public:
  // cap 0: no cap.
  explicit EventBudget(uint32_t cap) : cap_(cap) {}

  // Whether a row of `client` ("": none) is written; false when it is past the cap (counted).
  bool admit(const ClientId& client);

  // One "events_left_out" row per client past the cap in round `round`, in client id order;
  // the counts start again from zero.
  std::vector<history::EventRecord> closeRound(int64_t run_id, uint32_t round, double now);

 private:
  uint32_t cap_;
  std::map<ClientId, uint32_t> counts_;  // event rows per client, this round
};

}  // namespace fedfleet::engine
