"""MobileNet's depthwise separable convolution, and what it saves.

    from minidist import nn
    block = nn.DepthwiseSeparableConv2d(32, 64, stride=2)           # (N, 32, H, W) -> (N, 64, H/2, W/2)
    print(nn.mobile.compare_costs(32, 64, 3, 14, 14))             # multiply-adds and parameters, both ways

Howard et al. (2017), "MobileNets: Efficient Convolutional Neural Networks
for Mobile Vision Applications", factor a standard k x k convolution, which
filters and combines channels in one step, into two:

* a *depthwise* k x k convolution: one filter per input channel
  (``Conv2d(C_in, C_in, k, groups=C_in)``), filtering each channel alone;
* a *pointwise* 1 x 1 convolution (``Conv2d(C_in, C_out, 1)``), combining
  the channels at each pixel.

Each is followed by batch normalisation and a ReLU (their Figure 3), so the
convolutions carry no bias when batch norm is on.

Cost, for an output of H x W pixels (one image; multiply by the batch):

    standard:   k^2 C_in C_out H W                multiply-adds, k^2 C_in C_out weights
    separable:  k^2 C_in H W + C_in C_out H W     multiply-adds, k^2 C_in + C_in C_out weights

    separable / standard = 1 / C_out + 1 / k^2

so a 3 x 3 separable block does 8 to 9 times less arithmetic once C_out is
large. In MobileNet 95 % of the multiply-adds and 75 % of the parameters
end up in the 1 x 1 convolutions, plain GEMMs, which is why it runs well.
On a CPU with NumPy the measured time falls by less than the arithmetic
(``benchmarks/bench_mobile.py``): the depthwise half does k^2 multiply-adds
per loaded value, so it is memory bound, and its im2col copy and the small
per-(image, channel) matrix products cost as much as they compute.
"""

from __future__ import annotations

import numpy

from minidist.nn import functional as F
from minidist.nn.activation import Identity, ReLU
from minidist.nn.batchnorm import BatchNorm2d
from minidist.nn.conv import Conv2d
from minidist.nn.module import Module


def _square(kernel_size) -> int:
    kh, kw = F._pair(kernel_size, "kernel_size")
    return kh * kw


