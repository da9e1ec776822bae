"""The layers and losses as functions of Tensors: ``from minidist.nn import functional as F``.

Every function here computes its forward pass on the backend arrays and
records *one* graph node whose local backward is written out by hand next to
it (a fused node: ``linear`` is one node, not a matmul, a transpose and an
add). Fewer nodes means fewer temporaries and less Python per step, which is
what keeps a minidist training step close to a hand-written NumPy one. Each
backward computes a parent's gradient only if that parent requires one, so
the first layer never computes the gradient of the input images.

Conventions:

* Arrays stay in the dtype of the layer's weights: an input of another dtype
  is cast to it (float64 images into a float32 network are cast to float32,
  never the weights up), because float32 is twice as fast and PyTorch's
  default. Use ``model.to(numpy.float64)`` for float64 gradient checks.
* Image tensors are ``(N, C, H, W)``; ``stride``, ``padding`` and kernel
  sizes are an int or an ``(h, w)`` pair.
* Axes are called ``axis`` as in NumPy and :class:`minidist.Tensor`
  (PyTorch says ``dim``).
* Losses take ``reduction="mean"`` (default), ``"sum"`` or ``"none"``.
"""

from __future__ import annotations

import math

import numpy

from minidist import backend
from minidist.nn import conv_gemm_sizing, init
from minidist.nn.erf import erfc
from minidist.nn.im2col import (
    col2im_product,
    im2col,
    output_size,
    window,
)
from minidist.tensor import (
    Tensor,
    _owned_gradients,
    _shape_str,
    _split_by_requires_grad,
    _unbroadcast,
    distributed_call,
)

# --------------------------------------------------------------------------
# Helpers


def _tensor(value) -> Tensor:
    return value if isinstance(value, Tensor) else Tensor(value)


def _pair(value, name: str, minimum: int = 1) -> tuple[int, int]:
    if isinstance(value, (int, numpy.integer)) and not isinstance(value, bool):
        pair = (int(value), int(value))
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, (int, numpy.integer)) and not isinstance(v, bool) for v in value
    ):
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{name} must be an int or a pair of ints (h, w), got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def _in_dtype(array, dtype):
    """``array`` cast to the layer's dtype (see the module docstring)."""
    return array if array.dtype == dtype else array.astype(dtype)


def _check_images(x, function: str):
    if x.ndim != 4:
        hint = (
            "; for a single image add a batch axis, e.g. x.reshape(1, *x.shape)"
            if x.ndim == 3
            else "; for 28x28 grey images reshape to (N, 1, 28, 28)"
            if x.ndim == 2
            else ""
        )
        raise ValueError(
            f"{function} expects images of shape (N, C, H, W), got shape {_shape_str(x.shape)}{hint}"
        )


def _check_groups(groups, in_channels: int, out_channels: int, function: str) -> int:
    if not isinstance(groups, (int, numpy.integer)) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{function}: groups must be a positive int, got {groups!r}")
    groups = int(groups)
    if in_channels % groups or out_channels % groups:
        raise ValueError(
            f"{function}: groups={groups} must divide both in_channels={in_channels} and "
            f"out_channels={out_channels} (each group convolves in_channels // groups inputs into "
            f"out_channels // groups outputs); for a depthwise convolution use groups=in_channels "
            f"and out_channels a multiple of it"
        )
    return groups


def _check_reduction(reduction: str, function: str):
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{function}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _reduce(losses, reduction: str):
    """Per-sample losses reduced; a 0-d array for 'mean' and 'sum'."""
    xp = backend.of(losses)
    if reduction == "mean":
        return xp.asarray(losses.mean(), dtype=losses.dtype)
    if reduction == "sum":
        return xp.asarray(losses.sum(), dtype=losses.dtype)
    return losses


def _loss_scale(g, reduction: str, count: int):
    """The gradient arriving at each per-sample loss: g / count for 'mean',
    g itself for 'sum' (a scalar) and for 'none' (one value per sample)."""
    if reduction == "mean":
        return g / max(count, 1)
    return g


# --------------------------------------------------------------------------
# Activations


def relu(input) -> Tensor:
    """max(x, 0); the gradient passes where x > 0."""
    return _tensor(input).relu()


def sigmoid(input) -> Tensor:
    """1 / (1 + exp(-x)), computed without overflow; gradient s (1 - s)."""
    return _tensor(input).sigmoid()


def tanh(input) -> Tensor:
    """tanh(x); gradient 1 - tanh(x)^2."""
    return _tensor(input).tanh()


