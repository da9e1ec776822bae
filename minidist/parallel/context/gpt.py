"""Context parallelism on the GPT: every rank holds its positions of every
sequence of the batch (Megatron-LM's context parallelism, torchtitan's
``context_parallel``; Liu et al., 2023, Jacobs et al., 2023).

:func:`context_parallel_gpt` turns a whole :class:`~minidist.models.gpt.GPT`
into this rank's replica over a context-parallel group of n ranks. Every
weight is replicated (nothing is split, unlike tensor parallelism); what is
split is the sequence, by :mod:`minidist.parallel.context.split`'s zig-zag:
rank r holds chunks r and 2n - 1 - r of each sequence's 2n chunks.

* Embeddings, LayerNorms, the MLP, ``c_attn``, ``c_proj`` and the logits work
  position by position: they run unchanged on the rank's L_r positions.
  The position embedding looks up the rank's positions (not 0 .. L_r - 1).
* Attention, the one layer that mixes positions, is
  :func:`~minidist.parallel.context.ring_attention.ring_attention` (``attention=
  "ring"``) or :func:`~minidist.parallel.context.ulysses.ulysses_attention`
  (``"ulysses"``), causal, over the group. It replaces the heads' attention
  through the GPT's hook :meth:`CausalSelfAttention.attend
  <minidist.models.gpt.CausalSelfAttention.attend>`; the rest of the
  block's code is the GPT's own.
* The loss (:meth:`ContextParallelGPT.loss`): the cross-entropy summed over
  the rank's positions, divided by all B T positions, summed over the group
  (forward all_reduce, backward identity): the mean over every token, the
  same scalar on every rank, and each rank's backward the gradient of its
  tokens' share.
* Gradients: each rank's are its tokens' share of every replicated weight's
  gradient; :meth:`ContextParallelGPT.allreduce_grads` sums them over the
  group in one all_reduce (and, given a data-parallel group, averages them
  over it: CP x DP). Call it after ``backward()``, before the step.

Messages per step, per rank: L attention layers' ring or Ulysses bytes
(:mod:`minidist.parallel.context.costs`), 1 all_reduce of one value for the
loss, and the gradients' all_reduce of the whole model (P values) over the
group, the same as data parallelism's; the activations of a rank are those of
L_r positions, attention's (L_r x S) scores never built across blocks.
"""

from __future__ import annotations

import copy

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.device_mesh import as_group
from minidist.models.gpt import GPT
from minidist.nn import functional as F
from minidist.nn.module import Module
from minidist.parallel.context.ring_attention import ring_attention
from minidist.parallel.context.split import rank_positions, shard_sequence
from minidist.parallel.context.ulysses import ulysses_attention
from minidist.parallel.replicas import all_reduce_gradients
from minidist.parallel.tensor import reduce_from_parallel_region
from minidist.tensor import Tensor

ATTENTIONS = {"ring": ring_attention, "ulysses": ulysses_attention}
ALGORITHM = "ring"   # the loss's and the gradients' all_reduce: deterministic bytes


