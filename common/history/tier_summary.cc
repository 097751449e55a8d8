#include "common/history/tier_summary.h"

#include <map>
#include <set>
#include <unordered_map>

namespace fedfleet::history {

std::vector<TierSummary> summarizeTiers(const std::vector<UpdateRecord>& updates,
                                        const std::vector<ClientRecord>& clients) {
  std::unordered_map<std::string, const ClientRecord*> by_id;
  for (const auto& c : clients) by_id[c.client_id] = &c;
  struct Acc {
    TierSummary row;
    std::set<std::string> clients;
    std::set<std::string> kinds;
    double completed_s = 0;
  };
  std::map<std::string, Acc> tiers;
  for (const auto& u : updates) {
    auto it = by_id.find(u.client_id);
    const ClientRecord* c = it == by_id.end() ? nullptr : it->second;
    std::string tier = "-";
    if (c) tier = !c->device_name.empty() ? c->device_name : c->device_kind;
    if (tier.empty()) tier = "-";
    Acc& acc = tiers[tier];
    acc.row.tier = tier;
    acc.clients.insert(u.client_id);
    if (c && !c->device_kind.empty()) acc.kinds.insert(c->device_kind);
    ++acc.row.updates;
    if (u.status == "completed") {
      ++acc.row.completed;
      acc.completed_s += u.end_time - u.start_time;
    } else if (u.status == "late") {
      ++acc.row.late;
    } else if (u.status == "dropped") {
      ++acc.row.dropped;
    } else if (u.status == "rejected") {
      ++acc.row.rejected;
    }
  }
  std::vector<TierSummary> out;
  out.reserve(tiers.size());
  for (auto& [name, acc] : tiers) {
    TierSummary row = std::move(acc.row);
    row.clients = acc.clients.size();
    if (acc.kinds.size() == 1) {
      row.device_kind = *acc.kinds.begin();
    } else if (acc.kinds.size() > 1) {
      row.device_kind = "mixed";
    }
    if (row.completed > 0)
      row.mean_completed_s = acc.completed_s / static_cast<double>(row.completed);
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace fedfleet::history
