"""The error function erf and its complement erfc, on whole arrays, to double
precision.

    erf(x)  = 2/sqrt(pi) * integral from 0 to x of exp(-t^2) dt
    erfc(x) = 1 - erf(x)

NumPy has no erf, and the exact GELU needs one (Phi(x), the normal CDF, is
(1 + erf(x / sqrt 2)) / 2). The short approximations found in textbooks
(Abramowitz and Stegun 7.1.26, Numerical Recipes' ``erfcc``) stop at 1e-7,
which a float64 gradient check sees. ``math.erf`` is exact but takes one
Python call per element. This file is W. J. Cody's algorithm (Cody,
"Rational Chebyshev approximations for the error function", Math. Comp. 23,
1969; his Fortran CALERF, which C and Fortran libraries still use), written
as array expressions so that it runs on NumPy and CuPy alike:

* |x| <= 0.46875: erf(x) = x P(x^2) / Q(x^2), degree 4 over 4;
* 0.46875 < |x| <= 4: erfc(|x|) = exp(-x^2) P(|x|) / Q(|x|), degree 8 over 8;
* |x| > 4: erfc(|x|) = exp(-x^2) / |x| (1/sqrt(pi) + z R(z) / S(z)), z = 1/x^2
  (the asymptotic series, rationalised).

Each is accurate to about 1e-16 relative (see tests/test_erf.py, which
checks against ``math.erf`` and ``math.erfc`` from -30 to 30). Two details
carry that accuracy: exp(-x^2) is computed as exp(-s^2) exp(-(x - s)(x + s))
with s = x rounded down to a sixteenth, so that the rounding error of x^2
(relative 1e-16, but absolute 1e-15 when x^2 is 10) does not reach the
exponent; and erf of a negative x is -erf(|x|), erfc(-|x|) = 2 - erfc(|x|),
so only the positive half is approximated.

Arithmetic is float64 whatever the input; a float32 (or float16) input is
widened block by block and the result rounded back once, so that it is the
float32 value nearest the true erf, as PyTorch's float32 erf is (within
3.2e-8 of math.erf from -6 to 6 as measured against torch 2.13). The same
formulas in float32 arithmetic are off by up to 7e-7 (a few roundings), and
would save little: the time goes in the number of array operations per
block (about 60), not in the bytes each one moves.

So erfc of a float32 (or float16) input, what the exact GELU computes, takes
a shorter road instead: one formula over the whole range, t exp(-x^2 + P(t))
with t = 2 / (2 + |x|) and P a polynomial of degree 11 fitted to 3e-9
relative (scripts/fit_erfc_float32.py), still in float64 arithmetic: about
35 passes and no splitting by range. Its float32 result is within one ulp of
the exact erfc (tests/test_erf.py), but not always the nearest float32.
float64 inputs, and erf of any dtype, keep Cody's algorithm.

Cost: per element about 20 multiply-adds, one division and two exponentials
(in the middle and outer ranges), and the passes that split each block by
range: some 60 elementwise passes over cache-sized blocks, far more than the
handful of the tanh form of GELU.
"""

from __future__ import annotations

import numpy

from minidist import backend

# Cody's coefficients (CALERF), lowest index first as in his Fortran.
_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
      3.20937758913846947e03, 1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
      2.84423683343917062e03)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
      2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
      2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
      1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
      3.43936767414372164e03, 1.23033935480374942e03)
_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
      1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_Q = (2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
      6.05183413124413191e-2, 2.33520497626869185e-3)
# erfc's float32 path (scripts/fit_erfc_float32.py fits them): P(t), lowest degree first.
_SINGLE = (-1.2655407943616759, 1.000822865201976, 0.364781165891119, 0.15544556444833948,
           -0.4043827003023681, 0.764176102800787, -1.7318726114756473, 1.714635978626599,
           -0.42221152412227725, -0.4608032257848518, 0.36405002977138406, -0.07910085324761887)
_SINGLE_LIMIT = 10.5  # erfc(10.5) = 5e-50: 0 in float32, as is everything beyond
_ONE_OVER_SQRT_PI = 5.6418958354775628695e-1
_THRESHOLD = 0.46875
_BLOCK = 1 << 15  # elements: 256 KiB float64 temporaries, about a core's L2 cache


def _erf_near_zero(x):
    """erf(x) for |x| <= 0.46875: x P(x^2) / Q(x^2)."""
    z = x * x
    num = _A[4] * z
    den = z + _B[0]
    for i in range(3):
        num += _A[i]
        num *= z
        if i:
            den += _B[i]
        den *= z
    num += _A[3]
    den += _B[3]
    num *= x
    num /= den
    return num


def _exp_minus_square(y):
    """exp(-y^2) without the rounding error of y^2 in the exponent."""
    xp = backend.of(y)
    y = xp.minimum(y, 40.0)  # exp(-1600) is 0 already; keeps inf - inf out
    s = xp.trunc(y * 16.0) / 16.0
    return xp.exp(-s * s) * xp.exp((s - y) * (y + s))


