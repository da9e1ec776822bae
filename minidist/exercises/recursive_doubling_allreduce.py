"""Exercise: the recursive-doubling all_reduce (lesson 3).

The reference solution: log2 p rounds of pairwise swaps of the whole array,
with MPICH's fold for worlds that are not a power of two. Checked against
the registry's ``recursive_doubling``: 2 (n - p) + p log2 p messages of the
whole array, summed over ranks.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.collectives.chunks import largest_power_of_two
from minidist.exercises.collective_check import CollectiveSpec, check_collective
from minidist.exercises.exercise import Exercise


def recursive_doubling_allreduce(comm, buffer):
    """All_reduce by recursive doubling (in place). Cost: log2 p (alpha + N beta
    + N gamma) + (2 (alpha + N beta) + N gamma if n != p else 0)."""
    n, rank = comm.size, comm.rank
    p = largest_power_of_two(n)
    extra = n - p
    # The fold: of the first 2 (n - p) ranks, each even one hands its array to
    # its odd neighbour and sits out; the odd one stands for both.
    if rank < 2 * extra and rank % 2 == 0:
        yield [comm.isend(buffer, rank + 1, "fold in")]
        yield [comm.irecv(buffer, rank + 1, "fold out")]
        return
    if rank < 2 * extra:
        yield [comm.irecv_reduce(buffer, rank - 1, "fold in")]
    virtual = rank // 2 if rank < 2 * extra else rank - extra
    incoming = np.empty_like(buffer)
    mask = 1
    while mask < p:  # round k: swap with the member differing in bit k
        partner_virtual = virtual ^ mask
        partner = 2 * partner_virtual + 1 if partner_virtual < extra else partner_virtual + extra
        yield [comm.isend(buffer, partner, f"round {mask.bit_length() - 1}"),
               comm.irecv(incoming, partner, f"round {mask.bit_length() - 1}")]
        comm.combine(buffer, incoming)
        mask <<= 1
    if rank < 2 * extra:
        yield [comm.isend(buffer, rank - 1, "fold out")]


SPEC = CollectiveSpec("recursive_doubling_allreduce", "all_reduce", "recursive_doubling",
                      recursive_doubling_allreduce, "recursive doubling")

EXERCISE = Exercise(
    name="recursive_doubling_allreduce", function="recursive_doubling_allreduce",
    summary="all_reduce by pairwise swaps: log2 n rounds, for small arrays",
    lesson="lessons/03_collectives.py", reference=recursive_doubling_allreduce,
    check=lambda function, **options: check_collective(SPEC, function, **options))
