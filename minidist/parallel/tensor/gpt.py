"""Tensor (and sequence) parallelism on the GPT: Megatron-LM's split of a
transformer (Shoeybi et al., 2019; Korthikanti et al., 2022).

:func:`tensor_parallel_gpt` turns a whole :class:`~minidist.models.gpt.GPT`
into this rank's shard of it, a :class:`TensorParallelGPT`. The block's code
is the GPT's own (``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))``); only its
Linears are swapped for the split layers of
:mod:`minidist.parallel.tensor.layers`, over the n ranks of ``group``:

* **Attention, split by heads.** Heads are independent until ``c_proj``
  mixes them, so rank r takes n_head / n of them: the rows of ``c_attn``
  that make *their* q, k and v (a column split) and the columns of
  ``c_proj`` that read their outputs (a row split). ``c_attn`` is fused,
  its (3C, C) weight the q rows, then the k rows, then the v rows: a rank's
  rows are three blocks (:func:`qkv_rows`), not one, which is why Megatron
  lays its fused weight out head by head. Here the shard takes the three
  blocks in order, so on each rank the weight is the same [q; k; v] layout
  of a GPT with n_head / n heads, and the attention code runs unchanged.
* **MLP**: ``c_fc`` column-parallel (4C / n hidden units per rank), GELU on
  the shard, ``c_proj`` row-parallel.
* **Vocabulary**: ``wte`` a :class:`~minidist.parallel.tensor.vocab.VocabParallelEmbedding`
  and the tied ``lm_head`` a column-parallel Linear on the same rows, the
  same Parameter; the loss :meth:`TensorParallelGPT.loss`, the
  vocab-parallel cross-entropy: the (B, T, V) logits are never gathered.
* Everything else (``wpe``, the LayerNorms, the row layers' biases) is
  replicated.

Why only two all_reduces per block each way: a column layer's output is
split the way the following row layer wants its input, so nothing is sent
between them (the attention and the GELU are per head and per unit); the
row layer's forward all_reduce makes the block half's output whole, and the
column layer's backward all_reduce makes its input gradient whole.

Messages per training step, per rank (ring collectives, B sequences of T
tokens, width C, L blocks, n ranks; :mod:`minidist.parallel.tensor.costs`
gives the bytes and the tests compare them with the trace):

* forward: all_reduce of B T C values after the embedding and after each of
  the 2 L row layers; three all_reduces of B T values in the loss;
* backward: all_reduce of B T C values before each of the 2 L column layers
  and before ``lm_head``.

So a block costs each rank 2 ring all_reduces of B T C values per pass,
4 (n-1)/n B T C s bytes forward and as many backward (s bytes a value),
whatever its width of 4C hidden units or its number of heads.

**Sequence parallelism** (``sequence_parallel=True``): the residual stream
between blocks is cut along the sequence, each rank holding T/n positions;
the LayerNorms run on them only. Every all_reduce of B T C values above
becomes a reduce_scatter (forward after a row layer and the embedding;
backward before a column layer) and an all_gather (forward before a column
layer and ``lm_head``; backward after a row layer): the same bytes, the
LayerNorms' and the residual's arrays divided by n. The parameters used on
T/n positions (LayerNorms, the row layers' biases, ``wpe``) get only their
positions' share of the gradient: :meth:`TensorParallelGPT.allreduce_sequence_parallel_grads`
sums them over the group in one all_reduce; call it after ``backward()``
and before the optimizer's step. (The GPT has no dropout; in a model with
dropout the dropout after each row layer would be in the sharded region.)
"""

from __future__ import annotations

import copy

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.device_mesh import as_group
from minidist.models.gpt import GPT
from minidist.nn.module import Module
from minidist.parallel.replicas import all_reduce_gradients
from minidist.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, packed_rows
from minidist.parallel.tensor.regions import DEFAULT_ALGORITHM
from minidist.parallel.tensor.vocab import (
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
    vocab_range,
)
from minidist.tensor import Tensor


