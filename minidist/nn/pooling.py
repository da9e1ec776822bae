"""MaxPool2d and AvgPool2d: downsampling by windows, one strided pass per kernel offset."""

from __future__ import annotations

from minidist.nn import functional as F
from minidist.nn.module import Module


class _Pool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = F._pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else F._pair(stride, "stride")
        self.padding = F._pair(padding, "padding", minimum=0)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool2d(_Pool2d):
    """``MaxPool2d(kernel_size, stride=None, padding=0)``: the maximum of each
    window; stride defaults to the kernel size (non-overlapping windows).

    Shapes: (N, C, H, W) -> (N, C, OH, OW), OH = floor((H + 2p - k) / s) + 1.
    The gradient of each window goes to its first maximum, as in PyTorch.
    Cost: KH*KW vectorised passes over the output forward, about three times
    that backward (see :func:`functional.max_pool2d`).
    """

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool2d):
    """``AvgPool2d(kernel_size, stride=None, padding=0)``: the mean of each
    window (zero padding counted, as PyTorch's default). Shapes as
    :class:`MaxPool2d`; cost KH*KW vectorised adds each way."""

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)
