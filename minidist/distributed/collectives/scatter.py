"""scatter: the root holds one array per rank; each rank receives its own.

    pieces = [np.full(4, r, np.float32) for r in range(n)] if rank == 0 else None
    out = np.empty(4, np.float32)
    dist.scatter(out, pieces, src=0)              # rank r's out becomes pieces[r]

Costs for n ranks, N bytes scattered in all (each rank's piece is N/n):

=====================  ===========================================================
linear                 (n - 1) (alpha + N/n beta)   (the root sends n - 1 pieces)
binomial               ceil(log2 n) alpha + (n-1)/n N beta
=====================  ===========================================================

The root first copies the list into one contiguous buffer, in *virtual*
order (piece v belongs to rank (v + src) mod n), so that every subtree of the
binomial tree is one slice of it (see :mod:`.trees`). The binomial tree sends
fewer messages but forwards pieces through intermediate ranks: the root's link
still carries (n-1)/n N bytes, and the whole tree moves more bytes in total
than the linear scatter (each piece once per level it descends).
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.collectives import call, trees
from minidist.distributed.collectives.registry import cost, register, whole_arrays


@cost("(n - 1) (alpha + N/n beta)", traffic=whole_arrays(lambda n: n - 1))
def linear(comm, pieces, output, root):
    """The root sends each other rank its piece, one message per rank (all
    posted at once; its link carries them one after another).
    Cost: (n - 1) (alpha + N/n beta)."""
    n = comm.size
    if comm.rank == root:
        others = trees.pieces_by_rank(pieces, output.size, root, n)[1:]  # the root keeps its own
        yield [comm.isend(mine, target, f"piece of rank {target}") for target, mine in others]
    else:
        yield [comm.irecv(output, root, f"from {root}")]


def binomial_scatter(comm, held, bounds, root, origin, first_step=0):
    """Scatter ranges of pieces down the binomial tree (also the first half of
    broadcast's scatter_allgather).

    ``bounds[v]`` is where virtual rank v's piece starts (n + 1 offsets); this
    rank's ``held`` holds the pieces from virtual rank ``origin`` on, so piece
    v is ``held[bounds[v] - bounds[origin]:...]``. Receive the pieces of the
    own subtree from the parent, then send each child its subtree's pieces,
    farthest child (largest subtree) first.
    """
    n = comm.size
    virtual = (comm.rank - root) % n
    base = bounds[origin]
    last = max(n - 1, 0).bit_length() - 1  # the largest subtree is served in step 0

    def pieces_of(first):
        return held[bounds[first] - base:bounds[first + trees.subtree_size(first, n)] - base]

    if virtual:
        source = trees.real_rank(trees.parent(virtual), root, n)
        comm.at(first_step + last - trees.round_of(virtual), "scatter")
        yield [comm.irecv(pieces_of(virtual), source,
                          f"round {trees.round_of(virtual)} from {source}")]
    sends = []
    for child in trees.children(virtual, n):
        target = trees.real_rank(child, root, n)
        comm.at(first_step + last - trees.round_of(child), "scatter")
        sends.append(comm.isend(pieces_of(child), target,
                                f"round {trees.round_of(child)} to {target}, "
                                f"{trees.subtree_size(child, n)} pieces"))
    if sends:
        yield sends


def _binomial_traffic(n, count, itemsize, root=0):
    # Each piece travels once for every level it descends: rank v receives its subtree's.
    return n - 1, sum(trees.subtree_size(v, n) for v in range(1, n)) * count * itemsize


@cost("ceil(log2 n) alpha + (n-1)/n N beta", traffic=_binomial_traffic)
def binomial(comm, pieces, output, root):
    """Binomial tree: the root sends the pieces of the ranks n/2 away and
    beyond to the rank n/2 away, the pieces of the next quarter to the rank n/4
    away, and so on; every rank that received pieces for others does the same
    within its subtree. After ceil(log2 n) rounds everyone has its piece.
    Non-power-of-two n: subtrees past the end are smaller or missing.
    Cost: ceil(log2 n) alpha + (n-1)/n N beta (the root's link: n - 1 pieces).
    """
    virtual, size, held, bounds = trees.subtree_layout(comm, root, pieces, output)
    yield from binomial_scatter(comm, held, bounds, root, virtual)
    if virtual and size > 1:  # (a leaf received its piece straight into place)
        np.copyto(output, held[:output.size])


ALGORITHMS = register("scatter", {
    "linear": linear,
    "binomial": binomial,
})


def _gathered_pieces(scatter_list, array, root, group):
    """The root's list checked and copied into one buffer in virtual order."""
    n = group.size
    pieces = np.empty(n * array.size, array.dtype)
    arrays = call.per_rank_arrays(scatter_list, group,
                                  f"scatter on the source rank (src={group.ranks[root]})",
                                  "scatter_list", array, writeable=False)
    for index, piece in enumerate(arrays):
        virtual = (index - root) % n
        pieces[virtual * array.size:(virtual + 1) * array.size] = piece.reshape(-1)
    return pieces


def scatter(tensor, scatter_list=None, src: int | None = None, group=None,
            async_op: bool = False, group_src: int | None = None, algorithm: str = "auto"):
    """Rank ``src`` (a global rank, as in torch.distributed; ``group_src``: numbered
    within ``group``) sends ``scatter_list[r]`` to the group's rank r, which
    receives it into ``tensor`` (in place); ``src`` keeps its own piece.

    On ``src``, ``scatter_list`` is a list of one array per rank, each the shape
    and dtype of ``tensor``; on the other ranks it must be None (as in
    torch.distributed). ``algorithm``: one of :data:`ALGORITHMS` or "auto".
    With ``async_op=True`` returns a Work; call ``wait()`` before using tensor.
    """
    group = call.group_of(group)
    root = call.check_root(src, group, "scatter", "src", group_src)
    rank = group._global_rank
    array = call.buffer_of(tensor, "scatter", rank)
    is_root = group.rank == root
    if is_root:
        pieces = _gathered_pieces(scatter_list, array, root, group)
    elif scatter_list is not None:
        raise ValueError(f"rank {rank}: scatter_list is only read on the source rank "
                         f"(src={group.ranks[root]}); pass None on the other ranks.")
    else:
        pieces = None
    flat, copied = call.flat_view(array)
    if is_root:
        np.copyto(flat, pieces[:flat.size])  # virtual piece 0 is the root's own
    if group.size == 1:
        if copied:
            array[...] = flat.reshape(array.shape)
        return call.nothing_to_do(async_op)
    comm = call.start("scatter", group, algorithm, nbytes=flat.nbytes * group.size,
                      dtype=flat.dtype, count=flat.size, root=root)

    def finish():
        if copied:
            array[...] = flat.reshape(array.shape)

    return call.execute(comm, call.steps_of(comm)(comm, pieces, flat, root), async_op,
                        finish if copied else None)
