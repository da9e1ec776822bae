"""Embedding: a learned table of vectors, looked up by integer index (the
token embedding of a language model, torch's ``nn.Embedding``).

``Embedding(num_embeddings, embedding_dim)`` holds ``weight`` of shape
(num_embeddings, embedding_dim), drawn from N(0, 1) as torch does. Called on
integer indices of any shape, it returns the rows: shape
indices.shape + (embedding_dim,). It is a Linear layer applied to one-hot
vectors, without ever building them: the forward is a gather, the backward
adds each output row's gradient into the row it came from (an index seen
twice accumulates twice; see :func:`functional.embedding`).

Cost: no flops forward (a copy of len(indices) rows); backward a zero-filled
gradient the size of the table plus a scatter-add, whatever the number of
indices. Weight tying (``lm_head.weight = embedding.weight``, as GPT-2)
shares this table with the output layer: one Parameter, two uses, and the
autograd adds both gradients into it.
"""

from __future__ import annotations

import numpy

from minidist import backend
from minidist.nn import functional as F
from minidist.nn import init
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter


class Embedding(Module):
    """``Embedding(num_embeddings, embedding_dim, padding_idx=None, rng=None,
    dtype=float32)``: ``weight`` (num_embeddings, embedding_dim) from
    N(0, 1), drawn from ``rng`` (a Generator or int seed) or the default
    generator of :mod:`minidist.nn.init`. ``padding_idx``, as torch: that
    row starts at zero and never receives a gradient (negative counts from
    the end)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 rng=None, dtype=numpy.float32):
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError(f"Embedding needs positive sizes, got num_embeddings={num_embeddings}, "
                             f"embedding_dim={embedding_dim}")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx={padding_idx} must be within num_embeddings="
                                 f"{num_embeddings} (from -{num_embeddings} to {num_embeddings - 1})")
            padding_idx = int(padding_idx) % num_embeddings
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.padding_idx = padding_idx
        self.weight = Parameter(backend.get().empty((num_embeddings, embedding_dim), dtype=dtype))
        self.reset_parameters(rng)

    def reset_parameters(self, rng=None):
        """Draw fresh rows from N(0, 1); the padding row (if any) is zero."""
        init.normal_(self.weight, 0.0, 1.0, rng=rng)
        if self.padding_idx is not None:
            self.weight.data[self.padding_idx] = 0

    def forward(self, input):
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        padding = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{padding}"
