"""Conv2d: 2-D convolution of a batch of images, by im2col and one GEMM."""

from __future__ import annotations

import math

import numpy

from minidist import backend
from minidist.nn import functional as F
from minidist.nn import init
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter


class Conv2d(Module):
    """``Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0,
    bias=True, rng=None, dtype=float32, groups=1)``.

    Shapes: input (N, C_in, H, W) -> output (N, C_out, OH, OW) with
    OH = floor((H + 2 * padding - kernel) / stride) + 1 (same for OW).
    ``weight`` is (C_out, C_in / groups, KH, KW), ``bias`` (C_out,).
    ``kernel_size``, ``stride`` and ``padding`` are ints or (h, w) pairs.

    ``groups`` splits the channels into independent blocks: output channels
    [g C_out/G, (g+1) C_out/G) see only input channels [g C_in/G, (g+1) C_in/G).
    ``groups=in_channels`` is a depthwise convolution (one KHxKW filter per
    channel, or ``out_channels / in_channels`` of them); both channel counts
    must be divisible by ``groups``. Parameters and multiply-adds fall G-fold.

    Algorithm: im2col, then (C_out, C_in*KH*KW) @ (C_in*KH*KW, N*OH*OW), see
    :mod:`minidist.nn.im2col`. Cost: 2 * C_out * C_in*KH*KW * N*OH*OW flops
    forward, twice that backward (one GEMM and the col2im less when the
    input needs no gradient, as for the first layer).

    Initialisation, as PyTorch: weight and bias from U(-1/sqrt(fan_in),
    1/sqrt(fan_in)), fan_in = C_in/groups*KH*KW, drawn from ``rng`` or the default
    generator of :mod:`minidist.nn.init`.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        bias: bool = True,
        rng=None,
        dtype=numpy.float32,
        groups: int = 1,
    ):
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError(
                f"Conv2d needs positive channel counts, got in_channels={in_channels}, out_channels={out_channels}"
            )
        self.groups = F._check_groups(groups, in_channels, out_channels, "Conv2d")
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = F._pair(kernel_size, "kernel_size")
        self.stride = F._pair(stride, "stride")
        self.padding = F._pair(padding, "padding", minimum=0)
        xp = backend.get()
        self.weight = Parameter(xp.empty((out_channels, in_channels // self.groups) + self.kernel_size, dtype=dtype))
        if bias:
            self.bias = Parameter(xp.empty((out_channels,), dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters(rng)

    def reset_parameters(self, rng=None):
        """Draw fresh weights (and bias) as described in the class docstring."""
        rng = init.as_generator(rng)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5), rng=rng)
        if self.bias is not None:
            fan_in, _ = init.calculate_fans(self.weight.shape)
            bound = 1.0 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound, rng=rng)

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.groups)

    def extra_repr(self) -> str:
        text = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        )
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text
