"""Ring attention: softmax attention over a sequence cut across n ranks, the
keys and values travelling round a ring (Liu et al., 2023, "Ring Attention
with Blockwise Transformers"; the backward of Zhu's ring-flash-attention).

Each rank holds the queries, keys and values of its positions
(:mod:`minidist.parallel.context.split`: the zig-zag split), (B, H, L_r, D).
Attention needs every query against every key, but no rank ever holds the
whole sequence: in step s (0 .. n - 1) rank r holds the K, V block of rank
(r - s) mod n, computes its queries against it, and passes the block on to
rank r + 1 while it computes (the send and the receive of the next block
are posted before the block's arithmetic, and waited for after it).

**Forward: the online softmax** (FlashAttention's, Milakov and Gimelshein's).
softmax(S) V over all keys is a merge of blocks. For each query row keep the
output so far O and the log of its softmax denominator, the log-sum-exp
LSE = log sum_j exp(s_j). A block of keys gives its own (O_b, LSE_b); the
two merge exactly:

    LSE' = log(exp(LSE) + exp(LSE_b))            (numpy.logaddexp: no overflow)
    O'   = exp(LSE - LSE') O + exp(LSE_b - LSE') O_b

so after n steps O is softmax attention over all keys and LSE its
denominator, computed block by block, in any order.

**Backward** (recomputed from the saved LSE, nothing of size L x S kept):
with D = rowsum(dO * O), for each block P = exp(S - LSE) (the final
probabilities, exactly), dV_b = P^T dO, dP = dO V_b^T,
dS = P * (dP - D), dQ += dS K_b * scale, dK_b = dS^T Q * scale. The K, V
blocks ring round again, and with each block travels its gradient so far
(dK, dV): rank r adds its queries' share and passes it on, and after n
sends the sums arrive back at their owners.

**Causal masking.** Positions decide: query i sees key j iff j <= i. Each
rank's tokens are chunks of positions, and each (query chunk, key chunk)
pair is computed in full, with the mask (the diagonal chunk), or skipped
(:func:`~minidist.parallel.context.split.pair_kind`). With the zig-zag split
every rank computes as many pairs as every other at every step
(:func:`~minidist.parallel.context.split.block_work`). Uneven lengths
(T not a multiple of 2n) are uneven blocks, no padding: every rank knows the
size of every block from (T, n).

**Cost per rank** (B batch, H heads, D = Dv head width, s bytes a value,
L_o the length of rank o's block; :mod:`minidist.parallel.context.costs`):

* forward: n - 1 messages, the K, V blocks of ranks r, r - 1, ..., r - n + 2,
  2 B H L_o D s bytes each (K and V in one message): 2 (n - 1) B H (T/n) D s
  for even blocks;
* backward: those n - 1 K, V messages again, and n dK, dV messages (every
  block's gradient, its own included, one hop each): 2 (2n - 1) B H (T/n) D s;
* no message more: each rank shows its call's shape (T, B, H, D, ...) in the
  run's control block as it enters (``dist.shown_call``), so that the rank
  whose block does not fit names the rank with another shape;
* compute: the 4 L S D flops per head of attention (8 backward), split
  evenly by the zig-zag split; memory: the rank's Q, K, V, O, LSE and two K,V
  blocks in flight, never an (L, S) matrix across blocks.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

import minidist.distributed as dist
from minidist import backend, trace
from minidist.distributed.device_mesh import as_group
from minidist.parallel.context.split import DIAGONAL, LAYOUTS, SKIP, pair_kind, rank_chunks
from minidist.tensor import Tensor

#: Tags of the two kinds of message, so that a block and a gradient from the
#: same neighbour never match each other's receive.
KV_TAG, GRAD_TAG = 7301, 7302

#: Every call is numbered, the same on every rank (they call in one order):
#: the replay tells the calls in a trace apart by it.
_calls = itertools.count()


def _tensor(value) -> Tensor:
    return value if isinstance(value, Tensor) else Tensor(value)


class _Ring:
    """One call's geometry: who the neighbours are, every rank's chunks and
    where each chunk sits in its rank's storage order."""

    def __init__(self, group, seq_len, is_causal, layout, shapes, call, itemsize):
        self.group, self.itemsize = group, itemsize
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.seq_len, self.is_causal, self.layout, self.call = seq_len, is_causal, layout, call
        self.chunks = [rank_chunks(seq_len, self.world, owner, layout) for owner in range(self.world)]
        self.lengths = [sum(stop - start for start, stop in chunks) for chunks in self.chunks]
        (batch, heads, length, width), value_width = shapes
        if length != self.lengths[self.rank]:
            raise ValueError(
                f"rank {dist.get_rank()}: ring attention over {seq_len} positions on {self.world} "
                f"ranks ({layout} split) gives this rank {self.lengths[self.rank]} positions, but "
                f"its queries have {length} (shape (B, H, L, D)); shard q, k and v with "
                f"context_split.shard_sequence(x, {seq_len}, {self.world}, rank, axis=2)")
        self.batch, self.heads, self.width, self.value_width = batch, heads, width, value_width

    def rows(self, owner):
        """(position range, slice of the owner's storage) for each of its chunks."""
        found, offset = [], 0
        for start, stop in self.chunks[owner]:
            found.append(((start, stop), slice(offset, offset + stop - start)))
            offset += stop - start
        return found

    def pairs(self, owner):
        """The (query chunk, key chunk) pairs this rank computes against
        ``owner``'s block: (kind, query rows, key rows, query positions, key positions)."""
        for query, q_rows in self.rows(self.rank):
            for key, k_rows in self.rows(owner):
                kind = pair_kind(query, key, self.is_causal)
                if kind != SKIP:
                    yield kind, q_rows, k_rows, np.arange(*query), np.arange(*key)

    def block_size(self, owner, width):
        return self.batch * self.heads * self.lengths[owner] * width

    def label(self, text, phase, step, owner):
        return trace.with_info(text, ring_attention=self.call, phase=phase, step=step, owner=owner,
                               seq=self.seq_len, world=self.world, causal=int(self.is_causal),
                               layout=self.layout, itemsize=self.itemsize)

    def exchange(self, outgoing, incoming_size, tag, text, phase, step, owner, dtype):
        """Post the send of ``outgoing`` to the right and the receive of a
        block of ``incoming_size`` values from the left; returns (buffer, requests)."""
        right, left = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        incoming = np.empty(incoming_size, dtype=dtype)
        label = self.label(text, phase, step, owner)
        requests = [dist.isend(outgoing, group=self.group, group_dst=right, tag=tag, label=label),
                    dist.irecv(incoming, group=self.group, group_src=left, tag=tag, label=label)]
        return incoming, requests


