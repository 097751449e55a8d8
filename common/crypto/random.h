// Unpredictable random values from OpenSSL's CSPRNG (RAND_bytes), for what a peer must not be
// able to guess: task tokens. Never seeded, never reproducible: nothing deterministic (history,
// selection, fold order) may depend on these values.
#pragma once

#include <cstdint>

namespace fedfleet::crypto {

// 64 random bits from RAND_bytes, never 0 (0 means "no task" on the wire). Aborts only if
// OpenSSL cannot produce random bytes (a broken invariant: the process must not go on handing
// out guessable tokens).
uint64_t randomToken();

}  // namespace fedfleet::crypto