def _erfc_away_from_zero(y):
    """erfc(y) for y > 0.46875 (and inf, nan)."""
    xp = backend.of(y)
    scaled = xp.empty_like(y)  # erfc(y) exp(y^2)
    middle = y <= 4.0
    ym = y[middle]
    num = _C[8] * ym
    den = ym + _D[0]
    for i in range(7):
        num += _C[i]
        num *= ym
        if i:
            den += _D[i]
        den *= ym
    num += _C[7]
    den += _D[7]
    scaled[middle] = num / den
    outer = ~middle
    yo = y[outer]
    z = 1.0 / (yo * yo)
    num = _P[5] * z
    den = z + _Q[0]
    for i in range(4):
        num += _P[i]
        num *= z
        if i:
            den += _Q[i]
        den *= z
    scaled[outer] = (_ONE_OVER_SQRT_PI - z * (num + _P[4]) / (den + _Q[4])) / yo
    # exp(-y^2) underflows to 0 beyond y = 27, where erfc is below 1e-300 anyway.
    scaled *= _exp_minus_square(y)
    return scaled


def _erf_block(x, out):
    xp = backend.of(x)
    near = xp.abs(x) <= _THRESHOLD
    out[near] = _erf_near_zero(x[near])
    far = ~near
    xf = x[far]
    # 1 - erfc, for |x| > 0.46875 where erfc < 0.51: no cancellation to fear.
    out[far] = xp.copysign(1.0 - _erfc_away_from_zero(xp.abs(xf)), xf)


def _erfc_block(x, out):
    xp = backend.of(x)
    near = xp.abs(x) <= _THRESHOLD
    out[near] = 1.0 - _erf_near_zero(x[near])
    far = ~near
    xf = x[far]
    tail = _erfc_away_from_zero(xp.abs(xf))
    out[far] = xp.where(xf < 0, 2.0 - tail, tail)


def _erfc_single_block(x, out):
    """erfc to float32 accuracy, one formula for every x: with a = |x| (at
    most 10.5) and t = 2 / (2 + a), erfc(a) = t exp(-a^2 + P(t)), P of
    degree 11 (the form of Numerical Recipes' erfcc, refitted to 3e-9
    relative); erfc(-a) = 2 - erfc(a). About 35 passes and no split by range,
    against Cody's 60 and three masked ranges; in float64 arithmetic, since
    a float32 exponent -a^2 + P would carry its rounding (1e-6 at a = 4) into
    the result."""
    xp = backend.of(x)
    a = xp.abs(x)
    xp.minimum(a, _SINGLE_LIMIT, out=a)  # nan stays nan
    t = a + 2.0
    xp.divide(2.0, t, out=t)
    acc = t * _SINGLE[-1]
    for coefficient in _SINGLE[-2:0:-1]:
        acc += coefficient
        acc *= t
    acc += _SINGLE[0]
    a *= a
    acc -= a
    xp.exp(acc, out=acc)
    acc *= t
    out[...] = xp.where(x < 0, 2.0 - acc, acc)


def _blockwise(block_function, x):
    """``block_function`` over ``x`` in blocks of _BLOCK elements, each
    widened to float64 on the way in and rounded to x's float dtype (float64
    for integers) on the way out. Blocks keep the ~60 array operations on
    data that stays in the CPU's cache instead of streaming the whole array
    through memory for each. On a GPU the whole array is one block."""
    xp = backend.of(x)
    dtype = x.dtype if xp.issubdtype(x.dtype, xp.floating) else numpy.dtype(numpy.float64)
    flat = x.reshape(-1)
    out = xp.empty(flat.shape, dtype=dtype)
    step = _BLOCK if xp is numpy else max(flat.size, 1)
    for start in range(0, flat.size, step):
        block = flat[start:start + step].astype(numpy.float64)
        result = xp.empty_like(block)
        block_function(block, result)
        out[start:start + step] = result
    return out.reshape(x.shape)


def erf(x):
    """erf(x) of an array (or number): x's shape and float dtype (float64
    for integers)."""
    return _blockwise(_erf_block, backend.of(x).asarray(x))


def erfc(x):
    """erfc(x) = 1 - erf(x) of an array (or number), as :func:`erf` does;
    accurate where erfc is tiny (x large), where 1 - erf(x) is not.

    A float32 or float16 input needs float32's accuracy only, and gets the
    faster :func:`_erfc_single_block`: within one float32 ulp of the exact
    value (not always the nearest float32, as float64 inputs' results are
    the nearest float64 but for a rounding or two)."""
    x = backend.of(x).asarray(x)
    single = x.dtype in (numpy.float32, numpy.float16)
    return _blockwise(_erfc_single_block if single else _erfc_block, x)


__all__ = ["erf", "erfc"]