def _pack(key, value):
    return np.concatenate([key.reshape(-1), value.reshape(-1)])


def _unpack(flat, ring, owner):
    split = ring.block_size(owner, ring.width)
    shape = (ring.batch, ring.heads, ring.lengths[owner])
    return (flat[:split].reshape(shape + (ring.width,)),
            flat[split:].reshape(shape + (ring.value_width,)))


def _scores(q, k, q_pos, k_pos, kind, scale):
    """Q K^T * scale for one chunk pair, -inf where the causal mask forbids."""
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if kind == DIAGONAL:
        scores = np.where(q_pos[:, None] >= k_pos[None, :], scores, -np.inf)
    return scores


def _block_attention(scores, v):
    """(O_b, LSE_b) of one block: softmax(scores) v and log sum exp(scores)
    per row; a row with no key allowed gives O_b = 0, LSE_b = -inf."""
    top = scores.max(axis=-1)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(scores - top[..., None])
    total = weights.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = top + np.log(total)
    out = (weights @ v) / np.where(total == 0, 1.0, total)[..., None]
    return out, lse


def merge(out, lse, block_out, block_lse):
    """The online softmax's merge, in place: (out, lse) and a block's
    (block_out, block_lse) become the attention over both key sets. Rows
    that have seen no key (lse = -inf) take the block's as they are."""
    merged = np.logaddexp(lse, block_lse)
    safe = np.where(np.isfinite(merged), merged, 0.0)
    out *= np.exp(lse - safe)[..., None]
    out += np.exp(block_lse - safe)[..., None] * block_out
    lse[...] = merged


