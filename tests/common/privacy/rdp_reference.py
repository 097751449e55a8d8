#!/usr/bin/python3
"""Independent reference for common/privacy/rdp_accountant: the RDP of the sampled Gaussian
mechanism and its (epsilon, delta) conversions at 30 significant digits with mpmath.

Integer orders: the binomial sum of A_alpha term by term in exact-enough arithmetic; fractional
orders: the defining integral E_{z ~ N(0, sigma^2)}[((1 - q) + q exp((2z - 1) / (2 sigma^2)))^alpha]
by mpmath's quadrature (a different method from the C++ trapezoid rule).

Usage: rdp_reference.py STEPS[,STEPS...] DELTA "q,sigma" ... -- ORDER ...
Prints, for each (q, sigma): one line "rdp q sigma alpha value" per order, then for each STEPS
"eps q sigma steps delta classic|tight epsilon order".
"""
import sys

import mpmath as mp

mp.mp.dps = 30


def log_a(q, sigma, alpha):
    q, sigma, alpha = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)
    if alpha == mp.floor(alpha):
        n = int(alpha)
        total = mp.fsum(
            mp.binomial(n, k) * (1 - q) ** (n - k) * q ** k * mp.e ** ((k * k - k) / (2 * sigma ** 2))
            for k in range(n + 1))
        return mp.log(total)

    def integrand(z):
        density = mp.e ** (-z * z / (2 * sigma ** 2)) / (sigma * mp.sqrt(2 * mp.pi))
        return density * ((1 - q) + q * mp.e ** ((2 * z - 1) / (2 * sigma ** 2))) ** alpha

    return mp.log(mp.quad(integrand, [-mp.inf, -1, 0, 1, alpha, mp.inf]))


def rdp(q, sigma, alpha):
    if q == 0:
        return mp.mpf(0)
    if q == 1:
        return mp.mpf(alpha) / (2 * mp.mpf(sigma) ** 2)
    return log_a(q, sigma, alpha) / (mp.mpf(alpha) - 1)


def main(argv):
    split = argv.index("--")
    step_counts, delta = [int(s) for s in argv[0].split(",")], mp.mpf(argv[1])
    pairs = [tuple(float(v) for v in p.split(",")) for p in argv[2:split]]
    orders = [float(a) for a in argv[split + 1:]]
    for q, sigma in pairs:
        values = []
        for a in orders:
            r = rdp(q, sigma, a)
            values.append(r)
            print("rdp", q, sigma, a, mp.nstr(r, 20))
        for steps, name in ((s, n) for s in step_counts for n in ("classic", "tight")):
            best = None
            for a, r in zip(orders, values):
                a = mp.mpf(a)
                total = steps * r
                if name == "classic":
                    eps = total + mp.log(1 / delta) / (a - 1)
                else:
                    eps = total + mp.log((a - 1) / a) - (mp.log(delta) + mp.log(a)) / (a - 1)
                if best is None or eps < best[0]:
                    best = (eps, a)
            print("eps", q, sigma, steps, mp.nstr(delta, 10), name, mp.nstr(best[0], 20),
                  mp.nstr(best[1], 10))


if __name__ == "__main__":
    main(sys.argv[1:])
