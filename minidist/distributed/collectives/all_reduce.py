"""all_reduce: every rank ends with the element-wise combination of all ranks' arrays.

    dist.all_reduce(grad, op=dist.ReduceOp.SUM)              # in place, every rank
    dist.all_reduce(grad, algorithm="ring")                   # choose the algorithm

The algorithms of the course, cheapest in latency first. For n ranks and an
N-byte array (alpha: latency of a message, beta: seconds per byte moved,
xbeta: per byte of a step that sends and receives at once, beta on a
full-duplex link; gamma: seconds per byte combined; p: the largest power of
two <= n):

======================  ========================================================
coordinator             2 (n - 1) (alpha + N beta) + (n - 1) N gamma
reduce_broadcast        2 ceil(log2 n) (alpha + N beta) + ceil(log2 n) N gamma
recursive_doubling      log2 p (alpha + N xbeta + N gamma)
                        + (2 (alpha + N beta) + N gamma if n != p else 0)
rabenseifner            2 log2 p alpha + 2 (p-1)/p N xbeta + (p-1)/p N gamma
                        + (2 (alpha + N beta) + N gamma if n != p else 0)
ring                    2 (n - 1) alpha + 2 (n-1)/n N xbeta + (n-1)/n N gamma
two_shot                2 (n - 1) alpha + 2 (n-1)/n N xbeta + (n-1)/n N gamma  (2 steps)
one_shot                slots_alpha + N beta + (n - 1) N gamma if shared
                        else (n - 1) (alpha + N xbeta) + (n - 1) N gamma      (1 step)
double_binary_tree      (k + 2 ceil(log2 n) - 1) (alpha + 2 N/k beta + N/k gamma)
======================  ========================================================

For a machine of nodes, :mod:`.hierarchical`, :mod:`.ring_2d` and
:mod:`.nccl_tree` add three more (``registry.NODE_ALGORITHMS``).

(The last term of recursive doubling and Rabenseifner: the fold of a world
that is not a power of two. shared: the array fits the shared slots, see
:func:`one_shot`. k: the chunks each half is pipelined in, see
:func:`double_binary_tree`.)

Latency-bound small arrays want few steps (recursive doubling); large arrays
want few bytes per rank (ring, Rabenseifner: each rank sends about 2N bytes
whatever n is, which is why the ring's time stays flat as n grows).

Identical bits: every algorithm here leaves the same bits on every rank. Each
element is combined by exactly one rank (ring, Rabenseifner, coordinator,
reduce + broadcast, double binary tree) and then copied, or, in recursive doubling, both partners
compute ``a + b`` and ``b + a`` of identical partial results, which IEEE
arithmetic makes equal.

Worlds that are not a power of two (recursive doubling, Rabenseifner), as
MPICH does it: of the first 2 (n - p) ranks, each even one hands its whole
array to its odd neighbour and sits out; the remaining p ranks run the
power-of-two algorithm; at the end each odd rank hands the result back.
"""

from __future__ import annotations

import functools

from minidist.distributed.collectives import broadcast as _broadcast
from minidist.distributed.collectives import call
from minidist.distributed.collectives import reduce as _reduce
from minidist.distributed.collectives.chunks import (
    chunk_bounds,
    double_binary_tree_chunks,
    largest_power_of_two,
    split,
)
from minidist.distributed.collectives.halving import fold_in as _fold_in
from minidist.distributed.collectives.halving import fold_out as _fold_out
from minidist.distributed.collectives.halving import real_rank as _real_rank
from minidist.distributed.collectives.halving import reduce_scatter_by_halving
from minidist.distributed.collectives.registry import cost, register, whole_arrays
from minidist.distributed.reduce_op import ReduceOp
from minidist.distributed.transport import shared_slots


@cost("2 (n - 1) (alpha + N beta) + (n - 1) N gamma",
      traffic=whole_arrays(lambda n: 2 * (n - 1)))
def coordinator(comm, buffer):
    """The LSML lecture's "coordinator": everyone sends to rank 0, rank 0 adds them up
    one by one and sends the sum back to everyone. Rank 0's link carries
    2 (n - 1) full arrays, so it is the bottleneck as n grows.
    Cost: 2 (n - 1) (alpha + N beta) + (n - 1) N gamma."""
    yield from _reduce.linear(comm, buffer, 0)
    yield from _broadcast.linear(comm, buffer, 0, first_step=1)