def sequence_parallel_parameters(module) -> list[tuple[str, object]]:
    """(name, parameter) of a GPT's (or a pipeline stage's) replicated
    parameters that, under sequence parallelism, see only this rank's
    positions: the LayerNorms, the row layers' biases (``c_proj.bias``,
    added after the reduce_scatter) and ``wpe``. Their gradients are partial
    sums, to be summed over the tensor-parallel group after backward."""
    return [(name, param) for name, param in module.named_parameters()
            if ".ln_" in name or name.startswith("transformer.ln_f")
            or name.endswith("c_proj.bias") or name == "transformer.wpe.weight"]


def qkv_rows(n_embd: int, n_head: int, rank: int, world_size: int) -> np.ndarray:
    """The rows of a fused (3 C, C) q, k, v weight that make the q, k and v of
    ``rank``'s n_head / world_size heads: three blocks of C / world_size rows,
    one in each of the q, k and v thirds (heads h are rows h D : (h + 1) D
    of each third, D = C / n_head)."""
    if n_head % world_size:
        raise ValueError(
            f"rank {dist.get_rank()}: the attention splits n_head={n_head} heads over "
            f"{world_size} ranks, but {n_head} is not divisible by {world_size}; use a tensor-"
            f"parallel size that divides the head count "
            f"({', '.join(str(d) for d in range(1, n_head + 1) if n_head % d == 0)})")
    return packed_rows(3 * n_embd, 3, rank, world_size)


def shard_block(block, source, config, rank: int, world_size: int, **split) -> None:
    """Make ``block`` (a copy of the GPT's ``source`` block) this rank's
    tensor-parallel shard of it, in place: ``c_attn`` split by heads
    (:func:`qkv_rows`), ``attn.c_proj`` by rows, ``mlp.c_fc`` by columns,
    ``mlp.c_proj`` by rows; the LayerNorms stay whole. ``split`` is passed
    on to the split layers (``group``, ``algorithm``, ``sequence_parallel``).
    The pieces of a pipeline stage (:mod:`minidist.parallel.mesh.gpt_3d`) are
    made with it too. Cost: copies of 1 / world_size of the block's weights."""
    attn = block.attn
    attn.n_head = config.n_head // world_size
    attn.c_attn = ColumnParallelLinear.from_linear(
        source.attn.c_attn, rows=qkv_rows(config.n_embd, config.n_head, rank, world_size), **split)
    attn.c_proj = RowParallelLinear.from_linear(source.attn.c_proj, **split)
    block.mlp.c_fc = ColumnParallelLinear.from_linear(source.mlp.c_fc, **split)
    block.mlp.c_proj = RowParallelLinear.from_linear(source.mlp.c_proj, **split)


def embed_tokens(wte, wpe, idx, block_size: int, rank: int, world_size: int,
                 sequence_parallel: bool, who: str = "TensorParallelGPT", start: int = 0):
    """The residual stream's start, ``wte(idx) + wpe(positions)``: (B, T, C),
    or this rank's T / world_size positions, (B, T / world_size, C), with
    sequence parallelism (``wte`` a :class:`VocabParallelEmbedding` that
    reduce-scatters then). ``idx``: token ids (B, T), an array or a Tensor,
    at positions ``start`` .. ``start + T - 1`` (``start`` > 0 after a KV
    cache's positions); ``who`` names the caller in the errors."""
    idx = np.asarray(backend.to_numpy(idx.data if isinstance(idx, Tensor) else idx))
    if idx.ndim != 2:
        raise ValueError(f"{who}: expected token ids of shape (batch, time), "
                         f"got shape {idx.shape}")
    steps = idx.shape[1]
    if steps > block_size:
        raise ValueError(f"{who}: a sequence of {steps} tokens is longer than "
                         f"block_size={block_size}")
    positions = np.arange(start, start + steps)
    if sequence_parallel:
        if steps % world_size:
            raise ValueError(
                f"rank {dist.get_rank()}: sequence parallelism cuts each sequence of {steps} "
                f"tokens into {world_size} pieces, but {steps} is not divisible by "
                f"{world_size}; use sequences of a multiple of {world_size} tokens")
        piece = steps // world_size
        positions = np.arange(rank * piece, (rank + 1) * piece)
    return wte(idx) + wpe(positions)


