"""all_gather: every rank ends with every rank's array, side by side in rank order.

    dist.all_gather(parts, x)                      # parts[i] becomes rank i's x
    dist.all_gather_into_tensor(out, x)            # out = concatenation of every x
    dist.all_gather_into_tensor(out, x, algorithm="bruck")

Internally the result is one contiguous buffer of n equal pieces, piece i
being rank i's input; every algorithm fills the pieces it is missing. Costs
for n ranks and an N-byte *result* (so each rank contributes N/n bytes;
alpha: latency of a message, beta: seconds per byte, xbeta: per byte of a
step that sends and receives at once; p: the largest power of two <= n;
B(n) defined at :func:`recursive_doubling`):

===================  ============================================================
ring                 (n - 1) (alpha + N/n xbeta)
recursive_doubling   log2 p alpha + (n-1)/n N xbeta if n == p
                     else (log2 p + 2) alpha + B(n) N/n xbeta + (1 + n) N/n beta
bruck                ceil(log2 n) alpha + (n-1)/n N xbeta            (any n)
===================  ============================================================

Every rank receives the n - 1 pieces it lacks, so (n-1)/n N beta is the
least any algorithm can move; they differ in how many messages it takes.
Small arrays want few rounds (Bruck, recursive doubling), large arrays do
not care and the ring's neighbour-only traffic suits real networks best.

Worlds that are not a power of two: recursive doubling folds them, as
all_reduce does. Of the first 2 (n - p) ranks each even one hands its piece
to its odd neighbour and sits out; the odd one then stands for both pieces
in a power-of-two exchange, and at the end hands the whole result back.
Bruck's algorithm needs no fold: its last round simply sends fewer pieces.

Identical bits: pieces are only ever copied, so every rank ends with the
very bytes each rank gave.
"""

from __future__ import annotations

import numpy as np

from minidist.alpha_beta import ceil_log2
from minidist.distributed.collectives import call
from minidist.distributed.collectives.all_reduce import _real_rank
from minidist.distributed.collectives.chunks import largest_power_of_two, split
from minidist.distributed.collectives.registry import cost, register


@cost("(n - 1) (alpha + N/n xbeta)",
      traffic=lambda n, count, itemsize, root=0: (n * (n - 1), (n - 1) * count * itemsize))
