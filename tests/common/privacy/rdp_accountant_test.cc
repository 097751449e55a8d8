// The RDP accountant of the sampled Gaussian mechanism against an independent computation
// (tests/common/privacy/rdp_reference.py: mpmath at 30 digits, the integer orders' binomial sum
// and the fractional orders' integral by mpmath's quadrature) over a grid of sampling rates,
// noise multipliers and round counts, and against closed forms.
#include "common/privacy/rdp_accountant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace fedfleet::privacy {
namespace {

bool haveMpmath() {
  static const bool has = std::system("/usr/bin/python3 -c 'import mpmath' >/dev/null 2>&1") == 0;
  return has;
}

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// The reference's output lines for `steps` rounds, delta, the (q, sigma) pairs and the orders.
std::vector<std::string> reference(const std::string& steps, double delta,
                                   const std::vector<std::pair<double, double>>& pairs,
                                   const std::vector<double>& orders) {
  std::string cmd = "/usr/bin/python3 " + std::string(FEDFLEET_SOURCE_DIR) +
                    "/tests/common/privacy/rdp_reference.py " + steps + " " + number(delta);
  for (const auto& [q, s] : pairs) cmd += " " + number(q) + "," + number(s);
  cmd += " --";
  for (double a : orders) cmd += " " + number(a);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
  std::vector<std::string> lines;
  if (!pipe) return lines;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), pipe.get()) != nullptr) lines.emplace_back(buf);
  return lines;
}

const std::vector<std::pair<double, double>> kGrid = [] {
  std::vector<std::pair<double, double>> g;
  for (double q : {0.001, 0.01, 0.1, 0.5, 1.0}) {
    for (double s : {0.6, 1.0, 2.0, 5.0}) g.emplace_back(q, s);
  }
  return g;
}();

TEST(RdpAccountant, EveryOrdersRdpAndEveryEpsilonMatchTheHighPrecisionReference) {
  if (!haveMpmath()) GTEST_SKIP() << "/usr/bin/python3 cannot import mpmath (python3-mpmath)";
  const std::vector<double> orders = defaultOrders();
  const double delta = 1e-5;
  int rdp_checked = 0, eps_checked = 0;
  {
    const auto lines = reference("1,100,10000", delta, kGrid, orders);
    ASSERT_FALSE(lines.empty()) << "the reference script printed nothing";
    for (const std::string& line : lines) {
      std::istringstream in(line);
      std::string kind;
      in >> kind;
      double q = 0, sigma = 0;
      in >> q >> sigma;
      SCOPED_TRACE(line);
      if (kind == "rdp") {
        double alpha = 0, want = 0;
        in >> alpha >> want;
        const double got = sampledGaussianRdp(q, sigma, alpha);
        EXPECT_NEAR(got, want, 1e-6 * want + 1e-12);
        ++rdp_checked;
      } else if (kind == "eps") {
        uint64_t s = 0;
        double d = 0, want = 0;
        std::string conversion;
        in >> s >> d >> conversion >> want;  // then the order (near-ties may differ)
        auto got =
            epsilonOf(q, sigma, s, d,
                      conversion == "classic" ? Conversion::kClassic : Conversion::kTight, orders);
        ASSERT_TRUE(got.isOk()) << got.status().toString();
        EXPECT_NEAR(got->epsilon, want, 0.01 * want) << conversion;
        ++eps_checked;
      }
    }
  }
  EXPECT_EQ(rdp_checked, static_cast<int>(kGrid.size() * orders.size()));
  EXPECT_EQ(eps_checked, static_cast<int>(3 * kGrid.size() * 2));
}

