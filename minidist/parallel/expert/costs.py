"""What expert parallelism sends, by formula, and what the dense MLP it
replaces sends under tensor parallelism (:mod:`minidist.parallel.expert.dispatch`).

Notation: n ranks in the expert-parallel group, E experts, width C, s bytes
a value, N tokens per rank, k choices per token. The routing decides the
*dispatch matrix* M (n, n): M[i, j] the kept choices of rank i's tokens whose
expert is on rank j (:func:`dispatch_matrix`). Per rank r, one MoE layer,
pairwise all_to_alls (only the pieces to other ranks cross a link):

==========  ===================================================
forward     (n - 1) E/n 8   (the counts, int64)
            + D_r C s       (dispatch: D_r = sum_{j != r} M[r, j])
            + R_r C s       (combine: R_r = sum_{i != r} M[i, r])
backward    (R_r + D_r) C s (the same two, transposed)
==========  ===================================================

With the routing spread evenly and nothing dropped, D_r = R_r = (n - 1)/n k N,
so a pass sends 2 (n - 1)/n k N C s (:func:`balanced_dispatch_bytes`). The
dense MLP split by tensor parallelism over the same n ranks sends one ring
all_reduce of the N C values per pass, also 2 (n - 1)/n N C s
(:func:`dense_mlp_all_reduce_bytes`): with k = 1 the two are the same bytes,
k = 2 doubles the experts'; but the experts hold E times the MLP's
parameters for about k times its flops. What differs is the shape: an
all_reduce's pieces are equal, the all_to_all's are what the router chose,
so an overloaded rank's link sets the pace (its D_r or R_r is the largest),
which is what the load-balancing loss and the capacity bound keep in check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist.distributed.collectives.traffic import ring_all_reduce_sent

COUNT_BYTES = 8   # the counts travel as int64


def dispatch_matrix(routings, world_size: int) -> np.ndarray:
    """M (n, n): ``M[i, j]`` the kept choices of rank i's tokens for experts
    on rank j; ``routings[i]`` is rank i's :class:`~minidist.models.moe.Routing`
    (experts split in n equal ranges, rank j the j-th)."""
    matrix = np.zeros((world_size, world_size), dtype=np.int64)
    for source, routing in enumerate(routings):
        per_rank = routing.n_expert // world_size
        matrix[source] = routing.load.reshape(world_size, per_rank).sum(axis=1)
    return matrix


@dataclass(frozen=True)
class DispatchBytes:
    """Bytes each rank sends for one MoE layer (rank order): ``forward``
    (counts, dispatch, combine), ``backward``; ``counts``, ``dispatch`` and
    ``combine`` the forward's three parts."""

    counts: tuple[int, ...]
    dispatch: tuple[int, ...]
    combine: tuple[int, ...]
    backward: tuple[int, ...]

    @property
    def forward(self) -> tuple[int, ...]:
        return tuple(a + b + c for a, b, c in zip(self.counts, self.dispatch, self.combine))


def dispatch_bytes(matrix: np.ndarray, n_expert: int, width: int,
                   itemsize: int = 4) -> DispatchBytes:
    """The module docstring's table for the dispatch matrix ``matrix``."""
    matrix = np.asarray(matrix)
    n = matrix.shape[0]
    if n_expert % n:
        raise ValueError(f"dispatch_bytes: {n_expert} experts do not split over {n} ranks")
    off_diagonal = matrix - np.diag(np.diag(matrix))
    sent_rows = off_diagonal.sum(axis=1)       # D_r
    received_rows = off_diagonal.sum(axis=0)   # R_r
    row = width * itemsize
    counts = tuple([(n - 1) * (n_expert // n) * COUNT_BYTES] * n)
    dispatch = tuple(int(d) * row for d in sent_rows)
    combine = tuple(int(r) * row for r in received_rows)
    backward = tuple(int(d + r) * row for d, r in zip(sent_rows, received_rows))
    return DispatchBytes(counts, dispatch, combine, backward)


def balanced_dispatch_bytes(tokens: int, top_k: int, width: int, world_size: int,
                            itemsize: int = 4) -> float:
    """Bytes a rank sends in one pass of one layer (dispatch and combine,
    counts left out) when its ``tokens`` tokens' ``top_k`` choices are all
    kept and spread evenly: 2 (n - 1)/n k N C s."""
    n = world_size
    return 2 * (n - 1) / n * top_k * tokens * width * itemsize


def dense_mlp_all_reduce_bytes(tokens: int, width: int, world_size: int,
                               itemsize: int = 4) -> tuple[int, ...]:
    """Bytes each rank sends in one pass of the dense MLP split by tensor
    parallelism over ``world_size`` ranks: one ring all_reduce of the
    ``tokens`` x ``width`` values (2 (n - 1)/n N C s when n divides N C)."""
    return tuple(v * itemsize for v in ring_all_reduce_sent(tokens * width, world_size))


__all__ = ["dispatch_matrix", "dispatch_bytes", "DispatchBytes", "balanced_dispatch_bytes",
           "dense_mlp_all_reduce_bytes", "COUNT_BYTES"]
