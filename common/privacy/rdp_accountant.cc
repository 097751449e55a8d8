#include "common/privacy/rdp_accountant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

namespace fedfleet::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMaxQuadraturePoints = 1e6;

// log(exp(a) + exp(b)), exact for -infinity terms.
double logAddExp(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const double hi = std::max(a, b), lo = std::min(a, b);
  return hi + std::log1p(std::exp(lo - hi));
}

// log A_alpha for an integer alpha >= 2. The binomial weights sum to 1, so
//   A_alpha - 1 = sum_{k=2..alpha} C(alpha, k) (1 - q)^(alpha - k) q^k (e^((k^2 - k) / (2 sigma^2))
//   - 1),
// a sum of positive terms, added in log space; log A_alpha = log(1 + (A_alpha - 1)) then keeps
// full relative precision even where A_alpha - 1 is far below the rounding of 1 (small q).
double logAInteger(double q, double sigma, int64_t alpha) {
  const double log_q = std::log(q), log_1mq = std::log1p(-q);
  const double two_s2 = 2 * sigma * sigma;
  const double a = static_cast<double>(alpha);
  double excess = -kInf;  // log(A_alpha - 1)
  for (int64_t k = 2; k <= alpha; ++k) {
    const double kd = static_cast<double>(k);
    const double log_binom = std::lgamma(a + 1) - std::lgamma(kd + 1) - std::lgamma(a - kd + 1);
    const double x = (kd * kd - kd) / two_s2;  // > 0
    const double log_expm1 = x > 30 ? x + std::log1p(-std::exp(-x)) : std::log(std::expm1(x));
    excess = logAddExp(excess, log_binom + (a - kd) * log_1mq + kd * log_q + log_expm1);
  }
  return logAddExp(0.0, excess);
}

// log A_alpha for any alpha > 1: the expectation over z ~ N(0, sigma^2) by the trapezoid rule.
// The log integrand is -z^2 / (2 sigma^2) + alpha log((1 - q) + q exp((2z - 1) / (2 sigma^2)))
// less log(sigma sqrt(2 pi)); it is at most quadratic with curvature 1 / sigma^2 around a peak
// between 0 and alpha, so [-(12 sigma + 1), alpha + 12 sigma + 1] holds all but e^-72 of it.
double logAByQuadrature(double q, double sigma, double alpha) {
  const double log_q = std::log(q), log_1mq = std::log1p(-q);
  const double s2 = sigma * sigma;
  const double lo = -(12 * sigma + 1), hi = alpha + 12 * sigma + 1;
  const double h = sigma / 64;
  const auto n = static_cast<int64_t>(std::ceil((hi - lo) / h));
  const double log_norm = std::log(sigma * std::sqrt(2 * std::numbers::pi));
  // Two passes: the largest term first, then the sum of exp(term - largest).
  auto logIntegrand = [&](int64_t i) {
    const double z = lo + static_cast<double>(i) * h;
    return -z * z / (2 * s2) + alpha * logAddExp(log_1mq, log_q + (2 * z - 1) / (2 * s2)) -
           log_norm;
  };
  double top = -kInf;
  for (int64_t i = 0; i <= n; ++i) top = std::max(top, logIntegrand(i));
  double sum = 0;
  for (int64_t i = 0; i <= n; ++i) {
    const double w = (i == 0 || i == n) ? 0.5 : 1.0;
    sum += w * std::exp(logIntegrand(i) - top);
  }
  return top + std::log(sum * h);
}

}  // namespace

std::vector<double> defaultOrders() {
  std::vector<double> out = {1.25, 1.5, 1.75};
  for (double a = 2; a <= 10; a += 0.5) out.push_back(a);
  for (int a = 11; a <= 64; ++a) out.push_back(a);
  for (double a : {80.0, 96.0, 128.0, 256.0}) out.push_back(a);
  return out;
}

double sampledGaussianRdp(double q, double sigma, double alpha) {
  if (q == 0) return 0;
  if (q == 1) return alpha / (2 * sigma * sigma);
  const bool integer = alpha == std::floor(alpha) && alpha <= 1e6;
  // The quadrature's grid has (alpha + 24 sigma + 2) 64 / sigma points: for a tiny sigma (a
  // noise that protects nothing) far too many. RDP does not decrease with the order, so the
  // next integer order's value bounds it from above: conservative, and as fast as a sum.
  if (!integer && (alpha + 24 * sigma + 2) * 64 / sigma > kMaxQuadraturePoints &&
      std::ceil(alpha) <= 1e6) {
    return sampledGaussianRdp(q, sigma, std::ceil(alpha));
  }
  const double log_a = integer ? logAInteger(q, sigma, static_cast<int64_t>(alpha))
                               : logAByQuadrature(q, sigma, alpha);
  if (!std::isfinite(log_a)) return kInf;
  return std::max(0.0, log_a / (alpha - 1));  // A_alpha >= 1; rounding may dip below
}

RdpAccountant::RdpAccountant(std::vector<double> orders)
    : orders_(std::move(orders)), rdp_(orders_.size(), 0.0) {
  if (orders_.empty()) bad_orders_ = invalidArgument("privacy accountant: no orders");
  for (double a : orders_) {
    if (!(std::isfinite(a) && a > 1)) {
      bad_orders_ = invalidArgument("privacy accountant: order " + std::to_string(a) +
                                    " is not a finite number above 1");
    }
  }
}

Status RdpAccountant::add(double q, double sigma, uint64_t steps) {
  FEDFLEET_RETURN_IF_ERROR(bad_orders_);
  if (!(q >= 0 && q <= 1)) {
    return invalidArgument("privacy accountant: sampling rate " + std::to_string(q) +
                           " is not in [0, 1]");
  }
  if (!(std::isfinite(sigma) && sigma > 0)) {
    return invalidArgument("privacy accountant: noise multiplier " + std::to_string(sigma) +
                           " is not a finite number above 0");
  }
  for (size_t i = 0; i < orders_.size(); ++i) {
    rdp_[i] += static_cast<double>(steps) * sampledGaussianRdp(q, sigma, orders_[i]);
  }
  return Status::ok();
}

Result<PrivacySpent> RdpAccountant::spent(double delta, Conversion conversion) const {
  FEDFLEET_RETURN_IF_ERROR(bad_orders_);
  if (!(delta > 0 && delta < 1)) {
    return invalidArgument("privacy accountant: delta " + std::to_string(delta) +
                           " is not in (0, 1)");
  }
  if (std::all_of(rdp_.begin(), rdp_.end(), [](double r) { return r == 0; })) {
    return PrivacySpent{0, orders_.front()};  // nothing spent (no round, or q = 0)
  }
  PrivacySpent best{kInf, orders_.front()};
  for (size_t i = 0; i < orders_.size(); ++i) {
    const double a = orders_[i];
    const double eps =
        conversion == Conversion::kClassic
            ? rdp_[i] + std::log(1 / delta) / (a - 1)
            : rdp_[i] + std::log((a - 1) / a) - (std::log(delta) + std::log(a)) / (a - 1);
    if (eps < best.epsilon) best = {eps, a};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

Result<PrivacySpent> epsilonOf(double q, double sigma, uint64_t steps, double delta,
                               Conversion conversion, const std::vector<double>& orders) {
  RdpAccountant acc(orders);
  FEDFLEET_RETURN_IF_ERROR(acc.add(q, sigma, steps));
  return acc.spent(delta, conversion);
}

}  // namespace fedfleet::privacy
