"""Grouped and depthwise convolution (``groups=`` in F.conv2d and nn.Conv2d):
forward and gradients against a plain NumPy loop that convolves each group's
channel slice on its own, against finite differences in float64, against
PyTorch when it is installed, and the errors for channel counts that groups
does not divide."""

import numpy as np
import pytest
from nn_reference import check_grad, conv2d_naive

from minidist import Tensor, nn
from minidist.nn import functional as F

# Values through BLAS, compared exactly or to a rounding: run again on Haswell kernels by .ci/run.
pytestmark = pytest.mark.blas_kernel

rng = np.random.default_rng(2021)


def randn(*shape):
    return rng.standard_normal(shape)


def grouped_conv_reference(x, w, b, stride, padding, groups):
    """The definition: split the channels into ``groups`` slices and convolve
    each input slice with its own block of filters, by the naive loop."""
    c, oc = x.shape[1], w.shape[0]
    cg, og = c // groups, oc // groups
    outs = [
        conv2d_naive(x[:, g * cg : (g + 1) * cg], w[g * og : (g + 1) * og],
                     None if b is None else b[g * og : (g + 1) * og], stride, padding)
        for g in range(groups)
    ]
    return np.concatenate(outs, axis=1)


def grouped_grads_reference(x, w, grad_out, stride, padding, groups):
    """Input and weight gradients of sum(conv * grad_out), summed element by
    element from the definition (slow loops, no im2col)."""
    n, c, h, width = x.shape
    oc, cg, kh, kw = w.shape
    og = oc // groups
    sh, sw = stride
    ph, pw = padding
    xpad = np.zeros((n, c, h + 2 * ph, width + 2 * pw))
    xpad[:, :, ph : ph + h, pw : pw + width] = x
    grad_xpad, grad_w = np.zeros_like(xpad), np.zeros_like(w)
    for s in range(n):
        for o in range(oc):
            g = o // og
            for r in range(grad_out.shape[2]):
                for q in range(grad_out.shape[3]):
                    patch = xpad[s, g * cg : (g + 1) * cg, r * sh : r * sh + kh, q * sw : q * sw + kw]
                    grad_w[o] += grad_out[s, o, r, q] * patch
                    grad_xpad[s, g * cg : (g + 1) * cg, r * sh : r * sh + kh, q * sw : q * sw + kw] += (
                        grad_out[s, o, r, q] * w[o]
                    )
    return grad_xpad[:, :, ph : ph + h, pw : pw + width], grad_w


GROUP_CASES = [
    # (N, C, H, W, OC, kernel, stride, padding, groups)
    (2, 4, 6, 5, 6, (3, 3), (1, 1), (1, 1), 2),      # two groups, as AlexNet
    (2, 3, 7, 7, 3, (3, 3), (1, 1), (1, 1), 3),      # depthwise
    (1, 4, 8, 8, 8, (3, 3), (2, 2), (1, 1), 4),      # depthwise, 2 filters per channel, stride 2
    (2, 6, 9, 7, 6, (3, 3), (2, 2), (0, 0), 3),      # no padding, odd size
    (1, 4, 6, 7, 4, (2, 3), (1, 2), (1, 0), 4),      # rectangular kernel, mixed stride/padding
    (2, 4, 5, 5, 4, (5, 5), (1, 1), (2, 2), 4),      # depthwise 5x5
    (2, 6, 4, 4, 9, (1, 1), (1, 1), (0, 0), 3),      # grouped pointwise
    (1, 2, 7, 7, 2, (3, 3), (3, 3), (1, 1), 2),      # stride = kernel
]


