// Fleet: the device, network and availability profile of every virtual client.
//
// A fleet of a million clients holds no per-client arrays: a client's profile is computed on
// demand from (seed, client index) by hashing. Built-in fleets:
//   "uniform"     every client is the reference device (speed 1, 20/50 Mbit/s up/down, 20 ms).
//   "mobile-mix"  four tiers of phones and embedded boards, in the spirit of FedScale's device
//                 (AI Benchmark) and network (MobiPerf) traces: compute speed spans 40x and
//                 uplink bandwidth 40x between the fastest and slowest tier, with a log-normal
//                 spread of 30% around each tier's value.
// A CSV fleet lists tiers, one per row, with these columns (header required, any order; extra
// columns are an error so that typos are caught):
//   name         tier name (text)
//   share        relative share of the clients in this tier (> 0; shares need not sum to 1)
//   device       cpu or gpu
//   speed        compute speed as a multiple of the reference device (> 0)
//   memory_mib   device memory (> 0)
//   up_mbps      uplink bandwidth, Mbit/s (> 0)
//   down_mbps    downlink bandwidth, Mbit/s (> 0)
//   latency_ms   one-way latency, ms (>= 0)
//   spread       optional: sigma of the log-normal jitter of speed and bandwidth (default 0)
//   online_hours optional: hours online per day for "diurnal" availability (default 24)
//   dropout      optional: per-round probability that a sampled client drops out (default 0)
// The reference device's speed in samples per second is the caller's (see sim/model_cost.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/status.h"

namespace fedfleet::sim {

struct Tier {
  std::string name;
  double share = 1;
  bool gpu = false;
  double speed = 1;  // x reference device
  double memory_mib = 4096;
  double up_mbps = 20;
  double down_mbps = 50;
  double latency_ms = 20;
  double spread = 0;
  double online_hours = 24;
  double dropout = 0;
};

struct ClientProfile {
  uint32_t tier = 0;
  bool gpu = false;
  double speed = 1;         // x reference device
  double memory_mib = 0;
  double up_bytes_per_s = 0;
  double down_bytes_per_s = 0;
  double latency_s = 0;
  double online_hours = 24;  // per day, for diurnal availability
  double phase_s = 0;        // where in the day its online window starts
  double dropout = 0;        // per-round probability of dropping out of a task
};

struct AvailabilityOptions {
  config::Choice<config::AvailabilityMode> mode = "always";  // always, diurnal
  double online_hours = 0;      // > 0: overrides every tier's online_hours
  double dropout = -1;          // >= 0: overrides every tier's dropout
};

class Fleet {
 public:
  // name: "uniform", "mobile-mix", or a path to a CSV file (see above). Errors: unknown name
  // (kInvalidArgument listing the built-ins), unreadable file (kNotFound / kIoError), a bad
  // CSV (kInvalidArgument naming file, line and column).
  static Result<Fleet> create(const std::string& name, uint64_t clients, uint64_t seed,
                              const AvailabilityOptions& availability);
  // From tiers directly (tests).
  static Result<Fleet> fromTiers(std::vector<Tier> tiers, uint64_t clients, uint64_t seed,
                                 const AvailabilityOptions& availability);

  uint64_t size() const { return clients_; }
  const std::vector<Tier>& tiers() const { return tiers_; }
  const std::string& name() const { return name_; }

  // Deterministic in (seed, index); O(number of tiers). Precondition: index < size().
  ClientProfile profile(uint64_t index) const;

  // Whether the client is online at virtual time t (seconds from the run's start).
  bool online(const ClientProfile& p, double t) const;
  // When the client's current online window ends (infinity when always online). Precondition:
  // online(p, t).
  double onlineUntil(const ClientProfile& p, double t) const;
  // When the client is next online at or after t.
  double nextOnline(const ClientProfile& p, double t) const;
  // Whether the client drops out of the task it got in `round` (a pure function of seed, round
  // and client), and if so, at which fraction of its work.
  bool dropsOut(const ClientProfile& p, uint64_t index, uint32_t round, double* at_fraction) const;

 private:
  std::string name_;
  std::vector<Tier> tiers_;
  std::vector<double> cumulative_;  // cumulative shares, normalised to 1
  uint64_t clients_ = 0;
  uint64_t seed_ = 0;
  AvailabilityOptions availability_;
};

// The built-in tier tables.
std::vector<Tier> uniformTiers();
std::vector<Tier> mobileMixTiers();

}  // namespace fedfleet::sim
