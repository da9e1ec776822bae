"""gather: every rank's array lands, one per rank, in a list on the root.

    pieces = [np.empty(4, np.float32) for _ in range(n)] if rank == 0 else None
    dist.gather(x, pieces, dst=0)                 # pieces[r] becomes rank r's x

Costs for n ranks, N bytes gathered in all (each rank's piece is N/n):

=====================  ===========================================================
linear                 (n - 1) (alpha + N/n beta)   (the root receives n - 1 pieces)
binomial               ceil(log2 n) alpha + (n-1)/n N beta
=====================  ===========================================================

The mirror of :mod:`.scatter`: the root collects the pieces in one buffer in
*virtual* order (piece v comes from rank (v + dst) mod n), where every
subtree of the binomial tree is one slice, and copies them into the list at
the end.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.collectives import call, trees
from minidist.distributed.collectives.registry import cost, register, whole_arrays


@cost("(n - 1) (alpha + N/n beta)", traffic=whole_arrays(lambda n: n - 1))
def linear(comm, pieces, piece, root):
    """Every rank sends its piece straight to the root, which receives the
    n - 1 pieces into their places (all posted at once; its link takes them one
    after another). Cost: (n - 1) (alpha + N/n beta)."""
    n = comm.size
    if comm.rank == root:
        others = trees.pieces_by_rank(pieces, piece.size, root, n)[1:]  # the root's is in place
        yield [comm.irecv(place, source, f"from {source}") for source, place in others]
    else:
        yield [comm.isend(piece, root, f"to {root}")]


def binomial_gather(comm, held, bounds, root, origin):
    """Gather ranges of pieces up the binomial tree: the scatter run backwards.

    ``bounds[v]`` is where virtual rank v's piece starts (n + 1 offsets); this
    rank's ``held`` holds the pieces from virtual rank ``origin`` on. Receive
    each child's subtree of pieces (all at once: they go to different places),
    then send the own subtree's pieces to the parent in one message.
    """
    n = comm.size
    virtual = (comm.rank - root) % n
    base = bounds[origin]

    def pieces_of(first):
        return held[bounds[first] - base:bounds[first + trees.subtree_size(first, n)] - base]

    receives = []
    for child in reversed(trees.children(virtual, n)):
        source = trees.real_rank(child, root, n)
        comm.at(trees.round_of(child), "gather")  # leaves first, the largest subtree last
        receives.append(comm.irecv(pieces_of(child), source,
                                   f"round {trees.round_of(child)} from {source}, "
                                   f"{trees.subtree_size(child, n)} pieces"))
    if receives:
        yield receives
    if virtual:
        target = trees.real_rank(trees.parent(virtual), root, n)
        comm.at(trees.round_of(virtual), "gather")
        yield [comm.isend(pieces_of(virtual), target,
                          f"round {trees.round_of(virtual)} to {target}")]


def _binomial_traffic(n, count, itemsize, root=0):
    # Each piece travels once for every level it descends: rank v receives its subtree's.
    return n - 1, sum(trees.subtree_size(v, n) for v in range(1, n)) * count * itemsize


@cost("ceil(log2 n) alpha + (n-1)/n N beta", traffic=_binomial_traffic)
def binomial(comm, pieces, piece, root):
    """Binomial tree: in round k every rank whose virtual rank has bit k set
    (and no lower one) sends everything it has gathered so far to the rank 2^k
    before it and is done; the receivers keep collecting. After ceil(log2 n)
    rounds the root has every piece. Non-power-of-two n: subtrees past the end
    are smaller or missing. Cost: ceil(log2 n) alpha + (n-1)/n N beta (the
    root's link: n - 1 pieces).
    """
    virtual, size, held, bounds = trees.subtree_layout(comm, root, pieces, piece)
    if virtual and size > 1:
        held[:piece.size] = piece  # its own piece first (a leaf sends it as it is)
    yield from binomial_gather(comm, held, bounds, root, virtual)


ALGORITHMS = register("gather", {
    "linear": linear,
    "binomial": binomial,
})


def gather(tensor, gather_list=None, dst: int | None = None, group=None, async_op: bool = False,
           group_dst: int | None = None, algorithm: str = "auto"):
    """Every rank's ``tensor`` is copied into ``gather_list[r]`` (r: its rank in
    ``group``) on rank ``dst`` (a global rank, as in torch.distributed;
    ``group_dst``: numbered within ``group``).

    On ``dst``, ``gather_list`` is a list of one array per rank, each the shape
    and dtype of ``tensor``; on the other ranks it must be None (as in
    torch.distributed). ``tensor`` is not changed. ``algorithm``: one of
    :data:`ALGORITHMS` or "auto". With ``async_op=True`` returns a Work; call
    ``wait()`` before reading gather_list.
    """
    group = call.group_of(group)
    root = call.check_root(dst, group, "gather", "dst", group_dst)
    rank = group._global_rank
    array = call.buffer_of(tensor, "gather", rank, writeable=False)
    is_root = group.rank == root
    if is_root:
        targets = call.per_rank_arrays(gather_list, group, "gather on the destination rank",
                                       "gather_list", array)
    elif gather_list is not None:
        raise ValueError(f"rank {rank}: gather_list is only written on the destination rank "
                         f"(dst={group.ranks[root]}); pass None on the other ranks.")
    piece = np.ascontiguousarray(array).reshape(-1)
    pieces = np.empty(group.size * piece.size, piece.dtype) if is_root else None
    if is_root:
        pieces[:piece.size] = piece  # virtual piece 0 is the root's own

    def finish():
        if is_root:
            for source, gathered in trees.pieces_by_rank(pieces, piece.size, root, group.size):
                targets[source][...] = gathered.reshape(array.shape)

    if group.size == 1:
        finish()
        return call.nothing_to_do(async_op)
    comm = call.start("gather", group, algorithm, nbytes=piece.nbytes * group.size,
                      dtype=piece.dtype, count=piece.size, root=root)
    return call.execute(comm, call.steps_of(comm)(comm, pieces, piece, root), async_op,
                        finish)