def shard_index(name: str, full_shape, rank: int, world_size: int, config):
    """Where ``rank``'s shard of the GPT parameter ``name`` (nanoGPT's names)
    sits in the whole parameter of ``full_shape``: ``whole[shard_index(...)]``
    is the shard. Vocabulary rows for ``wte`` / ``lm_head``, :func:`qkv_rows`
    for ``c_attn``, a block of rows for ``c_fc``, of columns for the
    ``c_proj`` weights; ``...`` (all of it) for what is replicated."""
    if name.endswith("wte.weight") or name == "lm_head.weight":
        return slice(*vocab_range(config.vocab_size, rank, world_size))
    if ".c_attn." in name:
        return qkv_rows(config.n_embd, config.n_head, rank, world_size)
    if ".c_fc." in name:
        width = full_shape[0] // world_size
        return slice(rank * width, (rank + 1) * width)
    if name.endswith("c_proj.weight"):
        width = full_shape[1] // world_size
        return (slice(None), slice(rank * width, (rank + 1) * width))
    return Ellipsis


class TensorParallelGPT(Module):
    """This rank's shard of a GPT (build it with :func:`tensor_parallel_gpt`).

    Submodules and parameter names are the GPT's (``transformer.wte``,
    ``transformer.h.0.attn.c_attn``, ..., ``lm_head``), each holding its
    shard. ``forward(idx)`` maps token ids (B, T) to this rank's columns of
    the logits, (B, T, vocab_end - vocab_start); :meth:`loss` turns them into
    the mean cross-entropy, the same scalar on every rank. Token ids and
    targets outside the vocabulary are refused on the rank that got them,
    as the GPT's ``nn.Embedding`` and ``F.cross_entropy`` refuse them.
    :func:`~minidist.models.generate.generate` samples from it (with a KV
    cache too, without sequence parallelism): :meth:`gather_vocabulary`
    gives it the whole vocabulary's logits of the last position.
    """

    def __init__(self, model: GPT, group=None, sequence_parallel: bool = False,
                 algorithm: str = DEFAULT_ALGORITHM):
        super().__init__()
        if not isinstance(model, GPT):
            raise TypeError(f"tensor_parallel_gpt needs a minidist GPT, got {type(model).__name__}")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        config = model.config
        qkv_rows(config.n_embd, config.n_head, rank, world)   # refuses a head count that does not divide
        self.config, self.group, self.algorithm = config, group, algorithm
        self.sequence_parallel = bool(sequence_parallel)
        self.world_size, self.rank = world, rank
        split = dict(group=group, algorithm=algorithm, sequence_parallel=self.sequence_parallel)
        whole = model.transformer
        # A copy of what stays whole (LayerNorms, wpe); the Linears are replaced below.
        transformer = copy.deepcopy(whole)
        transformer.wte = VocabParallelEmbedding.from_embedding(whole.wte, **split)
        for block, source in zip(transformer.h, whole.h):
            shard_block(block, source, config, rank, world, **split)
        self.transformer = transformer
        wte = transformer.wte
        self.vocab_start, self.vocab_end = wte.vocab_start, wte.vocab_end
        self.lm_head = ColumnParallelLinear.from_linear(
            model.lm_head, rows=slice(self.vocab_start, self.vocab_end), **split)
        self.lm_head.weight = wte.weight   # tied, as in the GPT: one shard, two uses

    def forward(self, idx, cache=None):
        """``cache``: a :class:`~minidist.models.kv_cache.KVCache` (generation),
        as the GPT's: each rank's cache holds the keys and values of its own
        heads. Not with sequence parallelism, which cannot cut one new token
        over the ranks."""
        t = self.transformer
        start = 0
        if cache is not None:
            if self.sequence_parallel:
                raise ValueError(
                    f"rank {dist.get_rank()}: TensorParallelGPT: a KV cache feeds one token at a "
                    f"time, which sequence parallelism cannot cut over {self.world_size} ranks; "
                    "generate with use_cache=False, or from a shard made with "
                    "sequence_parallel=False")
            cache.check_model(len(t.h), self.config.block_size)
            start = cache.check_feed(np.shape(idx)[-1])
        x = embed_tokens(t.wte, t.wpe, idx, self.config.block_size, self.rank, self.world_size,
                         self.sequence_parallel, "TensorParallelGPT", start)
        for index, block in enumerate(t.h):
            x = block(x) if cache is None else block(x, cache.layer(index))
        if cache is not None:
            cache.advance(np.shape(idx)[-1])
        return self.lm_head(t.ln_f(x))      # (B, T, V_r): this rank's words

    def gather_vocabulary(self, logits) -> np.ndarray:
        """The whole vocabulary's logits (..., V) from this rank's columns
        (..., V_r), the same array on every rank: one all_gather over the
        group, each share padded to the largest (the first V mod n ranks
        hold one word more) and trimmed after. What
        :func:`~minidist.models.generate.generate` calls on the last
        position's logits, so that every rank draws the same token from
        the whole distribution. Cost: (n - 1) / n of n ceil(V / n) values
        per row received; the (B, T, V) logits of training are never made."""
        local = np.asarray(backend.to_numpy(logits.data if isinstance(logits, Tensor) else logits))
        widest = vocab_range(self.config.vocab_size, 0, self.world_size)[1]
        padded = np.zeros(local.shape[:-1] + (widest,), dtype=local.dtype)
        padded[..., :local.shape[-1]] = local
        if self.world_size == 1:
            return padded
        shares = [np.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(shares, padded, group=self.group, algorithm=self.algorithm)
        return np.concatenate([share[..., :stop - start] for share, (start, stop) in zip(
            shares, (vocab_range(self.config.vocab_size, r, self.world_size)
                     for r in range(self.world_size)))], axis=-1)

    def loss(self, logits, targets) -> Tensor:
        """The mean cross-entropy of ``targets`` (B, T) under the logits this
        rank's :meth:`forward` made: :func:`~minidist.parallel.tensor.vocab.vocab_parallel_cross_entropy`."""
        return vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.group,
                                            self.algorithm, vocab_size=self.config.vocab_size)

    def sequence_parallel_parameters(self) -> list[tuple[str, object]]:
        """(name, parameter) of the replicated parameters used on this rank's
        positions only under sequence parallelism; empty without it."""
        return sequence_parallel_parameters(self) if self.sequence_parallel else []

    def allreduce_sequence_parallel_grads(self) -> None:
        """Sum the gradients of :meth:`sequence_parallel_parameters` over the
        group, in one all_reduce of their concatenation (Megatron's
        ``finalize_model_grads`` does the same). A no-op without sequence
        parallelism or on one rank. Call after backward, before the step."""
        all_reduce_gradients([param for _, param in self.sequence_parallel_parameters()],
                             self.group, algorithm=self.algorithm)

    def extra_repr(self) -> str:
        return (f"rank {self.rank} of {self.world_size}, words {self.vocab_start}:{self.vocab_end}, "
                f"sequence_parallel={self.sequence_parallel}")


