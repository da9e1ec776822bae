"""Ulysses: context-parallel attention by swapping the sequence split for a
head split (DeepSpeed-Ulysses, Jacobs et al., 2023).

Each rank holds the queries, keys and values of its positions, (B, H, L_r, D)
(:mod:`minidist.parallel.context.split`). Heads are independent: attention
needs every position of *one* head, not every head of one position. So an
all_to_all trades the split: rank r sends head group j (heads j H/n ..
(j + 1) H/n) of its L_r positions to rank j, and receives head group r of
every rank's positions: (B, H/n, T, D), the whole sequence for H/n heads.
Ordinary attention runs on that (``F.scaled_dot_product_attention``, causal
or not: the positions are put back in order first), and a second all_to_all
trades back, each rank getting all heads of its own positions.

Two autograd nodes (:func:`sequence_to_heads`, :func:`heads_to_sequence`),
each the other's backward, as tensor parallelism's region functions are;
the attention between them is the autograd's own node. H must be divisible
by n (each rank a whole group of heads); :func:`ulysses_attention` refuses
otherwise.

**Cost per rank**, every all_to_all the pairwise exchange of
:mod:`minidist.distributed.collectives.all_to_all` with uneven split sizes
(rank r sends each other rank its whole piece once; L_r its positions, s
bytes a value, D = Dv; :mod:`minidist.parallel.context.costs`):

* sequence -> heads of a (B, H, L_r, D) tensor: (n - 1) B (H/n) L_r D s
  (its L_r positions of n - 1 head groups);
* heads -> sequence: B (H/n) (T - L_r) D s (its head group of the other
  ranks' positions).

Forward: three sequence -> heads (q, k, v) and one heads -> sequence (the
output): 4 all_to_alls. Backward: their transposes, one heads -> sequence
each for dq, dk, dv and one sequence -> heads for dO. With even blocks
(L_r = T/n) each of the 8 sends (n - 1)/n^2 B H T D s: the volume per rank
falls as n grows (ring attention's stays 2 (n - 1)/n B H T D s per pass),
but the head count caps n.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.device_mesh import as_group
from minidist.nn import functional as F
from minidist.parallel.context.split import rank_positions
from minidist.tensor import Tensor

#: The all_to_all's algorithm: the pairwise exchange, the only one that
#: moves uneven pieces, so the bytes are the same whatever the lengths.
ALGORITHM = "pairwise"


def _tensor(value) -> Tensor:
    return value if isinstance(value, Tensor) else Tensor(value)


class _Split:
    """Every rank's positions, and the order that puts the concatenation of
    the ranks' pieces back into sequence order."""

    def __init__(self, group, seq_len, heads, layout):
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        if heads % self.world:
            raise ValueError(
                f"rank {dist.get_rank()}: Ulysses gives each of the {self.world} ranks a group of "
                f"heads, but {heads} heads are not divisible by {self.world}; use a context-"
                f"parallel size that divides the heads "
                f"({', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)}), or ring "
                f"attention, which splits no heads")
        self.seq_len, self.heads, self.group_heads = seq_len, heads, heads // self.world
        self.positions = [rank_positions(seq_len, self.world, r, layout) for r in range(self.world)]
        self.lengths = [len(p) for p in self.positions]
        self.order = np.concatenate(self.positions)   # row i of the gathered pieces is position order[i]


def _exchange(rows, send_counts, receive_counts, group):
    """all_to_all_single of ``rows`` (dim 0 cut by ``send_counts``)."""
    result = np.empty((sum(receive_counts),) + rows.shape[1:], dtype=rows.dtype)
    dist.all_to_all_single(result, np.ascontiguousarray(rows), output_split_sizes=receive_counts,
                           input_split_sizes=send_counts, group=group, algorithm=ALGORITHM)
    return result


