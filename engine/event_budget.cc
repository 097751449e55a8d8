#include "engine/event_budget.h"

#include <algorithm>
#include <cstdio>

namespace fedfleet::engine {
namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

bool EventBudget::take(Client& c, double now) const {
  if (!timed()) return true;
  if (c.at < 0) {
    c.level = burst_;
  } else if (now > c.at) {
    c.level = std::min(burst_, c.level + (now - c.at) / every_s_);
  }
  c.at = std::max(c.at, now);
  if (c.level < 1) return false;
  c.level -= 1;
  return true;
}

bool EventBudget::admit(const ClientId& client, double now) {
  if (client.empty() || (per_round_ == 0 && !timed())) return true;
  Client& c = clients_[client];
  const bool over_round = per_round_ > 0 && ++c.this_round > per_round_;
  // While a count is owed, the next row the budget allows is the one that reports it (at the
  // round's end): new rows are counted with it, so a storm cannot starve its own count.
  if (!over_round && c.left_out == 0 && take(c, now)) return true;
  c.by_round |= over_round;
  c.by_time |= !over_round;
  ++c.left_out;
  return false;
}

std::string EventBudget::reasons(const Client& c) const {
  std::string why;
  if (c.by_round) why = "limits.events_per_client_round = " + std::to_string(per_round_);
  if (c.by_time) {
    if (!why.empty()) why += "; ";
    why += "limits.events_burst = " + number(burst_) +
           " at once, then one every limits.events_every_s = " + number(every_s_) + " s";
  }
  return why;
}

history::EventRecord EventBudget::leftOutRow(int64_t run_id, uint32_t round, double now,
                                             const ClientId& client, Client& c) const {
  history::EventRecord e;
  e.run_id = run_id;
  e.time = now;
  e.kind = "events_left_out";
  e.client_id = client;
  e.detail = (c.since == round ? "round " + std::to_string(round)
                               : "rounds " + std::to_string(c.since) + " to " +
                                     std::to_string(round)) +
             ": " + std::to_string(c.left_out) + " more events of this client left out (" +
             reasons(c) + ")";
  c.left_out = 0;
  c.since = 0;
  c.by_round = c.by_time = false;
  return e;
}

std::vector<history::EventRecord> EventBudget::closeRun(int64_t run_id, uint32_t round,
                                                        double now) {
  std::vector<history::EventRecord> rows;
  for (auto& [client, c] : clients_) {
    if (c.left_out == 0) continue;
    if (c.since == 0) c.since = round;
    rows.push_back(leftOutRow(run_id, round, now, client, c));
  }
  clients_.clear();
  return rows;
}

std::vector<history::EventRecord> EventBudget::closeRound(int64_t run_id, uint32_t round,
                                                          double now) {
  std::vector<history::EventRecord> rows;
  for (auto it = clients_.begin(); it != clients_.end();) {
    Client& c = it->second;
    c.this_round = 0;
    if (c.left_out > 0 && c.since == 0) c.since = round;
    if (c.left_out > 0 && take(c, now)) rows.push_back(leftOutRow(run_id, round, now, it->first, c));
    // A budget that is full again at `now` is the one a newcomer gets: nothing to keep.
    const bool full = !timed() || c.at < 0 || c.level + std::max(0.0, now - c.at) / every_s_ >= burst_;
    if (c.left_out == 0 && full) {
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
  return rows;
}

}  // namespace fedfleet::engine
