#include "common/secagg/round_params.h"

#include <algorithm>

#include "common/crypto/hkdf.h"
#include "common/crypto/keyed_stream.h"

namespace fedfleet::secagg {
namespace {

std::string pairInfo(uint64_t round, uint32_t i, uint32_t j) {
  const uint32_t lo = std::min(i, j), hi = std::max(i, j);
  std::string info;
  for (int b = 0; b < 8; ++b) info.push_back(static_cast<char>(round >> (8 * b)));
  for (int b = 0; b < 4; ++b) info.push_back(static_cast<char>(lo >> (8 * b)));
  for (int b = 0; b < 4; ++b) info.push_back(static_cast<char>(hi >> (8 * b)));
  return info;
}

// Stream ids of the two kinds of mask (the high word of the initial counter block).
constexpr uint64_t kSelfMaskStream = 0x5e1f;
constexpr uint64_t kPairwiseMaskStream = 0x9a12;

}  // namespace

uint32_t effectiveDegree(const RoundParams& p) {
  return p.clients == 0 ? 0 : std::min(p.neighbours, p.clients - 1);
}

Status validateRoundParams(const RoundParams& p) {
  if (p.clients < 2) {
    return invalidArgument("secure aggregation needs at least 2 clients in a round, got " +
                           std::to_string(p.clients));
  }
  if (p.length == 0) return invalidArgument("secure aggregation of an empty vector");
  const uint32_t k = effectiveDegree(p);
  if (k < 2 && p.clients > 2) return invalidArgument("secagg.neighbours must be at least 2");
  if (k > kMaxNeighbours) {
    return invalidArgument("a client may have at most " + std::to_string(kMaxNeighbours) +
                           " neighbours (secagg.neighbours, or the cohort size - 1 for every "
                           "pair), got " +
                           std::to_string(k));
  }
  if (k < p.clients - 1 && k % 2 != 0) {
    return invalidArgument(
        "secagg.neighbours must be even (or at least the cohort size - 1), "
        "got " +
        std::to_string(p.neighbours));
  }
  if (p.threshold > k + 1 || 2 * p.threshold <= k + 1) {
    return invalidArgument(
        "secagg.threshold must be in ((k+1)/2, k+1] for k = " + std::to_string(k) +
        " neighbours (each client and its neighbours hold its shares), got " +
        std::to_string(p.threshold) +
        ": at (k+1)/2 or below the coordinator could collect both kinds of share of one client");
  }
  return Status::ok();
}

std::string pairwiseMaskSeed(std::string_view secret, uint64_t round, uint32_t i, uint32_t j) {
  return crypto::hkdfSha256(secret, "fedfleet secagg v1 pairwise mask", pairInfo(round, i, j), 32);
}

std::string shareKey(std::string_view secret, uint64_t round, uint32_t i, uint32_t j) {
  return crypto::hkdfSha256(secret, "fedfleet secagg v1 share key", pairInfo(round, i, j), 32);
}

std::string shareNonce(uint32_t from, uint32_t to) {
  std::string n(12, '\0');
  for (int b = 0; b < 4; ++b) {
    n[b] = static_cast<char>(from >> (8 * b));
    n[4 + b] = static_cast<char>(to >> (8 * b));
  }
  return n;
}

std::string shareAad(uint64_t round, uint32_t from, uint32_t to) {
  std::string a = "fedfleet secagg v1 shares";
  a += pairInfo(round, from, to);
  a.push_back(from < to ? 'u' : 'd');
  return a;
}

void addMask(std::string_view seed, bool pairwise, int sign, uint64_t offset, uint32_t* values,
             size_t n) {
  // AES-CTR blocks hold 4 values: start at the block holding `offset`, skip what precedes it.
  crypto::KeyedStream stream(seed, pairwise ? kPairwiseMaskStream : kSelfMaskStream, offset / 4);
  uint32_t skip[4];
  stream.fill(skip, 4 * (offset % 4));
  uint32_t buf[2048];
  while (n > 0) {
    const size_t take = std::min(n, sizeof(buf) / sizeof(buf[0]));
    stream.fill(buf, take * sizeof(uint32_t));
    if (sign > 0) {
      for (size_t i = 0; i < take; ++i) values[i] += buf[i];
    } else {
      for (size_t i = 0; i < take; ++i) values[i] -= buf[i];
    }
    values += take;
    n -= take;
  }
}

}  // namespace fedfleet::secagg