@pytest.mark.parametrize("n, c, h, w, oc, kernel, stride, padding, groups", GROUP_CASES)
def test_grouped_conv2d_forward_matches_the_per_group_loop(n, c, h, w, oc, kernel, stride, padding, groups):
    x, weight, b = randn(n, c, h, w), randn(oc, c // groups, *kernel), randn(oc)
    out = F.conv2d(Tensor(x), Tensor(weight), Tensor(b), stride, padding, groups)
    expected = grouped_conv_reference(x, weight, b, stride, padding, groups)
    np.testing.assert_allclose(out.data, expected, rtol=1e-12, atol=1e-12)
    assert out.data.flags.c_contiguous


@pytest.mark.parametrize("n, c, h, w, oc, kernel, stride, padding, groups", GROUP_CASES)
def test_grouped_conv2d_gradients_match_the_loop_and_finite_differences(n, c, h, w, oc, kernel, stride, padding, groups):
    x, weight, b = randn(n, c, h, w), randn(oc, c // groups, *kernel), randn(oc)
    xt, wt, bt = (Tensor(a.copy(), requires_grad=True) for a in (x, weight, b))
    out = F.conv2d(xt, wt, bt, stride, padding, groups)
    grad_out = randn(*out.shape)
    out.backward(grad_out)
    grad_x, grad_w = grouped_grads_reference(x, weight, grad_out, stride, padding, groups)
    np.testing.assert_allclose(xt.grad, grad_x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(wt.grad, grad_w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(bt.grad, grad_out.sum(axis=(0, 2, 3)), rtol=1e-12)
    check_grad(lambda a, k, bias: F.conv2d(a, k, bias, stride, padding, groups), x, weight, b)


def test_groups_one_is_the_plain_convolution():
    x, weight = randn(2, 3, 6, 6), randn(4, 3, 3, 3)
    plain = F.conv2d(Tensor(x), Tensor(weight), None, 1, 1)
    grouped = F.conv2d(Tensor(x), Tensor(weight), None, 1, 1, groups=1)
    np.testing.assert_array_equal(plain.data, grouped.data)


@pytest.mark.parametrize("n, c, h, w, oc, kernel, stride, padding, groups", GROUP_CASES)
def test_grouped_conv2d_matches_pytorch(n, c, h, w, oc, kernel, stride, padding, groups):
    torch = pytest.importorskip("torch")
    x, weight, b = randn(n, c, h, w), randn(oc, c // groups, *kernel), randn(oc)
    xt, wt, bt = (Tensor(a.copy(), requires_grad=True) for a in (x, weight, b))
    out = F.conv2d(xt, wt, bt, stride, padding, groups)
    grad_out = randn(*out.shape)
    out.backward(grad_out)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, weight, b))
    reference = torch.nn.functional.conv2d(tx, tw, tb, stride, padding, groups=groups)
    reference.backward(torch.tensor(grad_out))
    np.testing.assert_allclose(out.data, reference.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, theirs in ((xt, tx), (wt, tw), (bt, tb)):
        np.testing.assert_allclose(mine.grad, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_depthwise_layer_has_one_filter_per_channel_and_trains():
    nn.init.manual_seed(0)
    layer = nn.Conv2d(8, 8, 3, padding=1, groups=8)
    assert layer.weight.shape == (8, 1, 3, 3)
    assert layer.num_parameters() == 8 * 9 + 8
    assert "groups=8" in repr(layer)
    x = Tensor(randn(2, 8, 5, 5).astype(np.float32))
    out = layer(x)
    assert out.shape == (2, 8, 5, 5) and out.dtype == np.float32
    out.sum().backward()
    assert layer.weight.grad.shape == (8, 1, 3, 3)


def test_bad_groups_are_clear_errors():
    with pytest.raises(ValueError, match=r"groups=3 must divide both in_channels=4 and out_channels=6"):
        nn.Conv2d(4, 6, 3, groups=3)
    with pytest.raises(ValueError, match=r"groups=2 must divide both in_channels=4 and out_channels=3"):
        nn.Conv2d(4, 3, 3, groups=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="groups must be a positive int"):
            nn.Conv2d(4, 4, 3, groups=bad)
    # a weight whose in_channels // groups does not match the input
    with pytest.raises(ValueError, match=r"with groups=2 expects in_channels = 1 \* 2 = 2"):
        F.conv2d(Tensor(randn(1, 4, 5, 5)), Tensor(randn(4, 1, 3, 3)), groups=2)
    with pytest.raises(ValueError, match="groups=3 must divide"):
        F.conv2d(Tensor(randn(1, 4, 5, 5)), Tensor(randn(3, 1, 3, 3)), groups=3)
