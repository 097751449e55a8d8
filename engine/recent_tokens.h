// RecentTokens: a set of task tokens that forgets the tokens of old rounds.
//
// The engine remembers the tokens of ended tasks, so that an upload arriving after its task
// ended is answered once as stale (rather than as an unknown token) and later frames of it stay
// quiet. Kept for the whole run, those sets grew by one entry (about 40 bytes) per task without
// bound (bench/memory_soak.sh). A token is now kept for the round it was added in and the next
// `keep_rounds` - 1 rounds: an upload later than that is answered as an unknown token, once per
// keep_rounds rounds at most, which is all the difference makes.
//
// advance(round) says which round the following insertions belong to and drops the tokens of
// rounds before round - keep_rounds + 1; rounds must not decrease. Plain value type: no I/O, no
// clock, one owner (the engine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_set>
#include <utility>

namespace fedfleet::engine {

class RecentTokens {
 public:
  explicit RecentTokens(uint32_t keep_rounds) : keep_rounds_(keep_rounds > 0 ? keep_rounds : 1) {}

  // Adds `token` to the current round; true when it was not in the set.
  bool insert(uint64_t token) {
    if (!tokens_.insert(token).second) return false;
    order_.emplace_back(round_, token);
    return true;
  }
  // 1 when `token` is in the set, else 0 (as std::set::count).
  size_t count(uint64_t token) const { return tokens_.count(token); }
  size_t size() const { return tokens_.size(); }

  // Later insertions belong to `round`; forgets the tokens of rounds older than the last
  // keep_rounds (round - keep_rounds and before).
  void advance(uint32_t round) {
    if (round > round_) round_ = round;
    while (!order_.empty() && order_.front().first + keep_rounds_ <= round_) {
      tokens_.erase(order_.front().second);
      order_.pop_front();
    }
  }

 private:
  const uint32_t keep_rounds_;
  uint32_t round_ = 0;
  std::unordered_set<uint64_t> tokens_;
  std::deque<std::pair<uint32_t, uint64_t>> order_;  // (round, token) in insertion order
};

}  // namespace fedfleet::engine
