"""How context parallelism cuts a sequence over n ranks: which positions each
rank holds (the zig-zag split), and which blocks of causal attention each
rank then has to compute.

Context parallelism gives every rank a piece of *every* sequence (where data
parallelism gives it whole sequences): its queries, keys and values are
those of its positions only, and attention, the one layer that mixes
positions, is computed across ranks (:mod:`minidist.parallel.context.ring_attention`,
:mod:`minidist.parallel.context.ulysses`). Everything else in a transformer works
position by position and needs no change.

**The split.** A sequence of T positions is cut into 2n chunks, and rank r
holds chunks r and 2n - 1 - r (the *zig-zag* split of Megatron-LM's context
parallelism and Brandon et al.'s striped/zig-zag ring attention). Why not
the n contiguous blocks? Under the causal mask a query sees only the keys
at or before it: with contiguous blocks, rank 0's queries need one block of
keys, rank n - 1's need all n, and in a ring the last rank computes n blocks
while the first idles n - 1 steps out of n. Zig-zag pairs an early chunk with
a late one: every rank's queries need about the same number of keys, and at
every step of the ring every rank computes the same number of chunk pairs
(:func:`block_work` counts them; the tests hold the balance).

``layout="contiguous"`` (rank r holds positions r T/n .. (r + 1) T/n) is
kept to show the imbalance, and as the natural split without a causal mask.

**Uneven lengths.** T need not be a multiple of 2n (or n): the chunks are
numpy's ``array_split`` shares (:func:`chunk_bounds`), the
first T mod 2n chunks one position longer than the rest (uneven blocks, no
padding). Every rank computes every rank's chunks from (T, n) alone, so a
receiver always knows the size of the block it is about to receive. The
balance is then off by at most one position per chunk.
"""

from __future__ import annotations

import itertools

import numpy as np

LAYOUTS = ("zigzag", "contiguous")


def chunk_bounds(count: int, parts: int) -> list[int]:
    """``parts + 1`` offsets: chunk i is ``[bounds[i], bounds[i + 1])``, the
    first ``count % parts`` chunks one longer (numpy's ``array_split``)."""
    base, extra = divmod(count, parts)
    return [0] + list(itertools.accumulate(base + (index < extra) for index in range(parts)))


#: How a (query chunk, key chunk) pair is computed under the causal mask.
FULL, DIAGONAL, SKIP = "full", "diagonal", "skip"


def _check(seq_len: int, world: int, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"context parallelism: layout must be one of {LAYOUTS}, got {layout!r}")
    if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise ValueError(f"context parallelism: seq_len must be a positive int, got {seq_len!r}")
    if world < 1:
        raise ValueError(f"context parallelism: the group needs at least one rank, got {world}")


def rank_chunks(seq_len: int, world: int, rank: int, layout: str = "zigzag") -> list[tuple[int, int]]:
    """The [start, stop) position ranges rank ``rank`` holds, in the order its
    tokens are stored: zig-zag, chunks r and 2n - 1 - r of 2n; contiguous,
    block r of n. A range may be empty when T < 2n."""
    _check(seq_len, world, layout)
    if not 0 <= rank < world:
        raise ValueError(f"context parallelism: rank {rank} is not in a group of {world}")
    if layout == "contiguous":
        bounds = chunk_bounds(seq_len, world)
        return [(bounds[rank], bounds[rank + 1])]
    bounds = chunk_bounds(seq_len, 2 * world)
    late = 2 * world - 1 - rank
    return [(bounds[rank], bounds[rank + 1]), (bounds[late], bounds[late + 1])]


def rank_positions(seq_len: int, world: int, rank: int, layout: str = "zigzag") -> np.ndarray:
    """The positions rank ``rank`` holds, in its storage order (int64)."""
    ranges = rank_chunks(seq_len, world, rank, layout)
    return np.concatenate([np.arange(start, stop, dtype=np.int64) for start, stop in ranges])


def shard_sequence(array, seq_len: int, world: int, rank: int, axis: int = 1,
                   layout: str = "zigzag"):
    """Rank ``rank``'s positions of ``array`` along ``axis`` (a copy): token ids
    (B, T) with ``axis=1``, heads (B, H, T, D) with ``axis=2``."""
    array = np.asarray(array)
    if array.shape[axis] != seq_len:
        raise ValueError(f"context parallelism: axis {axis} of shape {array.shape} should be the "
                         f"sequence of {seq_len} positions")
    return np.take(array, rank_positions(seq_len, world, rank, layout), axis=axis)


def pair_kind(query: tuple[int, int], key: tuple[int, int], is_causal: bool) -> str:
    """How the block of queries ``query`` against keys ``key`` (position
    ranges) is computed: ``"full"`` (no mask), ``"diagonal"`` (the causal mask
    cuts through it) or ``"skip"`` (masked out entirely, or empty)."""
    (q_start, q_stop), (k_start, k_stop) = query, key
    if q_stop <= q_start or k_stop <= k_start:
        return SKIP
    if not is_causal or k_stop - 1 <= q_start:
        return FULL
    if k_start > q_stop - 1:
        return SKIP
    return DIAGONAL


def block_work(seq_len: int, world: int, is_causal: bool, layout: str = "zigzag") -> np.ndarray:
    """Score entries (query, key pairs) each rank computes at each step of
    the ring, shape (n steps, n ranks): at step s rank r holds the keys of
    rank (r - s) mod n and computes every pair of chunks not skipped. With
    the zig-zag split and T a multiple of 2n, every entry of a step is the
    same (no rank idles); contiguous blocks leave rank 0 idle after step 0."""
    work = np.zeros((world, world), dtype=np.int64)
    chunks = [rank_chunks(seq_len, world, rank, layout) for rank in range(world)]
    for step in range(world):
        for rank in range(world):
            for query in chunks[rank]:
                for key in chunks[(rank - step) % world]:
                    if pair_kind(query, key, is_causal) != SKIP:
                        work[step, rank] += (query[1] - query[0]) * (key[1] - key[0])
    return work


__all__ = ["LAYOUTS", "FULL", "DIAGONAL", "SKIP", "rank_chunks", "rank_positions",
           "shard_sequence", "pair_kind", "block_work"]
