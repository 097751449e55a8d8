// The privacy accountant of differentially private federated averaging: Renyi differential
// privacy (RDP, Mironov 2017) of the sampled Gaussian mechanism (Mironov, Talwar and Zhang
// 2019), composed over rounds and converted to (epsilon, delta).
//
// One round samples each of N clients with probability q = K / N and adds Gaussian noise of
// standard deviation sigma * S to the sum of updates clipped to L2 norm S: the sampled Gaussian
// mechanism with noise multiplier sigma. Its RDP at order alpha > 1 is
//   eps(alpha) = log(A_alpha) / (alpha - 1),
//   A_alpha = E_{z ~ N(0, sigma^2)} [((1 - q) + q exp((2z - 1) / (2 sigma^2)))^alpha],
// which for an integer alpha is the finite sum
//   A_alpha = sum_{k=0..alpha} C(alpha, k) (1 - q)^(alpha - k) q^k exp((k^2 - k) / (2 sigma^2)),
// computed here in log space (to rounding, relative), and for a fractional alpha the integral,
// computed by the trapezoid rule on a grid of step sigma / 64 over the integrand's whole mass
// (the integrand is smooth and decays like a Gaussian, so the rule converges geometrically);
// where that grid would exceed a million points (sigma below about 1e-3), the next integer
// order's value instead, an upper bound since RDP does not decrease with the order.
// RDP composes by addition: T rounds give T eps(alpha). The conversion to (epsilon, delta):
//   classic (Mironov 2017, Proposition 3): epsilon = min_alpha T eps(alpha) + log(1/delta) / (alpha
//   - 1) tight (Balle et al. 2020, Theorem 21): epsilon = min_alpha T eps(alpha)
//       + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1),
// both valid bounds; the tight one is never the larger.
// tests/common/privacy/rdp_reference.py computes the same quantities independently with
// mpmath at 50 digits.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace fedfleet::privacy {

// The orders the accountant minimises over: 1.25 to 10 in quarter and half steps, every
// integer from 11 to 64, then 80, 96, 128, 256 (large orders matter for small epsilon).
std::vector<double> defaultOrders();

// RDP of one round of the sampled Gaussian mechanism at order `alpha` (> 1): sampling rate `q`
// in [0, 1], noise multiplier `sigma` (> 0). q = 0: 0; q = 1: alpha / (2 sigma^2), the Gaussian
// mechanism's. +infinity where the value overflows a double. Preconditions checked by the
// accountant (RdpAccountant::add); callers of this function pass valid values.
double sampledGaussianRdp(double q, double sigma, double alpha);

enum class Conversion { kClassic, kTight };

struct PrivacySpent {
  double epsilon = 0;
  double order = 0;  // the order that gave it
};

// The RDP of a run, order by order, as rounds are added.
class RdpAccountant {
 public:
  explicit RdpAccountant(std::vector<double> orders = defaultOrders());

  // `steps` rounds of sampling rate q and noise multiplier sigma. kInvalidArgument, and
  // nothing added, for q outside [0, 1], sigma not finite and > 0, or (from the constructor)
  // an order not finite and > 1.
  Status add(double q, double sigma, uint64_t steps = 1);

  // The (epsilon, delta) bound of the rounds added so far, minimised over the orders;
  // delta in (0, 1), else kInvalidArgument. epsilon 0 while nothing is spent (no round with
  // q > 0).
  Result<PrivacySpent> spent(double delta, Conversion conversion = Conversion::kTight) const;

  // The RDP of the rounds added so far at each order (orders() order).
  const std::vector<double>& rdp() const { return rdp_; }
  const std::vector<double>& orders() const { return orders_; }

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
  Status bad_orders_;
};

// epsilon after `steps` rounds of one (q, sigma): RdpAccountant over `orders`, add, spent.
Result<PrivacySpent> epsilonOf(double q, double sigma, uint64_t steps, double delta,
                               Conversion conversion = Conversion::kTight,
                               const std::vector<double>& orders = defaultOrders());

}  // namespace fedfleet::privacy
