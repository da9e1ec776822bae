"""The vocabulary split: a token embedding and a cross-entropy whose (V, C)
table and (B, T, V) logits never exist whole on one rank (Megatron-LM's
``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy``).

A language model's two vocabulary-sized pieces are its token embedding
(V x C parameters) and its logits (B x T x V values, the largest activation
of a small-width model). Split the vocabulary over n ranks: rank r holds the
rows ``vocab_range(V, r, n)`` of the table, ``numpy.array_split``'s shares
(the first V mod n ranks one row more, so any V works: no padding).

* **Embedding** (:class:`VocabParallelEmbedding`): each rank looks up the
  tokens that fall in its rows and writes zeros for the others (a masked
  lookup); the n partial tables are summed (all_reduce) into the whole
  (B, T, C) embedding. Backward: each rank's rows receive the gradient of
  its own tokens only; no message. With ``sequence_parallel=True`` the sum
  is a reduce_scatter along the sequence instead (each rank keeps its T/n
  positions, as the sequence-parallel blocks above it want).
* **Output layer**: the tied ``lm_head`` is a column-parallel Linear with the
  same rows: each rank makes the logits of its V_r words, (B, T, V_r).
* **Cross-entropy** (:func:`vocab_parallel_cross_entropy`): the loss of a
  token is log(sum_v exp z_v) - z_target. Every term is a sum over the
  vocabulary, so three all_reduces of one number per token give it without
  gathering the logits: the maximum (for a stable exp), the sum of
  exp(z - max), and the target's logit (only the rank that holds the target
  has it; the others add 0). Backward is local: softmax minus one-hot,
  computed on each rank's own columns.

Cost per step, per rank, with B T tokens and ring collectives of n ranks:
the embedding sends one all_reduce of B T C values forward (none backward);
the cross-entropy three all_reduces of B T values forward (none backward);
the output layer, as a column-parallel layer, one all_reduce of the B T C
input gradient backward. Memory: V/n rows of the table and B T V/n logits
per rank instead of V and B T V.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.nn import functional as F
from minidist.nn.embedding import Embedding
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter
from minidist.parallel.tensor.layers import set_tensor_model_parallel_attributes
from minidist.parallel.tensor.regions import (
    DEFAULT_ALGORITHM,
    reduce_from_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)
from minidist.tensor import Tensor


def vocab_range(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """(first, one past the last) row of a vocabulary of ``vocab_size`` words
    held by ``rank`` of ``world_size``: ``numpy.array_split``'s shares, the
    first ``vocab_size % world_size`` ranks one row more."""
    if vocab_size < world_size:
        raise ValueError(
            f"vocab_range: a vocabulary of {vocab_size} words cannot be split over "
            f"{world_size} ranks (each needs at least one row); use at most {vocab_size} ranks")
    base, extra = divmod(vocab_size, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _all_reduce(array, op, group, algorithm):
    """A contiguous copy of ``array`` combined with ``op`` over the group."""
    out = np.array(backend.to_numpy(array), copy=True, order="C")
    if dist.get_world_size(group) > 1:
        dist.all_reduce(out, op=op, group=group, algorithm=algorithm)
    return backend.from_numpy(out)


def check_token_ids(idx: np.ndarray, vocab_size: int, who: str) -> None:
    """Refuse token ids that are not integers in [0, vocab_size), as
    ``nn.Embedding`` does on one process. Every rank checks the whole
    ``idx``, before any message: the masked lookup would otherwise give an
    id no rank holds a row of zeros, and the model would run on silently."""
    if not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"rank {dist.get_rank()}: {who}: token ids must be integers, got dtype "
                        f"{idx.dtype}; convert them with idx.astype(numpy.int64)")
    if idx.size:
        low, high = int(idx.min()), int(idx.max())
        if low < 0 or high >= vocab_size:
            raise IndexError(
                f"rank {dist.get_rank()}: {who}: token id {low if low < 0 else high} is out of "
                f"range for a vocabulary of {vocab_size} words (valid ids are 0..{vocab_size - 1}); "
                f"check the tokenizer's vocabulary size against the model's vocab_size={vocab_size}")


def check_targets(target: np.ndarray, vocab_size: int | None, ignore_index: int) -> None:
    """Refuse targets that are not word ids in [0, vocab_size) or
    ``ignore_index``, as ``F.cross_entropy`` does on one process: a target
    no rank holds would add a logit of 0 in place of its own, silently.
    Without ``vocab_size`` only negative targets can be told."""
    who = "vocab_parallel_cross_entropy"
    if not np.issubdtype(target.dtype, np.integer):
        raise TypeError(f"rank {dist.get_rank()}: {who}: targets must be integer word ids, got "
                        f"dtype {target.dtype}; convert them with targets.astype(numpy.int64)")
    counted = target[target != ignore_index]
    if not counted.size:
        return
    low, high = int(counted.min()), int(counted.max())
    if low < 0 or vocab_size is not None and high >= vocab_size:
        valid = "0 or more" if vocab_size is None else f"0..{vocab_size - 1}"
        raise ValueError(
            f"rank {dist.get_rank()}: {who}: target {low if low < 0 else high} is out of range "
            f"for the vocabulary (valid targets are {valid}, and ignore_index={ignore_index} for "
            "positions that count for nothing); check the targets against the model's vocab_size")


class VocabParallelEmbedding(Module):
    """``VocabParallelEmbedding.from_embedding(embedding, group=None,
    algorithm="ring", sequence_parallel=False)``: this rank's rows
    ``vocab_start:vocab_end`` of ``embedding``'s (V, C) table (copied).

    ``forward(idx)``: token ids (..., T) -> the whole embedding (..., T, C)
    on every rank (masked lookup, then all_reduce), or with
    ``sequence_parallel`` this rank's positions (..., T/n, C)
    (reduce_scatter along the sequence). ``weight`` is the shard,
    (vocab_end - vocab_start, C).
    """

    @classmethod
    def from_embedding(cls, embedding, group=None, algorithm: str = DEFAULT_ALGORITHM,
                       sequence_parallel: bool = False) -> VocabParallelEmbedding:
        if not isinstance(embedding, Embedding):
            raise TypeError(f"VocabParallelEmbedding.from_embedding needs an nn.Embedding, "
                            f"got {type(embedding).__name__}")
        if getattr(embedding, "padding_idx", None) is not None:
            raise ValueError("VocabParallelEmbedding: padding_idx is not supported (the GPT has none)")
        layer = cls()
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        layer.num_embeddings, layer.embedding_dim = embedding.weight.data.shape
        layer.vocab_start, layer.vocab_end = vocab_range(layer.num_embeddings, rank, world)
        layer.group, layer.algorithm = group, algorithm
        layer.sequence_parallel = bool(sequence_parallel)
        layer.weight = set_tensor_model_parallel_attributes(
            Parameter(embedding.weight.data[layer.vocab_start:layer.vocab_end].copy()), True, 0,
            group=group)
        return layer

    def forward(self, idx):
        idx = np.asarray(backend.to_numpy(idx.data if isinstance(idx, Tensor) else idx))
        check_token_ids(idx, self.num_embeddings, "VocabParallelEmbedding")
        outside = (idx < self.vocab_start) | (idx >= self.vocab_end)
        local = np.where(outside, 0, idx - self.vocab_start)   # row 0 stands in, then zeroed
        rows = F.embedding(local, self.weight)
        keep = (~outside)[..., None].astype(self.weight.data.dtype)
        partial = rows * Tensor(backend.from_numpy(keep))
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel_region(partial, self.group, self.algorithm)
        return reduce_from_parallel_region(partial, self.group, self.algorithm)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim} (rows {self.vocab_start}:"
                f"{self.vocab_end} here)" + (", sequence_parallel=True" if self.sequence_parallel else ""))


def vocab_parallel_cross_entropy(logits, target, vocab_start: int | None = None, group=None,
                                 algorithm: str = DEFAULT_ALGORITHM,
                                 ignore_index: int = -100, vocab_size: int | None = None) -> Tensor:
    """The mean cross-entropy of the tokens, from this rank's columns of the
    logits (..., V_r) (a vocabulary split over the group) and the whole
    ``target`` (...) of word ids: the same scalar on every rank, equal to
    ``F.cross_entropy`` of the gathered logits, without gathering them.

    ``vocab_start``: the first word of this rank's columns (default
    ``rank * V_r``, an even split; pass the shard's ``vocab_start`` for an
    uneven one). Forward: three all_reduces of one value per token (MAX of
    the row maxima, SUM of the target logit, SUM of the exp sums), in
    Megatron's order. Backward: (softmax - one-hot) / tokens on this rank's
    columns, no message.

    ``ignore_index``: as ``F.cross_entropy`` (torch's default -100, what
    padding is labelled with): such tokens add nothing to the loss or the
    gradient, and the mean is over the others (NaN if every token is
    ignored, as torch's).

    ``vocab_size``: the whole vocabulary's, to refuse a target past it (as
    ``F.cross_entropy`` refuses a label past its classes) before any
    message; by default ``n * V_r`` for the even split, unknown for an
    uneven one (then only negative targets are refused; the GPT's
    :meth:`~minidist.parallel.tensor.gpt.TensorParallelGPT.loss` passes it).
    """
    logits = logits if isinstance(logits, Tensor) else Tensor(logits)
    z = logits.data
    xp = backend.of(z)
    width = z.shape[-1]
    if vocab_start is None:
        vocab_start = dist.get_rank(group) * width
        vocab_size = dist.get_world_size(group) * width if vocab_size is None else vocab_size
    target = np.asarray(backend.to_numpy(target.data if isinstance(target, Tensor) else target))
    if target.shape != z.shape[:-1]:
        raise ValueError(f"vocab_parallel_cross_entropy: target shape {target.shape} must be the "
                         f"logits' shape {z.shape} without its last (vocabulary) axis")
    check_targets(target, vocab_size, ignore_index)
    target = xp.asarray(target) if xp is not np else target
    top = _all_reduce(z.max(axis=-1), dist.ReduceOp.MAX, group, algorithm)
    shifted = z - top[..., None]
    outside = (target < vocab_start) | (target >= vocab_start + width)
    local = xp.where(outside, 0, target - vocab_start)
    picked = xp.take_along_axis(shifted, local[..., None], axis=-1)[..., 0]
    picked = _all_reduce(xp.where(outside, 0, picked), dist.ReduceOp.SUM, group, algorithm)
    exp = xp.exp(shifted)
    total = _all_reduce(exp.sum(axis=-1), dist.ReduceOp.SUM, group, algorithm)
    counted = target != ignore_index
    count = int(counted.sum())
    losses = xp.log(total) - picked
    if count == target.size:
        counted = None  # nothing ignored: no mask to keep for the backward
    else:
        losses = xp.where(counted, losses, 0)
    loss = losses.sum() / count if count else np.nan

    def backward(g):
        grad = exp / total[..., None]                 # softmax, this rank's columns
        rows = xp.nonzero(~outside.reshape(-1))[0]
        flat = grad.reshape(-1, width)
        flat[rows, local.reshape(-1)[rows]] -= 1.0     # minus the one-hot where the target is here
        if counted is None:
            grad *= g / count
        else:
            grad *= xp.where(counted, g / max(count, 1), 0)[..., None]
        return (grad,)

    return Tensor._make(xp.asarray(loss, dtype=z.dtype), (logits,), backward,
                        "vocab_parallel_cross_entropy")


__all__ = ["VocabParallelEmbedding", "vocab_parallel_cross_entropy", "vocab_range", "check_token_ids",
           "check_targets"]
