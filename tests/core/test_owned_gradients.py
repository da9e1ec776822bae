"""The autograd's gradient ownership (``minidist.tensor._owned_gradients``):
a backward may overwrite the gradient it receives only when that gradient is
a new array no one else holds. Each test builds a graph where an overwrite in
the wrong place would change a visible result, and checks that result against
a reference computed without minidist's backward."""

import numpy as np
from nn_reference import max_pool2d_grad_naive

from minidist import Tensor
from minidist.nn import functional as F
from minidist.tensor import _owned_gradients

rng = np.random.default_rng(23)


def relu_pool_reference(x, grad_out):
    """Gradient of max_pool2d(relu(x), 2) for x and for relu(x)."""
    r = np.maximum(x, 0)
    grad_r = max_pool2d_grad_naive(r, grad_out, (2, 2), (2, 2))
    return grad_r * (x > 0), grad_r


def test_relu_masks_a_pooling_gradient_in_place_and_the_result_is_right():
    # Pooling's backward gives a new array, so ReLU's backward masks it in
    # place; the ties (relu zeros) route to the first maximum, then are masked.
    x = rng.standard_normal((2, 3, 6, 8))
    grad_out = rng.standard_normal((2, 3, 3, 4))
    tensor = Tensor(x, requires_grad=True)
    F.max_pool2d(F.relu(tensor), 2).backward(grad_out)
    expected, _ = relu_pool_reference(x, grad_out)
    np.testing.assert_allclose(tensor.grad, expected, rtol=1e-12)


def test_a_retained_gradient_is_copied_before_relu_overwrites_it():
    x = rng.standard_normal((1, 2, 4, 4))
    grad_out = rng.standard_normal((1, 2, 2, 2))
    tensor = Tensor(x, requires_grad=True)
    activation = F.relu(tensor).retain_grad()
    F.max_pool2d(activation, 2).backward(grad_out)
    expected_x, expected_activation = relu_pool_reference(x, grad_out)
    # Unmasked: pooling sends gradient to relu zeros too (all-negative windows).
    assert np.any((expected_activation != 0) & (x <= 0))
    np.testing.assert_allclose(activation.grad, expected_activation, rtol=1e-12)
    np.testing.assert_allclose(tensor.grad, expected_x, rtol=1e-12)


def test_the_callers_gradient_is_never_overwritten():
    x = rng.standard_normal((3, 4))
    grad_out = rng.standard_normal((3, 4))
    kept = grad_out.copy()
    tensor = Tensor(x, requires_grad=True)
    F.relu(tensor).backward(grad_out)
    np.testing.assert_array_equal(grad_out, kept)
    np.testing.assert_array_equal(tensor.grad, kept * (x > 0))


def test_a_gradient_shared_by_two_branches_is_not_overwritten():
    # ``add`` hands the same array to both operands (it is not marked), so
    # neither ReLU may mask it in place: the second would see the first's mask.
    x = rng.standard_normal((4, 5))
    y = rng.standard_normal((4, 5))
    a, b = Tensor(x, requires_grad=True), Tensor(y, requires_grad=True)
    (F.relu(a) + F.relu(b)).sum().backward()
    np.testing.assert_array_equal(a.grad, (x > 0).astype(x.dtype))
    np.testing.assert_array_equal(b.grad, (y > 0).astype(y.dtype))


def test_only_owned_gradients_reach_a_backward_as_owned():
    # A probe that records what it was handed: owned only below a marked
    # producer or a sum of two gradients, never for the caller's array.
    seen = []

    def probe(t, name):
        @_owned_gradients(overwrites=True)
        def backward(g, owned=False):
            seen.append((name, owned))
            return (g,)

        return Tensor._make(t.data.copy(), (t,), backward, "probe")

    def fresh(t):
        @_owned_gradients()
        def backward(g):
            return (g.copy(),)

        return Tensor._make(t.data.copy(), (t,), backward, "fresh")

    x = Tensor(rng.standard_normal(3), requires_grad=True)
    probe(x, "root").backward(np.ones(3))
    fresh(probe(x, "below a marked producer")).backward(np.ones(3))
    (probe(x, "below an unmarked add") + x).backward(np.ones(3))
    shared = probe(x, "a sum of two gradients")
    (shared * 2 + shared).backward(np.ones(3))
    assert seen == [
        ("root", False),
        ("below a marked producer", True),
        ("below an unmarked add", False),
        ("a sum of two gradients", True),
    ]
