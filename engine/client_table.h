// ClientTable: every client the engine knows, by id, in id order, and the idle ones among them
// (connected, without a task) with the uniform draw of a round's clients (protocol step 2).
//
// Its size is what a fleet costs: a simulator registers every virtual client, ten million of
// them in one process. So a client's row is small and lives in arrays rather than in tree
// nodes: its id, its state (ClientState, its Hello without the strings, which are interned),
// its slot in the id order (4 bytes) and its idle mark (1 byte), about 150 bytes a client.
// Lookup is a binary search over the id order; ids that arrive in increasing order (a
// simulator's) are appended in O(1), others are inserted in O(n) (a memmove of 4-byte slots).
// The draw is over ranks in the id order, so it does not depend on arrival order, and costs
// O(K log N) when many are idle: a counting (Fenwick) tree over the id order gives the r-th
// idle client. One owner: not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/wire/messages.h"
#include "engine/participant.h"

namespace fedfleet::engine {

// What the engine keeps of a client's Hello: its numbers, and its strings as indices into the
// table's interned strings (ClientTable::hello gives the Hello back).
struct ClientHello : wire::HelloNumbers {
  uint32_t public_key = 0;   // interned (ClientTable)
  uint32_t device_name = 0;  // interned (ClientTable)
};

struct ClientState {
  ClientHello hello;
  int32_t partition = -1;
  bool connected = false;
  bool sent_task = false;    // this engine has sent it a task
  bool sent_frames = false;  // a frame of one of this engine's tasks has come from it
  double last_seen = 0;
  uint64_t task_token = 0;        // 0: idle
  double uplink_bytes_per_s = 0;  // measured from its last completed upload (0: unknown)
  double steps_per_s = 0;    // local steps per compute second, last completed task (0: unknown)
  double overhead_s = -1;    // its task duration less compute (download, upload; -1: unknown)
  uint64_t dp_releases = 0;  // local DP: its updates the coordinator received, this process
};

class ClientTable {
 public:
  ClientTable();

  // The client `id`, or nullptr when it is not known.
  ClientState* find(const ClientId& id);
  const ClientState* find(const ClientId& id) const;
  // The client `id`, which must be known.
  ClientState& at(const ClientId& id);
  const ClientState& at(const ClientId& id) const;
  bool contains(const ClientId& id) const { return find(id) != nullptr; }
  size_t size() const { return ids_.size(); }

  // Adds `id` (not known yet) with `state` and what `hello` says, not idle.
  ClientState& add(const ClientId& id, const ClientState& state, const wire::Hello& hello);
  // `c` (a client of this table) said `hello`: its kept Hello becomes that one. Strings no
  // client names any more are let go, so a client that greets again and again with new strings
  // costs nothing that stays.
  void setHello(ClientState& c, const wire::Hello& hello);
  // The Hello kept in `c`, with `id` as its client id.
  wire::Hello hello(const ClientId& id, const ClientHello& kept) const;
  // Distinct non-empty strings the kept Hellos name.
  size_t internedStrings() const { return string_index_.size(); }

  // Every client, in id order: f(id, state).
  template <class F>
  void forEach(F&& f) {
    for (uint32_t slot : order_) f(ids_[slot], states_[slot]);
  }
  template <class F>
  void forEach(F&& f) const {
    for (uint32_t slot : order_) f(ids_[slot], static_cast<const ClientState&>(states_[slot]));
  }

  // ---- The idle clients ----
  // `id` (known) is idle or no longer.
  void setIdle(const ClientId& id, bool idle);
  size_t idleCount() const { return idle_count_; }
  // Every idle client, in id order: f(id).
  void forEachIdle(const std::function<void(const ClientId&)>& f) const;
  // Up to k of the idle clients for which `eligible` holds, uniformly without replacement,
  // drawn with `rng`; sorted by id. Fewer (all of them) when fewer are eligible. Many idle
  // clients: ranks are drawn and repeats and ineligible ones skipped; when that keeps missing
  // (few eligible), or few are idle, the eligible ones are listed and a partial Fisher-Yates
  // picks k.
  std::vector<ClientId> sample(size_t k, const std::function<bool(const ClientId&)>& eligible,
                               std::mt19937_64& rng) const;

 private:
  // Where `id` is or would go in the id order.
  size_t lowerBound(const ClientId& id) const;
  // Its position in the id order, or size() when not known.
  size_t positionOf(const ClientId& id) const;
  // The index of `s` among the interned strings, counted once more (0: "", never counted).
  uint32_t acquire(const std::string& s);
  void release(uint32_t index);
  // The idle client of rank r (0-based) in the id order; r < idleCount().
  const ClientId& idleOfRank(size_t r) const;
  // The counting tree, rebuilt from idle_ (O(n)) after insertions.
  void rebuildCounts() const;

  std::deque<ClientId> ids_;        // by slot (the order of arrival)
  std::deque<ClientState> states_;  // by slot
  std::vector<uint32_t> order_;     // slots in id order
  std::vector<uint8_t> idle_;       // by position in the id order: 1 idle
  size_t idle_count_ = 0;
  // Fenwick tree over idle_ (1-based); stale (counts_dirty_) after an insertion until the
  // next draw needs it.
  mutable std::vector<uint32_t> counts_;
  mutable bool counts_dirty_ = false;
  std::vector<std::string> strings_;                        // interned Hello strings; 0 is ""
  std::vector<uint32_t> string_uses_;                       // how many kept Hello fields name each
  std::vector<uint32_t> free_strings_;                      // indices let go, to be used again
  std::unordered_map<std::string, uint32_t> string_index_;  // non-empty strings only
};

}  // namespace fedfleet::engine
