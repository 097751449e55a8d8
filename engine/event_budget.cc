#include "engine/event_budget.h"

namespace fedfleet::engine {

bool EventBudget::admit(const ClientId& client) {
  return client.empty() || cap_ == 0 || ++counts_[client] <= cap_;
}

std::vector<history::EventRecord> EventBudget::closeRound(int64_t run_id, uint32_t round,
                                                          double now) {
  std::map<ClientId, uint32_t> counts;
  counts.swap(counts_);
  std::vector<history::EventRecord> rows;
  for (const auto& [client, n] : counts) {
    if (n <= cap_) continue;
    history::EventRecord e;
    e.run_id = run_id;
    e.time = now;
    e.kind = "events_left_out";
    e.client_id = client;
    e.detail = "round " + std::to_string(round) + ": " + std::to_string(n - cap_) +
               " more events of this client left out (limits.events_per_client_round = " +
               std::to_string(cap_) + ")";
    rows.push_back(std::move(e));
  }
  return rows;
}

}  // namespace fedfleet::engine
