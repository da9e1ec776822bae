"""Flatten: merge axes, typically (N, C, H, W) -> (N, C*H*W) between the
convolutional and the fully connected part of a network."""

from __future__ import annotations

from minidist.nn import functional as F
from minidist.nn.module import Module


class Flatten(Module):
    """``Flatten(start_axis=1, end_axis=-1)``: merge axes start..end into one
    (the batch axis 0 is kept by default). A reshape: free for contiguous input."""

    def __init__(self, start_axis: int = 1, end_axis: int = -1):
        super().__init__()
        self.start_axis = start_axis
        self.end_axis = end_axis

    def forward(self, x):
        return F.flatten(x, self.start_axis, self.end_axis)

    def extra_repr(self) -> str:
        return f"start_axis={self.start_axis}, end_axis={self.end_axis}"
