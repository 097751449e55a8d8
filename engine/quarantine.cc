#include "engine/quarantine.h"

#include <algorithm>
#include <cstring>

namespace fedfleet::engine {
namespace {

constexpr std::string_view kMagic = "QRN1";

bool getU32(std::string_view& in, uint32_t* v) {
  if (in.size() < 4) return false;
  std::memcpy(v, in.data(), 4);
  in.remove_prefix(4);
  return true;
}

void putU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

}  // namespace

std::optional<uint32_t> Quarantine::flag(const ClientId& client, uint32_t round) {
  Entry& e = entries_[client];
  ++e.strikes;
  if (after_ == 0 || rounds_ == 0 || e.strikes < after_) return std::nullopt;
  e.until = round + rounds_ + 1;
  last_until_ = std::max(last_until_, e.until);
  return e.until;
}

void Quarantine::clear(const ClientId& client) {
  auto it = entries_.find(client);
  if (it == entries_.end()) return;
  it->second.strikes = 0;
  if (it->second.until == 0) entries_.erase(it);
}

bool Quarantine::holds(const ClientId& client, uint32_t round) const {
  if (round >= last_until_) return false;
  auto it = entries_.find(client);
  return it != entries_.end() && round < it->second.until;
}

bool Quarantine::anyHeld(uint32_t round) const { return round < last_until_; }

uint32_t Quarantine::strikes(const ClientId& client) const {
  auto it = entries_.find(client);
  return it == entries_.end() ? 0 : it->second.strikes;
}

std::string Quarantine::save() const {
  std::string out(kMagic);
  putU32(out, static_cast<uint32_t>(entries_.size()));
  for (const auto& [id, e] : entries_) {
    putU32(out, static_cast<uint32_t>(id.size()));
    out.append(id);
    putU32(out, e.strikes);
    putU32(out, e.until);
  }
  return out;
}

Status Quarantine::load(std::string_view in) {
  if (in.substr(0, kMagic.size()) != kMagic) {
    return corrupt("engine state: not a quarantine section");
  }
  in.remove_prefix(kMagic.size());
  uint32_t n = 0;
  if (!getU32(in, &n)) return corrupt("engine state: truncated quarantine section");
  std::map<ClientId, Entry> entries;
  uint32_t last = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t len = 0;
    if (!getU32(in, &len) || len == 0 || len > 128 || in.size() < len) {
      return corrupt("engine state: bad client id in the quarantine section");
    }
    ClientId id(in.substr(0, len));
    in.remove_prefix(len);
    Entry e;
    if (!getU32(in, &e.strikes) || !getU32(in, &e.until)) {
      return corrupt("engine state: truncated quarantine section");
    }
    last = std::max(last, e.until);
    entries[std::move(id)] = e;
  }
  if (!in.empty()) return corrupt("engine state: trailing bytes after the quarantine section");
  entries_ = std::move(entries);
  last_until_ = last;
  return Status::ok();
}

}  // namespace fedfleet::engine
