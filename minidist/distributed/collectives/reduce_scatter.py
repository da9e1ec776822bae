"""reduce_scatter: combine every rank's array element-wise, and leave the i-th
n-th of the result on rank i.

    dist.reduce_scatter_tensor(shard, full_grad)           # shard = my n-th of the sum
    dist.reduce_scatter(out, [piece_for_0, piece_for_1, ...], op=dist.ReduceOp.AVG)

It is the first half of the ring and Rabenseifner all_reduce on its own
(all_reduce = reduce_scatter + all_gather), and what ZeRO and FSDP use to
leave each rank only the gradients of the parameters it owns. The input is
cut into n equal pieces; rank r ends with the combination of everyone's
piece r. Costs for n ranks and an N-byte *input* (each rank ends with N/n
bytes; gamma: seconds per byte combined; xbeta: seconds per byte of a step
that sends and receives at once; p: the largest power of two <= n; B(n)
defined at :func:`recursive_halving`):

===================  ==============================================================
ring                 (n - 1) (alpha + N/n (xbeta + gamma))
recursive_halving    log2 p alpha + (n-1)/n N (xbeta + gamma) if n == p
                     else (log2 p + 2) alpha + B(n) N/n (xbeta + gamma)
                     + N (beta + gamma) + N/n beta
pairwise             (n - 1) (alpha + N/n (xbeta + gamma))
===================  ==============================================================

Each rank must receive the n - 1 other contributions to its piece, so
(n-1)/n N (xbeta + gamma) is the least; recursive halving gets there in
log2 p messages, the ring and the pairwise exchange in n - 1. The ring
talks only to neighbours; the pairwise exchange talks to everyone (good on
a full-bisection network, and every contribution is combined exactly once
by its owner, straight from what its sender holds).

Worlds that are not a power of two (recursive halving), as MPICH does it:
of the first 2 (n - p) ranks, each even one hands its whole input to its
odd neighbour, which combines it and stands for both in a power-of-two
recursive halving over the pieces of the ranks it stands for; at the end
the odd rank sends the even one its finished piece.

The input is left as it was (as in torch): algorithms that combine in place
(ring, recursive halving) work on a scratch copy of it. AVG is SUM followed
by one division by n of the result.
"""

from __future__ import annotations

import numpy as np

from minidist.alpha_beta import ceil_log2
from minidist.distributed.collectives import call
from minidist.distributed.collectives.all_gather import core_piece_offsets
from minidist.distributed.collectives.chunks import largest_power_of_two, split
from minidist.distributed.collectives.halving import real_rank as _real_rank
from minidist.distributed.collectives.registry import cost, register
from minidist.distributed.reduce_op import ReduceOp


def _exchanges(n, count, itemsize, root=0):
    """Traffic of n - 1 steps in which every rank sends one piece."""
    return n * (n - 1), (n - 1) * count * itemsize


