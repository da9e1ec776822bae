"""minidist.nn.erf against the C library's erf and erfc (Python's math module),
over the whole range where they are not 0, 1 or 2, and at the edges."""

import math

import numpy as np
import pytest

from minidist.nn.erf import erf, erfc

# Dense where the three rational approximations meet (0.46875 and 4), wide
# enough to reach erfc's underflow (x = 27) and both signs.
POINTS = np.unique(np.concatenate([
    np.linspace(-30.0, 30.0, 60001),
    np.linspace(0.46, 0.48, 2001), -np.linspace(0.46, 0.48, 2001),
    np.linspace(3.99, 4.01, 2001), -np.linspace(3.99, 4.01, 2001),
    np.geomspace(1e-300, 1e-2, 500), -np.geomspace(1e-300, 1e-2, 500),
]))


def _relative_error(values, exact):
    exact = np.asarray(exact)
    return np.abs(values - exact) / np.abs(exact)


def test_erf_agrees_with_math_erf_to_double_precision():
    exact = np.array([math.erf(v) for v in POINTS])
    nonzero = exact != 0
    assert _relative_error(erf(POINTS)[nonzero], exact[nonzero]).max() < 1e-15


def test_erfc_keeps_its_relative_accuracy_in_the_far_tail():
    # 1 - erf(x) loses every digit for x > 6; erfc keeps them down to 1e-300.
    exact = np.array([math.erfc(v) for v in POINTS])
    normal = exact > 1e-300
    assert _relative_error(erfc(POINTS)[normal], exact[normal]).max() < 2e-15
    assert erfc(np.array([28.0, 40.0, 1e10])).tolist() == [math.erfc(28.0), 0.0, 0.0] == [0.0] * 3


def test_special_values_and_odd_symmetry():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan])
    np.testing.assert_array_equal(erf(x), [0.0, -0.0, 1.0, -1.0, np.nan])
    np.testing.assert_array_equal(erfc(x), [1.0, 1.0, 0.0, 2.0, np.nan])
    assert np.signbit(erf(np.array([-0.0]))[0])
    np.testing.assert_array_equal(erf(-POINTS), -erf(POINTS))


def test_float32_is_the_correctly_rounded_float64_result():
    x = POINTS.astype(np.float32)
    exact = np.array([math.erf(float(v)) for v in x])
    result = erf(x)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, exact.astype(np.float32))
    assert erfc(x).dtype == np.float32


@pytest.mark.parametrize("value", [0.3, 2, np.float64(-5.5)])
def test_scalars_integers_and_shapes(value):
    assert erf(value).shape == ()
    assert float(erf(value)) == pytest.approx(math.erf(value), rel=1e-15)
    grid = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7 - 1.5
    np.testing.assert_allclose(erf(grid), np.vectorize(math.erf)(grid), rtol=1e-15)
    assert erf(np.array([1, 2])).dtype == np.float64


def test_arrays_larger_than_one_block_and_views():
    x = np.random.default_rng(0).standard_normal((3, 40000))[:, ::3]  # a strided view
    np.testing.assert_allclose(erf(x), np.vectorize(math.erf)(x), rtol=1e-15, atol=0)


def _ulps(values32, exact64):
    """|float32 result - exact| in units of the float32 spacing at the exact
    value (the spacing of the smallest subnormal below float32's normals)."""
    exact32 = exact64.astype(np.float32)
    spacing = np.spacing(np.abs(exact32)).astype(np.float64)
    return np.abs(values32.astype(np.float64) - exact64) / spacing


def test_float32_erfc_is_within_one_ulp_of_the_exact_value():
    # Dense over the whole float32 range of erfc (it is 0 past 10.06), every
    # float32 of [-0.01, 0.01] near 0 at a stride, and the edges.
    dense = np.linspace(-10.5, 11.0, 2_000_001)
    near_zero = np.arange(-(1 << 20), 1 << 20, 7, dtype=np.int64) * np.float32(2 ** -27)
    x = np.unique(np.concatenate([dense, near_zero, np.geomspace(1e-38, 1, 200)]).astype(np.float32))
    result = erfc(x)
    assert result.dtype == np.float32
    exact = erfc(x.astype(np.float64))  # Cody's double-precision path, against math.erfc above
    assert _ulps(result, exact).max() < 1.0
    # Most are the nearest float32: the approximation's 3e-9 moves few roundings.
    assert np.mean(result == exact.astype(np.float32)) > 0.95
    np.testing.assert_array_equal(erfc(np.array([np.inf, -np.inf, np.nan, 0.0, 10.1, 1e30], np.float32)),
                                  np.array([0.0, 2.0, np.nan, 1.0, 0.0, 0.0], np.float32))
    half = erfc(np.linspace(-4, 4, 101).astype(np.float16))
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, erfc(np.linspace(-4, 4, 101).astype(np.float16).astype(np.float64))
                                  .astype(np.float16))


def test_float64_erfc_keeps_the_exact_path():
    x = np.linspace(-6, 6, 1201)
    exact = np.array([math.erfc(v) for v in x])
    assert _relative_error(erfc(x), exact).max() < 2e-15