def ring(comm, buffer):
    """Ring allgather: for n - 1 steps, pass on around the ring the piece that
    arrived in the step before.

    In step s rank r sends piece (r - s) mod n (its own at step 0) to its
    right neighbour and receives piece (r - s - 1) mod n from its left one.
    Every link carries one piece per step and no rank is in charge.
    Cost: (n - 1) (alpha + N/n xbeta).
    """
    n, rank = comm.size, comm.rank
    pieces = split(buffer, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        comm.at(step, "allgather")
        out, into = (rank - step) % n, (rank - step - 1) % n
        yield [comm.isend(pieces[out], right, f"step {step} piece {out}"),
               comm.irecv(pieces[into], left, f"step {step} piece {into}")]


def core_piece_offsets(n: int, p: int, piece: int) -> list[int]:
    """Where, in a buffer of n pieces of ``piece`` elements, the pieces of each of
    the p ranks of a folded core start (p + 1 offsets). Core member v < n - p
    stands for the pair of ranks 2v, 2v + 1, so it owns two pieces; the others
    own one. Any run of core members owns a contiguous run of pieces."""
    extra = n - p
    return [(v + min(v, extra)) * piece for v in range(p + 1)]


def _recursive_doubling_traffic(n, count, itemsize, root=0):
    p = largest_power_of_two(n)
    # fold in (a piece each), hand back (the whole result each); the core swaps
    # (p - 1) pieces per member, the pair members' pieces counted twice
    return (p * ceil_log2(p) + 2 * (n - p),
            (n - p + n * (p - 1) + (n - p) * n) * count // n * itemsize)


@cost("log2 p alpha + (n-1)/n N xbeta if n == p"
      " else (log2 p + 2) alpha + B(n) N/n xbeta + (1 + n) N/n beta",
      traffic=_recursive_doubling_traffic)
def recursive_doubling(comm, buffer):
    """Recursive doubling: in round k each rank swaps everything it has with the
    rank whose number differs in bit k, so what each holds doubles every round.

    Before round k a rank holds the 2^k pieces of its aligned block of ranks;
    its partner holds the neighbouring block; after the swap both hold the
    block of 2^(k+1).

    Other n (folded, see the module docstring): the fold in costs
    alpha + N/n beta, the hand-back alpha + N beta, and in round k the
    largest block swapped holds 2^k + min(2^k, n - p) pieces (the members
    that stand for two ranks are at the front). Summed over the rounds that is
    B(n) = sum_k (2^k + min(2^k, n - p)) pieces, which is n - 1 when n = p.
    Cost: log2 p alpha + (n-1)/n N xbeta if n == p
    else (log2 p + 2) alpha + B(n) N/n xbeta + (1 + n) N/n beta.
    """
    n, rank = comm.size, comm.rank
    p = largest_power_of_two(n)
    extra = n - p
    piece = buffer.size // n
    if rank < 2 * extra:  # the fold in: even ranks leave their piece with the odd one
        if rank % 2 == 0:
            yield [comm.isend(buffer[rank * piece:(rank + 1) * piece], rank + 1,
                              f"fold in piece {rank} to {rank + 1}")]
            yield [comm.irecv(buffer, rank + 1, f"fold out from {rank + 1}")]
            return
        yield [comm.irecv(buffer[(rank - 1) * piece:rank * piece], rank - 1,
                          f"fold in piece {rank - 1} from {rank - 1}")]
        virtual = rank // 2
    else:
        virtual = rank - extra
    offsets = core_piece_offsets(n, p, piece)
    mask = 1
    while mask < p:
        partner = virtual ^ mask
        mine = virtual & ~(mask - 1)
        theirs = partner & ~(mask - 1)
        round_ = mask.bit_length() - 1
        peer = _real_rank(partner, extra)
        yield [comm.isend(buffer[offsets[mine]:offsets[mine + mask]], peer,
                          f"round {round_} to {peer}"),
               comm.irecv(buffer[offsets[theirs]:offsets[theirs + mask]], peer,
                          f"round {round_} from {peer}")]
        mask <<= 1
    if rank < 2 * extra:
        yield [comm.isend(buffer, rank - 1, f"fold out to {rank - 1}")]


@cost("ceil(log2 n) alpha + (n-1)/n N xbeta",
      traffic=lambda n, count, itemsize, root=0: (n * ceil_log2(n), (n - 1) * count * itemsize))
def bruck(comm, buffer):
    """Bruck's allgather, for any n in ceil(log2 n) rounds.

    Work in a buffer rotated so that this rank's own piece comes first: slot i
    is to hold the piece of rank (r + i) mod n. In round k (distance
    d = 2^k) rank r sends its first min(d, n - d) slots to rank r - d and
    receives as many from rank r + d into slots d, d + 1, ...: rank r + d's
    first slots are exactly the pieces r's next slots need. The slots filled
    double each round, the last round sending only what is still missing.
    Finally rotate the slots back into rank order (a local copy).
    Cost: ceil(log2 n) alpha + (n-1)/n N xbeta.
    """
    n, rank = comm.size, comm.rank
    piece = buffer.size // n
    slots = np.empty_like(buffer)
    slots[:piece] = buffer[rank * piece:(rank + 1) * piece]
    distance = 1
    while distance < n:
        count = min(distance, n - distance)
        to, source = (rank - distance) % n, (rank + distance) % n
        round_ = distance.bit_length() - 1
        yield [comm.isend(slots[:count * piece], to, f"round {round_} slots 0-{count - 1}"),
               comm.irecv(slots[distance * piece:(distance + count) * piece], source,
                          f"round {round_} slots {distance}-{distance + count - 1}")]
        distance <<= 1
    buffer[:] = np.roll(slots, rank * piece)


ALGORITHMS = register("all_gather", {
    "ring": ring,
    "recursive_doubling": recursive_doubling,
    "bruck": bruck,
})


def _gather(group, result, contribution, async_op, algorithm, finish):
    """Put this rank's contribution into its piece of ``result`` (flat, n pieces)
    and run the algorithm that fills in the others."""
    n = group.size
    count = contribution.size
    result[group.rank * count:(group.rank + 1) * count] = contribution.reshape(-1)
    if n == 1:
        return call.nothing_to_do(async_op, finish() if finish is not None else None)
    comm = call.start("all_gather", group, algorithm, nbytes=result.nbytes, dtype=result.dtype,
                      count=result.size, buffer=result)
    return call.execute(comm, call.steps_of(comm)(comm, result), async_op, finish)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False,
                           algorithm: str = "auto"):
    """Gather every rank's ``input_tensor`` into ``output_tensor`` on every rank:
    the output holds n times the input's elements, rank i's in the i-th n-th
    (along dim 0, or flat: any output shape with that many elements works).

    Every rank passes inputs of one shape and dtype. ``algorithm``: one of
    :data:`ALGORITHMS` or "auto". With ``async_op=True`` returns a Work.
    """
    group = call.group_of(group)
    rank = group._global_rank
    output = call.buffer_of(output_tensor, "all_gather_into_tensor", rank)
    contribution = call.buffer_of(input_tensor, "all_gather_into_tensor", rank, writeable=False)
    call.check_n_to_one(output, contribution, group, "all_gather_into_tensor",
                        output_is_whole=True, hint="Allocate it as "
                        "np.empty((n * x.shape[0],) + x.shape[1:], x.dtype).")
    flat, copied = call.flat_view(output)

    def finish():
        if copied:
            output[...] = flat.reshape(output.shape)

    return _gather(group, flat, contribution, async_op, algorithm, finish if copied else None)


def all_gather(tensor_list, tensor, group=None, async_op: bool = False, algorithm: str = "auto"):
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank:
    ``tensor_list[i]`` becomes (a copy of) rank i's ``tensor``.

    ``tensor_list`` has one array per rank of the group, each of ``tensor``'s
    shape and dtype. ``algorithm``: one of :data:`ALGORITHMS` or "auto".
    With ``async_op=True`` returns a Work; the list is filled by ``wait()``.
    """
    group = call.group_of(group)
    rank = group._global_rank
    contribution = call.buffer_of(tensor, "all_gather", rank, writeable=False)
    outputs = call.per_rank_arrays(tensor_list, group, "all_gather", "tensor_list", contribution)
    result = np.empty(group.size * contribution.size, contribution.dtype)

    def finish():
        for output, piece in zip(outputs, split(result, group.size)):
            output[...] = piece.reshape(output.shape)

    return _gather(group, result, contribution, async_op, algorithm, finish)
