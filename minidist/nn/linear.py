"""Linear: the fully connected layer, y = x W^T + b."""

from __future__ import annotations

import math

import numpy

from minidist import backend
from minidist.nn import functional as F
from minidist.nn import init
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter


class Linear(Module):
    """``Linear(in_features, out_features, bias=True, rng=None, dtype=float32)``.

    Shapes: input (..., in_features) -> output (..., out_features).
    ``weight`` is (out_features, in_features) and ``bias`` (out_features,),
    PyTorch's layout, so state dicts and the row/column splits of tensor
    parallelism read the same as in PyTorch.

    Initialisation, as PyTorch: weight and bias from U(-1/sqrt(in_features),
    1/sqrt(in_features)) (``kaiming_uniform_`` with a=sqrt(5)), drawn from
    ``rng`` (a Generator or int seed) or the default generator of
    :mod:`minidist.nn.init`.

    Cost: 2 * batch * in * out flops forward, twice that backward (one GEMM
    less when the input needs no gradient). See :func:`functional.linear`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, rng=None, dtype=numpy.float32):
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear needs positive sizes, got in_features={in_features}, out_features={out_features}")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        xp = backend.get()
        self.weight = Parameter(xp.empty((out_features, in_features), dtype=dtype))
        if bias:
            self.bias = Parameter(xp.empty((out_features,), dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters(rng)

    def reset_parameters(self, rng=None):
        """Draw fresh weights (and bias) as described in the class docstring."""
        rng = init.as_generator(rng)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5), rng=rng)
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound, rng=rng)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
