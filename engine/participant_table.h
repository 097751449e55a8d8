// ParticipantTable: a round's participants by task token, iterated in dispatch order.
//
// Task tokens are random (common/crypto/random.h), so a container ordered by token would visit
// participants in an order that changes from run to run. Everything the engine derives from a
// walk over the participants (update rows, the fold order of the running sum, event order,
// selector feedback) must follow the order in which the tasks were sent, so that the same
// seed gives the same history. This table keeps entries in insertion order (a list) with a
// hash index by token: find, insert and erase are O(1) and never move an entry.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>

namespace fedfleet::engine {

template <typename Value>
class ParticipantTable {
 public:
  using Entry = std::pair<const uint64_t, Value>;  // (token, value), like a std::map entry
  using iterator = typename std::list<Entry>::iterator;
  using const_iterator = typename std::list<Entry>::const_iterator;

  // Appends `value` under `token` (dispatch order). A token already present is a bug of the
  // caller; the table keeps the first and returns it.
  Value& emplace(uint64_t token, Value value) {
    auto it = index_.find(token);
    if (it != index_.end()) return it->second->second;
    entries_.emplace_back(token, std::move(value));
    auto last = std::prev(entries_.end());
    index_.emplace(token, last);
    return last->second;
  }
  // The entry of `token`, or end().
  iterator find(uint64_t token) {
    auto it = index_.find(token);
    return it == index_.end() ? entries_.end() : it->second;
  }
  const_iterator find(uint64_t token) const {
    auto it = index_.find(token);
    return it == index_.end() ? entries_.cend() : const_iterator(it->second);
  }
  size_t count(uint64_t token) const { return index_.count(token); }
  // The value of `token`; the token must be present.
  Value& at(uint64_t token) { return index_.at(token)->second; }
  void erase(iterator it) {
    index_.erase(it->first);
    entries_.erase(it);
  }
  void erase(uint64_t token) {
    auto it = index_.find(token);
    if (it == index_.end()) return;
    entries_.erase(it->second);
    index_.erase(it);
  }
  void clear() {
    entries_.clear();
    index_.clear();
  }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  iterator begin() { return entries_.begin(); }
  iterator end() { return entries_.end(); }
  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }

 private:
  std::list<Entry> entries_;
  std::unordered_map<uint64_t, iterator> index_;
};

}  // namespace fedfleet::engine
