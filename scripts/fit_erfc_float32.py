"""Fit the coefficients of minidist.nn.erf's float32 erfc (run to print them).

erfc(a) = t exp(-a^2 + P(t)), t = 2 / (2 + a), for 0 <= a <= 10.5 (beyond,
erfc is below float32's smallest number): P is the polynomial of degree 11
that fits log(erfc(a) / t) + a^2 by least squares at 4,001 Chebyshev nodes of
t in [2 / 12.5, 1] (near the minimax polynomial), against math.erfc. The
form is Numerical Recipes' erfcc (their degree 9 stops at 1.2e-7, two float32
ulps); degree 11 reaches about 3e-9 relative, a twentieth of an ulp, so the
float32 result is within one ulp of the exact value (tests/test_erf.py).
"""

import math

import numpy as np
from numpy.polynomial import chebyshev, polynomial

LIMIT, DEGREE = 10.5, 11


def fit():
    low = 2.0 / (2.0 + LIMIT)
    u = np.cos(np.linspace(0.0, np.pi, 4001))          # Chebyshev nodes on [-1, 1]
    t = low + (u + 1.0) * (1.0 - low) / 2.0
    a = 2.0 / t - 2.0
    target = np.array([math.log(math.erfc(v)) for v in a]) + a * a - np.log(t)
    in_u = chebyshev.cheb2poly(chebyshev.chebfit(u, target, DEGREE))
    # u = (2 t - 1 - low) / (1 - low): compose to get the coefficients in t.
    scale, shift = 2.0 / (1.0 - low), -(1.0 + low) / (1.0 - low)
    in_t = np.zeros(1)
    for coefficient in in_u[::-1]:
        in_t = polynomial.polyadd(polynomial.polymul(in_t, [shift, scale]), [coefficient])
    return in_t


def main():
    coefficients = fit()
    a = np.linspace(0.0, LIMIT, 200001)
    t = 2.0 / (2.0 + a)
    approx = t * np.exp(-a * a + polynomial.polyval(t, coefficients))
    exact = np.array([math.erfc(v) for v in a])
    print("max relative error", np.max(np.abs(approx / exact - 1.0)))
    print("_SINGLE = (" + ",\n           ".join(f"{float(c)!r}" for c in coefficients) + ")")


if __name__ == "__main__":
    main()
