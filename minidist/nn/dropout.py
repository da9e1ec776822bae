"""Dropout: randomly silence units while training, a regulariser."""

from __future__ import annotations

from minidist.nn import functional as F
from minidist.nn.module import Module


class Dropout(Module):
    """``Dropout(p=0.5, rng=None)``: in training mode, zero each element with
    probability ``p`` and scale the rest by 1 / (1 - p) (inverted dropout,
    so evaluation is the identity). Any shape.

    The masks come from ``rng`` (a Generator or an int seed, fixed at
    construction) or, when None, from the default generator of
    :mod:`minidist.nn.init` at each call, so ``nn.init.manual_seed`` makes a
    run reproducible. Cost: one random draw and two passes over the input.
    """

    def __init__(self, p: float = 0.5, rng=None):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout probability p must be in [0, 1], got {p}")
        self.p = float(p)
        self.rng = F.init.as_generator(rng) if rng is not None else None

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.rng)

    def extra_repr(self) -> str:
        return f"p={self.p}"