def _forward(ring, q, k, v, scale, merge_block=merge):
    out = np.zeros(q.shape[:-1] + (ring.value_width,), dtype=q.dtype)
    lse = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)
    block = _pack(k, v)
    for step in range(ring.world):
        owner = (ring.rank - step) % ring.world
        requests = []
        if step < ring.world - 1:   # pass the block on while computing with it
            following = (owner - 1) % ring.world
            incoming, requests = ring.exchange(
                block, ring.block_size(following, ring.width + ring.value_width), KV_TAG,
                f"ring attention forward step {step}: K,V of rank {owner}", "forward", step,
                owner, q.dtype)
        key, value = _unpack(block, ring, owner)
        for kind, q_rows, k_rows, q_pos, k_pos in ring.pairs(owner):
            scores = _scores(q[..., q_rows, :], key[..., k_rows, :], q_pos, k_pos, kind, scale)
            block_out, block_lse = _block_attention(scores, value[..., k_rows, :])
            merge_block(out[..., q_rows, :], lse[..., q_rows], block_out, block_lse)
        for request in requests:
            request.wait()
        if requests:
            block = incoming
    return out, lse


def _backward(ring, q, k, v, out, lse, grad_out, scale):
    delta = (grad_out * out).sum(axis=-1)            # D = rowsum(dO * O)
    safe_lse = np.where(np.isfinite(lse), lse, np.inf)   # a row with no key: P = 0
    grad_q = np.zeros_like(q)
    block = _pack(k, v)
    carried, carried_requests = None, []              # the gradient of this step's block, arriving
    sends = []
    for step in range(ring.world):
        owner = (ring.rank - step) % ring.world
        requests = []
        if step < ring.world - 1:
            following = (owner - 1) % ring.world
            incoming, requests = ring.exchange(
                block, ring.block_size(following, ring.width + ring.value_width), KV_TAG,
                f"ring attention backward step {step}: K,V of rank {owner}", "backward", step,
                owner, q.dtype)
        key, value = _unpack(block, ring, owner)
        grad_key, grad_value = np.zeros_like(key), np.zeros_like(value)
        for kind, q_rows, k_rows, q_pos, k_pos in ring.pairs(owner):
            q_block, k_block, v_block = q[..., q_rows, :], key[..., k_rows, :], value[..., k_rows, :]
            scores = _scores(q_block, k_block, q_pos, k_pos, kind, scale)
            probs = np.exp(scores - safe_lse[..., q_rows, None])      # P, recomputed
            g = grad_out[..., q_rows, :]
            grad_value[..., k_rows, :] += np.swapaxes(probs, -1, -2) @ g
            grad_scores = probs * (g @ np.swapaxes(v_block, -1, -2) - delta[..., q_rows, None])
            grad_q[..., q_rows, :] += grad_scores @ k_block * scale
            grad_key[..., k_rows, :] += np.swapaxes(grad_scores, -1, -2) @ q_block * scale
        local = _pack(grad_key, grad_value)
        if ring.world == 1:
            return grad_q, grad_key, grad_value
        for request in carried_requests:
            request.wait()
        total = local if carried is None else local + carried
        # The sum so far goes on to the right; the next block's arrives from the left.
        right, left = (ring.rank + 1) % ring.world, (ring.rank - 1) % ring.world
        label = ring.label(f"ring attention backward step {step}: dK,dV of rank {owner}",
                           "gradients", step, owner)
        sends.append(dist.isend(total, group=ring.group, group_dst=right, tag=GRAD_TAG,
                                label=label))
        arriving = (owner - 1) % ring.world   # the block the left neighbour just finished
        carried = np.empty(ring.block_size(arriving, ring.width + ring.value_width), dtype=q.dtype)
        carried_requests = [dist.irecv(carried, group=ring.group, group_src=left, tag=GRAD_TAG,
                                       label=ring.label(
                                           f"ring attention backward step {step}: dK,dV of rank "
                                           f"{arriving}", "gradients", step, arriving))]
        for request in requests:
            request.wait()
        if requests:
            block = incoming
    for request in carried_requests + sends:
        request.wait()
    grad_key, grad_value = _unpack(carried, ring, ring.rank)   # our own block, all ranks' sums
    return grad_q, grad_key, grad_value