// Closed forms: no sampling (q = 1) is the Gaussian mechanism, alpha / (2 sigma^2); order 2 of
// the sampled one is log(1 + q^2 (e^(1/sigma^2) - 1)); q = 0 spends nothing.
TEST(RdpAccountant, ClosedFormsHold) {
  for (double s : {0.5, 1.0, 3.0}) {
    for (double a : {1.5, 2.0, 7.0, 64.0}) {
      EXPECT_DOUBLE_EQ(sampledGaussianRdp(1.0, s, a), a / (2 * s * s));
    }
    for (double q : {1e-4, 0.01, 0.3}) {
      const double want = std::log1p(q * q * std::expm1(1 / (s * s)));
      EXPECT_NEAR(sampledGaussianRdp(q, s, 2.0), want, 1e-12 * want + 1e-300) << q << " " << s;
    }
  }
  // The quadrature of a fractional order agrees with the exact sum at the integers around it:
  // RDP is non-decreasing in the order.
  for (double q : {0.01, 0.2}) {
    for (double a = 2; a < 12; a += 1) {
      const double mid = sampledGaussianRdp(q, 1.0, a + 0.5);
      EXPECT_LE(sampledGaussianRdp(q, 1.0, a), mid * (1 + 1e-9));
      EXPECT_LE(mid, sampledGaussianRdp(q, 1.0, a + 1) * (1 + 1e-9));
    }
  }
  RdpAccountant none;
  ASSERT_TRUE(none.add(0.0, 1.0, 1000).isOk());
  EXPECT_EQ(none.spent(1e-5)->epsilon, 0.0);
}

TEST(RdpAccountant, CompositionAddsAndMoreNoiseOrLessSamplingSpendsLess) {
  RdpAccountant a;
  ASSERT_TRUE(a.add(0.01, 1.1, 300).isOk());
  ASSERT_TRUE(a.add(0.01, 1.1, 700).isOk());
  RdpAccountant b;
  ASSERT_TRUE(b.add(0.01, 1.1, 1000).isOk());
  for (size_t i = 0; i < a.rdp().size(); ++i)
    EXPECT_NEAR(a.rdp()[i], b.rdp()[i], 1e-12 * b.rdp()[i]);
  const double base = epsilonOf(0.01, 1.1, 1000, 1e-5)->epsilon;
  EXPECT_LT(epsilonOf(0.01, 2.0, 1000, 1e-5)->epsilon, base);
  EXPECT_LT(epsilonOf(0.001, 1.1, 1000, 1e-5)->epsilon, base);
  EXPECT_GT(epsilonOf(0.01, 1.1, 2000, 1e-5)->epsilon, base);
  EXPECT_LE(epsilonOf(0.01, 1.1, 1000, 1e-5, Conversion::kTight)->epsilon,
            epsilonOf(0.01, 1.1, 1000, 1e-5, Conversion::kClassic)->epsilon);
}

// A noise multiplier too small for the quadrature's grid: a fractional order takes the next
// integer order's value (an upper bound, RDP being non-decreasing in the order), at once.
TEST(RdpAccountant, ATinyNoiseMultiplierIsBoundedByTheNextIntegerOrder) {
  for (double alpha : {1.25, 2.5, 9.75}) {
    const double tiny = sampledGaussianRdp(0.5, 1e-6, alpha);
    EXPECT_EQ(tiny, sampledGaussianRdp(0.5, 1e-6, std::ceil(alpha))) << alpha;
  }
  // Where both are computed, the fractional order's value lies below the next integer's.
  EXPECT_LT(sampledGaussianRdp(0.5, 0.8, 2.5), sampledGaussianRdp(0.5, 0.8, 3));
  auto spent = epsilonOf(0.5, 1e-6, 10, 1e-5);
  ASSERT_TRUE(spent.isOk());
  EXPECT_GT(spent->epsilon, 1e6);  // no privacy to speak of
}

TEST(RdpAccountant, BadArgumentsAreRefusedAndAddNothing) {
  RdpAccountant a;
  for (auto [q, s] : std::vector<std::pair<double, double>>{
           {-0.1, 1}, {1.5, 1}, {std::nan(""), 1}, {0.1, 0}, {0.1, -1}, {0.1, HUGE_VAL}}) {
    EXPECT_EQ(a.add(q, s).code(), StatusCode::kInvalidArgument) << q << " " << s;
  }
  for (double r : a.rdp()) EXPECT_EQ(r, 0.0);
  for (double d : {0.0, 1.0, -1e-5, std::nan("")}) {
    EXPECT_EQ(a.spent(d).status().code(), StatusCode::kInvalidArgument) << d;
  }
  RdpAccountant bad({2.0, 1.0});
  EXPECT_EQ(bad.add(0.1, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RdpAccountant(std::vector<double>{}).spent(1e-5).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedfleet::privacy
