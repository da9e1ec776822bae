"""The autograd Tensor: every op's forward against NumPy, every op's gradient
against central finite differences in float64, and broadcasting by
property-based tests."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minidist
from minidist import Tensor, no_grad


def numeric_grad(function, arrays, eps=1e-6):
    """Central differences of the scalar sum(function(*arrays) * weights)."""
    grads = []
    for array in arrays:
        grad = np.zeros_like(array)
        flat, gflat = array.reshape(-1), grad.reshape(-1)
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + eps
            plus = function(*arrays)
            flat[i] = old - eps
            minus = function(*arrays)
            flat[i] = old
            gflat[i] = (plus - minus) / (2 * eps)
        grads.append(grad)
    return grads


def check_grad(op, *arrays, rtol=1e-5, atol=1e-7, seed=0):
    """Compare autograd with finite differences for sum(op(...) * W), W random,
    so every output element carries a distinct weight."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    out_shape = op(*[Tensor(a) for a in arrays]).shape
    weights = np.random.default_rng(seed).standard_normal(out_shape)

    def scalar(*values):
        return float((op(*[Tensor(v) for v in values]).data * weights).sum())

    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    (op(*tensors) * Tensor(weights)).sum().backward()
    expected = numeric_grad(scalar, [a.copy() for a in arrays])
    for i, (t, e) in enumerate(zip(tensors, expected)):
        assert t.grad is not None, f"input {i} got no gradient"
        assert t.grad.shape == arrays[i].shape
        np.testing.assert_allclose(t.grad, e, rtol=rtol, atol=atol, err_msg=f"input {i}")


rng = np.random.default_rng(42)


def randn(*shape):
    return rng.standard_normal(shape)


def positive(*shape):
    return rng.uniform(0.5, 2.0, shape)


# ---------------------------------------------------------------- elementwise
BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
}


@pytest.mark.parametrize("name", BINARY)
def test_binary_forward_and_grad_with_broadcasting(name):
    op, reference = BINARY[name]
    a, b = randn(3, 4), positive(4)
    np.testing.assert_allclose(op(Tensor(a), Tensor(b)).data, reference(a, b))
    check_grad(op, a, b)
    check_grad(op, positive(2, 1, 3), positive(4, 1))


UNARY = {
    "neg": (lambda x: -x, np.negative, randn),
    "exp": (lambda x: x.exp(), np.exp, randn),
    "log": (lambda x: x.log(), np.log, positive),
    "sqrt": (lambda x: x.sqrt(), np.sqrt, positive),
    "tanh": (lambda x: x.tanh(), np.tanh, randn),
    "sigmoid": (lambda x: x.sigmoid(), lambda x: 1 / (1 + np.exp(-x)), randn),
    "relu": (lambda x: x.relu(), lambda x: np.maximum(x, 0), randn),
    "abs": (lambda x: x.abs(), np.abs, randn),
    "pow3": (lambda x: x**3, lambda x: x**3, randn),
    "pow_half": (lambda x: x**0.5, np.sqrt, positive),
    "clip": (lambda x: x.clip(-0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), randn),
    "rsub": (lambda x: 2.0 - x, lambda x: 2.0 - x, randn),
    "rdiv": (lambda x: 2.0 / x, lambda x: 2.0 / x, positive),
    "rpow": (lambda x: 2.0**x, lambda x: 2.0**x, randn),
}


@pytest.mark.parametrize("name", UNARY)
def test_unary_forward_and_grad(name):
    op, reference, make = UNARY[name]
    x = make(3, 5)
    if name in ("relu", "abs", "clip"):
        # Keep away from the kinks where the finite difference is undefined.
        x = np.where(np.abs(x) < 0.05, 0.3, x)
        x = np.where(np.abs(np.abs(x) - 0.5) < 0.05, 0.3, x)
    np.testing.assert_allclose(op(Tensor(x)).data, reference(x), rtol=1e-12)
    check_grad(op, x)


def test_pow_with_tensor_exponent():
    check_grad(lambda a, b: a**b, positive(3, 2), randn(2))


def test_sigmoid_does_not_overflow():
    out = Tensor(np.array([-1000.0, 0.0, 1000.0], np.float32)).sigmoid().data
    np.testing.assert_allclose(out, [0.0, 0.5, 1.0])
    assert np.all(np.isfinite(out))


# ------------------------------------------------------------------- matmul
@pytest.mark.parametrize(
    "shape_a, shape_b",
    [((3, 4), (4, 5)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((3, 4), (2, 4, 5))],
)
def test_matmul_forward_and_grad(shape_a, shape_b):
    a, b = randn(*shape_a), randn(*shape_b)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).data, a @ b)
    check_grad(lambda x, y: x @ y, a, b)


