"""reduce: combine every rank's array element-wise; the result lands on one rank.

    dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)    # rank 0's x becomes the sum

Costs for n ranks and an N-byte array (gamma: seconds per byte combined):

=====================  ======================================================
linear                 (n - 1) * (alpha + N beta + N gamma)  (the root receives n - 1 times)
binomial               ceil(log2 n) * (alpha + N beta + N gamma)
=====================  ======================================================

The reduction must be commutative and associative (all of ReduceOp's are):
algorithms combine in different orders. Only the root's array changes; the
others keep their input (the algorithms combine into a scratch copy there).
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.collectives import call


def linear(comm, buffer, root):
    """Every rank sends its array to the root, which combines them one after
    another (the "coordinator" of the slides: its link and its adder do all the
    work). Cost: (n - 1) * (alpha + N beta + N gamma)."""
    if comm.rank == root:
        for peer in range(comm.size):
            if peer != root:
                yield [comm.irecv_reduce(buffer, peer, f"from {peer}")]
    else:
        yield [comm.isend(buffer, root, f"to {root}")]


def binomial(comm, buffer, root):
    """Binomial tree, the broadcast tree run backwards: in round k the ranks
    whose virtual rank has bit k set send their partial result to v - 2^k and
    drop out; the others combine what they receive. After ceil(log2 n) rounds
    the root holds everything. Cost: ceil(log2 n) * (alpha + N beta + N gamma).
    """
    n = comm.size
    virtual = (comm.rank - root) % n
    mask = 1
    while mask < n:
        if virtual & mask:
            parent = (virtual - mask + root) % n
            yield [comm.isend(buffer, parent, f"round {mask.bit_length() - 1} to {parent}")]
            return
        if virtual + mask < n:
            child = (virtual + mask + root) % n
            yield [comm.irecv_reduce(buffer, child,
                                     f"round {mask.bit_length() - 1} from {child}")]
        mask <<= 1


ALGORITHMS = call.register("reduce", {
    "linear": linear,
    "binomial": binomial,
})


def reduce(tensor, dst: int = 0, op=None, group=None, async_op: bool = False,
           algorithm: str = "auto"):
    """Combine every rank's ``tensor`` with ``op`` (default SUM) into ``tensor`` on
    group rank ``dst``. Other ranks' arrays are left as they were."""
    from minidist.distributed.reduce_op import ReduceOp

    group = call.group_of(group)
    root = call.check_root(dst, group, "reduce", "dst")
    array = call.buffer_of(tensor, "reduce", group._global_rank)
    op, ufunc, average = call.reduction(ReduceOp.SUM if op is None else op, array.dtype,
                                        "reduce", group._global_rank)
    is_root = group.rank == root
    if is_root:
        flat, copied = call.flat_view(array)
    else:
        flat, copied = np.array(array, order="C").reshape(-1), False  # scratch: input kept
    if group.size == 1:
        return call.nothing_to_do(async_op)
    comm = call.start("reduce", group, algorithm, nbytes=flat.nbytes, op=op, ufunc=ufunc,
                      dtype=flat.dtype, count=flat.size, root=root)

    def finish():
        if is_root:
            if average:
                call.finish_average(flat, group.size)
            if copied:
                array[...] = flat.reshape(array.shape)

    return call.execute(comm, ALGORITHMS[comm.algorithm](comm, flat, root), async_op, finish)
