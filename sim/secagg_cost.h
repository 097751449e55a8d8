// What SecAgg+ costs a virtual client in compute, for the simulator's virtual clock: seconds on
// the reference device (speed 1), divided by the client's speed by the caller. The per-operation
// figures were measured on one core of the development machine (x86-64 with AES-NI, OpenSSL 3)
// by bench/secagg.sh, which prints them again wherever it runs; they are constants here so that
// the same seed gives the same history on every machine.
#pragma once

#include <cstddef>

#include "common/wire/messages.h"

namespace fedfleet::sim {

inline constexpr double kX25519KeygenS = 46e-6;     // a public key from a private key
inline constexpr double kX25519AgreeS = 92e-6;      // a shared secret
inline constexpr double kHkdfS = 9.8e-6;            // one HKDF-SHA256 derivation
inline constexpr double kSealS = 1.3e-6;            // AES-256-GCM of one pair of shares
inline constexpr double kShareS = 0.25e-6;          // Shamir: one secret's share for one holder
inline constexpr double kMaskValueS = 1.03e-9;      // one AES-CTR mask stream, per value
inline constexpr double kQuantizeValueS = 20.6e-9;  // stochastic rounding, per value

// The work before the client sends step `m` (its keys: two key pairs; its shares: two
// agreements, two derivations and a seal per neighbour, and both secrets shared).
double secAggStepSeconds(const wire::SecAgg& m);
// Opening the shares of `partners` neighbours (an agreement, a derivation and an open each).
double secAggOpenSeconds(size_t partners);
// Quantising `values` values and adding the self mask and `partners` pairwise masks.
double secAggMaskSeconds(size_t values, size_t partners);

}  // namespace fedfleet::sim
