"""Flatten: merge dims, typically (N, C, H, W) -> (N, C*H*W) between the
convolutional and the fully connected part of a network."""

from __future__ import annotations

from minidist.nn import functional as F
from minidist.nn.module import Module


class Flatten(Module):
    """``Flatten(start_dim=1, end_dim=-1)`` (torch's names and defaults): merge
    dims start_dim..end_dim into one, negative dims counting from the end (the
    batch dim 0 is kept by default). A reshape: free for contiguous input."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, x):
        return F.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