class ContextParallelGPT(Module):
    """This rank's replica of a GPT over a context-parallel group (build it
    with :func:`context_parallel_gpt`). Parameter names are the GPT's.
    :meth:`shard` gives the rank's tokens of a (B, T) batch;
    ``forward(tokens, seq_len)`` maps them to their logits (B, L_r, V);
    :meth:`loss` to the mean cross-entropy over every token of the batch."""

    def __init__(self, model: GPT, group=None, attention: str = "ring", layout: str = "zigzag"):
        super().__init__()
        if not isinstance(model, GPT):
            raise TypeError(f"context_parallel_gpt needs a minidist GPT, got {type(model).__name__}")
        if attention not in ATTENTIONS:
            raise ValueError(f"context_parallel_gpt: attention must be one of {sorted(ATTENTIONS)}, "
                             f"got {attention!r}")
        self.config, self.group, self.attention, self.layout = model.config, group, attention, layout
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.transformer = copy.deepcopy(model.transformer)
        self.lm_head = copy.deepcopy(model.lm_head)
        self.lm_head.weight = self.transformer.wte.weight   # tied, as in the GPT
        self._seq_len = None
        for block in self.transformer.h:
            block.attn.attend = self._attend   # the GPT's hook, set on each block's instance

    def _attend(self, q, k, v):
        """The GPT's attention hook: the heads of this rank's positions, attended over the group."""
        return ATTENTIONS[self.attention](q, k, v, self._seq_len, group=self.group, is_causal=True,
                                          layout=self.layout)

    def shard(self, tokens) -> np.ndarray:
        """This rank's positions of a (B, T) batch of token ids (or targets)."""
        tokens = np.asarray(backend.to_numpy(tokens.data if isinstance(tokens, Tensor) else tokens))
        return shard_sequence(tokens, tokens.shape[1], self.world_size, self.rank, axis=1,
                              layout=self.layout)

    def forward(self, tokens, seq_len: int):
        """Logits (B, L_r, V) of this rank's ``tokens`` (B, L_r), its positions
        of sequences of ``seq_len`` (every rank of the group calls it)."""
        tokens = np.asarray(backend.to_numpy(tokens.data if isinstance(tokens, Tensor) else tokens))
        # A rank with another length cuts other blocks, which the ring shows
        # only as a block that does not fit, on one neighbour or the other:
        # agreeing first names the odd rank (2 (n - 1) small messages a
        # forward, for all the layers' attentions).
        dist.agree("ContextParallelGPT.forward", (int(seq_len), len(tokens)), group=self.group,
                   describe=lambda value: f"seq_len {value[0]}, {value[1]} sequences")
        if seq_len > self.config.block_size:
            raise ValueError(f"ContextParallelGPT: a sequence of {seq_len} tokens is longer than "
                             f"block_size={self.config.block_size}")
        positions = rank_positions(seq_len, self.world_size, self.rank, self.layout)
        if tokens.ndim != 2 or tokens.shape[1] != len(positions):
            raise ValueError(f"rank {dist.get_rank()}: expected this rank's {len(positions)} "
                             f"positions of sequences of {seq_len} tokens, shape (B, "
                             f"{len(positions)}), got {tokens.shape}; pass model.shard(batch)")
        self._seq_len = seq_len
        t = self.transformer
        x = t.wte(tokens) + t.wpe(positions)
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))

    def loss(self, logits, targets, seq_len: int) -> Tensor:
        """The mean cross-entropy over every token of the batch (B seq_len),
        from this rank's logits and targets (B, L_r): the same value on every
        rank; backward gives each rank its tokens' share."""
        targets = np.asarray(backend.to_numpy(targets.data if isinstance(targets, Tensor) else targets))
        vocab = logits.shape[-1]
        total = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), reduction="sum")
        share = total * (1.0 / (targets.shape[0] * seq_len))
        return reduce_from_parallel_region(share, self.group, ALGORITHM)

    def allreduce_grads(self, dp_group=None) -> None:
        """Sum every gradient over the context-parallel group (each rank's
        is its tokens' share), and average over ``dp_group`` when given
        (CP x DP: each data-parallel rank saw other sequences): one
        all_reduce of the gradients' concatenation per group."""
        params = list(self.parameters())
        all_reduce_gradients(params, self.group, algorithm=ALGORITHM)
        if dp_group is not None:
            all_reduce_gradients(params, dp_group, algorithm=ALGORITHM, average=True)

    def extra_repr(self) -> str:
        return f"rank {self.rank} of {self.world_size}, {self.attention} attention, {self.layout} split"


def context_parallel_gpt(model: GPT, group=None, attention: str = "ring",
                         layout: str = "zigzag") -> ContextParallelGPT:
    """This rank's context-parallel replica of ``model`` (copied; ``model``
    is left as it is) over ``group`` (a ProcessGroup, None for the world, or
    a 1-D device mesh such as ``mesh["cp"]``). Every rank passes the same
    model. A training step (CP x DP on a mesh of dims ("dp", "cp"))::

        shard = context_parallel_gpt(GPT(config, rng=0), mesh["cp"])
        tokens, targets = shard.shard(idx), shard.shard(next_tokens)
        loss = shard.loss(shard(tokens, T), targets, T)
        loss.backward()
        shard.allreduce_grads(dp_group=mesh["dp"].get_group())
        optimizer.step()
    """
    return ContextParallelGPT(model, as_group(group, "context_parallel_gpt"), attention, layout)


__all__ = ["ContextParallelGPT", "context_parallel_gpt", "ATTENTIONS"]

