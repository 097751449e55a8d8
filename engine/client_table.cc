#include "engine/client_table.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "common/check.h"

namespace fedfleet::engine {

namespace {

size_t lowBit(size_t i) { return i & (~i + 1); }

}  // namespace

ClientTable::ClientTable() {
  strings_.emplace_back();
  string_uses_.push_back(0);
  counts_.push_back(0);  // the Fenwick tree is 1-based
}

size_t ClientTable::lowerBound(const ClientId& id) const {
  // Ids that arrive in order (a simulator's fleet) go at the end: checked first.
  if (order_.empty() || ids_[order_.back()] < id) return order_.size();
  auto it = std::lower_bound(order_.begin(), order_.end(), id,
                             [this](uint32_t slot, const ClientId& v) { return ids_[slot] < v; });
  return static_cast<size_t>(it - order_.begin());
}

size_t ClientTable::positionOf(const ClientId& id) const {
  const size_t p = lowerBound(id);
  return p < order_.size() && ids_[order_[p]] == id ? p : order_.size();
}

ClientState* ClientTable::find(const ClientId& id) {
  const size_t p = positionOf(id);
  return p < order_.size() ? &states_[order_[p]] : nullptr;
}

const ClientState* ClientTable::find(const ClientId& id) const {
  const size_t p = positionOf(id);
  return p < order_.size() ? &states_[order_[p]] : nullptr;
}

ClientState& ClientTable::at(const ClientId& id) {
  ClientState* c = find(id);
  FEDFLEET_CHECK(c != nullptr);
  return *c;
}

const ClientState& ClientTable::at(const ClientId& id) const {
  const ClientState* c = find(id);
  FEDFLEET_CHECK(c != nullptr);
  return *c;
}

ClientState& ClientTable::add(const ClientId& id, const ClientState& state,
                              const wire::Hello& hello) {
  FEDFLEET_CHECK(ids_.size() < std::numeric_limits<uint32_t>::max());
  const size_t p = lowerBound(id);
  FEDFLEET_CHECK(p == order_.size() || ids_[order_[p]] != id);
  const auto slot = static_cast<uint32_t>(ids_.size());
  ids_.push_back(id);
  states_.push_back(state);
  states_.back().hello = ClientHello{};
  setHello(states_.back(), hello);
  // The counting tree is rebuilt when a draw next needs it: a fleet registering at once pays
  // for one rebuild.
  order_.insert(order_.begin() + static_cast<std::ptrdiff_t>(p), slot);
  idle_.insert(idle_.begin() + static_cast<std::ptrdiff_t>(p), 0);
  counts_dirty_ = true;
  return states_.back();
}

uint32_t ClientTable::acquire(const std::string& s) {
  if (s.empty()) return 0;
  auto it = string_index_.find(s);
  if (it == string_index_.end()) {
    uint32_t index = 0;
    if (free_strings_.empty()) {
      index = static_cast<uint32_t>(strings_.size());
      strings_.push_back(s);
      string_uses_.push_back(0);
    } else {
      index = free_strings_.back();
      free_strings_.pop_back();
      strings_[index] = s;
    }
    it = string_index_.emplace(s, index).first;
  }
  ++string_uses_[it->second];
  return it->second;
}

void ClientTable::release(uint32_t index) {
  if (index == 0 || --string_uses_[index] > 0) return;
  string_index_.erase(strings_[index]);
  std::string().swap(strings_[index]);
  free_strings_.push_back(index);
}

void ClientTable::setHello(ClientState& c, const wire::Hello& hello) {
  ClientHello kept;
  static_cast<wire::HelloNumbers&>(kept) = hello;
  kept.public_key = acquire(hello.public_key);  // before the old ones go: a name kept stays
  kept.device_name = acquire(hello.device_name);
  release(c.hello.public_key);
  release(c.hello.device_name);
  c.hello = kept;
}

wire::Hello ClientTable::hello(const ClientId& id, const ClientHello& kept) const {
  wire::Hello hello;
  static_cast<wire::HelloNumbers&>(hello) = kept;
  hello.client_id = id;
  hello.public_key = strings_[kept.public_key];
  hello.device_name = strings_[kept.device_name];
  return hello;
}

// ---- The idle clients ----

void ClientTable::setIdle(const ClientId& id, bool idle) {
  const size_t p = positionOf(id);
  FEDFLEET_CHECK(p < order_.size());
  if (idle_[p] == static_cast<uint8_t>(idle)) return;
  idle_[p] = idle;
  if (idle) {
    ++idle_count_;
  } else {
    --idle_count_;
  }
  if (counts_dirty_) return;
  for (size_t i = p + 1; i < counts_.size(); i += lowBit(i)) {
    counts_[i] = idle ? counts_[i] + 1 : counts_[i] - 1;
  }
}

void ClientTable::rebuildCounts() const {
  const size_t n = idle_.size();
  counts_.assign(n + 1, 0);
  for (size_t i = 1; i <= n; ++i) {
    counts_[i] += idle_[i - 1];
    const size_t up = i + lowBit(i);
    if (up <= n) counts_[up] += counts_[i];
  }
  counts_dirty_ = false;
}

const ClientId& ClientTable::idleOfRank(size_t r) const {
  if (counts_dirty_) rebuildCounts();
  const size_t n = idle_.size();
  size_t step = 1;
  while (step * 2 <= n) step *= 2;
  size_t pos = 0;  // counts_ index: the idle ones at positions < pos number fewer than r + 1
  size_t left = r + 1;
  for (; step > 0; step /= 2) {
    if (pos + step <= n && counts_[pos + step] < left) {
      pos += step;
      left -= counts_[pos];
    }
  }
  FEDFLEET_CHECK(pos < n && idle_[pos]);
  return ids_[order_[pos]];
}

void ClientTable::forEachIdle(const std::function<void(const ClientId&)>& f) const {
  for (size_t p = 0; p < order_.size(); ++p) {
    if (idle_[p]) f(ids_[order_[p]]);
  }
}

std::vector<ClientId> ClientTable::sample(size_t k,
                                          const std::function<bool(const ClientId&)>& eligible,
                                          std::mt19937_64& rng) const {
  const size_t n = idle_count_;
  std::vector<ClientId> out;
  out.reserve(std::min(k, n));
  // Many idle clients: draw ranks uniformly and skip repeats and ineligible ones, which is
  // uniform sampling without replacement over the eligible clients at O(K log N). When that
  // keeps missing (few eligible), or there are few idle clients, list them all instead.
  if (n > 4 * k + 64) {
    std::uniform_int_distribution<size_t> rank(0, n - 1);
    std::unordered_set<size_t> seen;
    size_t budget = 50 * k + 1000;
    while (out.size() < k && budget-- > 0) {
      const size_t r = rank(rng);
      if (!seen.insert(r).second) continue;
      const ClientId& id = idleOfRank(r);
      if (eligible(id)) out.push_back(id);
    }
    if (out.size() == k) {
      std::sort(out.begin(), out.end());
      return out;
    }
    out.clear();
  }
  forEachIdle([&](const ClientId& id) {
    if (eligible(id)) out.push_back(id);
  });
  const size_t take = std::min(k, out.size());
  for (size_t i = 0; i < take; ++i) {  // partial Fisher-Yates
    std::uniform_int_distribution<size_t> pick(i, out.size() - 1);
    std::swap(out[i], out[pick(rng)]);
  }
  out.resize(take);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace fedfleet::engine