def _to_heads(x, split):
    """(B, H, L_r, D) of this rank's positions -> (B, H/n, T, D) of its head group."""
    batch, _, length, width = x.shape
    n, hn = split.world, split.group_heads
    rows = x.reshape(batch, n, hn, length, width).transpose(1, 3, 0, 2, 4)   # (n, L_r, B, H/n, D)
    rows = rows.reshape(n * length, batch * hn * width)
    gathered = _exchange(rows, [length] * n, split.lengths, split.group)       # (T, ...) in piece order
    ordered = np.empty_like(gathered)
    ordered[split.order] = gathered
    return np.ascontiguousarray(ordered.reshape(split.seq_len, batch, hn, width).transpose(1, 2, 0, 3))


def _to_sequence(y, split):
    """(B, H/n, T, D) of this rank's head group -> (B, H, L_r, D) of its positions."""
    batch, hn, _, width = y.shape
    n, length = split.world, split.lengths[split.rank]
    rows = y[:, :, split.order].transpose(2, 0, 1, 3).reshape(split.seq_len, batch * hn * width)
    mine = _exchange(rows, split.lengths, [length] * n, split.group)          # (n L_r, ...) by head group
    mine = mine.reshape(n, length, batch, hn, width).transpose(2, 0, 3, 1, 4)
    return np.ascontiguousarray(mine.reshape(batch, n * hn, length, width))


def _swap(input, there, back, split: _Split, op: str) -> Tensor:
    """One all_to_all as an autograd node: ``there`` forward, ``back`` backward."""
    input = _tensor(input)
    return Tensor._make(backend.from_numpy(there(backend.to_numpy(input.data), split)), (input,),
                        lambda grad: (backend.from_numpy(back(backend.to_numpy(grad), split)),), op)


def sequence_to_heads(input, split: _Split) -> Tensor:
    """Forward: all_to_all from this rank's positions of every head to every
    position of its head group. Backward: the all_to_all back."""
    return _swap(input, _to_heads, _to_sequence, split, "sequence_to_heads")


def heads_to_sequence(input, split: _Split) -> Tensor:
    """Forward: all_to_all from every position of this rank's head group to
    every head of its positions. Backward: the all_to_all back."""
    return _swap(input, _to_sequence, _to_heads, split, "heads_to_sequence")


def ulysses_attention(query, key, value, seq_len: int, group=None, is_causal: bool = False,
                      scale=None, layout: str = "zigzag") -> Tensor:
    """Attention over the whole sequence of ``seq_len`` positions, each rank
    passing the (B, H, L_r, D) query, key and value of its positions (the
    ``layout`` split, as :func:`~minidist.parallel.context.ring_attention.ring_attention`)
    and getting back its positions' output; equal to
    ``F.scaled_dot_product_attention`` on the whole sequence. H must be
    divisible by the group's size. Every rank of ``group`` (a ProcessGroup,
    None for the world, or a 1-D device mesh) must call it, and its backward."""
    query, key, value = _tensor(query), _tensor(key), _tensor(value)
    if query.ndim != 4:
        raise ValueError(f"ulysses_attention: expects (B, H, L, D) of this rank's positions, got "
                         f"shape {query.shape}")
    group = as_group(group, "ulysses_attention")
    split = _Split(group, seq_len, query.shape[1], layout)
    mine = split.lengths[split.rank]
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if tensor.ndim != 4 or tensor.shape[2] != mine or tensor.shape[1] != split.heads:
            raise ValueError(
                f"rank {dist.get_rank()}: Ulysses over {seq_len} positions on {split.world} ranks "
                f"gives this rank {mine} positions; {name} has shape {tensor.shape}, expected "
                f"(B, {split.heads}, {mine}, D)")
    q, k, v = (sequence_to_heads(t, split) for t in (query, key, value))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    return heads_to_sequence(out, split)


__all__ = ["ulysses_attention", "sequence_to_heads", "heads_to_sequence", "ALGORITHM"]
