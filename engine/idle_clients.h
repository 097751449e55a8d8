// IdleClients: the connected clients without a task, ordered by id with rank lookup, and the
// uniform draw of a round's clients among them (protocol step 2). The draw is over ranks in
// the id order, so it does not depend on arrival order, and costs O(K log N) when many are
// idle: a simulator with a million clients pays per round for the K it samples. One owner: not
// thread-safe.
#pragma once

#include <cstddef>
#include <ext/pb_ds/assoc_container.hpp>
#include <ext/pb_ds/tree_policy.hpp>
#include <functional>
#include <random>
#include <vector>

#include "engine/participant.h"

namespace fedfleet::engine {

class IdleClients {
 public:
  // Clients in id order, with rank lookup (find_by_order).
  using Set =
      __gnu_pbds::tree<ClientId, __gnu_pbds::null_type, std::less<ClientId>,
                       __gnu_pbds::rb_tree_tag, __gnu_pbds::tree_order_statistics_node_update>;

  // `id` is idle (connected, without a task) or no longer.
  void set(const ClientId& id, bool idle);
  void erase(const ClientId& id) { idle_.erase(id); }
  size_t size() const { return idle_.size(); }
  Set::const_iterator begin() const { return idle_.begin(); }
  Set::const_iterator end() const { return idle_.end(); }

  // Up to k of the idle clients for which `eligible` holds, uniformly without replacement,
  // drawn with `rng`; sorted by id. Fewer (all of them) when fewer are eligible. Many idle
  // clients: ranks are drawn and repeats and ineligible ones skipped; when that keeps missing
  // (few eligible), or few are idle, the eligible ones are listed and a partial Fisher-Yates
  // picks k.
  std::vector<ClientId> sample(size_t k, const std::function<bool(const ClientId&)>& eligible,
                               std::mt19937_64& rng) const;

 private:
  Set idle_;
};

}  // namespace fedfleet::engine
