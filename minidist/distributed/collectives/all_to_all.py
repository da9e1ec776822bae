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

Uneven pieces, what expert parallelism sends (each rank routes a different
number of tokens to each expert): ``all_to_all_single(out, x,
output_split_sizes, input_split_sizes)`` cuts dim 0 of ``x`` into
``input_split_sizes[j]`` rows for rank j and of ``out`` into
``output_split_sizes[i]`` rows from rank i, as torch does; ``all_to_all``'s
lists may hold arrays of different sizes. Only the pairwise exchange can do
it ("auto" takes it; Bruck's rounds forward slots of one size, so "bruck"
refuses): in step s each pair moves its own counts, at a cost of

    (n - 1) alpha + sum over steps s of max(bytes sent, bytes received) xbeta

(the larger piece of a step sets its pace). A piece of zero rows is still
sent, as an empty message: both sides of every pair then make the same calls
in the same order whatever the counts, and an ``output_split_sizes[i]`` that
is not what rank i sends is a message of the wrong size, which the
transport refuses at once (instead of a rank waiting for a message that
never comes). Which receiver sees it first is chance, so each rank shows
its sizes as the call begins, and the receiver names the rank whose sizes
disagree with the most ranks' (a CollectiveMismatchError,
:mod:`.split_sizes`; a MessageMismatchError naming both sizes where the
ranks' records cannot be read). Every rank must
pass split sizes, or none: "auto" chooses by the bytes of an equal
exchange, which differ between ranks of an uneven one, so the two kinds of
call are told apart by their fingerprint (a rank with split sizes and one
without end in a collective mismatch error, not in a wrong exchange).