def test_matmul_shape_error_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(3, 4\) @ \(5, 2\)"):
        Tensor(randn(3, 4)) @ Tensor(randn(5, 2))


# --------------------------------------------------------------- reductions
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
def test_reductions(name, axis, keepdims):
    x = randn(3, 4, 5)
    out = getattr(Tensor(x), name)(axis=axis, keepdims=keepdims)
    expected = getattr(np, {"max": "amax", "min": "amin"}.get(name, name))(x, axis=axis, keepdims=keepdims)
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(out.data, expected)
    check_grad(lambda t: getattr(t, name)(axis=axis, keepdims=keepdims), x)


def test_max_splits_gradient_between_ties():
    x = Tensor(np.array([1.0, 3.0, 3.0]), requires_grad=True)
    x.max().backward()
    np.testing.assert_allclose(x.grad, [0.0, 0.5, 0.5])


# -------------------------------------------------------------------- shape
def test_reshape_transpose_and_indexing():
    x = randn(2, 3, 4)
    np.testing.assert_allclose(Tensor(x).reshape(6, 4).data, x.reshape(6, 4))
    np.testing.assert_allclose(Tensor(x).transpose(2, 0, 1).data, x.transpose(2, 0, 1))
    np.testing.assert_allclose(Tensor(x[0]).T.data, x[0].T)
    check_grad(lambda t: t.reshape(4, 6), x)
    check_grad(lambda t: t.transpose(2, 0, 1), x)
    check_grad(lambda t: t.T, x)
    check_grad(lambda t: t[1, :, 1:3], x)
    check_grad(lambda t: t[..., ::2], x)
    check_grad(lambda t: t[np.array([0, 1, 0])], x)  # repeated fancy index accumulates
    check_grad(lambda t: t[x > 0], x)


def test_reshape_error_names_shapes():
    with pytest.raises(ValueError, match=r"shape \(2, 3\).*\(4,\)"):
        Tensor(randn(2, 3)).reshape(4)


def test_concatenate_stack_split():
    a, b, c = randn(2, 3), randn(2, 1), randn(2, 3)
    np.testing.assert_allclose(minidist.concatenate([Tensor(a), Tensor(b)], axis=1).data, np.concatenate([a, b], 1))
    check_grad(lambda x, y: minidist.concatenate([x, y], axis=1), a, b)
    np.testing.assert_allclose(minidist.stack([Tensor(a), Tensor(c)], axis=1).data, np.stack([a, c], 1))
    check_grad(lambda x, y: minidist.stack([x, y], axis=1), a, c)
    pieces = minidist.split(Tensor(randn(6, 2)), 3)
    assert [p.shape for p in pieces] == [(2, 2)] * 3
    check_grad(lambda x: minidist.split(x, [1, 4])[1] * 2.0, randn(6, 2))
    with pytest.raises(ValueError, match="cannot be divided"):
        minidist.split(Tensor(randn(5)), 2)
    with pytest.raises(ValueError, match="concatenate"):
        minidist.concatenate([Tensor(randn(2, 3)), Tensor(randn(3, 3))], axis=1)


# ---------------------------------------------------------- softmax family
def test_softmax_and_log_softmax():
    x = randn(4, 6) * 3
    e = np.exp(x - x.max(1, keepdims=True))
    reference = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(Tensor(x).softmax(axis=1).data, reference)
    np.testing.assert_allclose(Tensor(x).log_softmax(axis=1).data, np.log(reference))
    check_grad(lambda t: t.softmax(axis=1), x)
    check_grad(lambda t: t.log_softmax(axis=-1), x)
    check_grad(lambda t: t.softmax(axis=0), x)
    big = Tensor(np.array([[1000.0, 0.0]], np.float32)).log_softmax()
    assert np.all(np.isfinite(big.data))


def test_where_maximum_minimum():
    a, b = randn(3, 4), randn(4)
    np.testing.assert_allclose(minidist.maximum(Tensor(a), Tensor(b)).data, np.maximum(a, b))
    np.testing.assert_allclose(minidist.minimum(Tensor(a), Tensor(b)).data, np.minimum(a, b))
    check_grad(lambda x, y: minidist.maximum(x, y), a, b)
    check_grad(lambda x, y: minidist.minimum(x, y), a, b)
    condition = a > 0
    check_grad(lambda x, y: minidist.where(condition, x, y), a, b)


