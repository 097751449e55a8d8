#include "sim/fleet.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "common/data/csv_reader.h"
#include "sim/hash.h"

namespace fedfleet::sim {
namespace {

constexpr double kDay = 86400.0;

Status validateTier(const Tier& t, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return invalidArgument(where + ": tier '" + t.name + "': " + what);
  };
  if (!(t.share > 0) || !std::isfinite(t.share)) return bad("share must be > 0");
  if (!(t.speed > 0) || !std::isfinite(t.speed)) return bad("speed must be > 0");
  if (!(t.memory_mib > 0)) return bad("memory_mib must be > 0");
  if (!(t.up_mbps > 0) || !std::isfinite(t.up_mbps)) return bad("up_mbps must be > 0");
  if (!(t.down_mbps > 0) || !std::isfinite(t.down_mbps)) return bad("down_mbps must be > 0");
  if (!(t.latency_ms >= 0) || !std::isfinite(t.latency_ms)) return bad("latency_ms must be >= 0");
  if (!(t.spread >= 0) || t.spread > 3) return bad("spread must be in [0, 3]");
  if (!(t.online_hours > 0) || t.online_hours > 24) return bad("online_hours must be in (0, 24]");
  if (!(t.dropout >= 0) || t.dropout >= 1) return bad("dropout must be in [0, 1)");
  return Status::ok();
}

Result<std::vector<Tier>> readTiersCsv(const std::string& path) {
  FEDFLEET_ASSIGN_OR_RETURN(auto rows, data::readCsvRows(path, "fleet file"));
  if (rows.empty()) return invalidArgument("fleet file '" + path + "' is empty");

  static const char* kRequired[] = {"name",       "share",   "device",    "speed",
                                    "memory_mib", "up_mbps", "down_mbps", "latency_ms"};
  static const char* kOptional[] = {"spread", "online_hours", "dropout"};
  const auto& header = rows[0];
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) {
    const std::string& h = header[i];
    bool known = std::find_if(std::begin(kRequired), std::end(kRequired),
                              [&](const char* k) { return h == k; }) != std::end(kRequired) ||
                 std::find_if(std::begin(kOptional), std::end(kOptional),
                              [&](const char* k) { return h == k; }) != std::end(kOptional);
    if (!known) {
      return invalidArgument(
          "fleet file '" + path + "': unknown column '" + h +
          "' (columns: name, share, device, speed, memory_mib, up_mbps, "
          "down_mbps, latency_ms, and optionally spread, online_hours, dropout)");
    }
    if (!col.emplace(h, i).second) {
      return invalidArgument("fleet file '" + path + "': column '" + h + "' appears twice");
    }
  }
  for (const char* k : kRequired) {
    if (!col.count(k)) {
      return invalidArgument("fleet file '" + path + "': missing column '" + k + "'");
    }
  }

  std::vector<Tier> tiers;
  for (size_t r = 1; r < rows.size(); ++r) {
    const auto& row = rows[r];
    const std::string where = "fleet file '" + path + "' line " + std::to_string(r + 1);
    if (row.size() == 1 && row[0].empty()) continue;  // blank line
    if (row.size() != header.size()) {
      return invalidArgument(where + ": " + std::to_string(row.size()) + " fields, header has " +
                             std::to_string(header.size()));
    }
    Tier t;
    t.name = row[col["name"]];
    Status st = Status::ok();
    auto number = [&](const char* key, double* out) {
      auto it = col.find(key);
      if (it == col.end() || !st.isOk()) return;
      const std::string& s = row[it->second];
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) {
        st = invalidArgument(where + ": column '" + key + "' must be a number, got '" + s + "'");
        return;
      }
      *out = v;
    };
    number("share", &t.share);
    number("speed", &t.speed);
    number("memory_mib", &t.memory_mib);
    number("up_mbps", &t.up_mbps);
    number("down_mbps", &t.down_mbps);
    number("latency_ms", &t.latency_ms);
    number("spread", &t.spread);
    number("online_hours", &t.online_hours);
    number("dropout", &t.dropout);
    FEDFLEET_RETURN_IF_ERROR(st);
    const std::string& device = row[col["device"]];
    if (device != "cpu" && device != "gpu") {
      return invalidArgument(where + ": column 'device' must be cpu or gpu, got '" + device + "'");
    }
    t.gpu = device == "gpu";
    FEDFLEET_RETURN_IF_ERROR(validateTier(t, where));
    tiers.push_back(t);
  }
  if (tiers.empty()) return invalidArgument("fleet file '" + path + "' has no tiers");
  return tiers;
}

}  // namespace

std::vector<Tier> uniformTiers() {
  Tier t;
  t.name = "reference";
  return {t};
}

std::vector<Tier> mobileMixTiers() {
  // name, share, gpu, speed, memory MiB, up, down Mbit/s, latency ms, spread, online h, dropout
  return {
      {"flagship-phone", 0.15, true, 4.0, 8192, 20, 80, 30, 0.3, 24, 0},
      {"midrange-phone", 0.35, false, 1.0, 4096, 8, 30, 50, 0.3, 24, 0},
      {"budget-phone", 0.35, false, 0.35, 2048, 2, 8, 80, 0.3, 24, 0},
      {"embedded-board", 0.15, false, 0.1, 1024, 0.5, 2, 150, 0.3, 24, 0},
  };
}

