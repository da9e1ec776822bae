"""Activation layers: elementwise nonlinearities (and softmax along an axis)
as Modules, for use in Sequential. Each calls :mod:`minidist.nn.functional`;
none has parameters. Cost: a few elementwise passes each way."""

from __future__ import annotations

from minidist.nn import functional as F
from minidist.nn.module import Module


class ReLU(Module):
    """max(x, 0)."""

    def forward(self, x):
        return F.relu(x)


class Tanh(Module):
    """tanh(x)."""

    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    """1 / (1 + exp(-x))."""

    def forward(self, x):
        return F.sigmoid(x)


class GELU(Module):
    """``GELU(approximate="none")``, torch's ``nn.GELU``: x * Phi(x), Phi the
    standard normal CDF, exact by default (a double-precision erfc, see
    :mod:`minidist.nn.erf`; some 60 elementwise passes forward),
    ``approximate="tanh"`` for GPT-2's tanh approximation (a handful). See
    :func:`functional.gelu`."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softmax(Module):
    """Softmax along ``axis`` (default the last)."""

    def __init__(self, axis: int = -1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        return F.softmax(x, self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"


class LogSoftmax(Module):
    """Log-softmax along ``axis`` (default the last); pair it with NLLLoss."""

    def __init__(self, axis: int = -1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        return F.log_softmax(x, self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"


class Identity(Module):
    """Returns its input: a placeholder layer (e.g. a skipped block)."""

    def forward(self, x):
        return x