# ---------------------------------------------------------- broadcasting PBT
@st.composite
def broadcastable_pair(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3))
    shape_b = tuple(draw(st.sampled_from([1, s])) for s in shape)
    shape_b = shape_b[draw(st.integers(0, len(shape_b))):]
    if draw(st.booleans()):
        shape, shape_b = shape_b, shape
    elements = st.floats(-2, 2, allow_nan=False, width=64)
    a = draw(hnp.arrays(np.float64, shape, elements=elements))
    b = draw(hnp.arrays(np.float64, shape_b, elements=st.floats(0.5, 2, width=64)))
    return a, b


@settings(max_examples=40, deadline=None)
@given(broadcastable_pair(), st.sampled_from(list(BINARY)))
def test_broadcasting_matches_numpy_and_gradients(pair, name):
    a, b = pair
    op, reference = BINARY[name]
    out = op(Tensor(a), Tensor(b))
    np.testing.assert_allclose(out.data, reference(a, b))
    ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    op(ta, tb).sum().backward()
    assert ta.grad.shape == a.shape and tb.grad.shape == b.shape
    check_grad(op, a, b)


# ------------------------------------------------------- graph and semantics
def test_gradients_accumulate_and_shared_subgraphs_sum():
    x = Tensor(np.array([2.0]), requires_grad=True)
    y = x * x
    (y + y).sum().backward()  # d/dx 2x^2 = 4x
    np.testing.assert_allclose(x.grad, [8.0])
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad, [11.0])


def test_accumulation_is_in_place_into_a_view():
    buffer = np.zeros(6)
    x = Tensor(np.ones(3), requires_grad=True)
    x.grad = buffer[2:5]
    (x * 2).sum().backward()
    np.testing.assert_allclose(buffer, [0, 0, 2, 2, 2, 0])


def test_post_accumulate_hook_fires_in_backward_order():
    w1 = Tensor(randn(3, 3), requires_grad=True)
    w2 = Tensor(randn(3, 3), requires_grad=True)
    seen = []
    w1.register_post_accumulate_grad_hook(lambda t: seen.append("w1"))
    handle = w2.register_post_accumulate_grad_hook(lambda t: seen.append("w2"))
    ((Tensor(randn(2, 3)) @ w1).relu() @ w2).sum().backward()
    assert seen == ["w2", "w1"]  # the last layer's gradient is ready first
    handle.remove()
    ((Tensor(randn(2, 3)) @ w1) @ w2).sum().backward()
    assert seen == ["w2", "w1", "w1"]


def test_deep_chain_needs_no_recursion():
    x = Tensor(np.array([1.0]), requires_grad=True)
    y = x
    for _ in range(5000):
        y = y * 1.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [1.0])


def test_backward_errors_are_clear():
    x = Tensor(randn(3), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"non-scalar tensor of shape \(3,\)"):
        (x * 2).backward()
    y = (x * 2).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="already freed.*retain_graph=True"):
        y.backward()
    z = (x * 2).sum()
    z.backward(retain_graph=True)
    z.backward()  # allowed once retained
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(randn(3)).sum().backward()
    with pytest.raises(ValueError, match="gradient shape"):
        (x * 2).backward(np.ones(4))
    with pytest.raises(TypeError, match="floating-point"):
        Tensor(np.arange(3), requires_grad=True)


def test_backward_with_explicit_gradient():
    x = Tensor(randn(3), requires_grad=True)
    (x * 2).backward(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(x.grad, [2.0, 4.0, 6.0])


def test_no_grad_records_nothing():
    x = Tensor(randn(3), requires_grad=True)
    with no_grad():
        y = x * 2
    assert not y.requires_grad and y.is_leaf

    @no_grad()
    def double(t):
        return t * 2

    assert not double(x).requires_grad
    assert minidist.is_grad_enabled()


def test_dtypes_default_float32_and_stay_float32():
    assert Tensor([1, 2]).dtype == np.float32
    assert Tensor(3.0).dtype == np.float32
    assert Tensor(np.zeros(2, np.float64)).dtype == np.float64
    assert Tensor(np.zeros(2, np.int64)).dtype == np.int64
    w = Tensor(np.ones((4, 3), np.float32), requires_grad=True)
    x = Tensor(np.ones((2, 4), np.float32))
    loss = ((x @ w).tanh() * 0.5 + 1.0).log_softmax().mean()
    assert loss.dtype == np.float32
    loss.backward()
    assert w.grad.dtype == np.float32


def test_retain_grad_and_detach():
    x = Tensor(randn(3), requires_grad=True)
    h = (x * 2).retain_grad()
    (h * h).sum().backward()
    np.testing.assert_allclose(h.grad, 2 * h.data)
    assert not h.detach().requires_grad
    assert Tensor([5.0]).item() == 5.0
    with pytest.raises(ValueError, match="one element"):
        Tensor([1.0, 2.0]).item()
