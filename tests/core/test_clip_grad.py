"""minidist.nn.utils's gradient clipping against live torch on the same gradients.

The total norm is a sum over the elements, and torch's CPU kernels add them
in their own vectorised order, NumPy in pairwise order: the norms agree to a
few ulps, not to the last one (float32 rtol 2e-6, float64 rtol 1e-14, on
gradients of up to 1,200 elements; p = 0 counts and inf takes a max, so
those are exact). Given the same total norm, the clipping arithmetic is the
same as torch's (the coefficient in the norm's dtype, torch's reciprocal
times max_norm, the gradient multiplied in its own dtype), so the clipped
gradients are bit-equal to torch's: ``clip_grads_with_norm_`` is checked so.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from minidist import nn
from minidist.nn.utils import (
    clip_grad_norm_,
    clip_grad_value_,
    clip_grads_with_norm_,
    get_total_norm,
)
from minidist.tensor import Tensor

torch = pytest.importorskip("torch")

SHAPES = [(3, 4), (5,), (2, 2, 3), (40, 30)]
NORMS = [2.0, 1.0, math.inf, 3.0, 0.5, 0.0, "inf"]
RTOL = {np.float32: 2e-6, np.float64: 1e-14}


def _pair(dtype, seed, scale=3.0, shapes=SHAPES):
    """The same gradients on minidist Parameters and torch tensors."""
    rng = np.random.default_rng(seed)
    grads = [(rng.standard_normal(s) * scale).astype(dtype) for s in shapes]
    mine = [nn.Parameter(np.zeros(s, dtype)) for s in shapes]
    theirs = [torch.zeros(s, dtype=torch.from_numpy(np.zeros(1, dtype)).dtype, requires_grad=True)
              for s in shapes]
    for m, t, g in zip(mine, theirs, grads):
        m.grad, t.grad = g.copy(), torch.from_numpy(g.copy())
    return mine, theirs


def _exact(p) -> bool:
    return float(p) in (0.0, math.inf)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm_type", NORMS)
def test_clip_grad_norm_equals_torch(dtype, norm_type):
    mine, theirs = _pair(dtype, 1)
    total = clip_grad_norm_(mine, 1.0, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type)
    assert isinstance(total, Tensor) and total.data.shape == () and total.data.dtype == dtype
    rtol = 0 if _exact(norm_type) else RTOL[dtype]
    np.testing.assert_allclose(total.data, expected.numpy(), rtol=rtol, atol=0)
    for m, t in zip(mine, theirs):
        np.testing.assert_allclose(m.grad, t.grad.numpy(), rtol=2 * rtol, atol=0)
    assert total.data > 1.0 or float(norm_type) == 0   # it did clip (p = 0: counts)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3.0])
def test_the_split_halves_equal_torchs_to_the_last_bit(dtype, norm_type):
    """get_total_norm then clip_grads_with_norm_ (torch 2.6's split); given
    torch's own total norm the clipped gradients are bit-equal."""
    mine, theirs = _pair(dtype, 2)
    total = get_total_norm([m.grad for m in mine], norm_type)
    expected = torch.nn.utils.get_total_norm([t.grad for t in theirs], norm_type)
    rtol = 0 if _exact(norm_type) else RTOL[dtype]
    np.testing.assert_allclose(total.data, expected.numpy(), rtol=rtol, atol=0)
    clip_grads_with_norm_(mine, 1.5, Tensor(expected.numpy()))
    torch.nn.utils.clip_grads_with_norm_(theirs, 1.5, expected)
    for m, t in zip(mine, theirs):
        assert m.grad.dtype == dtype
        np.testing.assert_array_equal(m.grad, t.grad.numpy())


@pytest.mark.timeout(60)
def test_under_max_norm_nothing_changes_and_the_norm_is_returned():
    mine, theirs = _pair(np.float64, 3, scale=1e-3)
    before = [m.grad.copy() for m in mine]
    total = clip_grad_norm_(mine, 10.0)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 10.0)
    np.testing.assert_allclose(total.data, expected.numpy(), rtol=1e-14)
    for m, b in zip(mine, before):
        np.testing.assert_array_equal(m.grad, b)      # coefficient clamped to 1


@pytest.mark.timeout(60)
def test_a_single_tensor_a_generator_and_parameters_without_grad():
    mine, theirs = _pair(np.float64, 4)
    mine.append(nn.Parameter(np.ones(3)))                 # no gradient: skipped
    theirs.append(torch.ones(3, dtype=torch.float64, requires_grad=True))
    consumed = []

    def generator(items):
        for item in items:
            consumed.append(item)
            yield item

    total = clip_grad_norm_(generator(mine), 0.5)
    expected = torch.nn.utils.clip_grad_norm_(iter(theirs), 0.5)
    assert len(consumed) == len(mine)                     # read once, all of it
    np.testing.assert_allclose(total.data, expected.numpy(), rtol=1e-14)
    for m, t in zip(mine[:-1], theirs[:-1]):
        np.testing.assert_allclose(m.grad, t.grad.numpy(), rtol=1e-14)
    assert mine[-1].grad is None

    one, their_one = _pair(np.float32, 5, shapes=[(6,)])
    total = clip_grad_norm_(one[0], 0.1)
    expected = torch.nn.utils.clip_grad_norm_(their_one[0], 0.1)
    np.testing.assert_allclose(total.data, expected.numpy(), rtol=2e-6)
    single = get_total_norm(Tensor(np.array([3.0, 4.0])))
    assert single.data == 5.0


@pytest.mark.timeout(60)
def test_empty_inputs_as_torch():
    assert get_total_norm([]).data == np.float32(0) and get_total_norm([]).data.dtype == np.float32
    assert torch.nn.utils.get_total_norm([]).dtype == torch.float32
    with pytest.warns(UserWarning, match="empty generator"):
        total = clip_grad_norm_((p for p in []), 1.0)
    assert total.data == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clip_grad_norm_([], 1.0)                          # a list: no warning, as torch


@pytest.mark.timeout(60)
def test_a_non_finite_total_raises_only_when_asked():
    mine, theirs = _pair(np.float64, 6)
    mine[1].grad[0] = np.inf
    theirs[1].grad[0] = math.inf
    with pytest.raises(RuntimeError) as ours:
        clip_grad_norm_(mine, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError) as torchs:
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=True)
    assert str(ours.value) == str(torchs.value)
    total = clip_grad_norm_(mine, 1.0)                    # scaled by the inf norm anyway
    expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert np.isinf(total.data) and torch.isinf(expected)
    for m, t in zip(mine, theirs):
        np.testing.assert_array_equal(m.grad, t.grad.numpy())   # 0 or nan, as torch's


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_grad_value_equals_torch(dtype):
    mine, theirs = _pair(dtype, 7)
    clip_grad_value_(mine, 0.75)
    torch.nn.utils.clip_grad_value_(theirs, 0.75)
    for m, t in zip(mine, theirs):
        np.testing.assert_array_equal(m.grad, t.grad.numpy())


def test_bad_arguments_say_what_to_do():
    mine, _ = _pair(np.float64, 8)
    with pytest.raises(ValueError, match="norm_type must be a number or 'inf'"):
        clip_grad_norm_(mine, 1.0, norm_type="two")
    with pytest.raises(TypeError, match="foreach must be None, True or False"):
        clip_grad_norm_(mine, 1.0, foreach="yes")