def _shape_words(shape) -> str:
    """A call's shape in words: 'seq_len 16, batch 2, 4 heads of width 8, causal, zigzag split'."""
    seq_len, causal, layout, batch, heads, width, value_width = shape
    values = f" (values {value_width})" if value_width != width else ""
    return (f"seq_len {seq_len}, batch {batch}, {heads} heads of width {width}{values}, "
            f"{'causal' if causal else 'not causal'}, {LAYOUTS[layout]} split")


def ring_attention(query, key, value, seq_len: int, group=None, is_causal: bool = False,
                   scale=None, layout: str = "zigzag", merge_block=None) -> Tensor:
    """softmax(Q K^T * scale) V over the whole sequence of ``seq_len``
    positions, each rank passing the (B, H, L_r, D) query, key and value of
    its positions (:func:`~minidist.parallel.context.split.shard_sequence`),
    and getting back its positions' (B, H, L_r, Dv) output: what
    ``F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)`` gives on
    the whole sequence, rows of this rank's positions. One autograd node; its
    backward rings again and must be run by every rank of ``group`` (a
    ProcessGroup, None for the world, or a 1-D device mesh). ``scale``
    defaults to 1/sqrt(D). ``merge_block``: the function that merges a
    block's (O_b, LSE_b) into the running (O, LSE) in place, at every pair
    of chunks of every step of the forward; None for :func:`merge` (the
    exercise ``ring_attention_merge`` passes the student's). The backward
    reads only the final (O, LSE). Cost and method: the module's docstring.
    """
    query, key, value = _tensor(query), _tensor(key), _tensor(value)
    group = as_group(group, "ring_attention")
    q, k, v = backend.to_numpy(query.data), backend.to_numpy(key.data), backend.to_numpy(value.data)
    if q.ndim != 4 or k.shape[:-1] != q.shape[:-1] or v.shape[:-1] != q.shape[:-1] \
            or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"ring_attention: expects query and key (B, H, L, D) and value "
                         f"(B, H, L, Dv) of this rank's positions, got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    ring = _Ring(group, seq_len, bool(is_causal), layout, (q.shape, v.shape[-1]), next(_calls),
                 q.dtype.itemsize)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    # Every rank computes every block's size from this shape; a rank with
    # another one sends blocks that do not fit, and which neighbour sees it
    # first is chance: shown, the shapes name the odd rank (no message more).
    shape = (seq_len, int(is_causal), LAYOUTS.index(layout), *q.shape[:2], q.shape[3],
             v.shape[-1])
    with dist.shown_call("ring_attention", shape, group, describe=_shape_words):
        out, lse = _forward(ring, q, k, v, scale, merge if merge_block is None else merge_block)

    def backward(grad):
        with dist.shown_call("ring_attention's backward", shape, group, describe=_shape_words):
            grads = _backward(ring, q, k, v, out, lse, backend.to_numpy(grad), scale)
        return tuple(backend.from_numpy(g) for g in grads)

    return Tensor._make(backend.from_numpy(out), (query, key, value), backward, "ring_attention")


__all__ = ["ring_attention", "merge", "KV_TAG", "GRAD_TAG"]
