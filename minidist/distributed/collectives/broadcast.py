"""broadcast: one rank's array, copied to every rank of the group.

    dist.broadcast(x, src=0)                      # every rank ends with rank 0's x
    dist.broadcast(x, src=0, algorithm="binomial")

Costs for n ranks and an N-byte array (alpha: latency per message, beta:
seconds per byte on a link, xbeta: per byte of a step that sends and
receives at once; see :mod:`.registry`):

=====================  ==================================================================
linear                 (n - 1) (alpha + N beta)   (the root sends n - 1 times)
binomial               ceil(log2 n) (alpha + N beta)
scatter_allgather      ceil(log2 n) alpha + (n-1)/n N beta + (n - 1) (alpha + N/n xbeta)
chain                  (n - 2 + S) (alpha + N/S xbeta)   (S segments, see chain_segments)
=====================  ==================================================================

Small arrays want few messages (binomial); large ones want every link busy
with a small part of the array: van de Geijn's scatter + allgather moves
about 2N bytes per rank whatever n is, and the pipelined chain keeps all n - 1
links streaming segments at once.

Ranks are *virtual*: ``v = (rank - src) mod n``, so every algorithm is written
as if the root were rank 0.
"""

from __future__ import annotations

from minidist.distributed.collectives import call, trees
from minidist.distributed.collectives.chunks import chunk_bounds, split
from minidist.distributed.collectives.registry import cost, register, whole_arrays
from minidist.distributed.collectives.scatter import binomial_scatter


@cost("(n - 1) (alpha + N beta)", traffic=whole_arrays(lambda n: n - 1))
def linear(comm, buffer, root, first_step=0):
    """The root sends the whole array to every other rank, one after another
    (its link carries n - 1 copies). Cost: (n - 1) (alpha + N beta)."""
    comm.at(first_step, "broadcast")
    if comm.rank == root:
        yield [comm.isend(buffer, peer, f"to {peer}")
               for peer in range(comm.size) if peer != root]
    else:
        yield [comm.irecv(buffer, root, f"from {root}")]


@cost("ceil(log2 n) (alpha + N beta)", traffic=whole_arrays(lambda n: n - 1))
def binomial(comm, buffer, root, first_step=0):
    """Binomial tree: in every round each rank that has the data sends it on,
    so the number of ranks holding it doubles each round.

    Round 0: the root sends to the rank 2^(L-1) away (L = ceil(log2 n)); round
    k: every holder sends to the rank 2^(L-1-k) away. In code: receive from
    the parent (clear the lowest set bit of the virtual rank), then send to
    the children v + 2^j, farthest subtree first. Any n works:
    children past the end are skipped. Cost: ceil(log2 n) (alpha + N beta).
    """
    n = comm.size
    rounds = max(n - 1, 0).bit_length()
    virtual = (comm.rank - root) % n
    mask = 1
    while mask < n:
        if virtual & mask:
            parent = (virtual - mask + root) % n
            round_ = rounds - mask.bit_length()  # the farthest subtree is served first
            comm.at(first_step + round_, "broadcast")
            yield [comm.irecv(buffer, parent, f"round {round_} from {parent}")]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:
        if virtual + mask < n:
            child = (virtual + mask + root) % n
            round_ = rounds - mask.bit_length()
            comm.at(first_step + round_, "broadcast")
            sends.append(comm.isend(buffer, child, f"round {round_} to {child}"))
        mask >>= 1
    if sends:
        yield sends


def _scatter_allgather_traffic(n, count, itemsize, root=0):
    # The scatter sends each rank its subtree's chunks, the allgather n - 1 chunks per rank.
    bounds = chunk_bounds(count, n)
    scatter = sum(bounds[v + trees.subtree_size(v, n)] - bounds[v] for v in range(1, n))
    return (n - 1) + n * (n - 1), (scatter + (n - 1) * count) * itemsize


@cost("ceil(log2 n) alpha + (n-1)/n N beta + (n - 1) (alpha + N/n xbeta)",
      traffic=_scatter_allgather_traffic)
def scatter_allgather(comm, buffer, root):
    """Van de Geijn: a binomial scatter, then a ring allgather.

    The array is cut into n chunks, chunk v belonging to virtual rank v.
    Scatter: the root sends each subtree of the binomial tree its chunks (the
    rank n/2 away gets the second half, and so on), so after ceil(log2 n)
    rounds rank v holds chunk v. Allgather: for n - 1 steps every rank sends
    the chunk it got last to its right neighbour and receives one from its
    left, until everyone holds every chunk. Chunks may be empty (fewer
    elements than ranks); they are still sent.
    Cost: ceil(log2 n) alpha + (n-1)/n N beta + (n - 1) (alpha + N/n xbeta).
    """
    n = comm.size
    bounds = chunk_bounds(buffer.size, n)
    yield from binomial_scatter(comm, buffer, bounds, root, 0)
    virtual = (comm.rank - root) % n
    right, left = (comm.rank + 1) % n, (comm.rank - 1) % n
    rounds = max(n - 1, 0).bit_length()
    for step in range(n - 1):
        comm.at(rounds + step, "allgather")
        out, into = (virtual - step) % n, (virtual - step - 1) % n
        yield [comm.isend(buffer[bounds[out]:bounds[out + 1]], right,
                          f"allgather step {step} chunk {out}"),
               comm.irecv(buffer[bounds[into]:bounds[into + 1]], left,
                          f"allgather step {step} chunk {into}")]


