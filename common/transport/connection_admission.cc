#include "common/transport/connection_admission.h"

#include <algorithm>

namespace fedfleet::transport {

const char* refusalCauseName(RefusalCause cause) {
  switch (cause) {
    case RefusalCause::kUnauthenticatedLimit:
      return "unauthenticated_limit";
    case RefusalCause::kEarlyDrop:
      return "early_drop";
    case RefusalCause::kPerHostLimit:
      return "per_host_limit";
    case RefusalCause::kDescriptorReserve:
      return "descriptor_reserve";
    case RefusalCause::kHandshakeTimeout:
      return "handshake_timeout";
    case RefusalCause::kSilentAfterHandshake:
      return "silent_after_handshake";
    case RefusalCause::kPerKeyLimit:
      return "per_key_limit";
    case RefusalCause::kSilentWithoutHello:
      return "silent_without_hello";
  }
  return "unknown";
}

ConnectionAdmission::ConnectionAdmission(const AdmissionOptions& options, uint64_t seed)
    : options_(options), rng_(seed) {
  options_.early_drop_rate = std::clamp(options_.early_drop_rate, 0.0, 1.0);
}

uint32_t ConnectionAdmission::earlyDropStart() const {
  const uint32_t full = options_.max_unauthenticated;
  const uint32_t start = options_.early_drop_start == 0 ? full / 2 : options_.early_drop_start;
  return std::min(start, full);
}

double ConnectionAdmission::dropProbability(uint64_t unauthenticated) const {
  const uint64_t full = options_.max_unauthenticated;
  if (full == 0) return 0;  // no limit
  if (unauthenticated >= full) return 1;
  const uint64_t start = earlyDropStart();
  if (unauthenticated < start) return 0;
  const double rate = options_.early_drop_rate;
  return rate + (1 - rate) * static_cast<double>(unauthenticated - start) /
                    static_cast<double>(full - start);
}

uint64_t ConnectionAdmission::reserveFor(uint64_t descriptor_limit) const {
  if (options_.descriptor_reserve > 0) return options_.descriptor_reserve;
  return std::clamp<uint64_t>(descriptor_limit / 8, 32, 4096);
}

bool ConnectionAdmission::overReserve(uint64_t open_descriptors, uint64_t descriptor_limit) const {
  if (descriptor_limit == 0) return false;
  const uint64_t reserve = reserveFor(descriptor_limit);
  return reserve >= descriptor_limit || open_descriptors >= descriptor_limit - reserve;
}

std::optional<RefusalCause> ConnectionAdmission::admit(uint64_t unauthenticated, uint64_t from_host,
                                                       uint64_t open_descriptors,
                                                       uint64_t descriptor_limit) {
  if (overReserve(open_descriptors, descriptor_limit)) return RefusalCause::kDescriptorReserve;
  if (options_.max_unauthenticated_per_host > 0 &&
      from_host >= options_.max_unauthenticated_per_host) {
    return RefusalCause::kPerHostLimit;
  }
  const double p = dropProbability(unauthenticated);
  if (p >= 1) return RefusalCause::kUnauthenticatedLimit;
  if (p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p) {
    return RefusalCause::kEarlyDrop;
  }
  return std::nullopt;
}

}  // namespace fedfleet::transport
