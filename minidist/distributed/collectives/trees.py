"""Binomial trees on virtual ranks, for any number of ranks.

Virtual ranks count from the root: ``v = (rank - root) mod n``, so the root
is 0 and ``real_rank`` turns a virtual rank back. In the binomial tree,

* the parent of v > 0 is v with its lowest set bit cleared;
* the children of v are v + 2^j for every 2^j below v's lowest set bit (for
  the root: every 2^j below n), as long as v + 2^j < n;
* the subtree of v is the range of virtual ranks [v, v + subtree_size(v, n)).

Subtrees being ranges is what lets scatter and gather move a whole subtree's
pieces as one slice: they lay the pieces out in virtual order (as MPICH does).
In round j (j = 0, 1, ...) of a broadcast the ranks below 2^j send to the rank
2^j further on, so a rank hears from its parent in the round of its lowest set
bit and ceil(log2 n) rounds reach everyone.
"""

from __future__ import annotations

import numpy as np


def real_rank(virtual: int, root: int, n: int) -> int:
    """The group rank of virtual rank ``virtual`` in a tree rooted at ``root``."""
    return (virtual + root) % n


def parent(virtual: int) -> int:
    """The parent of virtual rank ``virtual`` > 0."""
    return virtual - (virtual & -virtual)


def children(virtual: int, n: int) -> list[int]:
    """The children of ``virtual``, farthest (largest subtree) first."""
    below = virtual & -virtual if virtual else 1 << max(n - 1, 0).bit_length()
    kids = []
    mask = below >> 1
    while mask:
        if virtual + mask < n:
            kids.append(virtual + mask)
        mask >>= 1
    return kids


def subtree_size(virtual: int, n: int) -> int:
    """How many virtual ranks the subtree of ``virtual`` holds (itself included)."""
    if virtual == 0:
        return n
    return min(virtual & -virtual, n - virtual)


def round_of(virtual: int) -> int:
    """The round (0, 1, ...) in which ``virtual`` > 0 hears from its parent."""
    return (virtual & -virtual).bit_length() - 1


def pieces_by_rank(pieces, count: int, root: int, n: int) -> list[tuple]:
    """``(real rank, its piece)`` for every virtual rank 0, 1, ..., n - 1 of a
    buffer of n pieces of ``count`` items laid out in virtual order (piece v
    belongs to the rank v after ``root``); the pieces are views. The first
    pair is the root's own."""
    return [(real_rank(virtual, root, n), pieces[virtual * count:(virtual + 1) * count])
            for virtual in range(n)]


def subtree_layout(comm, root: int, pieces, mine) -> tuple:
    """(virtual rank, subtree size, held, bounds) of this rank in a binomial
    scatter or gather of n equal pieces rooted at ``root``.

    ``held`` is where the rank keeps its subtree's pieces, in virtual order:
    at the root ``pieces`` (all n of them), at a leaf its own piece ``mine``
    (sent or received in place), else a new array of ``size`` pieces whose
    first is the rank's own. ``bounds[v]``: where piece v starts (n + 1 offsets).
    """
    n, count = comm.size, mine.size
    virtual = (comm.rank - root) % n
    size = subtree_size(virtual, n)
    if virtual == 0:
        held = pieces
    elif size == 1:
        held = mine
    else:
        held = np.empty(size * count, mine.dtype)
    bounds = [index * count for index in range(n + 1)]
    return virtual, size, held, bounds