def softmax(input, axis: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis``, shifted by the max so it never overflows."""
    return _tensor(input).softmax(axis=axis)


def log_softmax(input, axis: int = -1) -> Tensor:
    """x - logsumexp(x) along ``axis``, computed stably."""
    return _tensor(input).log_softmax(axis=axis)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def gelu(input, approximate: str = "none") -> Tensor:
    """Gaussian Error Linear Unit: x * Phi(x), Phi the standard normal CDF
    (torch's ``F.gelu``).

    ``approximate="none"`` (the default, as in PyTorch) uses
    Phi(x) = erfc(-x / sqrt 2) / 2 with the double-precision erfc of
    :mod:`minidist.nn.erf` (erfc rather than 1 + erf, so that Phi keeps its
    digits for very negative x); the gradient is Phi(x) + x * phi(x), phi the
    normal density. Cost: the erfc's ~60 passes forward (~35 for float32, whose
    erfc takes the one-formula path of :mod:`minidist.nn.erf`), one exp backward.
    ``approximate="tanh"`` uses the approximation of GPT-2,
    Phi(x) ~ (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2, differentiated
    exactly: a handful of passes.
    """
    input = _tensor(input)
    if input._is_distributed:
        return distributed_call("gelu", input, approximate)
    x = input.data
    xp = backend.of(x)
    if approximate == "none":
        cdf = erfc(x * -_INV_SQRT_2)
        cdf *= 0.5
        out = x * cdf

        def backward(g):
            return (g * (cdf + x * (_INV_SQRT_2PI * xp.exp(-0.5 * x * x))),)

    elif approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        th = xp.tanh(inner)
        out = 0.5 * x * (1.0 + th)

        def backward(g):
            d_inner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
            return (g * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * d_inner),)

    else:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Tensor._make(out.astype(x.dtype, copy=False), (input,), backward, "gelu")


# --------------------------------------------------------------------------
# Linear


def linear(input, weight, bias=None) -> Tensor:
    """y = x W^T + b, with W of shape (out_features, in_features) as in PyTorch.

    ``x`` is (..., in_features). Forward is one GEMM and an in-place bias
    add: 2 * batch * in * out flops. Backward: grad_x = g W (a GEMM, skipped
    when x needs no gradient), grad_W = g^T x (a GEMM), grad_b = sum of g
    over the batch. BLAS reads the transposed operands in place; nothing is
    copied.
    """
    input = _tensor(input)
    if weight._is_distributed:   # one look-up; a DTensor input with a plain weight is refused below
        return distributed_call("linear", input, weight, bias)
    x, w = input.data, weight.data
    if x.ndim == 0 or x.shape[-1] != w.shape[1]:
        raise ValueError(
            f"linear: the input's last axis has {x.shape[-1] if x.ndim else 0} features "
            f"(input shape {_shape_str(x.shape)}) but the weight {_shape_str(w.shape)} expects "
            f"in_features={w.shape[1]}; flatten the input to (batch, {w.shape[1]}) "
            f"(e.g. with nn.Flatten()), or build the layer as Linear({x.shape[-1] if x.ndim else '?'}, {w.shape[0]})"
        )
    x = _in_dtype(x, w.dtype)
    if x.ndim > 2 and x.flags.c_contiguous:
        # (B, T, in) as one (B*T, in) GEMM rather than B GEMMs of T rows:
        # BLAS runs a tall product faster (a transformer's every Linear).
        out = (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])
    else:
        out = x @ w.T
    if bias is not None:
        out += bias.data

    @_owned_gradients()  # new arrays: ReLU may mask them in place
    @_split_by_requires_grad  # grad_W = g^T x is the GEMM a split backward defers
    def backward(g):
        g2 = g.reshape(-1, g.shape[-1])  # one tall GEMM for each product, as forward
        grad_x = (g2 @ w).reshape(*g.shape[:-1], w.shape[1]) if input.requires_grad else None
        grad_w = grad_b = None
        if weight.requires_grad or (bias is not None and bias.requires_grad):
            if weight.requires_grad:
                grad_w = g2.T @ x.reshape(-1, x.shape[-1])
            if bias is not None and bias.requires_grad:
                grad_b = g2.sum(axis=0)
        return (grad_x, grad_w) if bias is None else (grad_x, grad_w, grad_b)

    parents = (input, weight) if bias is None else (input, weight, bias)
    return Tensor._make(out, parents, backward, "linear")


# --------------------------------------------------------------------------
# Convolution


def _conv_geometry(x, w, stride, padding, groups):
    """conv2d's arguments checked: ``(groups, (sh, sw), (ph, pw), (out_h, out_w))``."""
    _check_images(x, "conv2d")
    if w.ndim != 4:
        raise ValueError(f"conv2d: weight must be (out_channels, in_channels, kh, kw), got {_shape_str(w.shape)}")
    n, c, h, width = x.shape
    oc, wc, kh, kw = w.shape
    groups = _check_groups(groups, c, oc, "conv2d")
    if groups > 1 and c != wc * groups:
        raise ValueError(
            f"conv2d: the input has {c} channels (shape {_shape_str(x.shape)}) but the weight "
            f"{_shape_str(w.shape)} with groups={groups} expects in_channels = {wc} * {groups} = "
            f"{wc * groups}; a grouped weight is (out_channels, in_channels // groups, kh, kw)"
        )
    if groups == 1 and c != wc:
        raise ValueError(
            f"conv2d: the input has {c} channels (shape {_shape_str(x.shape)}) but the weight "
            f"{_shape_str(w.shape)} expects in_channels={wc}; build the layer as Conv2d({c}, {oc}, ...) "
            "or check the previous layer's out_channels"
        )
    sh, sw = _pair(stride, "stride")
    ph, pw = _pair(padding, "padding", minimum=0)
    out_h, out_w = output_size(h, kh, sh, ph), output_size(width, kw, sw, pw)
    if out_h < 1 or out_w < 1:
        raise ValueError(
            f"conv2d: a {kh}x{kw} kernel does not fit in the {h}x{width} input padded by "
            f"({ph}, {pw}); use more padding or a smaller kernel"
        )
    return groups, (sh, sw), (ph, pw), (out_h, out_w)


def conv2d(input, weight, bias=None, stride=1, padding=0, groups: int = 1) -> Tensor:
    """2-D cross-correlation (what deep learning calls convolution).

    ``input`` (N, C, H, W), ``weight`` (OC, C/groups, KH, KW), ``bias`` (OC,)
    or None; output (N, OC, OH, OW) with OH = floor((H + 2 ph - KH) / sh) + 1.

    Algorithm (see :mod:`minidist.nn.im2col`): build the columns
    (C*KH*KW, N*OH*OW) with KH*KW strided copies, then multiply
    ``W (OC, C*KH*KW) @ columns``, as one GEMM per image that reads its
    block of the columns in place and writes (N, OC, OH, OW) directly.
    Cost: 2 * OC * C*KH*KW * N*OH*OW flops, and the columns (KH*KW times the
    input for stride 1) are kept for the weight gradient.

    Without groups, the bias rides in the GEMM (a row of ones under the
    columns, the bias as one more weight column): no separate pass adds it.

    Backward: grad_W = g (OC, N*OH*OW) @ columns^T (per image, one batched
    matmul, or one GEMM over the batch on OpenBLAS's packed kernels:
    :mod:`minidist.nn.conv_gemm_sizing`; its extra column is grad_b = the
    sum of g), and, only if the
    input needs it, col2im(W^T @ g) in cache-sized pieces
    (:func:`minidist.nn.im2col.col2im_product`).

    Groups (``groups`` = G, as in PyTorch and AlexNet's two-GPU split): the
    channels are cut into G blocks and output block g is the convolution of
    input block g alone, with weights (OC/G, C/G, KH, KW). The columns are
    the same im2col; their rows are ordered (c, i, j), so group g's rows are
    the contiguous slab [g C/G KH KW, (g+1) C/G KH KW). Every GEMM above
    becomes G independent ones, done as one batched matmul over a group
    axis: (G, OC/G, C/G*KH*KW) @ (G, C/G*KH*KW, N*OH*OW). Cost falls G-fold,
    to 2 * OC * C/G*KH*KW * N*OH*OW flops. Depthwise convolution is
    ``groups=C`` (one filter per channel, MobileNet's first half); a 1x1
    convolution with ``groups=1`` is its pointwise second half.
    """
    input = _tensor(input)
    x, w = input.data, weight.data
    groups, (sh, sw), (ph, pw), (out_h, out_w) = _conv_geometry(x, w, stride, padding, groups)
    n, c, h, width = x.shape
    oc, wc, kh, kw = w.shape
    x = _in_dtype(x, w.dtype)
    rows = wc * kh * kw  # rows of the columns one group reads
    pixels = out_h * out_w
    # Without groups, the bias rides in the GEMM: a row of ones under the
    # columns, the bias as one more column of the weight (saves a pass over
    # the output forward and one backward; see im2col's ``ones_row``).
    folded = groups == 1 and bias is not None
    columns = im2col(x, kh, kw, sh, sw, ph, pw, ones_row=folded)
    if groups == 1:
        w2 = w.reshape(oc, rows)
        if folded:
            w2 = backend.of(w).concatenate([w2, bias.data.reshape(oc, 1).astype(w.dtype, copy=False)], axis=1)
        # One GEMM per image, each reading its (C*KH*KW, OH*OW) block of the
        # columns in place (BLAS takes the row stride), so the result lands in
        # (N, OC, OH*OW) order without a transposing copy.
        out = w2 @ columns.reshape(w2.shape[1], n, pixels).transpose(1, 0, 2)
    else:
        w2 = w.reshape(groups, oc // groups, rows)
        # (N, G, C/G*KH*KW, OH*OW) views of the columns, one GEMM per (image,
        # group) in a single batched matmul: the result is (N, G, OC/G, OH*OW),
        # which is already (N, OC, OH, OW) order.
        out = w2 @ columns.reshape(groups, rows, n, pixels).transpose(2, 0, 1, 3)
        # NumPy may hand back a strided result when OC/G is 1 (depthwise).
        out = backend.of(out).ascontiguousarray(out).reshape(n, oc, pixels)
    if bias is not None and not folded:
        out += bias.data[:, None]
    out = out.reshape(n, oc, out_h, out_w)

    xp = backend.of(x)

    @_owned_gradients()  # new arrays: ReLU may mask them in place
    # grad_W, a GEMM over the columns, is what a split backward defers; the
    # folded bias's gradient comes out of the same GEMM, both parameters.
    @_split_by_requires_grad
    def backward(g):
        grad_x = grad_w = grad_b = None
        by_channel = g.transpose(1, 0, 2, 3)  # (OC, N, OH, OW), a view
        one_gemm = groups == 1 and conv_gemm_sizing.weight_gradient_in_one_gemm(xp)
        if one_gemm and (weight.requires_grad or input.requires_grad):
            # g copied channel-major (OC, N*OH*OW) for the weight's one GEMM;
            # col2im reads the same copy, also when the weight needs no
            # gradient, so that the input's gradient is the same bits either
            # way (a split backward computes it with the weight left out).
            by_channel = xp.ascontiguousarray(by_channel)
        if weight.requires_grad and one_gemm:
            # One GEMM summing over every image and pixel, columns @ g^T:
            # what OpenBLAS's packed kernels run fastest (conv_gemm_sizing).
            product = (columns @ by_channel.reshape(oc, n * pixels).T).T  # (OC, C*KH*KW [+ 1 for the bias])
        elif weight.requires_grad and groups == 1:
            # Per image, columns (C*KH*KW [+1], OH*OW) @ g (OH*OW, OC), all N
            # in one batched matmul, then summed over the images: the
            # columns are read in place, and so is g, in its own
            # (N, OC, OH*OW) layout (copied first only where the BLAS kernel
            # wants it: conv_gemm_sizing).
            per_pixel = conv_gemm_sizing.weight_gradient_operand(
                xp, g.reshape(n, oc, pixels).transpose(0, 2, 1), oc * columns.shape[0])
            per_image = columns.reshape(columns.shape[0], n, pixels).transpose(1, 0, 2) @ per_pixel
            product = per_image.sum(axis=0).T
        if weight.requires_grad and groups == 1:
            grad_w = xp.ascontiguousarray(product[:, :rows]).reshape(w.shape)
            if folded and bias.requires_grad:
                grad_b = xp.ascontiguousarray(product[:, rows])
        elif weight.requires_grad:
            # Computed transposed, columns @ g^T per group, then turned back
            # (a weight-sized copy): OpenBLAS runs this orientation of the
            # long-K product faster (bench_training_step, grouped convolutions).
            grouped_columns = columns.reshape(groups, rows, n * pixels)
            grouped_g = by_channel.reshape(groups, oc // groups, n * pixels)
            grad_w = xp.ascontiguousarray((grouped_columns @ grouped_g.transpose(0, 2, 1)).transpose(0, 2, 1)).reshape(w.shape)
        if bias is not None and bias.requires_grad and grad_b is None:
            grad_b = g.sum(axis=(0, 2, 3))
        if input.requires_grad:
            grad_x = col2im_product(w, by_channel, x.shape, kh, kw, sh, sw, ph, pw, groups)
        return (grad_x, grad_w) if bias is None else (grad_x, grad_w, grad_b)

    parents = (input, weight) if bias is None else (input, weight, bias)
    return Tensor._make(out, parents, backward, "conv2d")


# --------------------------------------------------------------------------
# Pooling


def _pool_geometry(x, kernel_size, stride, padding, function):
    _check_images(x, function)
    kh, kw = _pair(kernel_size, "kernel_size")
    sh, sw = (kh, kw) if stride is None else _pair(stride, "stride")
    ph, pw = _pair(padding, "padding", minimum=0)
    if ph > kh // 2 or pw > kw // 2:
        raise ValueError(
            f"{function}: padding ({ph}, {pw}) must be at most half the kernel ({kh}, {kw}), "
            "or some windows would hold only padding"
        )
    n, c, h, w = x.shape
    out_h, out_w = output_size(h, kh, sh, ph), output_size(w, kw, sw, pw)
    if out_h < 1 or out_w < 1:
        raise ValueError(
            f"{function}: a {kh}x{kw} window does not fit in the {h}x{w} input "
            f"(shape {_shape_str(x.shape)}); use a smaller kernel_size"
        )
    return (kh, kw), (sh, sw), (ph, pw), (out_h, out_w)


def _pad_images(x, ph, pw, value):
    if ph == 0 and pw == 0:
        return x
    xp = backend.of(x)
    n, c, h, w = x.shape
    padded = xp.full((n, c, h + 2 * ph, w + 2 * pw), value, dtype=x.dtype)
    padded[:, :, ph : ph + h, pw : pw + w] = x
    return padded


def _unpad_images(padded, ph, pw, shape):
    if ph == 0 and pw == 0:
        return padded
    return padded[:, :, ph : ph + shape[2], pw : pw + shape[3]]


def _along(array, axis: int, start: int, count: int, stride: int):
    """The view of ``count`` entries of ``array`` along ``axis``, from
    ``start`` every ``stride``: what window offset ``start`` sees in each of
    ``count`` windows."""
    index = [slice(None)] * array.ndim
    index[axis] = slice(start, start + stride * (count - 1) + 1, stride)
    return array[tuple(index)]


def _max_along(x, kernel: int, stride: int, count: int, axis: int):
    """1-D max pooling along one axis: ``kernel - 1`` vectorised maximums."""
    xp = backend.of(x)
    if kernel == 1:
        return _along(x, axis, 0, count, stride).copy()
    out = xp.maximum(_along(x, axis, 0, count, stride), _along(x, axis, 1, count, stride))
    for offset in range(2, kernel):
        xp.maximum(out, _along(x, axis, offset, count, stride), out=out)
    return out


def _max_along_backward(x, out, g, kernel: int, stride: int, count: int, axis: int):
    """Route each window's gradient to its first maximum along ``axis``:
    walking the offsets in order, the gradient not yet routed goes where the
    input equals the window's maximum, and is removed from what is left.

    What is left is updated by subtraction, ``remaining - taken`` (exact:
    ``r - r = 0`` and ``r - 0 = r`` for finite r), so an offset costs one
    comparison, one product and one subtraction; when the windows tile the
    axis, the next-to-last offset's subtraction writes the last offset's
    gradient in place. Three passes instead of five for a 2-wide window (the
    earlier mask-negation form made two more)."""
    xp = backend.of(x)
    # Windows that tile the axis exactly cover each entry once: the result
    # can be written without zero-filling and adding.
    tiles = stride == kernel and count * kernel == x.shape[axis]
    grad = xp.empty_like(x) if tiles else xp.zeros_like(x)
    remaining = g  # never written in place: g may be shared with another node
    for offset in range(kernel):
        target = _along(grad, axis, offset, count, stride)
        if offset == kernel - 1:
            if tiles:
                target[...] = remaining
            else:
                target += remaining
            break
        hit = _along(x, axis, offset, count, stride) == out
        if tiles:
            taken = xp.multiply(remaining, hit, out=target)
        else:
            taken = remaining * hit
            target += taken
        if tiles and offset == kernel - 2:
            xp.subtract(remaining, taken, out=_along(grad, axis, kernel - 1, count, stride))
            break
        remaining = remaining - taken if remaining is g else xp.subtract(remaining, taken, out=remaining)
    return grad


def max_pool2d(input, kernel_size, stride=None, padding=0) -> Tensor:
    """The maximum of every KH x KW window (stride defaults to the kernel
    size; padding adds -inf borders). (N, C, H, W) -> (N, C, OH, OW).

    Algorithm: the maximum over a rectangle is the maximum over its rows of
    the maximum over its columns, so the pooling is done as two 1-D
    poolings: along W (N, C, H, W) -> (N, C, H, OW), then along H
    -> (N, C, OH, OW). Each is one vectorised ``maximum`` per kernel offset
    over the strided view that offset sees in every window: KW - 1 plus
    KH - 1 passes instead of KH*KW - 1. (Reshaping to (N, C, OH, KH, OW, KW)
    and reducing the two small axes, when kernel == stride, is far slower in
    NumPy: its reductions over tiny axes go element by element.)

    Backward routes each window's gradient to its *first* maximum in
    row-major order, as PyTorch does, and so never doubles a gradient at
    ties (common after a ReLU). The rule composes through the two passes:
    the H pass picks the first row holding the maximum, the W pass the first
    column of that row holding it. Cost: about three output-sized passes per
    kernel offset. Forward keeps the intermediate (N, C, H, OW) maximum.
    """
    input = _tensor(input)
    x = input.data
    (kh, kw), (sh, sw), (ph, pw), (out_h, out_w) = _pool_geometry(
        x, kernel_size, stride, padding, "max_pool2d"
    )
    padded = _pad_images(x, ph, pw, -numpy.inf)
    columns_max = _max_along(padded, kw, sw, out_w, axis=3)
    out = _max_along(columns_max, kh, sh, out_h, axis=2)

    @_owned_gradients()  # new arrays: ReLU may mask them in place
    def backward(g):
        grad_columns_max = _max_along_backward(columns_max, out, g, kh, sh, out_h, axis=2)
        grad = _max_along_backward(padded, columns_max, grad_columns_max, kw, sw, out_w, axis=3)
        return (_unpad_images(grad, ph, pw, x.shape),)

    return Tensor._make(out, (input,), backward, "max_pool2d")


def avg_pool2d(input, kernel_size, stride=None, padding=0) -> Tensor:
    """The mean of every KH x KW window (stride defaults to the kernel size;
    zero padding counts in the mean, PyTorch's ``count_include_pad=True``).

    Algorithm: KH*KW vectorised adds of the strided views, then one scaling.
    Backward: each window's gradient / (KH*KW) added to every pixel of the
    window, one strided add per offset.
    """
    input = _tensor(input)
    x = input.data
    (kh, kw), (sh, sw), (ph, pw), (out_h, out_w) = _pool_geometry(
        x, kernel_size, stride, padding, "avg_pool2d"
    )
    xp = backend.of(x)
    padded = _pad_images(x, ph, pw, 0)
    # Windows that tile the input exactly touch every pixel once: the
    # backward can then write its result without zero-filling and adding.
    tiles = (sh, sw) == (kh, kw) and out_h * kh == padded.shape[2] and out_w * kw == padded.shape[3]
    offsets = [(i, j) for i in range(kh) for j in range(kw)]
    out = window(padded, 0, 0, out_h, out_w, sh, sw).copy()
    for i, j in offsets[1:]:
        out += window(padded, i, j, out_h, out_w, sh, sw)
    out *= 1.0 / (kh * kw)

    @_owned_gradients()  # new arrays: ReLU may mask them in place
    def backward(g):
        share = g * (1.0 / (kh * kw))
        grad = xp.empty_like(padded) if tiles else xp.zeros_like(padded)
        for i, j in offsets:
            target = window(grad, i, j, out_h, out_w, sh, sw)
            if tiles:
                target[...] = share
            else:
                target += share
        return (_unpad_images(grad, ph, pw, x.shape),)

    return Tensor._make(out, (input,), backward, "avg_pool2d")


# --------------------------------------------------------------------------
# Normalisation


def batch_norm(
    input,
    running_mean=None,
    running_var=None,
    weight=None,
    bias=None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Batch normalisation over every axis but the channel axis 1.

    ``input`` is (N, C), (N, C, L) or (N, C, H, W); statistics are per
    channel, over the M = N*L (or N*H*W) values of that channel. Training::

        mean, var = batch mean and biased variance
        x_hat     = (x - mean) / sqrt(var + eps)
        y         = weight * x_hat + bias
        running   = (1 - momentum) * running + momentum * batch statistic

    (the running variance is updated with the *unbiased* variance,
    var * M / (M - 1), as in PyTorch). In evaluation (``training=False``) the
    running statistics replace the batch ones, and y is an affine function of
    x. ``running_mean``/``running_var`` (Tensors or arrays) are updated in
    place; with None they are neither used nor updated.

    Backward, in the standard closed form instead of through the graph of
    mean and var (one node, no saved intermediates but the centred input)::

        grad_bias   = sum(g)
        grad_weight = sum(g * x_hat)
        grad_x      = weight / sqrt(var + eps) *
                      (g - sum(g) / M - x_hat * sum(g * x_hat) / M)

    (sums per channel). Cost: about 4 passes over the input forward and 5
    backward.
    """
    input = _tensor(input)
    x = input.data
    if x.ndim < 2:
        raise ValueError(f"batch_norm expects (N, C, ...) input, got shape {_shape_str(x.shape)}")
    xp = backend.of(x)
    channels = x.shape[1]
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, channels) + (1,) * (x.ndim - 2)
    count = x.size // max(channels, 1)
    dtype = weight.data.dtype if weight is not None else x.dtype
    x = _in_dtype(x, dtype)
    w = weight.data if weight is not None else None
    b = bias.data if bias is not None else None
    rm = running_mean.data if isinstance(running_mean, Tensor) else running_mean
    rv = running_var.data if isinstance(running_var, Tensor) else running_var
    for name, param in (("weight", w), ("bias", b), ("running_mean", rm), ("running_var", rv)):
        if param is not None and param.shape != (channels,):
            raise ValueError(
                f"batch_norm: {name} has shape {_shape_str(param.shape)} but the input "
                f"{_shape_str(x.shape)} has {channels} channels on axis 1; build the layer with "
                f"num_features={channels}"
            )
    if weight is None and bias is not None:
        raise ValueError("batch_norm: a bias without a weight is not supported; pass both or neither")
    use_batch_stats = training or rm is None or rv is None

    if use_batch_stats:
        if count <= 1:
            raise ValueError(
                f"batch_norm in training mode needs more than one value per channel, got input "
                f"shape {_shape_str(x.shape)}; use a batch of 2 or more, or call model.eval()"
            )
        mean = x.mean(axis=axes)
        centred = x - mean.reshape(shape)
        var = (centred * centred).mean(axis=axes)
        inv_std = 1.0 / xp.sqrt(var + eps)
        if training and rm is not None and rv is not None:
            rm *= 1.0 - momentum
            rm += momentum * mean
            rv *= 1.0 - momentum
            rv += (momentum * count / (count - 1)) * var
    else:
        mean = rm.astype(dtype, copy=False)
        centred = None
        inv_std = 1.0 / xp.sqrt(rv.astype(dtype, copy=False) + eps)
    scale = inv_std if w is None else w * inv_std
    if use_batch_stats:
        out = centred * scale.reshape(shape)
    else:
        out = (x - mean.reshape(shape)) * scale.reshape(shape)
    if b is not None:
        out += b.reshape(shape)

    def backward(g):
        need_x = input.requires_grad
        need_w = weight is not None and weight.requires_grad
        need_b = bias is not None and bias.requires_grad
        # In training the input's gradient goes through the batch statistics
        # too, which is where the two per-channel sums come in.
        through_stats = need_x and use_batch_stats
        sum_g = g.sum(axis=axes) if need_b or through_stats else None
        sum_g_centred = None
        if need_w or through_stats:
            centred_x = centred if use_batch_stats else x - mean.reshape(shape)
            sum_g_centred = (g * centred_x).sum(axis=axes)
        grad_x = None
        if through_stats:
            # grad_x = g * scale + centred * k2 + k3, with per-channel k2, k3.
            k2 = -scale * inv_std * inv_std * sum_g_centred / count
            k3 = -scale * sum_g / count
            grad_x = g * scale.reshape(shape)
            grad_x += centred * k2.reshape(shape)
            grad_x += k3.reshape(shape)
        elif need_x:
            grad_x = g * scale.reshape(shape)
        grad_w = sum_g_centred * inv_std if need_w else None
        grad_b = sum_g if need_b else None
        return (grad_x, grad_w, grad_b)[: len(parents)]

    parents = tuple(p for p in (input, weight, bias) if p is not None)
    return Tensor._make(out, parents, backward, "batch_norm")


# --------------------------------------------------------------------------
# Embedding and layer normalisation


def _indices(input, function: str):
    """``input`` (a Tensor, an array, a list or an int) as an integer array."""
    indices = input.data if isinstance(input, Tensor) else input
    if isinstance(indices, (list, tuple, int, numpy.integer)):
        indices = numpy.asarray(indices)
    if not numpy.issubdtype(indices.dtype, numpy.integer):
        raise TypeError(
            f"{function}: indices must be integers, got dtype {indices.dtype}; convert them with "
            "indices.astype(numpy.int64) (token ids, not one-hot vectors or floats)"
        )
    return indices


def embedding(input, weight, padding_idx: int | None = None) -> Tensor:
    """Row lookup: ``weight[input]``, of shape input.shape + (embedding_dim,)
    (torch's ``F.embedding``). ``input`` holds integer indices in
    [0, num_embeddings) (a Tensor, an array or a list); it gets no gradient.

    Backward scatters the output's gradient back into the rows it came from
    with ``add.at``, so an index that occurs several times (the same token
    twice in a batch) accumulates all its gradients into one row. The row
    ``padding_idx`` (if given) receives no gradient, as in torch.
    Cost: a gather of len(input) rows forward; backward a zero-filled
    (num_embeddings, embedding_dim) gradient and a scatter-add of the rows.
    """
    if weight._is_distributed or getattr(input, "_is_distributed", False):
        return distributed_call("embedding", input, weight, padding_idx)
    w = weight.data
    if w.ndim != 2:
        raise ValueError(f"embedding: weight must be (num_embeddings, embedding_dim), got {_shape_str(w.shape)}")
    indices = _indices(input, "embedding")
    xp = backend.of(w)
    if backend.of(indices) is not xp:
        indices = xp.asarray(backend.to_numpy(indices))
    rows = w.shape[0]
    if indices.size:
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= rows:
            raise IndexError(
                f"embedding: index {low if low < 0 else high} is out of range for a table of "
                f"{rows} rows (valid indices are 0..{rows - 1}); check the tokenizer's vocabulary "
                f"size against Embedding(num_embeddings={rows}, ...)"
            )
    out = w[indices]

    def backward(g):
        grad_w = xp.zeros_like(w)
        xp.add.at(grad_w, indices.reshape(-1), g.reshape(-1, w.shape[1]))
        if padding_idx is not None:
            grad_w[padding_idx] = 0
        return (grad_w,)

    return Tensor._make(out, (weight,), backward, "embedding")


def _normalized_axes(x, normalized_shape, function: str) -> tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, (int, numpy.integer)) else tuple(normalized_shape)
    count = len(shape)
    if count == 0 or x.ndim < count or tuple(x.shape[x.ndim - count:]) != tuple(int(s) for s in shape):
        raise ValueError(
            f"{function}: normalized_shape {shape} must be the last axes of the input, whose shape "
            f"is {_shape_str(x.shape)}; for a (batch, length, features) input use "
            f"LayerNorm({x.shape[-1] if x.ndim else '?'})"
        )
    return tuple(range(x.ndim - count, x.ndim))


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """Layer normalisation (Ba et al., 2016; torch's ``F.layer_norm``): each
    sample is normalised over its last ``len(normalized_shape)`` axes,

        y = (x - mean) / sqrt(var + eps) * weight + bias,

    with the biased variance, then scaled and shifted elementwise by
    ``weight`` and ``bias`` (of shape ``normalized_shape``; either may be
    None). Unlike BatchNorm nothing is shared across the batch: training and
    evaluation compute the same thing, and there are no running statistics.

    One node. With x_hat = (x - mean) * rstd and gh = g * weight, the
    backward is the standard one: grad_weight = sum over the batch of
    g * x_hat, grad_bias = sum of g, and

        grad_x = rstd * (gh - mean(gh) - x_hat * mean(gh * x_hat)),

    the means over the normalised axes (the two terms remove what the mean
    and the variance depend on x). Cost: about 8 passes over the input
    forward and 10 backward; x_hat and rstd are kept.
    """
    input = _tensor(input)
    if input._is_distributed:   # a DTensor weight on a plain input is refused by the node maker
        return distributed_call("layer_norm", input, normalized_shape, weight, bias, eps)
    dtype = weight.data.dtype if weight is not None else input.data.dtype
    x = _in_dtype(input.data, dtype)
    axes = _normalized_axes(x, normalized_shape, "layer_norm")
    shape = x.shape[axes[0]:]
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and tuple(param.data.shape) != shape:
            raise ValueError(
                f"layer_norm: {name} has shape {_shape_str(param.data.shape)}, expected normalized_shape {shape}"
            )
    xp = backend.of(x)
    mean = x.mean(axis=axes, keepdims=True)
    x_hat = x - mean
    var = (x_hat * x_hat).mean(axis=axes, keepdims=True)
    rstd = 1.0 / xp.sqrt(var + eps)
    x_hat *= rstd
    out = x_hat * weight.data if weight is not None else x_hat.copy()
    if bias is not None:
        out += bias.data
    batch_axes = tuple(range(axes[0]))

    def backward(g):
        grad_x = grad_w = grad_b = None
        if weight is not None and weight.requires_grad:
            grad_w = (g * x_hat).sum(axis=batch_axes)
        if bias is not None and bias.requires_grad:
            grad_b = g.sum(axis=batch_axes)
        if input.requires_grad:
            gh = g * weight.data if weight is not None else g.copy()
            grad_x = gh - gh.mean(axis=axes, keepdims=True)
            grad_x -= x_hat * (gh * x_hat).mean(axis=axes, keepdims=True)
            grad_x *= rstd
        return (grad_x,) + tuple(grad for grad, param in ((grad_w, weight), (grad_b, bias))
                                 if param is not None)

    parents = tuple(p for p in (input, weight, bias) if p is not None)
    return Tensor._make(out, parents, backward, "layer_norm")


# --------------------------------------------------------------------------
# Attention


def _attention_mask(attn_mask, is_causal, target_len, source_len, dtype, xp, function):
    """``(allowed, additive, mask_tensor)``: a boolean array of the pairs
    that take part (or None), a float array to add to the scores (or None),
    and the mask as a Tensor when it needs a gradient."""
    if is_causal:
        if attn_mask is not None:
            raise ValueError(
                f"{function}: pass either attn_mask or is_causal=True, not both (is_causal is the "
                "lower-triangular boolean mask); fold the causal mask into attn_mask if you need both"
            )
        causal = xp.tril(xp.ones((target_len, source_len), dtype=bool))
        return causal, None, None
    if attn_mask is None:
        return None, None, None
    mask_tensor = attn_mask if isinstance(attn_mask, Tensor) and attn_mask.requires_grad else None
    mask = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
    if backend.of(mask) is not xp:
        mask = xp.asarray(backend.to_numpy(mask))
    if mask.dtype == bool:
        return mask, None, None
    if not numpy.issubdtype(mask.dtype, numpy.floating):
        raise TypeError(
            f"{function}: attn_mask must be boolean (True = take part, as torch) or floating "
            f"(added to the scores), got dtype {mask.dtype}; use mask.astype(bool)"
        )
    return None, _in_dtype(mask, dtype), mask_tensor


def _attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
               scale=None, rng=None, function: str = "scaled_dot_product_attention"):
    """Softmax attention as one node: ``(output Tensor, attention weights
    array)``; see :func:`scaled_dot_product_attention`. The weights (after
    dropout) are returned for ``MultiheadAttention(need_weights=True)``."""
    query, key, value = _tensor(query), _tensor(key), _tensor(value)
    q, k, v = query.data, key.data, value.data
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(f"{function}: query, key and value need at least 2 axes (..., length, features), got "
                         f"{_shape_str(q.shape)}, {_shape_str(k.shape)}, {_shape_str(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{function}: query, key and value must have one dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}; cast them (e.g. with .astype(numpy.float32))")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{function}: query (..., L, E) {_shape_str(q.shape)}, key (..., S, E) {_shape_str(k.shape)} "
            f"and value (..., S, Ev) {_shape_str(v.shape)} disagree: query and key need the same last "
            "axis E, key and value the same length S"
        )
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{function}: dropout_p must be in [0, 1], got {dropout_p}")
    xp = backend.of(q)
    target_len, source_len = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    allowed, additive, mask_tensor = _attention_mask(attn_mask, is_causal, target_len, source_len,
                                                     q.dtype, xp, function)

    scores = q @ xp.swapaxes(k, -1, -2)  # (..., L, S)
    scores *= scale
    if additive is not None:
        scores = scores + additive
    if allowed is not None:
        scores = xp.where(allowed, scores, -numpy.inf)
    # Softmax shifted by each row's maximum, so exp never overflows. A row in
    # which no key takes part (all -inf) gives zeros, as torch's CPU kernel
    # does, rather than 0/0.
    top = scores.max(axis=-1, keepdims=True)
    top[~xp.isfinite(top)] = 0
    weights = xp.exp(scores - top)
    total = weights.sum(axis=-1, keepdims=True)
    total[total == 0] = 1
    weights /= total
    del scores
    keep = None
    if dropout_p > 0.0:
        draws = init.as_generator(rng).random(weights.shape, dtype=numpy.float32)
        keep = xp.asarray(draws >= dropout_p).astype(q.dtype)
        keep *= 1.0 / (1.0 - dropout_p) if dropout_p < 1.0 else 0.0
        used = weights * keep
    else:
        used = weights
    out = used @ v

    def backward(g):
        grad_v = _unbroadcast(xp.swapaxes(used, -1, -2) @ g, v.shape) if value.requires_grad else None
        need_scores = query.requires_grad or key.requires_grad or mask_tensor is not None
        grad_q = grad_k = grad_mask = None
        if need_scores:
            grad_weights = g @ xp.swapaxes(v, -1, -2)  # (..., L, S)
            if keep is not None:
                grad_weights *= keep
                row = (grad_weights * weights).sum(axis=-1, keepdims=True)
            else:
                # sum_j dP_ij P_ij = sum_d g_id out_id: (L, D) work, not (L, S).
                row = (g * out).sum(axis=-1, keepdims=True)
            grad_weights -= row
            grad_weights *= weights  # the softmax's backward: P * (dP - rowsum(dP * P))
            if mask_tensor is not None:
                grad_mask = _unbroadcast(grad_weights, mask_tensor.shape)
            grad_weights *= scale
            if query.requires_grad:
                grad_q = _unbroadcast(grad_weights @ k, q.shape)
            if key.requires_grad:
                grad_k = _unbroadcast(xp.swapaxes(grad_weights, -1, -2) @ q, k.shape)
        grads = (grad_q, grad_k, grad_v)
        return grads + (grad_mask,) if mask_tensor is not None else grads

    parents = (query, key, value) + ((mask_tensor,) if mask_tensor is not None else ())
    return Tensor._make(out, parents, backward, "scaled_dot_product_attention"), used


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale=None, enable_gqa: bool = False,
                                 rng=None) -> Tensor:
    """softmax(Q K^T * scale + mask) V, torch's ``F.scaled_dot_product_attention``.

    ``query`` (..., L, E), ``key`` (..., S, E), ``value`` (..., S, Ev); the
    leading axes (usually batch and heads, (B, H, L, E)) broadcast as in
    matmul. ``scale`` defaults to 1/sqrt(E). ``attn_mask`` broadcasts to
    (..., L, S): boolean, True where a query may attend to a key (as torch;
    note that MultiheadAttention's masks mean the opposite), or floating,
    added to the scores (-inf forbids a pair). ``is_causal=True`` is the
    lower-triangular mask (query i sees keys 0..i), and cannot be combined
    with ``attn_mask``. A query row that may see no key at all gives zeros.
    ``dropout_p`` > 0 drops attention weights (scaling the rest by
    1/(1-dropout_p)) with a mask drawn from ``rng`` as :func:`dropout`
    draws it; torch's own draws cannot be reproduced. Pass
    ``dropout_p=0.0`` in evaluation, as with torch. ``enable_gqa=True``:
    key and value may have fewer heads (axis -3) than the query, a divisor
    of its number, each shared by a group of query heads (grouped-query
    attention, as torch).

    One node. Forward: S = Q K^T * scale (+ mask), P = softmax(S) along the
    keys (shifted by the row maximum), O = P V. Backward, from dO:
    dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)) (the softmax's
    backward, its row sum taken on (L, Ev) rather than (L, S)),
    dQ = dS K * scale, dK = dS^T Q * scale; a floating mask that requires a
    gradient gets dS. Every product is one batched matmul over the leading
    axes. Cost: 4 L S E flops forward (two GEMMs), 8 L S E backward, per
    leading index; the (L, S) weights P are kept, the memory that
    recomputation and flash attention avoid.
    """
    if enable_gqa:
        key, value = _share_key_value_heads(query, key, value)
    out, _ = _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, rng)
    return out


def _share_key_value_heads(query, key, value):
    """Grouped-query attention (``enable_gqa=True``, as torch): ``key`` and
    ``value`` have Hkv heads on axis -3, a divisor of the query's Hq, and
    key/value head j serves query heads j g .. j g + g - 1 (g = Hq / Hkv,
    torch's ``repeat_interleave``). Each is repeated g times along the heads
    (one node each: forward ``repeat``, backward the sum over each group), so
    a GQA model keeps g times fewer K, V heads, and so g times less K, V to
    store and to send, for the same attention arithmetic."""
    query, key, value = _tensor(query), _tensor(key), _tensor(value)
    if min(query.data.ndim, key.data.ndim, value.data.ndim) < 3:
        raise ValueError("scaled_dot_product_attention: enable_gqa=True needs the heads on axis -3 "
                         f"((..., H, L, E)), got query {_shape_str(query.shape)}, key "
                         f"{_shape_str(key.shape)}, value {_shape_str(value.shape)}")
    heads, kv_heads = query.data.shape[-3], key.data.shape[-3]
    if value.data.shape[-3] != kv_heads or heads % kv_heads:
        raise ValueError(
            f"scaled_dot_product_attention: enable_gqa=True shares each key/value head among "
            f"query heads, so key and value need one number of heads that divides the query's "
            f"{heads}; got key {kv_heads} and value {value.data.shape[-3]} heads")
    groups = heads // kv_heads
    if groups == 1:
        return key, value
    return _repeat_heads(key, groups), _repeat_heads(value, groups)


def _repeat_heads(tensor, groups: int) -> Tensor:
    """``tensor`` with each head (axis -3) repeated ``groups`` times in place
    (head j becomes heads j g .. j g + g - 1); backward: each group's sum."""
    a = tensor.data
    xp = backend.of(a)
    out = xp.repeat(a, groups, axis=-3)

    def backward(g):
        shape = a.shape[:-3] + (a.shape[-3], groups) + a.shape[-2:]
        return (g.reshape(shape).sum(axis=-3),)

    return Tensor._make(out, (tensor,), backward, "repeat_heads")


# --------------------------------------------------------------------------
# Dropout and shape


def dropout(input, p: float = 0.5, training: bool = True, rng=None) -> Tensor:
    """Inverted dropout: in training, zero each element with probability
    ``p`` and scale the survivors by 1 / (1 - p), so the expected value is
    unchanged and evaluation needs no rescaling; outside training, the
    identity. The mask is drawn from ``rng`` (see :mod:`minidist.nn.init`
    for the seeding convention; an int seed gives the same mask at every
    call) on the CPU and moved to the input's backend.
    Cost: one random draw and two passes over the input."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p must be in [0, 1], got {p}")
    input = _tensor(input)
    if not training or p == 0.0:
        return input
    if input._is_distributed:
        return distributed_call("dropout", input, p)
    x = input.data
    xp = backend.of(x)
    if p == 1.0:
        mask = xp.zeros_like(x)
    else:
        draws = init.as_generator(rng).random(x.shape, dtype=numpy.float32)
        mask = xp.asarray((draws >= p).astype(x.dtype))
        mask *= 1.0 / (1.0 - p)
    return Tensor._make(x * mask, (input,), lambda g: (g * mask,), "dropout")


def flatten(input, start_dim: int = 1, end_dim: int = -1) -> Tensor:
    """Merge dims ``start_dim..end_dim`` into one (torch's names; negative dims
    count from the end): (N, C, H, W) -> (N, C*H*W) by default, as
    ``nn.Flatten``. (``torch.flatten`` starts at dim 0: ``x.flatten()``.)
    A reshape: no copy for a contiguous input."""
    input = _tensor(input)
    shape = input.shape
    ndim = len(shape)
    if not (-ndim <= start_dim < ndim and -ndim <= end_dim < ndim) or start_dim % ndim > end_dim % ndim:
        raise ValueError(
            f"flatten: cannot merge dims {start_dim}..{end_dim} of a tensor of shape "
            f"{_shape_str(shape)}; a batch of N vectors is already flat (N, features)"
        )
    start, end = start_dim % ndim, end_dim % ndim
    merged = int(numpy.prod(shape[start : end + 1], dtype=numpy.int64))
    return input.reshape(shape[:start] + (merged,) + shape[end + 1 :])


# --------------------------------------------------------------------------
# Losses


def _class_labels(target, scores, function: str, ignore_index: int = -100):
    """``(scores as (M, classes), labels as (M,), the per-sample shape)``.

    The scores are (N, classes), (N, classes, d1, ...) with labels
    (N, d1, ...) (a class per position, as torch: the class axis is axis 1),
    or (classes,) with a 0-d label. The labels come as a Tensor, array, list
    or int, go to the scores' backend, and must be integer classes in
    [0, classes) or ``ignore_index``."""
    xp = backend.of(scores)
    labels = target.data if isinstance(target, Tensor) else target
    if isinstance(labels, (list, tuple, int, numpy.integer)):
        labels = numpy.asarray(labels)
    if backend.of(labels) is not xp:
        labels = xp.asarray(backend.to_numpy(labels))
    if scores.ndim == 0:
        raise ValueError(f"{function} expects scores of shape (batch, classes), got a 0-d array")
    if scores.ndim == 1:
        expected = ()
    else:
        expected = (scores.shape[0],) + tuple(scores.shape[2:])
    if tuple(labels.shape) != expected:
        if scores.ndim <= 2:
            raise ValueError(
                f"{function}: the scores have batch size {scores.shape[0]} (shape "
                f"{_shape_str(scores.shape)}) but the labels have shape {_shape_str(labels.shape)}; "
                f"pass one integer class label per row of scores, shape {_shape_str(expected)}"
            )
        raise ValueError(
            f"{function}: scores of shape {_shape_str(scores.shape)} are read as (batch, classes, d1, ...) "
            f"with the classes on axis 1, as torch, so the labels must have shape {_shape_str(expected)}, "
            f"got {_shape_str(labels.shape)}; for (batch, length, classes) logits flatten to "
            "(batch, classes) rows: logits.reshape(-1, classes) and labels.reshape(-1)"
        )
    if not numpy.issubdtype(labels.dtype, numpy.integer):
        raise TypeError(
            f"{function}: labels must be integer class indices, got dtype {labels.dtype}; convert "
            "them with labels.astype(numpy.int64) (probability targets are not supported)"
        )
    classes = scores.shape[0] if scores.ndim == 1 else scores.shape[1]
    counted = labels[labels != ignore_index]
    if counted.size:
        low, high = int(counted.min()), int(counted.max())
        if low < 0 or high >= classes:
            bad = low if low < 0 else high
            raise ValueError(
                f"{function}: label {bad} is out of range for scores with {classes} classes "
                f"(valid labels are 0..{classes - 1}, and ignore_index={ignore_index} for positions "
                "that count for nothing); check the labels, or give the last layer as many outputs "
                "as there are classes"
            )
    if scores.ndim == 1:
        rows = scores.reshape(1, classes)
    elif scores.ndim == 2:
        rows = scores
    else:
        rows = xp.moveaxis(scores, 1, -1).reshape(-1, classes)
    return rows, labels.reshape(-1), expected


def _class_gradient(grad_rows, scores):
    """The (M, classes) gradient back in the scores' layout."""
    if scores.ndim <= 2:
        return grad_rows.reshape(scores.shape)
    xp = backend.of(grad_rows)
    moved = grad_rows.reshape((scores.shape[0],) + scores.shape[2:] + (scores.shape[1],))
    return xp.moveaxis(moved, -1, 1)


def _reduce_counted(losses, reduction: str, count: int, shape):
    """Per-sample losses (ignored ones 0) reduced: 'mean' divides by the
    number counted (NaN when none is, as torch), 'none' keeps ``shape``."""
    xp = backend.of(losses)
    if reduction == "mean":
        total = losses.sum()
        return xp.asarray(total / count if count else numpy.nan, dtype=losses.dtype)
    if reduction == "sum":
        return xp.asarray(losses.sum(), dtype=losses.dtype)
    return losses.reshape(shape)


def _counted_scale(g, reduction: str, count: int):
    """The gradient arriving at each per-sample loss, as an (M, 1) column or
    a scalar (see :func:`_loss_scale`)."""
    if reduction == "none":
        return g.reshape(-1, 1)
    return g / max(count, 1) if reduction == "mean" else g


def cross_entropy(input, target, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """Cross-entropy of logits ``input`` (N, classes) against integer class
    labels ``target`` (N,) (a Tensor, an array or a list):
    loss_i = logsumexp(z_i) - z_i[y_i], averaged over the batch by default
    (torch's ``F.cross_entropy``; ``reduction`` is the third argument here,
    so pass torch's others by name). Also, as torch: logits
    (N, classes, d1, ...) with labels (N, d1, ...) (the class axis is 1), and
    (classes,) with one label.

    A label equal to ``ignore_index`` (-100, torch's default) counts for
    nothing: its loss is 0, its logits get no gradient, and the mean divides
    by the number of labels that are not ignored (NaN if all are, as torch).
    Padding and the positions a language model must not predict use it.

    Fused log-softmax and negative log-likelihood, one node: the forward
    shifts each row by its maximum so exp never overflows, and the backward
    is the famous (softmax(z) - onehot(y)) / count, computed from the saved
    exponentials without building a one-hot matrix. Cost: a few passes over
    the logits (plus one transposing copy for (N, classes, d1, ...)).
    """
    _check_reduction(reduction, "cross_entropy")
    input = _tensor(input)
    if input._is_distributed:
        return distributed_call("cross_entropy", input, target, reduction, ignore_index)
    scores = input.data
    z, labels, shape = _class_labels(target, scores, "cross_entropy", ignore_index)
    xp = backend.of(z)
    rows = xp.arange(z.shape[0])
    counted = labels != ignore_index
    all_counted = bool(counted.all())
    picked = labels if all_counted else xp.where(counted, labels, 0)
    count = int(counted.sum())
    shifted = z - z.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    sum_exp = exp.sum(axis=1)
    losses = xp.log(sum_exp) - shifted[rows, picked]
    if not all_counted:
        losses[~counted] = 0
    out = _reduce_counted(losses, reduction, count, shape)

    def backward(g):
        grad = exp / sum_exp[:, None]
        grad[rows, picked] -= 1
        if not all_counted:
            grad[~counted] = 0
        grad *= _counted_scale(g, reduction, count)
        return (_class_gradient(grad, scores),)

    return Tensor._make(out, (input,), backward, "cross_entropy")


def nll_loss(input, target, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """Negative log-likelihood of log-probabilities ``input`` (N, classes):
    loss_i = -input[i, y_i]; shapes and ``ignore_index`` as
    :func:`cross_entropy`. ``cross_entropy(z, y)`` equals
    ``nll_loss(log_softmax(z, axis=1), y)``, in one fused node."""
    _check_reduction(reduction, "nll_loss")
    input = _tensor(input)
    scores = input.data
    z, labels, shape = _class_labels(target, scores, "nll_loss", ignore_index)
    xp = backend.of(z)
    rows = xp.arange(z.shape[0])
    counted = labels != ignore_index
    picked = xp.where(counted, labels, 0)
    count = int(counted.sum())
    losses = -z[rows, picked]
    losses[~counted] = 0
    out = _reduce_counted(losses, reduction, count, shape)

    def backward(g):
        grad = xp.zeros_like(z)
        scale = -_counted_scale(g, reduction, count)
        grad[rows, picked] = scale[:, 0] if reduction == "none" else scale
        grad[~counted] = 0
        return (_class_gradient(grad, scores),)

    return Tensor._make(out, (input,), backward, "nll_loss")


def mse_loss(input, target, reduction: str = "mean") -> Tensor:
    """Mean squared error: mean((input - target)^2) over all elements by
    default. The shapes must be equal (broadcasting a (N, 1) prediction
    against (N,) targets is a classic silent bug). ``target`` may require a
    gradient too. Backward: 2 (input - target) / count."""
    _check_reduction(reduction, "mse_loss")
    input = _tensor(input)
    target_is_tensor = isinstance(target, Tensor)
    target = target if target_is_tensor else Tensor(target)
    a = input.data
    b = target.data
    if a.shape != b.shape:
        raise ValueError(
            f"mse_loss: input shape {_shape_str(a.shape)} and target shape {_shape_str(b.shape)} "
            "differ; reshape one of them (e.g. prediction.reshape(-1) for (N, 1) against (N,))"
        )
    if not target.requires_grad:
        b = _in_dtype(b, a.dtype)
    diff = a - b
    out = _reduce(diff * diff, reduction)
    count = diff.size

    def backward(g):
        grad = diff * (2 * _loss_scale(g, reduction, count))
        return (grad if input.requires_grad else None, -grad if target.requires_grad else None)

    return Tensor._make(out, (input, target), backward, "mse_loss")


__all__ = [
    "relu", "sigmoid", "tanh", "gelu", "softmax", "log_softmax", "linear", "conv2d",
    "max_pool2d", "avg_pool2d", "batch_norm", "dropout", "flatten", "cross_entropy",
    "nll_loss", "mse_loss", "embedding", "layer_norm", "scaled_dot_product_attention",
]