def conv2d_multiply_adds(in_channels: int, out_channels: int, kernel_size, out_h: int, out_w: int,
                         groups: int = 1) -> int:
    """Multiply-adds of one image through a (grouped) convolution:
    k^2 * (C_in / groups) * C_out * H_out * W_out."""
    F._check_groups(groups, in_channels, out_channels, "conv2d_multiply_adds")
    return _square(kernel_size) * (in_channels // groups) * out_channels * out_h * out_w


def conv2d_parameters(in_channels: int, out_channels: int, kernel_size, groups: int = 1,
                      bias: bool = False) -> int:
    """Weights of a (grouped) convolution: k^2 * (C_in / groups) * C_out, plus C_out biases."""
    F._check_groups(groups, in_channels, out_channels, "conv2d_parameters")
    return _square(kernel_size) * (in_channels // groups) * out_channels + (out_channels if bias else 0)


def separable_multiply_adds(in_channels: int, out_channels: int, kernel_size, out_h: int, out_w: int) -> int:
    """Multiply-adds of one image through a depthwise separable block:
    depthwise k^2 C_in H W + pointwise C_in C_out H W (H, W of the output)."""
    depthwise = conv2d_multiply_adds(in_channels, in_channels, kernel_size, out_h, out_w, groups=in_channels)
    pointwise = conv2d_multiply_adds(in_channels, out_channels, 1, out_h, out_w)
    return depthwise + pointwise


def separable_parameters(in_channels: int, out_channels: int, kernel_size, bias: bool = False) -> int:
    """Weights of a depthwise separable block: k^2 C_in + C_in C_out (plus
    C_in + C_out biases when ``bias``; batch norm's 2 (C_in + C_out) are not counted)."""
    return (conv2d_parameters(in_channels, in_channels, kernel_size, groups=in_channels, bias=bias)
            + conv2d_parameters(in_channels, out_channels, 1, bias=bias))


def compare_costs(in_channels: int, out_channels: int, kernel_size, out_h: int, out_w: int) -> dict:
    """Standard convolution against the separable block at one shape: both
    multiply-add counts and weight counts, their ratios, and the formula's
    ratio 1 / C_out + 1 / k^2 (which the counted ratio equals)."""
    standard = conv2d_multiply_adds(in_channels, out_channels, kernel_size, out_h, out_w)
    separable = separable_multiply_adds(in_channels, out_channels, kernel_size, out_h, out_w)
    standard_weights = conv2d_parameters(in_channels, out_channels, kernel_size)
    separable_weights = separable_parameters(in_channels, out_channels, kernel_size)
    return {
        "standard_multiply_adds": standard,
        "separable_multiply_adds": separable,
        "standard_parameters": standard_weights,
        "separable_parameters": separable_weights,
        "multiply_add_ratio": separable / standard,
        "parameter_ratio": separable_weights / standard_weights,
        "formula_ratio": 1 / out_channels + 1 / _square(kernel_size),
    }


class DepthwiseSeparableConv2d(Module):
    """``DepthwiseSeparableConv2d(in_channels, out_channels, kernel_size=3,
    stride=1, padding=None, batch_norm=True, rng=None, dtype=float32)``.

    MobileNet's block: depthwise k x k conv (``groups=in_channels``, the
    stride is taken here) -> BatchNorm2d -> ReLU -> pointwise 1x1 conv ->
    BatchNorm2d -> ReLU. ``padding=None`` keeps the size ("same" padding,
    k // 2) at stride 1. With ``batch_norm=False`` the two BatchNorms are left
    out and the convolutions get a bias instead. Input (N, C_in, H, W) ->
    output (N, C_out, OH, OW), OH = floor((H + 2 p - k) / stride) + 1.
    Submodules: ``depthwise``, ``depthwise_norm``, ``pointwise``,
    ``pointwise_norm`` (the norms are Identity without batch norm).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size=3, stride=1, padding=None,
                 batch_norm: bool = True, rng=None, dtype=numpy.float32):
        super().__init__()
        kh, kw = F._pair(kernel_size, "kernel_size")
        padding = (kh // 2, kw // 2) if padding is None else padding
        self.depthwise = Conv2d(in_channels, in_channels, (kh, kw), stride, padding, bias=not batch_norm,
                                rng=rng, dtype=dtype, groups=in_channels)
        self.depthwise_norm = BatchNorm2d(in_channels, dtype=dtype) if batch_norm else Identity()
        self.pointwise = Conv2d(in_channels, out_channels, 1, bias=not batch_norm, rng=rng, dtype=dtype)
        self.pointwise_norm = BatchNorm2d(out_channels, dtype=dtype) if batch_norm else Identity()
        self.relu = ReLU()
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.batch_norm = bool(batch_norm)

    def forward(self, x):
        x = self.relu(self.depthwise_norm(self.depthwise(x)))
        return self.relu(self.pointwise_norm(self.pointwise(x)))

    def multiply_adds(self, out_h: int, out_w: int) -> int:
        """Multiply-adds of the two convolutions for one image with an
        ``out_h`` x ``out_w`` output (batch norm and ReLU not counted)."""
        return separable_multiply_adds(self.in_channels, self.out_channels, self.depthwise.kernel_size,
                                       out_h, out_w)

    def extra_repr(self) -> str:
        return "" if self.batch_norm else "batch_norm=False"


__all__ = [
    "DepthwiseSeparableConv2d", "conv2d_multiply_adds", "conv2d_parameters",
    "separable_multiply_adds", "separable_parameters", "compare_costs",
]
