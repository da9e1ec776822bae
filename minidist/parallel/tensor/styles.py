"""The plan's styles: how one module is split (torch's ``ParallelStyle``s).

torch's meaning, on n ranks (torch states layouts as DTensor placements;
minidist's split modules hold plain shards and communicate in forward and
backward themselves, so only torch's defaults exist here, no layout
arguments):

==================  =========================  ============================  ======================
style               nn.Linear weight (out,in)  input -> output               messages (fwd / bwd)
==================  =========================  ============================  ======================
ColwiseParallel     rows (dim 0), bias too     replicated -> sharded (-1)    none / all_reduce dX
RowwiseParallel     columns (dim 1), bias      sharded (-1) -> replicated    all_reduce Y / none
                    replicated
==================  =========================  ============================  ======================

On an ``nn.Embedding`` (V, C): ``RowwiseParallel`` shards the vocabulary
(dim 0; masked lookup, all_reduce: a
:class:`~minidist.parallel.tensor.vocab.VocabParallelEmbedding`, any V)
and ``ColwiseParallel`` the embedding dimension (dim 1; each rank looks up
its C/n columns, output sharded on the last axis, no message).

A fused projection (the GPT's ``c_attn``, q, k and v rows one after the
other) cannot be split as one block of rows: rank 0 would get all of q and
some of k. :class:`PackedColwiseParallel` (the name of Hugging Face
transformers' style for packed weights; torch has none, and torch users
keep q, k, v apart, as Llama's ``wq``, ``wk``, ``wv``) splits each of the
``pieces`` blocks of rows and takes its share of every one.
"""

from __future__ import annotations

import abc

from minidist.nn import functional as F
from minidist.nn.embedding import Embedding
from minidist.nn.linear import Linear
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter
from minidist.parallel.tensor.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    _split_size,
    packed_rows,
)
from minidist.parallel.tensor.regions import DEFAULT_ALGORITHM
from minidist.parallel.tensor.vocab import VocabParallelEmbedding


class ParallelStyle(abc.ABC):
    """A way to split one module: :meth:`apply` returns the module that
    replaces it on this rank (an abstract class, as torch's)."""

    @abc.abstractmethod
    def apply(self, module: Module, group) -> Module:
        """The module that stands for ``module`` on this rank of ``group``."""

    def _refuse(self, module):
        return TypeError(f"{type(self).__name__} splits an nn.Linear or an nn.Embedding, got "
                         f"{type(module).__name__}; put the style on its Linear submodules "
                         f"(the plan's keys are their names, e.g. 'mlp.c_fc')")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _ColwiseEmbedding(Module):
    """An embedding's columns C/n of every row: output (..., C/n), no message."""

    def __init__(self, embedding: Embedding, group):
        super().__init__()
        rank, world, width = _split_size("ColwiseParallel on an Embedding", "embedding_dim",
                                         embedding.weight.data.shape[1], group)
        self.shard = slice(rank * width, (rank + 1) * width)
        self.weight = Parameter(embedding.weight.data[:, self.shard].copy())

    def forward(self, idx):
        return F.embedding(idx, self.weight)


class ColwiseParallel(ParallelStyle):
    """``ColwiseParallel()``: torch's default column split (see the module
    docstring): a Linear becomes a
    :class:`~minidist.parallel.tensor.layers.ColumnParallelLinear` with
    its output left sharded."""

    def __init__(self, algorithm: str = DEFAULT_ALGORITHM):
        self.algorithm = algorithm

    def apply(self, module, group):
        if isinstance(module, Linear):
            return ColumnParallelLinear.from_linear(module, group, algorithm=self.algorithm)
        if isinstance(module, Embedding):
            return _ColwiseEmbedding(module, group)
        raise self._refuse(module)


class RowwiseParallel(ParallelStyle):
    """``RowwiseParallel()``: torch's default row split (see the module
    docstring): a Linear becomes a
    :class:`~minidist.parallel.tensor.layers.RowParallelLinear` taking a
    sharded input; an Embedding a vocab-parallel one."""

    def __init__(self, algorithm: str = DEFAULT_ALGORITHM):
        self.algorithm = algorithm

    def apply(self, module, group):
        if isinstance(module, Linear):
            return RowParallelLinear.from_linear(module, group, algorithm=self.algorithm)
        if isinstance(module, Embedding):
            return VocabParallelEmbedding.from_embedding(module, group, algorithm=self.algorithm)
        raise self._refuse(module)


class PackedColwiseParallel(ColwiseParallel):
    """``PackedColwiseParallel(pieces)``: the column split of a Linear whose
    rows are ``pieces`` equal blocks packed one after the other (3 for the
    GPT's fused q, k, v): rank r takes the r-th n-th of every block, so that
    its shard is the same packing of a narrower layer (for ``c_attn``, the q,
    k and v of its n_head / n heads)."""

    def __init__(self, pieces: int, algorithm: str = DEFAULT_ALGORITHM):
        super().__init__(algorithm)
        if int(pieces) < 1:
            raise ValueError(f"PackedColwiseParallel: pieces must be at least 1, got {pieces}")
        self.pieces = int(pieces)

    def apply(self, module, group):
        if not isinstance(module, Linear):
            raise self._refuse(module)
        out, pieces = module.out_features, self.pieces
        if out % pieces:
            raise ValueError(f"PackedColwiseParallel({pieces}): out_features={out} is not "
                             f"{pieces} equal blocks")
        block = out // pieces
        rank, world, _ = _split_size("PackedColwiseParallel", "out_features / pieces", block, group)
        rows = packed_rows(out, pieces, rank, world)
        return ColumnParallelLinear.from_linear(module, group, algorithm=self.algorithm, rows=rows)

    def __repr__(self) -> str:
        return f"PackedColwiseParallel({self.pieces})"