Result<Fleet> Fleet::fromTiers(std::vector<Tier> tiers, uint64_t clients, uint64_t seed,
                               const AvailabilityOptions& availability) {
  if (clients == 0) return invalidArgument("a fleet needs at least one client");
  if (tiers.empty()) return invalidArgument("a fleet needs at least one tier");
  if (availability.online_hours < 0 || availability.online_hours > 24) {
    return invalidArgument("online_hours must be in (0, 24] (0: each tier's own)");
  }
  if (availability.dropout >= 1) return invalidArgument("dropout must be in [0, 1)");
  for (const Tier& t : tiers) FEDFLEET_RETURN_IF_ERROR(validateTier(t, "fleet"));
  Fleet f;
  double total = 0;
  for (const Tier& t : tiers) total += t.share;
  double acc = 0;
  for (const Tier& t : tiers) {
    acc += t.share / total;
    f.cumulative_.push_back(acc);
  }
  f.cumulative_.back() = 1.0;
  f.tiers_ = std::move(tiers);
  f.clients_ = clients;
  f.seed_ = seed;
  f.availability_ = availability;
  return f;
}

Result<Fleet> Fleet::create(const std::string& name, uint64_t clients, uint64_t seed,
                            const AvailabilityOptions& availability) {
  std::vector<Tier> tiers;
  if (name == "uniform") {
    tiers = uniformTiers();
  } else if (name == "mobile-mix") {
    tiers = mobileMixTiers();
  } else if (name.size() > 4 && name.substr(name.size() - 4) == ".csv") {
    FEDFLEET_ASSIGN_OR_RETURN(tiers, readTiersCsv(name));
  } else {
    return invalidArgument("unknown fleet '" + name +
                           "': use uniform, mobile-mix or the path of a .csv file");
  }
  FEDFLEET_ASSIGN_OR_RETURN(Fleet f, fromTiers(std::move(tiers), clients, seed, availability));
  f.name_ = name;
  return f;
}

ClientProfile Fleet::profile(uint64_t index) const {
  const uint64_t h = mix(seed_, 0x666c656574ull, index);
  const double u = unitInterval(h);
  const uint32_t tier = static_cast<uint32_t>(
      std::upper_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin());
  const Tier& t = tiers_[std::min<size_t>(tier, tiers_.size() - 1)];
  ClientProfile p;
  p.tier = std::min<uint32_t>(tier, static_cast<uint32_t>(tiers_.size() - 1));
  p.gpu = t.gpu;
  const double z_speed = standardNormal(mix(h, 1, 0));
  const double z_up = standardNormal(mix(h, 2, 0));
  const double z_down = standardNormal(mix(h, 3, 0));
  p.speed = t.speed * std::exp(t.spread * z_speed);
  p.memory_mib = t.memory_mib;
  p.up_bytes_per_s = t.up_mbps * 1e6 / 8 * std::exp(t.spread * z_up);
  p.down_bytes_per_s = t.down_mbps * 1e6 / 8 * std::exp(t.spread * z_down);
  p.latency_s = t.latency_ms / 1000.0;
  p.online_hours = availability_.online_hours > 0 ? availability_.online_hours : t.online_hours;
  p.phase_s = unitInterval(mix(h, 4, 0)) * kDay;
  p.dropout = availability_.dropout >= 0 ? availability_.dropout : t.dropout;
  return p;
}

bool Fleet::online(const ClientProfile& p, double t) const {
  if (availability_.mode == config::AvailabilityMode::kAlways || p.online_hours >= 24) return true;
  const double in_day = std::fmod(t + kDay - p.phase_s, kDay);
  return in_day < p.online_hours * 3600.0;
}

double Fleet::onlineUntil(const ClientProfile& p, double t) const {
  if (availability_.mode == config::AvailabilityMode::kAlways || p.online_hours >= 24) {
    return std::numeric_limits<double>::infinity();
  }
  const double in_day = std::fmod(t + kDay - p.phase_s, kDay);
  return t + (p.online_hours * 3600.0 - in_day);
}

double Fleet::nextOnline(const ClientProfile& p, double t) const {
  if (online(p, t)) return t;
  const double in_day = std::fmod(t + kDay - p.phase_s, kDay);
  return t + (kDay - in_day);
}

bool Fleet::dropsOut(const ClientProfile& p, uint64_t index, uint32_t round,
                     double* at_fraction) const {
  if (p.dropout <= 0) return false;
  const uint64_t h = mix(seed_ ^ 0x64726f70ull, round, index);
  if (unitInterval(h) >= p.dropout) return false;
  if (at_fraction) *at_fraction = unitInterval(mix(h, 5, 0));
  return true;
}

}  // namespace fedfleet::sim