@cost("2 ceil(log2 n) (alpha + N beta) + ceil(log2 n) N gamma",
      traffic=whole_arrays(lambda n: 2 * (n - 1)))
def reduce_broadcast(comm, buffer):
    """all_reduce = reduce + broadcast: a binomial-tree reduce to rank 0, then a
    binomial-tree broadcast of the result.
    Cost: 2 ceil(log2 n) (alpha + N beta) + ceil(log2 n) N gamma."""
    yield from _reduce.binomial(comm, buffer, 0)
    yield from _broadcast.binomial(comm, buffer, 0, first_step=max(comm.size - 1, 0).bit_length())


def _folded_rounds(n: int) -> int:
    """Messages of a folded recursive doubling: fold in and out, log2 p rounds of p."""
    p = largest_power_of_two(n)
    return 2 * (n - p) + p * (p.bit_length() - 1)


@cost("log2 p (alpha + N xbeta + N gamma) + (2 (alpha + N beta) + N gamma if n != p else 0)",
      traffic=whole_arrays(_folded_rounds))
def recursive_doubling(comm, buffer):
    """Recursive doubling: in round k each rank swaps its whole partial result
    with the rank whose number differs in bit k, and combines. After log2 p
    rounds every rank has combined everything, with no rank in charge.
    Cost: log2 p (alpha + N xbeta + N gamma)
    + (2 (alpha + N beta) + N gamma if n != p else 0), the last term the fold."""
    n = comm.size
    p = largest_power_of_two(n)
    # (The fold is skipped outright for powers of two: this is the algorithm
    # of small, latency-bound arrays, where every microsecond shows.)
    virtual = (yield from _fold_in(comm, buffer, p)) if n != p else comm.rank
    first = 0 if n == p else 1  # the fold takes a step
    if virtual >= 0:
        incoming = None  # the partner's partial result, before it is combined
        mask = 1
        while mask < p:
            partner = _real_rank(virtual ^ mask, n - p)
            round_ = mask.bit_length() - 1
            comm.at(first + round_, "exchange")
            send = comm.isend(buffer, partner, f"round {round_} to {partner}")
            if send.done:
                # The transport already holds a copy of what we sent (a small
                # message), so the partner's array can be combined straight
                # into ours: no scratch array, and no pass over it afterwards.
                yield [comm.irecv_reduce(buffer, partner, f"round {round_} from {partner}")]
            else:
                if incoming is None:
                    incoming = comm.scratch(buffer)
                yield [send, comm.irecv(incoming, partner, f"round {round_} from {partner}",
                                        combined_into=buffer)]
                comm.combine(buffer, incoming)
            mask <<= 1
    if n != p:
        yield from _fold_out(comm, buffer, p, step=first + p.bit_length() - 1)


def _rabenseifner_traffic(n, count, itemsize, root=0):
    p = largest_power_of_two(n)
    extra, rounds = n - p, p.bit_length() - 1
    # the fold in and out: whole arrays; halving and doubling: (p - 1) N each
    return 2 * extra + 2 * p * rounds, (2 * extra + 2 * (p - 1)) * count * itemsize


@cost("2 log2 p alpha + 2 (p-1)/p N xbeta + (p-1)/p N gamma"
      " + (2 (alpha + N beta) + N gamma if n != p else 0)",
      traffic=_rabenseifner_traffic)