The input is left as it was.
"""

from __future__ import annotations

import numpy as np

from minidist.alpha_beta import bruck_pieces, ceil_log2
from minidist.distributed.collectives import call, split_sizes
from minidist.distributed.collectives.chunks import split
from minidist.distributed.collectives.registry import cost, register


@cost("(n - 1) (alpha + N/n xbeta)",
      traffic=lambda n, count, itemsize, root=0: (n * (n - 1), (n - 1) * count * itemsize))
def pairwise(comm, source, result, send_counts=None, receive_counts=None):
    """Pairwise exchange: keep your own piece; then in step s (1 .. n - 1) send
    piece (r + s) mod n to rank (r + s) mod n and receive piece (r - s) mod n
    from rank (r - s) mod n. Each step pairs every rank with a different
    partner, so every link is busy and nobody waits on a slow rank twice.
    Cost: (n - 1) (alpha + N/n xbeta).

    ``send_counts`` / ``receive_counts`` (elements per rank, uneven pieces):
    piece j of ``source`` is ``send_counts[j]`` elements, piece i of
    ``result`` ``receive_counts[i]``; the steps are the same, an empty piece
    an empty message. Cost: (n - 1) alpha + sum over s of max(sent, received)
    xbeta.
    """
    n, rank = comm.size, comm.rank
    outgoing = split(source, n) if send_counts is None else pieces(source, send_counts)
    incoming = split(result, n) if receive_counts is None else pieces(result, receive_counts)
    incoming[rank][:] = outgoing[rank]
    for step in range(1, n):
        to, source_rank = (rank + step) % n, (rank - step) % n
        yield [comm.isend(outgoing[to], to, f"step {step} piece to {to}"),
               comm.irecv(incoming[source_rank], source_rank, f"step {step} piece from "
                          f"{source_rank}")]


def pieces(flat: np.ndarray, counts) -> list[np.ndarray]:
    """Views of ``flat`` cut into consecutive pieces of ``counts`` elements."""
    bounds = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    return [flat[bounds[index]:bounds[index + 1]] for index in range(len(counts))]


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


#: The element count an uneven call's fingerprint carries: its ranks' counts
#: differ, so none of them can stand for the call (each message's size is
#: checked by the transport instead).
UNEVEN = -1


def _exchange_uneven(group, source, result, send_counts, receive_counts, async_op,
                     algorithm, finish, collective):
    """The pairwise exchange of pieces of ``send_counts`` / ``receive_counts``
    elements; an all-equal exchange may take any algorithm."""
    n = group.size
    if len(set(send_counts) | set(receive_counts)) == 1 and algorithm not in ("auto", "pairwise"):
        return _exchange(group, source, result, async_op, algorithm, finish)
    if algorithm not in ("auto", "pairwise"):
        raise ValueError(
            f"rank {group._global_rank}: {collective} with uneven pieces (sent "
            f"{_rows(send_counts)}, received {_rows(receive_counts)} elements per rank) can "
            f"only run the pairwise exchange, not {algorithm!r}: it moves each pair's own "
            "counts. Pass algorithm='pairwise' or 'auto'.")
    if np.may_share_memory(source, result):
        source = source.copy()
    if n == 1:
        result[:] = source
        return call.nothing_to_do(async_op, finish() if finish is not None else None)
    comm = call.start("all_to_all", group, "pairwise", nbytes=source.nbytes,
                      dtype=source.dtype, count=UNEVEN, buffer=source)
    # Shown before any piece moves: a receiver whose piece does not fit
    # reads every rank's sizes and names the odd rank (see split_sizes).
    split_sizes.show(comm, collective, send_counts, receive_counts)
    return call.execute(comm, pairwise(comm, source, result, send_counts, receive_counts),
                        async_op, finish)


def _rows(counts) -> str:
    return "[" + ", ".join(str(int(count)) for count in counts) + "]"


def _given(splits) -> bool:
    return splits is not None and len(splits) > 0


def _split_rows(splits, rows: int, n: int, name: str, rank: int) -> list[int]:
    """The rows of dim 0 per rank: ``splits`` checked, or ``rows`` cut in n equal parts."""
    if not _given(splits):
        if rows % n:
            raise ValueError(f"rank {rank}: all_to_all_single without {name} cuts dim 0 into "
                             f"{n} equal parts, but it has {rows} rows, not a multiple of "
                             f"{n}. Pass {name} (rows per rank).")
        return [rows // n] * n
    if len(splits) != n:
        raise ValueError(f"rank {rank}: all_to_all_single needs {name} to have one size per "
                         f"rank, {n}, got {len(splits)}.")
    checked = []
    for index, size in enumerate(splits):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(f"rank {rank}: all_to_all_single's {name}[{index}] is {size!r}, "
                             f"but split sizes are non-negative ints, whole numbers of rows of "
                             f"dim 0 (one per rank); got {name}={list(splits)}.")
        checked.append(int(size))
    if sum(checked) != rows:
        raise ValueError(f"rank {rank}: all_to_all_single's {name}={checked} sum to "
                         f"{sum(checked)} rows, but dim 0 has {rows}. The split sizes cut "
                         "dim 0 and must add up to it.")
    return checked


def _uneven_counts(source, result, input_split_sizes, output_split_sizes, group):
    """Elements sent to and received from each rank, from the split sizes (rows of dim 0)."""
    rank, n, me = group._global_rank, group.size, group.rank
    if source.ndim == 0 or result.ndim == 0:
        raise ValueError(f"rank {rank}: all_to_all_single's split sizes cut dim 0, but "
                         "a 0-d array has none; pass arrays of at least one dimension.")
    if source.shape[1:] != result.shape[1:]:
        raise ValueError(f"rank {rank}: all_to_all_single with split sizes moves rows of dim "
                         f"0, so output and input need one row shape; got output "
                         f"{result.shape} and input {source.shape}.")
    row = int(np.prod(source.shape[1:], dtype=np.int64))
    sent = _split_rows(input_split_sizes, source.shape[0], n, "input_split_sizes", rank)
    received = _split_rows(output_split_sizes, result.shape[0], n, "output_split_sizes", rank)
    if sent[me] != received[me]:
        raise ValueError(f"rank {rank}: all_to_all_single keeps its own piece, but "
                         f"input_split_sizes[{me}] = {sent[me]} rows and output_split_sizes"
                         f"[{me}] = {received[me]}; they must be equal.")
    return [count * row for count in sent], [count * row for count in received]


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op: bool = False, algorithm: str = "auto"):
    """Send piece j of ``input`` to group rank j and put the piece from rank i
    into piece i of ``output``.

    Without split sizes both are cut into n equal pieces (flat; for arrays
    whose dim 0 is a multiple of n, rows of dim 0, as in torch): ``output``
    has the input's size and dtype. With ``input_split_sizes`` (rows of dim 0
    sent to each rank) and ``output_split_sizes`` (rows received from each
    rank), as torch: each must add up to its array's dim 0, either may be
    left out for equal parts, and ``output_split_sizes[i]`` must be what rank
    i sends here (else a CollectiveMismatchError naming the odd rank).
    Uneven pieces run the pairwise exchange. With ``async_op=True`` returns
    a Work.
    """
    group = call.group_of(group)
    rank, n = group._global_rank, group.size
    result = call.buffer_of(output, "all_to_all_single", rank)
    source = call.buffer_of(input, "all_to_all_single", rank, writeable=False)
    if source.dtype != result.dtype:
        raise TypeError(f"rank {rank}: all_to_all_single needs output and input of one dtype, "
                        f"got output {result.dtype} and input {source.dtype}.")
    uneven = _given(input_split_sizes) or _given(output_split_sizes)
    if uneven:
        send_counts, receive_counts = _uneven_counts(source, result, input_split_sizes,
                                                     output_split_sizes, group)
    elif source.size != result.size:
        raise ValueError(f"rank {rank}: all_to_all_single needs output and input of one size, "
                         f"got output {result.shape} and input {source.shape}.")
    elif source.size % n:
        raise ValueError(f"rank {rank}: all_to_all_single on {n} ranks cuts the input into "
                         f"{n} equal pieces, but it has {source.size} elements (shape "
                         f"{source.shape}), not a multiple of {n}. Pad it to a multiple of {n}, "
                         "or pass input_split_sizes and output_split_sizes.")
    flat_source = np.ascontiguousarray(source).reshape(-1)
    flat, copied = call.flat_view(result)

    def finish():
        if copied:
            result[...] = flat.reshape(result.shape)

    finish = finish if copied else None
    if uneven:
        return _exchange_uneven(group, flat_source, flat, send_counts, receive_counts,
                                async_op, algorithm, finish, "all_to_all_single")
    return _exchange(group, flat_source, flat, async_op, algorithm, finish)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False,
               algorithm: str = "auto"):
    """Send ``input_tensor_list[j]`` to group rank j; ``output_tensor_list[i]``
    receives what rank i sent to this rank.

    One array per rank in each list, all of one dtype; their sizes may differ
    (as in torch), ``output_tensor_list[i]`` being the size of what rank i
    sends (else a CollectiveMismatchError naming the odd rank). "auto" runs
    the pairwise exchange: a rank cannot tell from its own lists whether
    another rank's pieces are equal, and every rank must choose the same
    algorithm. With
    ``async_op=True`` returns a Work; the output list is filled by ``wait()``.
    """
    group = call.group_of(group)
    rank, me = group._global_rank, group.rank
    if not isinstance(input_tensor_list, (list, tuple)) or not input_tensor_list:
        raise TypeError(f"rank {rank}: all_to_all needs input_tensor_list as a list of "
                        f"{group.size} arrays (one per rank), got {input_tensor_list!r:.60}.")
    inputs = call.per_rank_arrays(input_tensor_list, group, "all_to_all", "input_tensor_list",
                                  writeable=False)
    outputs = call.per_rank_arrays(output_tensor_list, group, "all_to_all", "output_tensor_list")
    dtype = inputs[0].dtype
    for name, arrays in (("input_tensor_list", inputs), ("output_tensor_list", outputs)):
        for index, array in enumerate(arrays):
            if array.dtype != dtype:
                raise ValueError(f"rank {rank}: all_to_all needs every array of one dtype "
                                 f"(input_tensor_list[0]'s {dtype}), but {name}[{index}] is "
                                 f"{array.dtype}.")
    send_counts = [array.size for array in inputs]
    receive_counts = [array.size for array in outputs]
    if send_counts[me] != receive_counts[me]:
        raise ValueError(f"rank {rank}: all_to_all keeps its own piece, but "
                         f"input_tensor_list[{me}] has {send_counts[me]} elements and "
                         f"output_tensor_list[{me}] {receive_counts[me]}; they must be equal.")
    source = np.concatenate([array.reshape(-1) for array in inputs])
    result = np.empty(sum(receive_counts), dtype)

    def finish():
        for output, piece in zip(outputs, pieces(result, receive_counts)):
            output[...] = piece.reshape(output.shape)

    return _exchange_uneven(group, source, result, send_counts, receive_counts, async_op,
                            algorithm, finish, "all_to_all")