@cost("(n - 1) (alpha + N/n (xbeta + gamma))", traffic=_exchanges)
def ring(comm, pieces, output):
    """Ring reduce-scatter: for n - 1 steps, pass a partial sum to the right and
    add your own contribution to the one arriving from the left.

    In step s rank r sends piece (r - s - 1) mod n (its own contribution at
    step 0, then the partial sum it combined in the step before) to its right
    neighbour and combines piece (r - s - 2) mod n arriving from its left.
    Each piece travels n - 1 hops, picking up one contribution per hop, and
    ends finished on its owner: after the last step rank r holds piece r.
    Cost: (n - 1) (alpha + N/n (xbeta + gamma)).
    """
    n, rank = comm.size, comm.rank
    chunks = split(pieces, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        comm.at(step, "reduce-scatter")
        out, into = (rank - step - 1) % n, (rank - step - 2) % n
        yield [comm.isend(chunks[out], right, f"step {step} piece {out}"),
               comm.irecv_reduce(chunks[into], left, f"step {step} piece {into}")]
    output[:] = chunks[rank]


def _recursive_halving_traffic(n, count, itemsize, root=0):
    p = largest_power_of_two(n)
    # fold in (the whole input each), the halving ((p - 1) pieces per member,
    # the pairs' pieces counted twice), hand back (a piece each)
    return (p * ceil_log2(p) + 2 * (n - p),
            ((n - p) * n + n * (p - 1) + n - p) * count // n * itemsize)


@cost("log2 p alpha + (n-1)/n N (xbeta + gamma) if n == p"
      " else (log2 p + 2) alpha + B(n) N/n (xbeta + gamma) + N (beta + gamma) + N/n beta",
      traffic=_recursive_halving_traffic)
def recursive_halving(comm, pieces, output):
    """Recursive halving: in round k each rank sends the half of its pieces its
    partner keeps, and combines the half it keeps with the partner's.

    The partner is the rank differing in bit log2(p) - 1 - k; the pieces a
    rank is responsible for halve every round (those of the ranks on its side
    of the bit), so after log2 p rounds rank r holds only its own piece,
    combined over all ranks. Bytes sent per rank: N/2 + N/4 + ... + N/p.

    Other n (folded, see the module docstring): the fold in costs
    alpha + N (beta + gamma) and the hand-back alpha + N/n beta. The core
    members that stand for two ranks own two pieces, so the halves are not
    equal: round k (counting up, mask 2^k) sends at most 2^k + min(2^k, n - p)
    pieces, in all B(n) = sum_k (2^k + min(2^k, n - p)) pieces (n - 1 when
    n = p). Cost: log2 p alpha + (n-1)/n N (xbeta + gamma) if n == p
    else (log2 p + 2) alpha + B(n) N/n (xbeta + gamma) + N (beta + gamma) + N/n beta.
    """
    n, rank = comm.size, comm.rank
    p = largest_power_of_two(n)
    extra = n - p
    piece = pieces.size // n
    if rank < 2 * extra:  # the fold in: even ranks leave everything with the odd one
        if rank % 2 == 0:
            yield [comm.isend(pieces, rank + 1, f"fold in to {rank + 1}")]
            yield [comm.irecv(output, rank + 1, f"fold out piece {rank} from {rank + 1}")]
            return
        yield [comm.irecv_reduce(pieces, rank - 1, f"fold in from {rank - 1}")]
        virtual = rank // 2
    else:
        virtual = rank - extra
    offsets = core_piece_offsets(n, p, piece)
    low, high = 0, p  # the core members whose pieces this rank is responsible for
    mask = p >> 1
    while mask:
        partner = virtual ^ mask
        middle = (low + high) // 2
        if virtual & mask:
            keep, give = (middle, high), (low, middle)
        else:
            keep, give = (low, middle), (middle, high)
        peer = _real_rank(partner, extra)
        label = f"round {p.bit_length() - 1 - mask.bit_length()}"
        yield [comm.isend(pieces[offsets[give[0]]:offsets[give[1]]], peer, f"{label} to {peer}"),
               comm.irecv_reduce(pieces[offsets[keep[0]]:offsets[keep[1]]], peer,
                                 f"{label} from {peer}")]
        low, high = keep
        mask >>= 1
    output[:] = pieces[rank * piece:(rank + 1) * piece]
    if rank < 2 * extra:
        yield [comm.isend(pieces[(rank - 1) * piece:rank * piece], rank - 1,
                          f"fold out piece {rank - 1} to {rank - 1}")]


@cost("(n - 1) (alpha + N/n (xbeta + gamma))", traffic=_exchanges)
def pairwise(comm, pieces, output):
    """Pairwise exchange: in step s (1 .. n - 1) rank r sends piece (r + s) mod n
    to its owner, rank (r + s) mod n, and combines into its own piece the
    contribution of rank (r - s) mod n. Every pair of ranks meets once.
    Only reads ``pieces``. Cost: (n - 1) (alpha + N/n (xbeta + gamma)).
    """
    n, rank = comm.size, comm.rank
    chunks = split(pieces, n)
    output[:] = chunks[rank]
    for step in range(1, n):
        to, source = (rank + step) % n, (rank - step) % n
        yield [comm.isend(chunks[to], to, f"step {step} piece {to} to {to}"),
               comm.irecv_reduce(output, source, f"step {step} piece {rank} from {source}")]


ALGORITHMS = register("reduce_scatter", {
    "ring": ring,
    "recursive_halving": recursive_halving,
    "pairwise": pairwise,
})

def _copy(target: np.ndarray, source: np.ndarray) -> np.ndarray:
    target[:] = source.reshape(-1)
    return target.reshape(source.shape)


#: The algorithms that write into the pieces they are given.
_COMBINE_IN_PLACE = ("ring", "recursive_halving")


def _scatter_reduce(group, pieces, pieces_are_scratch, output, op, async_op, algorithm,
                    collective):
    """Run the reduce-scatter of flat ``pieces`` (n pieces) into ``output``."""
    rank = group._global_rank
    op, ufunc, average = call.reduction(op, output.dtype, collective, rank)
    flat, copied = call.flat_view(output)

    def finish():
        if average:
            call.finish_average(flat, group.size)
        if copied:
            output[...] = flat.reshape(output.shape)

    if group.size == 1:
        flat[:] = pieces
        return call.nothing_to_do(async_op, finish())
    comm = call.start("reduce_scatter", group, algorithm, nbytes=pieces.nbytes, op=op,
                      ufunc=ufunc, dtype=pieces.dtype, count=pieces.size)
    if not pieces_are_scratch and (comm.algorithm in _COMBINE_IN_PLACE
                                   or np.may_share_memory(pieces, flat)):
        pieces = _copy(comm.scratch(pieces), pieces)  # the caller's input is left as it was
    comm.buffer = pieces
    return call.execute(comm, call.steps_of(comm)(comm, pieces, flat), async_op,
                        finish if (average or copied) else None)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False,
                          algorithm: str = "auto"):
    """Combine every rank's ``input`` with ``op`` and leave the i-th n-th of the
    result (flat, i.e. along dim 0) in ``output`` on group rank i.

    ``input`` holds n times ``output``'s elements, same dtype; it is not
    changed. ``op``: a ReduceOp (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR,
    BXOR), its name, or a binary ufunc. With ``async_op=True`` returns a Work.
    """
    group = call.group_of(group)
    rank = group._global_rank
    result = call.buffer_of(output, "reduce_scatter_tensor", rank)
    source = call.buffer_of(input, "reduce_scatter_tensor", rank, writeable=False)
    n = group.size
    call.check_n_to_one(result, source, group, "reduce_scatter_tensor", output_is_whole=False,
                        hint=f"The input is cut into {n} equal pieces: pad it to a multiple "
                        f"of {n}, or size the output as input.size // {n}.")
    pieces, copied = call.flat_view(source)
    return _scatter_reduce(group, pieces, copied, result, op, async_op, algorithm,
                           "reduce_scatter_tensor")


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False,
                   algorithm: str = "auto"):
    """Combine, over all ranks, ``input_list[i]`` with ``op`` and leave the result
    in ``output`` on group rank i.

    ``input_list`` has one array per rank, each of ``output``'s shape and
    dtype; it is not changed. With ``async_op=True`` returns a Work.
    """
    group = call.group_of(group)
    result = call.buffer_of(output, "reduce_scatter", group._global_rank)
    inputs = call.per_rank_arrays(input_list, group, "reduce_scatter", "input_list", result,
                                  "output", writeable=False)
    pieces = np.concatenate([array.reshape(-1) for array in inputs])
    return _scatter_reduce(group, pieces, True, result, op, async_op, algorithm,
                           "reduce_scatter")