def rabenseifner(comm, buffer):
    """Rabenseifner: a reduce-scatter by recursive halving, then an allgather by
    recursive doubling.

    Halving: the array is cut into p chunks. In round k a rank keeps half of
    the chunks it is responsible for, sends the other half to its partner (the
    rank differing in bit log2(p) - 1 - k) and combines the half it keeps
    with the partner's. After log2 p rounds rank v owns the finished chunk v.
    Doubling: the same partners in reverse order swap their finished parts,
    doubling what each holds until everyone has the whole array.
    Cost: 2 log2 p alpha + 2 (p-1)/p N xbeta + (p-1)/p N gamma
    + (2 (alpha + N beta) + N gamma if n != p else 0), the last term the fold
    in and out.
    """
    n = comm.size
    p = largest_power_of_two(n)
    virtual = yield from _fold_in(comm, buffer, p)
    first = 0 if n == p else 1  # the fold takes a step
    rounds = p.bit_length() - 1
    if virtual >= 0:
        bounds = yield from reduce_scatter_by_halving(comm, buffer, virtual, p, first)
        low, high = virtual, virtual + 1  # the finished chunk this rank owns
        mask = 1
        while mask < p:  # recursive doubling: the allgather
            partner = _real_rank(virtual ^ mask, n - p)
            width = high - low
            other = (low - width, low) if virtual & mask else (high, high + width)
            label = f"allgather step {mask.bit_length() - 1}"
            comm.at(first + rounds + mask.bit_length() - 1, "allgather")
            yield [comm.isend(buffer[bounds[low]:bounds[high]], partner,
                              f"{label} chunks {low}-{high - 1}"),
                   comm.irecv(buffer[bounds[other[0]]:bounds[other[1]]], partner,
                              f"{label} chunks {other[0]}-{other[1] - 1}")]
            low, high = min(low, other[0]), max(high, other[1])
            mask <<= 1
    if n != p:
        yield from _fold_out(comm, buffer, p, step=first + 2 * rounds)


def _two_passes(n, count, itemsize, root=0):
    """Traffic of a reduce-scatter and an allgather: n (n - 1) pieces each."""
    return 2 * n * (n - 1), 2 * (n - 1) * count * itemsize