def tensor_parallel_gpt(model: GPT, group=None, sequence_parallel: bool = False,
                        algorithm: str = DEFAULT_ALGORITHM) -> TensorParallelGPT:
    """This rank's tensor-parallel shard of the whole ``model`` over
    ``group`` (a ProcessGroup, None for the world, or a 1-D device mesh: an
    object with ``get_group()``), copied: ``model`` is left whole. Every
    rank passes the same ``model`` (same seed); forward, loss and gradients
    then equal the whole model's, each rank holding its pieces. n_head must
    be divisible by the group's size; any vocabulary size works (uneven
    shares). ``sequence_parallel=True`` adds Megatron's sequence
    parallelism (sequence lengths a multiple of the group's size).

    A training step::

        shard = tensor_parallel_gpt(GPT(config, rng=0), group)
        logits = shard(idx)
        loss = shard.loss(logits, targets)
        loss.backward()
        shard.allreduce_sequence_parallel_grads()   # only does work with sequence_parallel
        optimizer.step()
    """
    return TensorParallelGPT(model, as_group(group, "tensor_parallel_gpt"), sequence_parallel,
                             algorithm)


__all__ = ["TensorParallelGPT", "tensor_parallel_gpt", "qkv_rows", "sequence_parallel_parameters",
           "shard_block",
           "embed_tokens", "shard_index"]