#: The chain's segments: about this many bytes each ...
SEGMENT_BYTES = 256 << 10
#: ... but never more than this many: each segment costs a latency alpha, and
#: with 64 segments the pipeline's fill (n - 2 segment times) is already a small
#: part of the whole for the world sizes of the course.
MAX_SEGMENTS = 64


def chain_segments(nbytes: int) -> int:
    """How many segments the chain cuts an ``nbytes`` array into: segments of
    about :data:`SEGMENT_BYTES`, at least 1 and at most :data:`MAX_SEGMENTS`.
    (The best S would be sqrt((n - 2) N beta / alpha), which every rank would
    need the same alpha and beta to agree on; a fixed size keeps it simple.)"""
    return max(1, min(MAX_SEGMENTS, -(-nbytes // SEGMENT_BYTES)))


@cost("(n - 2 + S) (alpha + N/S xbeta)",
      where={"S": lambda n, N, P: chain_segments(int(N))},
      traffic=lambda n, count, itemsize, root=0: ((n - 1) * chain_segments(count * itemsize),
                                                  (n - 1) * count * itemsize))
def chain(comm, buffer, root):
    """Pipelined chain: the array is cut into S segments that flow down the chain
    of virtual ranks 0 -> 1 -> ... -> n-1. The root sends the segments one after
    another; rank v receives segment s from v - 1 and forwards it to v + 1 while
    it receives segment s + 1. Once the pipeline is full every link carries a
    segment at the same time, so the time approaches N beta for large arrays,
    whatever n is. S from :func:`chain_segments` (segments of ~256 KiB, at most
    64). Cost: (n - 2 + S) (alpha + N/S xbeta).
    """
    n = comm.size
    virtual = (comm.rank - root) % n
    segments = split(buffer, chain_segments(comm.nbytes_of(buffer)))
    after, before = (comm.rank + 1) % n, (comm.rank - 1) % n
    # Segment s leaves virtual rank v in step v + s (the pipeline's diagonal).
    if virtual == 0:
        # The root has every segment from the start: post all its sends; the
        # transport streams them in order.
        sends = []
        for index, segment in enumerate(segments):
            comm.at(index, "pipeline")
            sends.append(comm.isend(segment, after, f"segment {index} to {after}"))
        yield sends
        return
    comm.at(virtual - 1, "pipeline")
    yield [comm.irecv(segments[0], before, f"segment 0 from {before}")]
    for index in range(len(segments)):
        step = []
        if virtual < n - 1:
            comm.at(virtual + index, "pipeline")
            step.append(comm.isend(segments[index], after, f"segment {index} to {after}"))
        if index + 1 < len(segments):
            comm.at(virtual + index, "pipeline")
            step.append(comm.irecv(segments[index + 1], before,
                                   f"segment {index + 1} from {before}"))
        if step:
            yield step


ALGORITHMS = register("broadcast", {
    "linear": linear,
    "binomial": binomial,
    "scatter_allgather": scatter_allgather,
    "chain": chain,
})


def broadcast(tensor, src: int | None = None, group=None, async_op: bool = False,
              group_src: int | None = None, algorithm: str = "auto"):
    """Copy rank ``src``'s ``tensor`` into ``tensor`` on every rank of ``group`` (in place).

    ``src`` is a global rank, as in torch.distributed; ``group_src`` the same
    root numbered within ``group`` (give one; neither: the group's first rank).

    Every rank passes an array of the same shape and dtype. ``algorithm``: one
    of :data:`ALGORITHMS` or "auto" (the cost model's choice for this size).
    With ``async_op=True`` returns a Work; call ``wait()`` before using tensor.
    """
    group = call.group_of(group)
    root = call.check_root(src, group, "broadcast", "src", group_src)
    array = call.buffer_of(tensor, "broadcast", group._global_rank)
    flat, copied = call.flat_view(array)
    if group.size == 1:
        return call.nothing_to_do(async_op)
    comm = call.start("broadcast", group, algorithm, nbytes=flat.nbytes, dtype=flat.dtype,
                      count=flat.size, root=root, buffer=flat)

    def finish():
        if copied:
            array[...] = flat.reshape(array.shape)

    return call.execute(comm, call.steps_of(comm)(comm, flat, root), async_op,
                        finish if copied else None)
