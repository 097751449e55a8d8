// FedNova's normaliser (Wang et al., "Tackling the Objective Inconsistency Problem in
// Heterogeneous Federated Optimization", NeurIPS 2020): how much local progress tau steps of
// SGD with momentum rho make, the a_k by which the coordinator divides update k. It lives
// here, below the engine, because under secure aggregation the client applies it to its own
// update before masking (client/masked_upload.h); engine/update_weights.h says how the
// coordinator uses it.
#pragma once

#include <cstdint>

namespace fedfleet {

// a(tau, rho) for tau local steps with momentum rho in [0, 1): tau when rho == 0, else
// (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho) (the sum over the tau steps of the
// geometric weights (1 - rho^j) / (1 - rho), j = 1..tau). a(1, rho) = 1 and a(0, rho) = 0;
// a >= 1 for tau >= 1. rho outside [0, 1) or non-finite is a bug (configs and tasks are
// validated before): aborts.
double fedNovaNormaliser(uint64_t tau, double momentum);

// Whether `momentum` is one FedNova can normalise by: finite and in [0, 1).
bool fedNovaMomentumValid(double momentum);

}  // namespace fedfleet
