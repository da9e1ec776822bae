"""LayerNorm: normalise each sample over its last axes, then scale and shift
(Ba, Kiros and Hinton, 2016; torch's ``nn.LayerNorm``).

    y = (x - mean) / sqrt(var + eps) * weight + bias

with the mean and (biased) variance taken over the last
``len(normalized_shape)`` axes of each sample: in a transformer, over the
features of each token. Unlike BatchNorm nothing is shared across the batch
or the sequence, so a token's output does not depend on its neighbours,
training and evaluation compute the same thing, and there are no running
statistics: what lets transformers train with any batch size and split the
sequence across devices.

Cost: about 8 elementwise passes forward and 10 backward over the input,
one fused node (see :func:`functional.layer_norm`); 2 * normalized_shape
parameters.
"""

from __future__ import annotations

import numpy

from minidist import backend
from minidist.nn import functional as F
from minidist.nn import init
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter


class LayerNorm(Module):
    """``LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True,
    bias=True, dtype=float32)``, torch's arguments: ``normalized_shape`` an
    int or a tuple (the trailing axes normalised), ``weight`` ones and
    ``bias`` zeros of that shape (absent when ``elementwise_affine=False``;
    no bias when ``bias=False``)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, dtype=numpy.float32):
        super().__init__()
        if isinstance(normalized_shape, (int, numpy.integer)):
            normalized_shape = (int(normalized_shape),)
        self.normalized_shape = tuple(int(size) for size in normalized_shape)
        if not self.normalized_shape or min(self.normalized_shape) < 1:
            raise ValueError(f"LayerNorm needs positive sizes in normalized_shape, got {normalized_shape!r}")
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        xp = backend.get()
        if elementwise_affine:
            self.weight = Parameter(xp.empty(self.normalized_shape, dtype=dtype))
            if bias:
                self.bias = Parameter(xp.empty(self.normalized_shape, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """weight = 1, bias = 0: the layer starts as a plain normalisation."""
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
