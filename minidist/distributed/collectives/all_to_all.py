"""all_to_all: every rank sends a different piece to every rank (a transpose of
the pieces across the ranks).

    dist.all_to_all_single(out, x)                 # out's piece i = rank i's piece r of x
    dist.all_to_all(out_list, in_list)             # out_list[i] = rank i's in_list[r]

What expert parallelism (routing tokens to the rank of their expert) and
sequence/head-parallel attention (Ulysses) are built on. Rank r's input is
cut into n equal pieces, piece j going to rank j; its output's piece i comes
from rank i. Costs for n ranks, each sending N bytes in all (N/n per
destination, its own piece included; xbeta: seconds per byte of a step that
sends and receives at once):

===================  ============================================================
pairwise             (n - 1) (alpha + N/n xbeta)
bruck                ceil(log2 n) alpha + C(n) N/n xbeta   (~ ceil(log2 n) (alpha + N/2 xbeta))
===================  ============================================================

(C(n) = sum_k c_k, c_k: how many of the indices 0 .. n-1 have bit k set;
n/2 when n is a power of two.) Unlike all_gather, every piece has its own destination, so
the n - 1 pieces must each cross a link at least once: (n-1)/n N beta is
the least, which the pairwise exchange achieves in n - 1 messages. Bruck's
algorithm trades bandwidth for latency: log2 n messages, but each piece is
forwarded up to log2 n times, so it wins only for small pieces.

Any n works for both: the pairwise exchange pairs rank r with r + s and
r - s mod n in step s; Bruck's rounds send the pieces whose (rotated) index
has bit k set, and the indices simply stop at n - 1.

Only equal pieces are supported (``all_to_all_single``'s split sizes must be
equal, ``all_to_all``'s arrays of one shape). The input is left as it was.
"""

from __future__ import annotations

import numpy as np

from minidist.alpha_beta import bruck_pieces, ceil_log2
from minidist.distributed.collectives import call
from minidist.distributed.collectives.all_gather import check_per_rank_list
from minidist.distributed.collectives.chunks import split
from minidist.distributed.collectives.registry import cost, register


@cost("(n - 1) (alpha + N/n xbeta)",
      traffic=lambda n, count, itemsize, root=0: (n * (n - 1), (n - 1) * count * itemsize))
def pairwise(comm, source, result):
    """Pairwise exchange: keep your own piece; then in step s (1 .. n - 1) send
    piece (r + s) mod n to rank (r + s) mod n and receive piece (r - s) mod n
    from rank (r - s) mod n. Each step pairs every rank with a different
    partner, so every link is busy and nobody waits on a slow rank twice.
    Cost: (n - 1) (alpha + N/n xbeta).
    """
    n, rank = comm.size, comm.rank
    outgoing, incoming = split(source, n), split(result, n)
    incoming[rank][:] = outgoing[rank]
    for step in range(1, n):
        to, source_rank = (rank + step) % n, (rank - step) % n
        yield [comm.isend(outgoing[to], to, f"step {step} piece to {to}"),
               comm.irecv(incoming[source_rank], source_rank, f"step {step} piece from "
                          f"{source_rank}")]


@cost("ceil(log2 n) alpha + C(n) N/n xbeta",
      traffic=lambda n, count, itemsize, root=0: (n * ceil_log2(n),
                                                  bruck_pieces(n) * count * itemsize))
def bruck(comm, source, result):
    """Bruck's all-to-all in ceil(log2 n) rounds, for any n.

    1. Rotate locally so slot i holds the piece for rank (r + i) mod n: the
       piece that must travel i ranks forward.
    2. In round k (distance d = 2^k) send every slot whose index has bit k set
       to rank r + d, and take the same slots from rank r - d. A piece that
       must travel i ranks moves by the powers of two that make up i, and
       keeps its slot index all the way.
    3. Slot i now holds the piece rank r - i sent to r: rotate (and reverse)
       into rank order.

    The slots of a round are packed into one message (a local copy each way).
    Cost: ceil(log2 n) alpha + C(n) N/n xbeta, about
    ceil(log2 n) (alpha + N/2 xbeta); C(n) = sum_k c_k, c_k counting the
    indices with bit k set.
    """
    n, rank = comm.size, comm.rank
    piece = source.size // n
    slots = np.roll(source, -rank * piece).reshape(n, piece)
    distance = 1
    while distance < n:
        moving = [index for index in range(n) if index & distance]
        outgoing = slots[moving].reshape(-1)
        incoming = np.empty_like(outgoing)
        round_ = distance.bit_length() - 1
        to, source_rank = (rank + distance) % n, (rank - distance) % n
        yield [comm.isend(outgoing, to, f"round {round_} {len(moving)} pieces to {to}"),
               comm.irecv(incoming, source_rank,
                          f"round {round_} {len(moving)} pieces from {source_rank}")]
        slots[moving] = incoming.reshape(len(moving), piece)
        distance <<= 1
    result.reshape(n, piece)[(rank - np.arange(n)) % n] = slots


