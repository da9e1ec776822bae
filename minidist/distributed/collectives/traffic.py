"""What each rank sends in a ring all_reduce or all_gather, value by value:
the counts every strategy's byte formula builds on (the split layers, the
conv splits, DistBelief, the hybrid, SyncBatchNorm, the tensor-parallel and
expert-parallel GPT).

* ring all_reduce of N values on n ranks, chunks c as ``numpy.array_split``
  cuts them (the first N mod n one larger): rank r sends every chunk but one
  in the reduce-scatter and every chunk but one in the all-gather,
  2 N - c[(r+1) mod n] - c[(r+2) mod n] values; exactly 2 (n-1)/n N when n
  divides N.
* ring all_gather of n pieces of P values: every rank sends the n - 1
  pieces it does not own, (n - 1) P values.

The registry's costs (:mod:`minidist.distributed.collectives.registry`)
sum the same traffic over all ranks to predict a time; these give one
rank's count, to compare with the ``bytes`` of its send events in a trace.
"""

from __future__ import annotations


def _chunk_sizes(count: int, parts: int) -> list[int]:
    base, extra = divmod(count, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def ring_all_reduce_sent(count: int, world_size: int) -> tuple[int, ...]:
    """Values each rank sends in a ring all_reduce of ``count`` values."""
    if world_size == 1:
        return (0,)
    chunks = _chunk_sizes(count, world_size)
    return tuple(2 * count - chunks[(rank + 1) % world_size] - chunks[(rank + 2) % world_size]
                 for rank in range(world_size))


def ring_all_gather_sent(piece: int, world_size: int) -> tuple[int, ...]:
    """Values each rank sends in a ring all_gather of pieces of ``piece`` values."""
    return ((world_size - 1) * piece,) * world_size


