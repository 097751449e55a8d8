// Local differential privacy on the client (dp.mode = "local"): before an update leaves, it is
// clipped to L2 norm C and every value gets N(0, (z C)^2) noise from a stream the coordinator
// cannot predict (a fresh CSPRNG key in a client process; a seeded one in the simulator). Each
// release is then (epsilon, delta)-DP for the client's whole data set on its own, whatever the
// coordinator does with it; the session counts the releases and logs the epsilon spent.
#pragma once

#include <cstddef>

#include "common/crypto/keyed_stream.h"
#include "common/wire/messages.h"

namespace fedfleet::client {

// delta[0 .. n) clipped to L2 norm dp.clip, then noised. Precondition: dp.on().
void applyLocalDp(const wire::LocalDpTask& dp, float* delta, size_t n, crypto::KeyedStream noise);

}  // namespace fedfleet::client
