"""nn.mobile: the depthwise separable block (shapes, parameters against the
formula, output against its two convolutions done by the naive loop,
gradients by finite differences) and the cost counts (ratio = 1/C_out + 1/k^2)."""

import numpy as np
import pytest
from nn_reference import check_grad, conv2d_naive

from minidist import Tensor, nn
from minidist.nn import functional as F
from minidist.nn import mobile

rng = np.random.default_rng(7)


def test_cost_counts_follow_the_formula():
    for c_in, c_out, k, h, w in [(32, 64, 3, 14, 14), (3, 5, 3, 8, 8), (16, 16, 5, 7, 9)]:
        costs = mobile.compare_costs(c_in, c_out, k, h, w)
        assert costs["standard_multiply_adds"] == k * k * c_in * c_out * h * w
        assert costs["separable_multiply_adds"] == k * k * c_in * h * w + c_in * c_out * h * w
        assert costs["standard_parameters"] == k * k * c_in * c_out
        assert costs["separable_parameters"] == k * k * c_in + c_in * c_out
        assert costs["multiply_add_ratio"] == pytest.approx(1 / c_out + 1 / k**2)
        assert costs["formula_ratio"] == pytest.approx(costs["multiply_add_ratio"])
    assert mobile.conv2d_multiply_adds(8, 8, 3, 4, 4, groups=8) == 9 * 8 * 16
    with pytest.raises(ValueError, match="must divide"):
        mobile.conv2d_parameters(6, 4, 3, groups=4)


@pytest.mark.parametrize("batch_norm", [True, False])
def test_block_shapes_and_parameter_count(batch_norm):
    nn.init.manual_seed(0)
    block = nn.DepthwiseSeparableConv2d(6, 10, stride=2, batch_norm=batch_norm)
    out = block(Tensor(rng.standard_normal((3, 6, 9, 9)).astype(np.float32)))
    assert out.shape == (3, 10, 5, 5)
    weights = mobile.separable_parameters(6, 10, 3, bias=not batch_norm)
    norms = 2 * (6 + 10) if batch_norm else 0
    assert block.num_parameters() == weights + norms
    assert block.depthwise.weight.shape == (6, 1, 3, 3)
    assert block.pointwise.weight.shape == (10, 6, 1, 1)
    assert block.multiply_adds(5, 5) == 9 * 6 * 25 + 6 * 10 * 25


def test_block_is_depthwise_then_pointwise_and_its_gradients_are_right():
    nn.init.manual_seed(1)
    block = nn.DepthwiseSeparableConv2d(3, 4, batch_norm=False).to(np.float64)
    x = rng.standard_normal((2, 3, 5, 5))
    dw, db = block.depthwise.weight.data, block.depthwise.bias.data
    pw, pb = block.pointwise.weight.data, block.pointwise.bias.data
    depthwise = np.concatenate(
        [conv2d_naive(x[:, c : c + 1], dw[c : c + 1], db[c : c + 1], (1, 1), (1, 1)) for c in range(3)], axis=1
    )
    expected = np.maximum(conv2d_naive(np.maximum(depthwise, 0), pw, pb), 0)
    np.testing.assert_allclose(block(Tensor(x)).data, expected, rtol=1e-12, atol=1e-12)

    def composed(a, w1, b1, w2, b2):
        hidden = F.relu(F.conv2d(a, w1, b1, 1, 1, groups=3))
        return F.relu(F.conv2d(hidden, w2, b2))

    check_grad(composed, x, dw, db, pw, pb)


def test_block_trains_with_batch_norm():
    nn.init.manual_seed(2)
    block = nn.DepthwiseSeparableConv2d(4, 8)
    out = block(Tensor(rng.standard_normal((2, 4, 6, 6)).astype(np.float32)))
    (out * out).sum().backward()
    for name, parameter in block.named_parameters():
        assert parameter.grad is not None and np.isfinite(parameter.grad).all(), name
