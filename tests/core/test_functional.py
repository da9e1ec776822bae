"""minidist.nn.functional: every op's forward against a naive loop or a direct
NumPy formula, every gradient against central finite differences in float64,
and the error messages for bad input."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nn_reference import (
    avg_pool2d_naive,
    check_grad,
    conv2d_naive,
    max_pool2d_grad_naive,
    max_pool2d_naive,
)

from minidist import Tensor, no_grad
from minidist.nn import conv_gemm_sizing
from minidist.nn import functional as F
from minidist.nn import im2col as im2col_module

# Values through BLAS, compared exactly or to a rounding: run again on Haswell kernels by .ci/run.
pytestmark = pytest.mark.blas_kernel

rng = np.random.default_rng(1234)


def randn(*shape):
    return rng.standard_normal(shape)


def as_tensor(array, requires_grad=False):
    return Tensor(np.asarray(array), requires_grad=requires_grad)


# --------------------------------------------------------------------------
# conv2d

CONV_CASES = [
    # (N, C, H, W, OC, kernel, stride, padding, bias)
    (2, 3, 7, 6, 4, (3, 3), (1, 1), (1, 1), True),
    (1, 1, 5, 5, 2, (3, 3), (1, 1), (0, 0), True),
    (2, 2, 8, 8, 3, (3, 3), (2, 2), (0, 0), False),
    (2, 2, 9, 7, 3, (3, 3), (2, 2), (1, 1), True),
    (1, 3, 6, 7, 2, (2, 3), (1, 2), (1, 0), True),
    (2, 2, 5, 5, 3, (5, 5), (1, 1), (2, 2), True),
    (1, 2, 4, 4, 3, (1, 1), (1, 1), (0, 0), True),
    (1, 2, 4, 5, 2, (4, 5), (1, 1), (0, 0), True),
    (2, 1, 7, 7, 2, (3, 3), (3, 3), (1, 1), True),
]


@pytest.mark.parametrize("n, c, h, w, oc, kernel, stride, padding, bias", CONV_CASES)
def test_conv2d_forward_matches_naive_loops(n, c, h, w, oc, kernel, stride, padding, bias):
    x, weight = randn(n, c, h, w), randn(oc, c, *kernel)
    b = randn(oc) if bias else None
    out = F.conv2d(as_tensor(x), as_tensor(weight), None if b is None else as_tensor(b), stride, padding)
    np.testing.assert_allclose(out.data, conv2d_naive(x, weight, b, stride, padding), rtol=1e-12, atol=1e-12)
    assert out.data.flags.c_contiguous


@pytest.mark.parametrize("n, c, h, w, oc, kernel, stride, padding, bias", CONV_CASES)
def test_conv2d_gradients_by_finite_differences(n, c, h, w, oc, kernel, stride, padding, bias):
    x, weight = randn(n, c, h, w), randn(oc, c, *kernel)
    if bias:
        check_grad(lambda a, k, b: F.conv2d(a, k, b, stride, padding), x, weight, randn(oc))
    else:
        check_grad(lambda a, k: F.conv2d(a, k, None, stride, padding), x, weight)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 3), c=st.integers(1, 3), oc=st.integers(1, 3),
    h=st.integers(1, 8), w=st.integers(1, 8),
    kh=st.integers(1, 4), kw=st.integers(1, 4),
    sh=st.integers(1, 3), sw=st.integers(1, 3),
    ph=st.integers(0, 2), pw=st.integers(0, 2),
)
def test_conv2d_random_shapes_match_naive(n, c, oc, h, w, kh, kw, sh, sw, ph, pw):
    if h + 2 * ph < kh or w + 2 * pw < kw:
        with pytest.raises(ValueError, match="does not fit"):
            F.conv2d(as_tensor(randn(n, c, h, w)), as_tensor(randn(oc, c, kh, kw)), None, (sh, sw), (ph, pw))
        return
    x, weight, b = randn(n, c, h, w), randn(oc, c, kh, kw), randn(oc)
    out = F.conv2d(as_tensor(x), as_tensor(weight), as_tensor(b), (sh, sw), (ph, pw))
    np.testing.assert_allclose(out.data, conv2d_naive(x, weight, b, (sh, sw), (ph, pw)), rtol=1e-12, atol=1e-12)


@settings(max_examples=10, deadline=None)
@given(
    h=st.integers(3, 6), w=st.integers(3, 6), k=st.integers(1, 3),
    s=st.integers(1, 2), p=st.integers(0, 1),
)
def test_col2im_is_the_adjoint_of_im2col(h, w, k, s, p):
    # <im2col(x), y> == <x, col2im(y)>: col2im is exactly the transpose map,
    # which is what makes it the right backward.
    x = randn(2, 3, h, w)
    columns = im2col_module.im2col(x, k, k, s, s, p, p)
    y = randn(*columns.shape)
    back = im2col_module.col2im(y, x.shape, k, k, s, s, p, p)
    assert np.isclose((columns * y).sum(), (x * back).sum(), rtol=1e-12)


@pytest.mark.parametrize("stride, padding", [(1, 0), (1, 2), (2, 1), (3, 0)])
def test_col2im_product_is_col2im_of_the_product(stride, padding):
    weight, x_shape = randn(4, 3, 3, 2), (2, 3, 7, 8)
    out_h = im2col_module.output_size(7, 3, stride, padding)
    out_w = im2col_module.output_size(8, 2, stride, padding)
    grad = randn(4, 2 * out_h * out_w)
    expected = im2col_module.col2im(weight.reshape(4, -1).T @ grad, x_shape, 3, 2, stride, stride, padding, padding)
    got = im2col_module.col2im_product(weight, grad, x_shape, 3, 2, stride, stride, padding, padding)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert got.flags.c_contiguous


@pytest.mark.parametrize("chunk_bytes", [1, 3000, 1 << 20])
@pytest.mark.parametrize(
    "n, c, h, w, oc, kernel, padding, groups",
    [
        (5, 3, 7, 8, 4, (3, 2), (1, 2), 1),   # rectangular kernel, uneven padding
        (1, 2, 6, 6, 3, (3, 3), (0, 0), 1),   # batch 1, no padding
        (4, 4, 5, 6, 6, (3, 3), (1, 1), 2),   # two groups
        (3, 3, 6, 5, 3, (5, 5), (2, 2), 3),   # depthwise 5x5
        (2, 4, 4, 4, 8, (1, 1), (0, 0), 4),   # grouped pointwise
    ],
)
def test_stride_one_col2im_product_in_chunks_matches_col2im(monkeypatch, chunk_bytes, n, c, h, w, oc, kernel, padding, groups):
    # Stride 1 takes the shifted-row path, in chunks of images sized by
    # CHUNK_BYTES: one image at a time, a few with a shorter last chunk, all
    # at once. Each must equal col2im of the whole product, group by group.
    monkeypatch.setattr(im2col_module, "CHUNK_BYTES", chunk_bytes)
    (kh, kw), (ph, pw) = kernel, padding
    out_h, out_w = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
    weight, grad = randn(oc, c // groups, kh, kw), randn(oc, n * out_h * out_w)
    rows, group_out = c // groups * kh * kw, oc // groups
    product = np.concatenate([
        weight[g * group_out : (g + 1) * group_out].reshape(group_out, rows).T @ grad[g * group_out : (g + 1) * group_out]
        for g in range(groups)
    ])
    expected = im2col_module.col2im(product, (n, c, h, w), kh, kw, 1, 1, ph, pw)
    got = im2col_module.col2im_product(weight, grad, (n, c, h, w), kh, kw, 1, 1, ph, pw, groups)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert got.shape == (n, c, h, w) and got.flags.c_contiguous


def test_stride_one_col2im_product_in_gemm_sized_chunks(monkeypatch):
    # The chunk is also capped so that each GEMM stays within SMALL_GEMM
    # multiply-adds (OpenBLAS's unpacked kernel): a cap of one image's GEMM
    # and of two, with 5 images (a short last chunk), must give the same sum.
    monkeypatch.setattr(conv_gemm_sizing, "unpacked_small_gemm", lambda: True)
    own = np.random.default_rng(230)  # not the module's generator: later tests keep their data
    n, c, h, w, oc = 5, 3, 6, 7, 4
    weight, grad = own.standard_normal((oc, c, 3, 3)), own.standard_normal((oc, n * h * w))
    expected = im2col_module.col2im(weight.reshape(oc, -1).T @ grad, (n, c, h, w), 3, 3, 1, 1, 1, 1)
    one_image = c * 3 * oc * (h * (w + 2) + 2)  # multiply-adds of one image's GEMM
    for cap in (1, one_image, 2 * one_image):
        monkeypatch.setattr(conv_gemm_sizing, "SMALL_GEMM", cap)
        got = im2col_module.col2im_product(weight, grad, (n, c, h, w), 3, 3, 1, 1, 1, 1)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_the_openblas_kernel_set_is_read_from_the_loaded_library():
    # OPENBLAS_CORETYPE makes OpenBLAS load the Haswell kernels, which lack
    # the unpacked small-matrix GEMM: a fresh process must see both.
    from minidist.runtime.blas_threads import openblas_cores

    if not openblas_cores():
        pytest.skip("NumPy's BLAS here is not an OpenBLAS that names its kernels")
    code = (
        "import numpy; from minidist.runtime.blas_threads import openblas_cores; "
        "from minidist.nn.conv_gemm_sizing import unpacked_small_gemm; print(openblas_cores(), unpacked_small_gemm())"
    )
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["['Haswell']", "False"]


@pytest.mark.parametrize("copy_g", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_weight_gradient_with_and_without_copying_g(monkeypatch, copy_g, bias):
    # The weight gradient copies g to (N, OH*OW, OC) when the product is too
    # big for OpenBLAS's unpacked kernel to read it transposed, and is one
    # GEMM over the batch on the packed kernels: both ways, against finite
    # differences (a threshold of 0 forces the copy where the kernel is the
    # unpacked one, on any BLAS).
    monkeypatch.setattr(conv_gemm_sizing, "unpacked_small_gemm", lambda: copy_g)
    monkeypatch.setattr(conv_gemm_sizing, "SMALL_GEMM_TRANSPOSED_OUTPUT", 0)
    own = np.random.default_rng(231)
    x, weight = own.standard_normal((2, 3, 5, 6)), own.standard_normal((4, 3, 3, 3))
    if bias:
        check_grad(lambda a, k, b: F.conv2d(a, k, b, 1, 1), x, weight, own.standard_normal((4,)))
    else:
        check_grad(lambda a, k: F.conv2d(a, k, None, 1, 1), x, weight)


@pytest.mark.parametrize("small_gemm_kernel", [True, False])
def test_conv2d_weight_gradient_of_a_wide_layer_matches_a_direct_sum(monkeypatch, small_gemm_kernel):
    # A layer big enough to take the copying path by itself (16 x 145 > 1200
    # entries) where OpenBLAS has the small-matrix kernel, and the one GEMM
    # over the whole batch where it has not (weight_gradient_in_one_gemm),
    # float32 as in training, against the definition in float64:
    # grad_w[o, c, i, j] = sum over n, r, s of g[n, o, r, s] * xpad[n, c, r + i, s + j].
    monkeypatch.setattr(conv_gemm_sizing, "unpacked_small_gemm", lambda: small_gemm_kernel)
    own = np.random.default_rng(232)
    x = own.standard_normal((3, 16, 6, 5)).astype(np.float32)
    weight = Tensor(own.standard_normal((16, 16, 3, 3)).astype(np.float32), requires_grad=True)
    bias = Tensor(own.standard_normal((16,)).astype(np.float32), requires_grad=True)
    assert 16 * (16 * 9 + 1) > conv_gemm_sizing.SMALL_GEMM_TRANSPOSED_OUTPUT
    g = own.standard_normal((3, 16, 6, 5))
    F.conv2d(as_tensor(x), weight, bias, 1, 1).backward(g.astype(np.float32))
    xpad = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(xpad, (3, 3), axis=(2, 3))  # (n, c, r, s, i, j)
    expected = np.einsum("nors,ncrsij->ocij", g, windows)
    np.testing.assert_allclose(weight.grad, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bias.grad, g.sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("h", [8, 14])
def test_conv2d_forward_of_an_image_does_not_depend_on_its_batch(h):
    # One GEMM per image: an image's output is the same bits in any batch, on
    # every BLAS kernel (on OpenBLAS's packed kernels one GEMM over the whole
    # batch rounds an image's outputs differently with the images around it;
    # .ci/run runs this on the Haswell kernels too).
    own = np.random.default_rng(233)
    x = own.standard_normal((12, 16, h, h)).astype(np.float32)
    weight = own.standard_normal((32, 16, 3, 3)).astype(np.float32)
    bias = own.standard_normal((32,)).astype(np.float32)
    with no_grad():
        batch = F.conv2d(as_tensor(x), as_tensor(weight), as_tensor(bias), 1, 1).data
        for start, stop in [(0, 1), (5, 6), (3, 9), (11, 12)]:
            part = F.conv2d(as_tensor(x[start:stop]), as_tensor(weight), as_tensor(bias), 1, 1).data
            np.testing.assert_array_equal(part, batch[start:stop])


def test_conv2d_skips_the_input_gradient_when_not_needed(monkeypatch):
    # The first layer's images need no gradient: the col2im and its GEMM must
    # not run at all.
    def fail(*args, **kwargs):
        raise AssertionError("col2im ran for an input that needs no gradient")

    monkeypatch.setattr(F, "col2im_product", fail)
    x = as_tensor(randn(2, 1, 5, 5).astype(np.float32))
    weight = Tensor(randn(3, 1, 3, 3).astype(np.float32), requires_grad=True)
    F.conv2d(x, weight, None, 1, 1).sum().backward()
    assert x.grad is None and weight.grad is not None


@pytest.mark.parametrize("needs", [(True, True), (False, True), (True, False)])
def test_conv2d_bias_gradient_whichever_parameters_need_one(needs):
    # The bias rides in the weight-gradient GEMM: it must still be the sum of
    # the output gradient when the weight is frozen, and absent when the bias is.
    # (atol too: a sum that cancels to near zero has no relative precision.)
    weight_needs, bias_needs = needs
    x, w, b = randn(3, 2, 6, 5), randn(4, 2, 3, 3), randn(4)
    grad_out = randn(3, 4, 6, 5)
    weight, bias = Tensor(w, requires_grad=weight_needs), Tensor(b, requires_grad=bias_needs)
    inputs = Tensor(x, requires_grad=True)
    F.conv2d(inputs, weight, bias, 1, 1).backward(grad_out)
    if bias_needs:
        np.testing.assert_allclose(bias.grad, grad_out.sum(axis=(0, 2, 3)), rtol=1e-12, atol=1e-12)
    else:
        assert bias.grad is None
    if weight_needs:
        numeric = np.zeros_like(w)  # dL/dw[o,c,i,j] = sum g[n,o,y,x] * xpad[n,c,y+i,x+j]
        xpad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        for i in range(3):
            for j in range(3):
                numeric[:, :, i, j] = np.einsum("noyx,ncyx->oc", grad_out, xpad[:, :, i : i + 6, j : j + 5])
        np.testing.assert_allclose(weight.grad, numeric, rtol=1e-10, atol=1e-12)
    else:
        assert weight.grad is None
    np.testing.assert_allclose(inputs.grad, _conv_input_grad(w, grad_out), rtol=1e-10, atol=1e-12)


def _conv_input_grad(w, grad_out):
    """dL/dx of a 3x3, padding 1 convolution, by its definition."""
    n, oc, h, width = grad_out.shape
    grad = np.zeros((n, w.shape[1], h + 2, width + 2))
    for i in range(3):
        for j in range(3):
            grad[:, :, i : i + h, j : j + width] += np.einsum("noyx,oc->ncyx", grad_out, w[:, :, i, j])
    return grad[:, :, 1:-1, 1:-1]


@pytest.mark.parametrize("bias, groups", [(True, 1), (False, 1), (True, 2)])
def test_conv2d_of_an_empty_batch(bias, groups):
    # A rank's shard can be empty (uneven splits): shapes must still work out.
    weight = Tensor(randn(4, 4 // groups, 3, 3), requires_grad=True)
    b = Tensor(randn(4), requires_grad=True) if bias else None
    x = Tensor(np.zeros((0, 4, 5, 5)), requires_grad=True)
    out = F.conv2d(x, weight, b, 1, 1, groups)
    assert out.shape == (0, 4, 5, 5)
    out.sum().backward()
    assert x.grad.shape == (0, 4, 5, 5) and not weight.grad.any()
    assert b is None or not b.grad.any()


@pytest.mark.parametrize(
    "shape, kernel, stride, padding",
    [
        ((2, 3, 5, 4), (3, 3), (1, 1), (1, 1)),   # the usual 3x3 "same" convolution
        ((1, 2, 7, 6), (3, 2), (2, 3), (2, 1)),   # strided, uneven padding
        ((3, 1, 1, 1), (1, 1), (2, 2), (1, 1)),   # blocks that see only padding
        ((1, 2, 2, 3), (5, 5), (1, 1), (2, 2)),   # kernel bigger than the image
        ((2, 2, 4, 5), (2, 3), (1, 1), (0, 0)),   # no padding
    ],
)
def test_im2col_matches_windows_of_the_padded_image(shape, kernel, stride, padding):
    # im2col never pads the input; each block must still equal the windows of
    # the explicitly zero-padded image, border zeros included.
    x = np.random.default_rng(233).standard_normal(shape)  # leaves the module's generator to later tests
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=(2, 3))[:, :, ::sh, ::sw]
    expected = windows.transpose(1, 4, 5, 0, 2, 3).reshape(shape[1] * kh * kw, -1)  # rows (c, i, j), columns (n, oh, ow)
    np.testing.assert_array_equal(im2col_module.im2col(x, kh, kw, sh, sw, ph, pw), expected)


def test_im2col_ones_row_appends_ones_under_the_same_columns():
    x = randn(2, 3, 5, 4)
    plain = im2col_module.im2col(x, 3, 2, 1, 2, 1, 0)
    with_ones = im2col_module.im2col(x, 3, 2, 1, 2, 1, 0, ones_row=True)
    np.testing.assert_array_equal(with_ones[:-1], plain)
    np.testing.assert_array_equal(with_ones[-1], np.ones(plain.shape[1]))


def test_conv2d_keeps_float32_and_casts_the_input_to_the_weights_dtype():
    weight = Tensor(randn(4, 2, 3, 3).astype(np.float32), requires_grad=True)
    bias = Tensor(np.zeros(4, np.float32), requires_grad=True)
    x = Tensor(randn(2, 2, 6, 6), requires_grad=True)  # float64 images
    out = F.conv2d(x, weight, bias, 1, 1)
    assert out.dtype == np.float32
    out.sum().backward()
    assert weight.grad.dtype == np.float32 and bias.grad.dtype == np.float32
    assert x.grad.dtype == np.float64  # accumulated in the leaf's own dtype


def test_conv2d_bad_input_names_both_shapes():
    weight = as_tensor(randn(8, 3, 3, 3))
    with pytest.raises(ValueError, match=r"input has 1 channels.*\(2, 1, 5, 5\).*\(8, 3, 3, 3\).*in_channels=3.*Conv2d\(1, 8"):
        F.conv2d(as_tensor(randn(2, 1, 5, 5)), weight)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\).*\(3, 5, 5\).*batch axis"):
        F.conv2d(as_tensor(randn(3, 5, 5)), weight)
    with pytest.raises(TypeError, match="stride"):
        F.conv2d(as_tensor(randn(1, 3, 5, 5)), weight, stride=1.5)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        F.conv2d(as_tensor(randn(1, 3, 5, 5)), weight, stride=0)


# --------------------------------------------------------------------------
# Pooling

POOL_CASES = [
    # (shape, kernel, stride, padding)
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0)),   # tiles exactly
    ((1, 2, 7, 9), (2, 2), (2, 2), (0, 0)),   # ragged edge dropped
    ((2, 2, 9, 7), (3, 3), (2, 2), (1, 1)),   # overlapping, padded
    ((1, 2, 6, 7), (2, 3), (1, 2), (0, 1)),
    ((1, 1, 5, 5), (3, 3), (1, 1), (1, 1)),
    ((1, 2, 6, 6), (2, 2), (3, 3), (0, 0)),   # gaps between windows
    ((2, 2, 9, 9), (3, 3), (3, 3), (0, 0)),   # tiles with 3-wide windows
    ((2, 1, 6, 9), (2, 3), (2, 3), (0, 0)),   # tiles, rectangular
]


@pytest.mark.parametrize("shape, kernel, stride, padding", POOL_CASES)
def test_max_pool2d_forward_and_gradient(shape, kernel, stride, padding):
    x = randn(*shape)
    out = F.max_pool2d(as_tensor(x), kernel, stride, padding)
    np.testing.assert_array_equal(out.data, max_pool2d_naive(x, kernel, stride, padding))
    check_grad(lambda a: F.max_pool2d(a, kernel, stride, padding), x)


@pytest.mark.parametrize("shape, kernel, stride, padding", POOL_CASES)
def test_avg_pool2d_forward_and_gradient(shape, kernel, stride, padding):
    x = randn(*shape)
    out = F.avg_pool2d(as_tensor(x), kernel, stride, padding)
    np.testing.assert_allclose(out.data, avg_pool2d_naive(x, kernel, stride, padding), rtol=1e-12)
    check_grad(lambda a: F.avg_pool2d(a, kernel, stride, padding), x)


@pytest.mark.parametrize("shape, kernel, stride, padding", POOL_CASES)
def test_max_pool2d_sends_a_tied_windows_gradient_to_its_first_maximum(shape, kernel, stride, padding):
    # Few distinct values: many ties, as after a ReLU. Finite differences are
    # undefined there; the rule (first maximum in row-major order, PyTorch's)
    # is checked against the naive loop, and no gradient is duplicated.
    x = rng.integers(0, 2, shape).astype(np.float64)
    tensor = Tensor(x, requires_grad=True)
    out = F.max_pool2d(tensor, kernel, stride, padding)
    grad_out = randn(*out.shape)
    out.backward(grad_out)
    np.testing.assert_allclose(tensor.grad, max_pool2d_grad_naive(x, grad_out, kernel, stride, padding), rtol=1e-12)
    assert np.isclose(tensor.grad.sum(), grad_out.sum())


def test_pooling_default_stride_is_the_kernel_and_errors_are_clear():
    x = as_tensor(randn(1, 1, 4, 4))
    assert F.max_pool2d(x, 2).shape == (1, 1, 2, 2)
    assert F.avg_pool2d(x, 3, 1).shape == (1, 1, 2, 2)
    with pytest.raises(ValueError, match=r"5x5 window does not fit in the 4x4 input"):
        F.max_pool2d(x, 5)
    with pytest.raises(ValueError, match="padding .* at most half the kernel"):
        F.avg_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        F.max_pool2d(as_tensor(randn(4, 4)), 2)


# --------------------------------------------------------------------------
# Batch normalisation


def batch_norm_reference(x, mean, var, weight, bias, eps):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * weight.reshape(shape) + bias.reshape(shape)


@pytest.mark.parametrize("shape", [(6, 4), (4, 3, 5), (3, 2, 4, 5)])
def test_batch_norm_training_forward_and_running_statistics(shape):
    x = randn(*shape) * 3 + 2
    channels = shape[1]
    weight, bias = randn(channels), randn(channels)
    running_mean, running_var = randn(channels), rng.uniform(0.5, 2, channels)
    old_mean, old_var = running_mean.copy(), running_var.copy()
    out = F.batch_norm(as_tensor(x), running_mean, running_var, as_tensor(weight), as_tensor(bias), True, 0.1, 1e-5)
    axes = (0,) + tuple(range(2, x.ndim))
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    np.testing.assert_allclose(out.data, batch_norm_reference(x, mean, var, weight, bias, 1e-5), rtol=1e-10, atol=1e-12)
    count = x.size // channels
    np.testing.assert_allclose(running_mean, 0.9 * old_mean + 0.1 * mean, rtol=1e-12)
    np.testing.assert_allclose(running_var, 0.9 * old_var + 0.1 * var * count / (count - 1), rtol=1e-12)


@pytest.mark.parametrize("shape", [(6, 4), (3, 2, 4, 5)])
def test_batch_norm_eval_uses_running_statistics_and_leaves_them(shape):
    x = randn(*shape)
    channels = shape[1]
    weight, bias = randn(channels), randn(channels)
    running_mean, running_var = randn(channels), rng.uniform(0.5, 2, channels)
    saved = running_mean.copy(), running_var.copy()
    out = F.batch_norm(as_tensor(x), running_mean, running_var, as_tensor(weight), as_tensor(bias), False)
    np.testing.assert_allclose(out.data, batch_norm_reference(x, running_mean, running_var, weight, bias, 1e-5), rtol=1e-10)
    np.testing.assert_array_equal(running_mean, saved[0])
    np.testing.assert_array_equal(running_var, saved[1])


@pytest.mark.parametrize("shape", [(5, 3), (3, 2, 4), (2, 3, 3, 4)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_gradients_by_finite_differences(shape, training):
    channels = shape[1]
    running_mean, running_var = randn(channels), rng.uniform(0.5, 2, channels)

    def op(x, weight, bias):
        # Fresh copies: training mode updates the running statistics in place.
        return F.batch_norm(x, running_mean.copy(), running_var.copy(), weight, bias, training)

    check_grad(op, randn(*shape) * 2 + 1, randn(channels), randn(channels))


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_computes_only_the_gradients_asked_for(training):
    arrays = randn(6, 3, 2, 2), randn(3), randn(3)
    grad_out = randn(6, 3, 2, 2)
    stats = randn(3), rng.uniform(0.5, 2, 3)

    def run(wanted):
        tensors = [Tensor(a, requires_grad=w) for a, w in zip(arrays, wanted)]
        out = F.batch_norm(tensors[0], stats[0].copy(), stats[1].copy(), tensors[1], tensors[2], training)
        out.backward(grad_out)
        return [t.grad for t in tensors]

    full = run((True, True, True))
    for wanted in [(True, False, False), (False, True, False), (False, False, True)]:
        for grad, reference, asked in zip(run(wanted), full, wanted):
            if asked:
                np.testing.assert_allclose(grad, reference, rtol=1e-12)
            else:
                assert grad is None


def test_batch_norm_without_affine_or_running_statistics():
    x = randn(8, 3)
    check_grad(lambda a: F.batch_norm(a, None, None, None, None, False), x)
    out = F.batch_norm(as_tensor(x), training=True)
    np.testing.assert_allclose(out.data.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(out.data.var(axis=0), 1 / (1 + 1e-5 / x.var(axis=0)), rtol=1e-6)


def test_batch_norm_needs_more_than_one_value_per_channel_in_training():
    with pytest.raises(ValueError, match=r"more than one value per channel.*\(1, 3\).*model.eval\(\)"):
        F.batch_norm(as_tensor(randn(1, 3)), training=True)
    with pytest.raises(ValueError, match=r"weight has shape \(4,\).*3 channels"):
        F.batch_norm(as_tensor(randn(2, 3)), weight=as_tensor(randn(4)), bias=as_tensor(randn(4)), training=True)


# --------------------------------------------------------------------------
# Linear and activations


@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5), (5,)])
def test_linear_forward_and_gradients(shape):
    x, weight, bias = randn(*shape), randn(3, 5), randn(3)
    out = F.linear(as_tensor(x), as_tensor(weight), as_tensor(bias))
    np.testing.assert_allclose(out.data, x @ weight.T + bias, rtol=1e-12)
    check_grad(lambda a, w, b: F.linear(a, w, b), x, weight, bias)
    check_grad(lambda a, w: F.linear(a, w), x, weight)


def test_linear_shape_mismatch_says_what_to_do():
    with pytest.raises(ValueError, match=r"has 783 features.*\(128, 783\).*\(512, 784\).*in_features=784.*Flatten"):
        F.linear(as_tensor(np.zeros((128, 783), np.float32)), as_tensor(np.zeros((512, 784), np.float32)))


@pytest.mark.parametrize(
    "function",
    [F.relu, F.sigmoid, F.tanh, lambda t: F.gelu(t, "tanh"), lambda t: F.softmax(t, axis=1), lambda t: F.log_softmax(t, axis=0)],
    ids=["relu", "sigmoid", "tanh", "gelu-tanh", "softmax", "log_softmax"],
)
def test_activation_gradients(function):
    x = randn(4, 5)
    x[np.abs(x) < 1e-3] = 0.5  # keep finite differences away from relu's kink
    check_grad(function, x)


def test_gelu_exact_matches_the_normal_cdf_and_its_gradient():
    x = np.linspace(-6, 6, 241)
    expected = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    np.testing.assert_allclose(F.gelu(as_tensor(x)).data, expected, rtol=1e-14, atol=1e-300)
    check_grad(F.gelu, randn(3, 4))
    tanh_version = F.gelu(as_tensor(x), "tanh").data
    assert np.abs(tanh_version - expected).max() < 1e-3
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(as_tensor(x), "fast")


# --------------------------------------------------------------------------
# Losses


def cross_entropy_reference(logits, labels):
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -log_probs[np.arange(len(labels)), labels]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_numpy_and_finite_differences(reduction):
    logits, labels = randn(6, 4) * 3, rng.integers(0, 4, 6)
    per_sample = cross_entropy_reference(logits, labels)
    expected = {"mean": per_sample.mean(), "sum": per_sample.sum(), "none": per_sample}[reduction]
    np.testing.assert_allclose(F.cross_entropy(as_tensor(logits), labels, reduction).data, expected, rtol=1e-12)
    check_grad(lambda z: F.cross_entropy(z, labels, reduction), logits)


def test_cross_entropy_is_stable_for_huge_logits_and_accepts_any_label_container():
    logits = np.array([[1e4, 0.0, -1e4], [0.0, 2e4, 0.0]], np.float32)
    tensor = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(tensor, [1, 1])
    loss.backward()
    assert np.isfinite(loss.item()) and np.isfinite(tensor.grad).all()
    assert loss.dtype == np.float32 and tensor.grad.dtype == np.float32
    np.testing.assert_allclose(loss.item(), 5e3, rtol=1e-6)
    for labels in ([1, 1], np.array([1, 1]), Tensor(np.array([1, 1]))):
        assert F.cross_entropy(as_tensor(logits), labels).item() == loss.item()


def test_nll_loss_of_log_softmax_is_cross_entropy():
    logits, labels = randn(5, 3), rng.integers(0, 3, 5)
    for reduction in ("mean", "sum", "none"):
        np.testing.assert_allclose(
            F.nll_loss(F.log_softmax(as_tensor(logits), 1), labels, reduction).data,
            F.cross_entropy(as_tensor(logits), labels, reduction).data,
            rtol=1e-12,
        )
        check_grad(lambda lp, r=reduction: F.nll_loss(lp, labels, r), randn(5, 3))


def test_losses_reject_bad_labels_with_clear_messages():
    logits = as_tensor(np.zeros((4, 10), np.float32))
    with pytest.raises(ValueError, match=r"batch size 4 \(shape \(4, 10\)\).*labels have shape \(3,\)"):
        F.cross_entropy(logits, np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"label 10 is out of range.*10 classes.*0\.\.9"):
        F.cross_entropy(logits, np.array([0, 1, 2, 10]))
    with pytest.raises(ValueError, match=r"label -1 is out of range"):
        F.nll_loss(logits, np.array([0, -1, 2, 3]))
    with pytest.raises(TypeError, match=r"integer class indices.*float64.*astype\(numpy.int64\)"):
        F.cross_entropy(logits, np.array([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"\(batch, classes\)"):
        F.cross_entropy(as_tensor(np.zeros((2, 3, 4))), np.array([0, 1]))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(logits, np.array([0, 1, 2, 3]), reduction="avg")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_forward_and_gradients_of_both_sides(reduction):
    prediction, target = randn(4, 3), randn(4, 3)
    squared = (prediction - target) ** 2
    expected = {"mean": squared.mean(), "sum": squared.sum(), "none": squared}[reduction]
    np.testing.assert_allclose(F.mse_loss(as_tensor(prediction), target, reduction).data, expected, rtol=1e-12)
    check_grad(lambda a, b: F.mse_loss(a, b, reduction), prediction, target)


def test_mse_loss_refuses_silent_broadcasting():
    with pytest.raises(ValueError, match=r"\(8, 1\).*\(8,\).*reshape"):
        F.mse_loss(as_tensor(np.zeros((8, 1))), np.zeros(8))


# --------------------------------------------------------------------------
# Dropout and flatten


def test_dropout_statistics_in_training():
    x = np.ones((200, 500), np.float32)
    tensor = Tensor(x, requires_grad=True)
    out = F.dropout(tensor, 0.3, training=True, rng=0)
    kept = out.data != 0
    assert abs(kept.mean() - 0.7) < 0.01  # 100,000 draws: 5 standard deviations is 0.007
    np.testing.assert_allclose(out.data[kept], 1 / 0.7, rtol=1e-6)  # inverted scaling
    assert abs(out.data.mean() - 1.0) < 0.02  # the expectation is kept
    out.backward(np.ones_like(x))
    np.testing.assert_array_equal(tensor.grad, out.data)  # gradient = the same scaled mask
    assert out.dtype == np.float32


def test_dropout_is_the_identity_in_eval_and_reproducible_when_seeded():
    tensor = as_tensor(randn(10, 10))
    assert F.dropout(tensor, 0.5, training=False) is tensor
    assert F.dropout(tensor, 0.0, training=True) is tensor
    np.testing.assert_array_equal(F.dropout(tensor, 1.0).data, 0)
    a = F.dropout(tensor, 0.5, rng=np.random.default_rng(7)).data
    b = F.dropout(tensor, 0.5, rng=np.random.default_rng(7)).data
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        F.dropout(tensor, 1.5)


def test_flatten():
    x = Tensor(randn(2, 3, 4, 5), requires_grad=True)
    assert F.flatten(x).shape == (2, 60)
    assert F.flatten(x, 0).shape == (120,)
    assert F.flatten(x, 1, 2).shape == (2, 12, 5)
    F.flatten(x).sum().backward()
    np.testing.assert_array_equal(x.grad, np.ones((2, 3, 4, 5)))
    with pytest.raises(ValueError, match="already flat"):
        F.flatten(as_tensor(randn(4)), 1)


def _numpy_flatten(array, start, end):
    """torch's rule written with NumPy: dims start..end (negative from the end)
    become one, of their product; the values keep their C order."""
    ndim = array.ndim
    start, end = start % ndim, end % ndim
    kept_before, kept_after = array.shape[:start], array.shape[end + 1:]
    return array.reshape(kept_before + (-1,) + kept_after) if start <= end else None


def test_flatten_with_torch_s_keywords_and_negative_dims():
    from minidist import nn

    data = randn(2, 3, 4, 5)
    for start in range(-4, 4):
        for end in range(-4, 4):
            expected = _numpy_flatten(data, start, end)
            if expected is None:
                with pytest.raises(ValueError, match="cannot merge dims"):
                    F.flatten(as_tensor(data), start_dim=start, end_dim=end)
                continue
            x = Tensor(data, requires_grad=True)
            got = nn.Flatten(start_dim=start, end_dim=end)(x)
            assert got.shape == expected.shape, (start, end)
            np.testing.assert_array_equal(got.data, expected)
            np.testing.assert_array_equal(x.flatten(start_dim=start, end_dim=end).data, expected)
            (got * as_tensor(np.arange(got.data.size).reshape(got.shape))).sum().backward()
            np.testing.assert_array_equal(x.grad, np.arange(data.size).reshape(data.shape))
    # The defaults, torch's: nn.Flatten from dim 1, Tensor.flatten from dim 0.
    assert nn.Flatten()(as_tensor(data)).shape == (2, 60)
    assert as_tensor(data).flatten().shape == (120,)
    assert as_tensor(data).flatten(1).shape == (2, 60)
    assert as_tensor(np.float64(3.0)).flatten().shape == (1,)
    assert repr(nn.Flatten(0, -2)) == "Flatten(start_dim=0, end_dim=-2)"
    with pytest.raises(TypeError):
        nn.Flatten(start_axis=1)   # the old names are gone: torch's only


# --------------------------------------------------------------------------
# float32 all the way and no graph under no_grad


def test_float32_in_float32_out_everywhere():
    x32 = randn(4, 2, 6, 6).astype(np.float32)
    weight = Tensor(randn(3, 2, 3, 3).astype(np.float32), requires_grad=True)
    bn_weight = Tensor(np.ones(3, np.float32), requires_grad=True)
    bn_bias = Tensor(np.zeros(3, np.float32), requires_grad=True)
    x = Tensor(x32, requires_grad=True)
    h = F.conv2d(x, weight, None, 1, 1)
    h = F.batch_norm(h, np.zeros(3, np.float32), np.ones(3, np.float32), bn_weight, bn_bias, True)
    h = F.max_pool2d(F.gelu(h), 2)
    h = F.avg_pool2d(F.relu(h), 3, 1, 1)
    h = F.dropout(F.flatten(h), 0.2, rng=0)
    loss = F.cross_entropy(h, np.arange(4) % h.shape[1]) + F.mse_loss(h, np.zeros(h.shape))
    assert loss.dtype == np.float32
    loss.backward()
    for tensor in (x, weight, bn_weight, bn_bias):
        assert tensor.grad.dtype == np.float32


def test_no_graph_is_recorded_under_no_grad():
    weight = Tensor(randn(3, 2, 3, 3), requires_grad=True)
    with no_grad():
        out = F.conv2d(as_tensor(randn(1, 2, 5, 5)), weight)
    assert not out.requires_grad and out._backward is None
