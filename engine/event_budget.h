// EventBudget: how many event rows one client may cause, so that a client that keeps provoking
// events (bad chunks, stale tokens) cannot grow the history without bound, however fast the
// rounds are. Two limits apply to each client's rows, both in force at once:
//   per round  at most limits.events_per_client_round rows a round (or server step);
//   in time    a bucket of limits.events_burst rows that refills one row every
//              limits.events_every_s seconds of the `now` the engine is given (the simulator's
//              virtual time counts like the wall clock).
// Rows past either limit are counted instead of written. At the end of each round a client with
// rows left out gets one "events_left_out" row saying how many, when its time budget allows a
// row; otherwise the count carries over to the next round's end that allows one, and while it is
// owed the client's new rows are counted with it (so the next row its budget allows is the one
// that reports them). When the run ends, every count still owed gets its row. Rows that
// name no client are never limited. Clients whose budget is full again and owe no row are
// forgotten, so the state is bounded by the clients active in the last burst x every_s
// seconds. Reads no clock. One owner: not thread-safe.
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
  // per_round 0: no cap a round. burst 0 (or every_s 0): no budget in time.
  explicit EventBudget(uint32_t per_round, double burst = 0, double every_s = 0)
      : per_round_(per_round), burst_(burst), every_s_(every_s) {}

  // Whether a row of `client` ("": none) is written at `now` (times must not decrease); false
  // when it is past a limit (counted).
  bool admit(const ClientId& client, double now);

  // The end of round `round` at `now`: one "events_left_out" row per client with rows left out
  // whose time budget allows it (in client id order), carrying the count since its last such
  // row; the counts a round start again from zero.
  std::vector<history::EventRecord> closeRound(int64_t run_id, uint32_t round, double now);
  // The run ended at `now` after round `round`: one "events_left_out" row for every client
  // still owed one, whatever its budget (nothing counted is lost), and every budget forgotten.
  std::vector<history::EventRecord> closeRun(int64_t run_id, uint32_t round, double now);

 private:
  struct Client {
    uint32_t this_round = 0;  // rows asked for this round
    uint64_t left_out = 0;    // rows left out since the last events_left_out row
    uint32_t since = 0;       // the round of the first of them
    bool by_round = false;    // some were left out by the cap a round
    bool by_time = false;     // some by the budget in time
    double level = 0;         // rows the time budget allows now
    double at = -1;           // time of the last refill (-1: not yet)
  };
  bool timed() const { return burst_ > 0 && every_s_ > 0; }
  // Refills c's bucket to `now` and takes a row from it; false when it is empty.
  bool take(Client& c, double now) const;
  std::string reasons(const Client& c) const;
  // The row that reports c's count (then cleared).
  history::EventRecord leftOutRow(int64_t run_id, uint32_t round, double now,
                                  const ClientId& client, Client& c) const;

  uint32_t per_round_;
  double burst_;
  double every_s_;
  std::map<ClientId, Client> clients_;  // clients with rows this round, left out, or a budget
                                        // not yet full again
};

}  // namespace fedfleet::engine
