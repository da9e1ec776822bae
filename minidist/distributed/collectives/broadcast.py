"""broadcast: one rank's array, copied to every rank of the group.

    dist.broadcast(x, src=0)                      # every rank ends with rank 0's x
    dist.broadcast(x, src=0, algorithm="binomial")

Costs for n ranks and an N-byte array (alpha: latency per message, beta:
seconds per byte on a link); see :mod:`minidist.costmodel`:

=====================  ===========================================
linear                 (n - 1) * (alpha + N beta)   (the root sends n - 1 times)
binomial               ceil(log2 n) * (alpha + N beta)
=====================  ===========================================

Ranks are *virtual*: ``v = (rank - src) mod n``, so every algorithm is written
as if the root were rank 0.
"""

from __future__ import annotations

from minidist.distributed.collectives import call


def linear(comm, buffer, root):
    """The root sends the whole array to every other rank, one after another
    (its link carries n - 1 copies). Cost: (n - 1) * (alpha + N beta)."""
    if comm.rank == root:
        yield [comm.isend(buffer, peer, f"to {peer}")
               for peer in range(comm.size) if peer != root]
    else:
        yield [comm.irecv(buffer, root, f"from {root}")]


def binomial(comm, buffer, root):
    """Binomial tree: in round k every rank that has the data sends it to the
    rank 2^k further on, so the number of ranks holding it doubles each round.

    Receive from the parent (clear the lowest set bit of the virtual rank),
    then send to the children v + 2^j, farthest subtree first. Any n works:
    children past the end are skipped. Cost: ceil(log2 n) * (alpha + N beta).
    """
    n = comm.size
    virtual = (comm.rank - root) % n
    mask = 1
    while mask < n:
        if virtual & mask:
            parent = (virtual - mask + root) % n
            yield [comm.irecv(buffer, parent, f"round {mask.bit_length() - 1} from {parent}")]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:
        if virtual + mask < n:
            child = (virtual + mask + root) % n
            sends.append(comm.isend(buffer, child, f"round {mask.bit_length() - 1} to {child}"))
        mask >>= 1
    if sends:
        yield sends


ALGORITHMS = call.register("broadcast", {
    "linear": linear,
    "binomial": binomial,
})


def broadcast(tensor, src: int = 0, group=None, async_op: bool = False, algorithm: str = "auto"):
    """Copy group rank ``src``'s ``tensor`` into ``tensor`` on every rank (in place).

    Every rank passes an array of the same shape and dtype. ``algorithm``: one
    of :data:`ALGORITHMS` or "auto" (the cost model's choice for this size).
    With ``async_op=True`` returns a Work; call ``wait()`` before using tensor.
    """
    group = call.group_of(group)
    root = call.check_root(src, group, "broadcast", "src")
    array = call.buffer_of(tensor, "broadcast", group._global_rank)
    flat, copied = call.flat_view(array)
    if group.size == 1:
        return call.nothing_to_do(async_op)
    comm = call.start("broadcast", group, algorithm, nbytes=flat.nbytes, dtype=flat.dtype,
                      count=flat.size, root=root)

    def finish():
        if copied:
            array[...] = flat.reshape(array.shape)

    return call.execute(comm, ALGORITHMS[comm.algorithm](comm, flat, root), async_op,
                        finish if copied else None)