@cost("2 (n - 1) alpha + 2 (n-1)/n N xbeta + (n-1)/n N gamma", traffic=_two_passes)
def ring(comm, buffer):
    """Ring allreduce: scatter-reduce for n - 1 steps, then allgather for n - 1 steps.

    The array is cut into n chunks. In reduce-scatter step s, rank r sends
    chunk (r - s) mod n to its right neighbour and combines chunk
    (r - s - 1) mod n arriving from its left; each chunk travels the ring once,
    picking up one more rank's contribution per hop, so after n - 1 steps rank
    r holds the finished chunk (r + 1) mod n. The allgather passes the finished
    chunks on around the ring for n - 1 more steps, copying instead of
    combining. No rank is in charge and every link carries N/n bytes per step.

    Pipelining: each chunk is streamed by the transport in slots, and the
    receiver combines each slot as it lands while the next one is in flight,
    so the copy and the add of one step overlap.

    Cost: 2 (n - 1) alpha + 2 (n-1)/n N xbeta + (n-1)/n N gamma.
    """
    n, rank = comm.size, comm.rank
    chunks = split(buffer, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        out, into = (rank - step) % n, (rank - step - 1) % n
        comm.at(step, "reduce-scatter")
        yield [comm.isend(chunks[out], right, f"reduce-scatter step {step} chunk {out}"),
               comm.irecv_reduce(chunks[into], left, f"reduce-scatter step {step} chunk {into}")]
    for step in range(n - 1):
        out, into = (rank + 1 - step) % n, (rank - step) % n
        comm.at(n - 1 + step, "allgather")
        yield [comm.isend(chunks[out], right, f"allgather step {step} chunk {out}"),
               comm.irecv(chunks[into], left, f"allgather step {step} chunk {into}")]


@cost("2 (n - 1) alpha + 2 (n-1)/n N xbeta + (n-1)/n N gamma", traffic=_two_passes)
def two_shot(comm, buffer):
    """Two-shot: a reduce-scatter and an allgather in which every rank talks to
    every other rank directly, in one step each.

    The array is cut into n chunks and rank r owns chunk r. Shot one: every
    rank sends chunk j to rank j, for all j at once, and combines the n - 1
    pieces of its own chunk as they arrive. Shot two: every rank sends its
    finished chunk to everyone and receives theirs. The bytes are the ring's,
    but there are 2 steps instead of 2 (n - 1), and no rank waits for a
    neighbour that is itself waiting for its neighbour: what NVLink and
    shared-memory libraries use inside one machine, where every pair of
    ranks is connected (NCCL and TensorRT-LLM call it two-shot). On a
    network it would push n - 1 messages through one link at once.

    On minidist's shm transport the big pieces go by rendezvous (see
    :mod:`minidist.distributed.transport.cma`): the owner reads each piece
    straight out of the peer's array and combines it block by block, so each
    byte is copied once, not twice.

    Identical bits: only the owner combines a chunk, then everyone copies it.
    The owner combines its pieces in the order they arrive, so float sums may
    differ in the last bit from one run to the next (never between ranks).

    Cost: 2 (n - 1) alpha + 2 (n-1)/n N xbeta + (n-1)/n N gamma, the sends of a
    step sharing the rank's link.
    """
    n, rank = comm.size, comm.rank
    chunks = split(buffer, n)
    # Send to rank + 1, + 2, ... and receive from rank - 1, - 2, ...: the
    # order in which the others send to us, so nobody's first message waits.
    to = [(rank + step) % n for step in range(1, n)]
    since = [(rank - step) % n for step in range(1, n)]
    comm.at(0, "reduce-scatter")
    yield ([comm.isend(chunks[peer], peer, f"reduce-scatter chunk {peer} to {peer}")
            for peer in to]
           + [comm.irecv_reduce(chunks[rank], peer, f"reduce-scatter chunk {rank} from {peer}")
              for peer in since])
    comm.at(1, "allgather")
    yield ([comm.isend(chunks[rank], peer, f"allgather chunk {rank} to {peer}")
            for peer in to]
           + [comm.irecv(chunks[peer], peer, f"allgather chunk {peer} from {peer}")
              for peer in since])


def _fits_the_slots(n, N, P) -> bool:
    """shared: one_shot goes through the shared slots (shm only: slots_alpha set)."""
    return P.slots_alpha is not None and N <= shared_slots.SLOT_BYTES \
        and n <= shared_slots.MAX_WORLD


@cost("slots_alpha + N beta + (n - 1) N gamma if shared"
      " else (n - 1) (alpha + N xbeta) + (n - 1) N gamma",
      where={"shared": _fits_the_slots},
      traffic=lambda n, count, itemsize, root=0: (n * (n - 1), n * (n - 1) * count * itemsize))
def one_shot(comm, buffer):
    """One-shot: every rank sends its whole array to every other rank, and every
    rank combines all n arrays itself, in rank order.

    One step, so one latency, and no rank waits on a chain of others: the
    algorithm of small arrays inside one machine (NCCL and TensorRT-LLM's
    one-shot). Every rank combining the same n arrays in the same order
    (((x0 + x1) + x2) + ...) computes the same bits. It moves (n - 1) N
    bytes per rank instead of the ring's 2 (n-1)/n N, so it loses as soon as
    the array is big.

    The exchange is one point-to-point step, :meth:`~.comm.Comm.exchange_with_all`
    (n - 1 isends and irecvs; on one machine the fast paths serve it through
    shared memory, see :mod:`.one_shot_shortcut`).

    Cost: slots_alpha + N beta + (n - 1) N gamma if shared
    else (n - 1) (alpha + N xbeta) + (n - 1) N gamma; shared: the array fits
    the slots, slots_alpha: their small latency.
    """
    comm.at(0, "exchange")
    arrays = yield from comm.exchange_with_all(buffer, "whole array")
    # ((x0 + x1) + x2) + ...: the same n arrays in the same order on every rank.
    comm.combine(arrays[0], arrays[1], out=buffer)
    for array in arrays[2:]:
        comm.combine(buffer, array)


# --------------------------------------------------------------------------- double binary tree


def binary_tree(n: int, rank: int) -> tuple[int, list[int]]:
    """(parent, children) of ``rank`` in NCCL's binary tree of n ranks (parent
    -1 at the root, rank 0). Rank r's level is its lowest set bit b: its
    parent is the rank with that bit cleared and the next one set (or just
    cleared, past the end), its children r - b/2 and r + b/2 (or the nearest
    r + b/2^j inside the world). Every odd rank is a leaf; rank 0's one child
    is the largest power of two below n. Depth: ceil(log2 n)."""
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, ([bit >> 1] if n > 1 else [])
    parent = (rank ^ bit) | (bit << 1)
    if parent >= n:
        parent = rank ^ bit
    low = bit >> 1
    children = [rank - low] if low else []
    while low and rank + low >= n:
        low >>= 1
    if low:
        children.append(rank + low)
    return parent, children


def double_binary_trees(n: int) -> list[tuple[list[int], list[list[int]]]]:
    """NCCL's two trees, each as (parent of every rank, children of every rank).

    The second tree is the first with ranks mirrored (r -> n - 1 - r) when n
    is even, shifted (r -> r + 1) when n is odd, which turns the first tree's
    leaves (odd ranks) into the second's interior nodes: every rank is a leaf
    in at least one tree (for odd n all but rank 0, the first root, which
    has only one child there), so each rank forwards the data of one tree only.
    """
    if n % 2:
        relabel, back = (lambda rank: (rank - 1) % n), (lambda rank: (rank + 1) % n)
    else:
        relabel = back = (lambda rank: n - 1 - rank)
    trees = []
    def same(rank):
        return rank

    for label, unlabel in ((same, same), (relabel, back)):
        parents, children = [], []
        for rank in range(n):
            parent, kids = binary_tree(n, label(rank))
            parents.append(-1 if parent < 0 else unlabel(parent))
            children.append([unlabel(kid) for kid in kids])
        trees.append((parents, children))
    return trees


def _heights_and_depths(parents, children):
    n = len(parents)
    depths = []
    for rank in range(n):
        depth, node = 0, rank
        while parents[node] >= 0:
            node, depth = parents[node], depth + 1
        depths.append(depth)
    heights = [0] * n
    for rank in sorted(range(n), key=depths.__getitem__, reverse=True):
        heights[rank] = max((heights[kid] + 1 for kid in children[rank]), default=0)
    return heights, depths


@functools.lru_cache(maxsize=8)
def _tree_tables(n: int) -> tuple:
    """Per tree: (parents, children, heights, depths, the root's height), made
    once per n and shared by every rank (read only): each rank building its
    own would cost O(n) each, n^2 in all, when the simulator runs n ranks."""
    return tree_tables(double_binary_trees(n))


def tree_tables(trees) -> tuple:
    """:func:`_tree_tables` of any trees, each as (parents, children)."""
    tables = []
    for parents, children in trees:
        heights, depths = _heights_and_depths(parents, children)
        tables.append((tuple(parents), tuple(tuple(kids) for kids in children),
                       tuple(heights), tuple(depths), heights[parents.index(-1)]))
    return tuple(tables)


class _LazyChunks:
    """``chunks[j]``: the view of piece j of ``half`` cut into ``count`` pieces
    (as :func:`split` cuts it), made on each use."""

    __slots__ = ("half", "bounds")

    def __init__(self, half, count):
        self.half = half
        self.bounds = chunk_bounds(half.size, count)

    def __getitem__(self, index):
        bounds = self.bounds
        return self.half[bounds[index]:bounds[index + 1]]


@cost("(k + 2 ceil(log2 n) - 1) (alpha + 2 N/k beta + N/k gamma)",
      where={"k": lambda n, N, P: double_binary_tree_chunks(N)},
      # each non-root rank of each tree sends k chunks up and receives k down
      traffic=lambda n, count, itemsize, root=0: (
          4 * (n - 1) * double_binary_tree_chunks(count * itemsize),
          2 * (n - 1) * count * itemsize))
def double_binary_tree(comm, buffer):
    """NCCL's double binary tree: each half of the array is reduced up one of two
    binary trees and broadcast back down it, both pipelined in k chunks.

    A single binary tree would make every interior rank receive two whole
    arrays and send three (one up, two down): twice the bandwidth of a ring.
    With two trees in which a leaf of one is an interior node of the other
    (:func:`double_binary_trees`), each rank forwards only half the array.

    Schedule, per tree (h: a rank's height above its deepest leaf, d: its
    depth below the root, H = ceil(log2 n) the root's height): in step s a
    rank combines chunk s - h(c) arriving from each child c and sends chunk
    s - h, finished below it, to its parent; the root, done with chunk j at
    step j + H - 1, sends it down at step j + H, and a rank at depth d
    receives it at step j + H + d - 1 and passes it on at step j + H + d.
    So the reduce of later chunks overlaps the broadcast of earlier ones, in
    k + 2H - 1 steps in all; k = :func:`double_binary_tree_chunks`.

    Cost: in a step a rank receives at most four chunks of N/(2k) (two from
    its children and one from its parent in the tree where it is interior,
    one from its parent in the other) and combines two.
    Cost: (k + 2 ceil(log2 n) - 1) (alpha + 2 N/k beta + N/k gamma), which tends to
    the ring's 2 N beta + N gamma with log n rather than n latency.
    Any n works (the trees simply stop at the last rank).
    """
    yield from pipelined_trees(comm, buffer, _tree_tables(comm.size))


def pipelined_trees(comm, buffer, tables):
    """The double binary tree's schedule on any two trees, ``tables`` as
    :func:`_tree_tables` makes them: half t of the array reduced up tree t and
    broadcast down it, in k chunks (see :func:`double_binary_tree`)."""
    rank = comm.rank
    count = double_binary_tree_chunks(comm.nbytes_of(buffer))
    plans = []
    for half, (parents, children, heights, depths, top) in zip(split(buffer, 2), tables):
        # Each chunk's view is made when a step uses it: a rank holds 2k chunks
        # and uses each in a few steps only, and the simulator runs thousands
        # of ranks (4,096 ranks x 1,526 views held for the whole call was 0.7 GB).
        plans.append((_LazyChunks(half, count), parents[rank], children[rank], heights,
                      depths[rank], top))
    # the last chunk reaches the deepest rank 2 top - 1 steps after it left a leaf
    steps = count + 2 * max(table[4] for table in tables) - 1
    for step in range(steps):
        comm.at(step, "pipeline")
        requests = []
        for tree, (chunks, parent, kids, heights, depth, top) in enumerate(plans):
            for kid in kids:
                chunk = step - heights[kid]
                if 0 <= chunk < count:
                    requests.append(comm.irecv_reduce(
                        chunks[chunk], kid, f"tree {tree} reduce chunk {chunk} from {kid}"))
            if parent >= 0:
                chunk = step - heights[rank]
                if 0 <= chunk < count:
                    requests.append(comm.isend(
                        chunks[chunk], parent, f"tree {tree} reduce chunk {chunk} to {parent}"))
                chunk = step - top - depth + 1
                if 0 <= chunk < count:
                    requests.append(comm.irecv(
                        chunks[chunk], parent,
                        f"tree {tree} broadcast chunk {chunk} from {parent}"))
            chunk = step - top - depth
            if 0 <= chunk < count:
                for kid in kids:
                    requests.append(comm.isend(
                        chunks[chunk], kid, f"tree {tree} broadcast chunk {chunk} to {kid}"))
        if requests:
            yield requests


ALGORITHMS = register("all_reduce", {
    "coordinator": coordinator,
    "reduce_broadcast": reduce_broadcast,
    "recursive_doubling": recursive_doubling,
    "rabenseifner": rabenseifner,
    "ring": ring,
    "double_binary_tree": double_binary_tree,
    "two_shot": two_shot,
    "one_shot": one_shot,
})


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False,
               algorithm: str = "auto"):
    """Combine every rank's ``tensor`` with ``op`` and leave the result in
    ``tensor`` on every rank (in place), with identical bits everywhere.

    ``op``: a ReduceOp (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR), its
    name, or a binary NumPy ufunc. ``algorithm``: one of :data:`ALGORITHMS`
    or "auto". With ``async_op=True`` returns a Work: the algorithm advances
    on its ``test()`` and finishes on ``wait()``.
    """
    group = call.group_of(group)
    array = call.buffer_of(tensor, "all_reduce", group._global_rank)
    op, ufunc, average = call.reduction(op, array.dtype, "all_reduce", group._global_rank)
    flat, copied = call.flat_view(array)
    if group.size == 1:
        return call.nothing_to_do(async_op)
    comm = call.start("all_reduce", group, algorithm, nbytes=flat.nbytes, op=op, ufunc=ufunc,
                      dtype=flat.dtype, count=flat.size, buffer=flat)

    def finish():
        if average:
            call.finish_average(flat, group.size)
        if copied:
            array[...] = flat.reshape(array.shape)

    return call.execute(comm, call.steps_of(comm)(comm, flat), async_op,
                        finish if (average or copied) else None)