ALGORITHMS = register("all_to_all", {
    "pairwise": pairwise,
    "bruck": bruck,
})


def _exchange(group, source, result, async_op, algorithm, finish):
    """Run the all-to-all of flat ``source`` into flat ``result`` (n pieces each)."""
    if np.may_share_memory(source, result):
        source = source.copy()  # pieces still to send must not be overwritten by arrivals
    if group.size == 1:
        result[:] = source
        return call.nothing_to_do(async_op, finish() if finish is not None else None)
    comm = call.start("all_to_all", group, algorithm, nbytes=source.nbytes, dtype=source.dtype,
                      count=source.size, buffer=source)
    return call.execute(comm, call.steps_of(comm)(comm, source, result), async_op, finish)


def _check_splits(splits, total: int, n: int, name: str, rank: int) -> None:
    if splits is None or len(splits) == 0:
        return
    splits = [int(size) for size in splits]
    if len(splits) != n:
        raise ValueError(f"rank {rank}: all_to_all_single needs {name} to have one size per "
                         f"rank, {n}, got {len(splits)}.")
    if any(size != total // n for size in splits) or total % n:
        raise ValueError(f"rank {rank}: all_to_all_single here supports equal pieces only, "
                         f"got {name}={splits} for {total} rows. Pad every piece to the "
                         "largest size (and send the true sizes first with an all_to_all of "
                         "one int per rank), or leave the split sizes out.")


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op: bool = False, algorithm: str = "auto"):
    """Cut ``input`` into n equal pieces (flat, i.e. along dim 0), send piece j to
    group rank j, and put the piece from rank i into the i-th n-th of ``output``.

    ``output`` has the input's size and dtype. Split sizes, if given, must all
    be equal (rows of dim 0, as in torch). With ``async_op=True`` returns a Work.
    """
    group = call.group_of(group)
    rank, n = group._global_rank, group.size
    result = call.buffer_of(output, "all_to_all_single", rank)
    source = call.buffer_of(input, "all_to_all_single", rank, writeable=False)
    if source.dtype != result.dtype:
        raise TypeError(f"rank {rank}: all_to_all_single needs output and input of one dtype, "
                        f"got output {result.dtype} and input {source.dtype}.")
    if source.size != result.size:
        raise ValueError(f"rank {rank}: all_to_all_single needs output and input of one size, "
                         f"got output {result.shape} and input {source.shape}.")
    _check_splits(input_split_sizes, source.shape[0] if source.ndim else 1, n,
                  "input_split_sizes", rank)
    _check_splits(output_split_sizes, result.shape[0] if result.ndim else 1, n,
                  "output_split_sizes", rank)
    if source.size % n:
        raise ValueError(f"rank {rank}: all_to_all_single on {n} ranks cuts the input into "
                         f"{n} equal pieces, but it has {source.size} elements (shape "
                         f"{source.shape}), not a multiple of {n}. Pad it to a multiple of {n}.")
    flat_source = np.ascontiguousarray(source).reshape(-1)
    flat, copied = call.flat_view(result)

    def finish():
        if copied:
            result[...] = flat.reshape(result.shape)

    return _exchange(group, flat_source, flat, async_op, algorithm, finish if copied else None)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False,
               algorithm: str = "auto"):
    """Send ``input_tensor_list[j]`` to group rank j; ``output_tensor_list[i]``
    receives what rank i sent to this rank.

    Both lists have one array per rank, all of one shape and dtype. With
    ``async_op=True`` returns a Work; the output list is filled by ``wait()``.
    """
    group = call.group_of(group)
    rank = group._global_rank
    if not isinstance(input_tensor_list, (list, tuple)) or not input_tensor_list:
        raise TypeError(f"rank {rank}: all_to_all needs input_tensor_list as a list of "
                        f"{group.size} arrays (one per rank), got {input_tensor_list!r:.60}.")
    like = call.buffer_of(input_tensor_list[0], "all_to_all", rank, writeable=False)
    inputs = check_per_rank_list(input_tensor_list, group, like, "all_to_all", "input_tensor_list",
                         "input_tensor_list[0]", writeable=False)
    outputs = check_per_rank_list(output_tensor_list, group, like, "all_to_all", "output_tensor_list",
                          "input_tensor_list[0]")
    source = np.concatenate([array.reshape(-1) for array in inputs])
    result = np.empty_like(source)

    def finish():
        for output, piece in zip(outputs, split(result, group.size)):
            output[...] = piece.reshape(output.shape)

    return _exchange(group, source, result, async_op, algorithm, finish)
