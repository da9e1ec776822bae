"""Recursive halving, and how any world runs an algorithm made for a power of two.

Recursive halving (the reduce-scatter half of Rabenseifner's algorithms) needs
p = 2^k ranks. Worlds that are not a power of two are folded in as MPICH does:
of the first 2 (n - p) ranks, each even one hands its whole array to its odd
neighbour and sits out; the remaining p ranks form the *core* and number
themselves 0..p-1 (core member v); afterwards each odd rank can hand the
result back (:func:`fold_out`). Cost of the fold: alpha + N beta + N gamma in,
alpha + N beta out.
"""

from __future__ import annotations

from minidist.distributed.collectives.chunks import chunk_bounds


def fold_in(comm, buffer, p):
    """Of the first 2 (n - p) ranks, even ones send their array to the odd
    neighbour and leave. Returns this rank's core member number, or -1 for a
    rank that sat out."""
    extra = comm.size - p
    rank = comm.rank
    comm.at(0, "fold-in")
    if rank < 2 * extra:
        if rank % 2 == 0:
            yield [comm.isend(buffer, rank + 1, f"fold in to {rank + 1}")]
            return -1
        yield [comm.irecv_reduce(buffer, rank - 1, f"fold in from {rank - 1}")]
        return rank // 2
    return rank - extra


def fold_out(comm, buffer, p, step=0):
    """The mirror of :func:`fold_in`: odd ranks hand the result back (in
    algorithm step ``step``)."""
    extra = comm.size - p
    rank = comm.rank
    comm.at(step, "fold-out")
    if rank < 2 * extra:
        if rank % 2 == 0:
            yield [comm.irecv(buffer, rank + 1, f"fold out from {rank + 1}")]
        else:
            yield [comm.isend(buffer, rank - 1, f"fold out to {rank - 1}")]


def real_rank(virtual: int, extra: int) -> int:
    """The rank of core member ``virtual`` (the odd ranks stand for their pairs)."""
    return 2 * virtual + 1 if virtual < extra else virtual + extra


def core_member(rank: int, extra: int) -> int:
    """The core member a rank belongs to: itself, or the pair it sat out in."""
    return rank // 2 if rank < 2 * extra else rank - extra


def reduce_scatter_by_halving(comm, buffer, virtual, p, first_step=0):
    """Recursive halving on the core: the array is cut into p chunks. In round
    k a member keeps half of the chunks it is responsible for, sends the other
    half to its partner (the member differing in bit log2(p) - 1 - k) and
    combines the half it keeps with the partner's. After log2 p rounds member
    v owns the finished chunk v. In round k each member sends N / 2^(k+1)
    bytes. Cost: log2 p alpha + (p-1)/p N (beta + gamma).

    Returns the chunk bounds (``chunk_bounds(count, p)``).
    """
    extra = comm.size - p
    bounds = chunk_bounds(buffer.size, p)
    low, high = 0, p  # the chunks this member is responsible for
    mask = p >> 1
    while mask:
        partner = real_rank(virtual ^ mask, extra)
        middle = (low + high) // 2
        if virtual & mask:
            keep, give = (middle, high), (low, middle)
        else:
            keep, give = (low, middle), (middle, high)
        step = p.bit_length() - 1 - mask.bit_length()
        label = f"reduce-scatter step {step}"
        comm.at(first_step + step, "reduce-scatter")
        yield [comm.isend(buffer[bounds[give[0]]:bounds[give[1]]], partner,
                          f"{label} chunks {give[0]}-{give[1] - 1}"),
               comm.irecv_reduce(buffer[bounds[keep[0]]:bounds[keep[1]]], partner,
                                 f"{label} chunks {keep[0]}-{keep[1] - 1}")]
        low, high = keep
        mask >>= 1
    return bounds
