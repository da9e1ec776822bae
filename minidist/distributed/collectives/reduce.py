"""reduce: combine every rank's array element-wise; the result lands on one rank.

    dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)    # rank 0's x becomes the sum

Costs for n ranks and an N-byte array (gamma: seconds per byte combined):

=====================  ======================================================================
linear                 (n - 1) (alpha + N beta + N gamma)  (the root receives n - 1 times)
binomial               ceil(log2 n) (alpha + N beta + N gamma)
rabenseifner           2 log2 p alpha + 2 (p-1)/p N beta + (p-1)/p N gamma
                       + (alpha + N beta + N gamma + alpha + N/p beta if n != p else 0)
=====================  ======================================================================

(p: the largest power of two <= n; the last term: the fold of a world that
is not a power of two, and the root's chunk.) The trees combine whole arrays at every
step; Rabenseifner's reduce-scatter + gather has each rank combine and send
only parts, so large arrays cost about 2 N beta + N gamma whatever n is.

The reduction must be commutative and associative (all of ReduceOp's are):
algorithms combine in different orders. Only the root's array changes; the
others keep their input (the algorithms combine into a scratch copy there).
"""

from __future__ import annotations

from minidist.distributed.collectives import call
from minidist.distributed.collectives.chunks import chunk_bounds, largest_power_of_two
from minidist.distributed.collectives.halving import (
    core_member,
    fold_in,
    real_rank,
    reduce_scatter_by_halving,
)
from minidist.distributed.collectives.registry import cost, register, whole_arrays


@cost("(n - 1) (alpha + N beta + N gamma)", traffic=whole_arrays(lambda n: n - 1))
def linear(comm, buffer, root, first_step=0):
    """Every rank sends its array to the root, which combines them one after
    another (the "coordinator" of the LSML lecture: its link and its adder do
    all the work). Cost: (n - 1) (alpha + N beta + N gamma)."""
    comm.at(first_step, "reduce")
    if comm.rank == root:
        for peer in range(comm.size):
            if peer != root:
                yield [comm.irecv_reduce(buffer, peer, f"from {peer}")]
    else:
        yield [comm.isend(buffer, root, f"to {root}")]


@cost("ceil(log2 n) (alpha + N beta + N gamma)", traffic=whole_arrays(lambda n: n - 1))
def binomial(comm, buffer, root, first_step=0):
    """Binomial tree, the broadcast tree run backwards: in round k the ranks
    whose virtual rank has bit k set send their partial result to v - 2^k and
    drop out; the others combine what they receive. After ceil(log2 n) rounds
    the root holds everything. Cost: ceil(log2 n) (alpha + N beta + N gamma).
    """
    n = comm.size
    virtual = (comm.rank - root) % n
    mask = 1
    while mask < n:
        comm.at(first_step + mask.bit_length() - 1, "reduce")
        if virtual & mask:
            parent = (virtual - mask + root) % n
            yield [comm.isend(buffer, parent, f"round {mask.bit_length() - 1} to {parent}")]
            return
        if virtual + mask < n:
            child = (virtual + mask + root) % n
            yield [comm.irecv_reduce(buffer, child,
                                     f"round {mask.bit_length() - 1} from {child}")]
        mask <<= 1


def _rabenseifner_traffic(n, count, itemsize, root=0):
    p = largest_power_of_two(n)
    extra, rounds = n - p, p.bit_length() - 1
    root_sat_out = root < 2 * extra and root % 2 == 0
    core_root = core_member(root, extra)
    bounds = chunk_bounds(count, p)
    chunks = [bounds[index + 1] - bounds[index] for index in range(p)]
    # In the gather, chunk c travels once for every bit in which c and the
    # root's chunk differ (each level's sender passes on all it has gathered).
    gathered = sum(bin(chunk ^ core_root).count("1") * size for chunk, size in enumerate(chunks))
    # fold in; halving ((p-1) N in all); the root's chunk if it sat out; gather
    messages = extra + p * rounds + root_sat_out + (p - 1)
    elements = extra * count + (p - 1) * count + root_sat_out * chunks[core_root] + gathered
    return messages, elements * itemsize


@cost("2 log2 p alpha + 2 (p-1)/p N beta + (p-1)/p N gamma"
      " + (alpha + N beta + N gamma + alpha + N/p beta if n != p else 0)",
      traffic=_rabenseifner_traffic)
def rabenseifner(comm, buffer, root):
    """Rabenseifner's reduce: a reduce-scatter by recursive halving, then a
    binomial gather of the finished chunks to the root.

    Halving (as in all_reduce's Rabenseifner): the array is cut into p chunks;
    in each of log2 p rounds a rank swaps half of its chunks with a partner and
    combines the half it keeps, until core member v owns the finished chunk v.
    Gather: the halving's rounds in reverse order. In the round of bit k the
    two partners hold neighbouring blocks of 2^k finished chunks; the one on
    the root's side (its bit k equals the root's) receives the other's block,
    the other is done. After log2 p rounds the root holds all p chunks.

    Non-power-of-two n: the first 2 (n - p) ranks fold in pairwise (even ranks
    hand their array to their odd neighbour and sit out). If the root is one of
    the ranks that sat out, its neighbour hands it the finished chunk of their
    pair and the root takes the neighbour's place in the gather (as MPICH does).
    The fold costs alpha + N beta + N gamma and the root's chunk, when the
    root sat out (always so for root 0), alpha + N/p beta.
    Cost: 2 log2 p alpha + 2 (p-1)/p N beta + (p-1)/p N gamma
    + (alpha + N beta + N gamma + alpha + N/p beta if n != p else 0).
    """
    n = comm.size
    p = largest_power_of_two(n)
    extra = n - p
    virtual = yield from fold_in(comm, buffer, p)
    root_sat_out = root < 2 * extra and root % 2 == 0
    core_root = core_member(root, extra)
    step = 0 if n == p else 1  # the fold takes a step
    rounds = p.bit_length() - 1
    if virtual >= 0:
        yield from reduce_scatter_by_halving(comm, buffer, virtual, p, step)
    bounds = chunk_bounds(buffer.size, p)
    if root_sat_out:
        stand_in = root + 1
        comm.at(step + rounds, "to the root")
        if comm.rank == stand_in:
            yield [comm.isend(buffer[bounds[virtual]:bounds[virtual + 1]], root,
                              f"finished chunk {virtual} to the root {root}")]
            return
        if comm.rank == root:
            virtual = core_root
            yield [comm.irecv(buffer[bounds[virtual]:bounds[virtual + 1]], stand_in,
                              f"finished chunk {virtual} from {stand_in}")]
    if virtual < 0:
        return

    def partner_rank(member):
        return root if root_sat_out and member == core_root else real_rank(member, extra)

    step += rounds + (1 if root_sat_out else 0)
    mask = 1
    while mask < p:
        partner = virtual ^ mask
        label = f"gather step {mask.bit_length() - 1}"
        comm.at(step + mask.bit_length() - 1, "gather")
        if (virtual ^ core_root) & mask:
            first = virtual & ~(mask - 1)
            yield [comm.isend(buffer[bounds[first]:bounds[first + mask]], partner_rank(partner),
                              f"{label} chunks {first}-{first + mask - 1}")]
            return
        first = partner & ~(mask - 1)
        yield [comm.irecv(buffer[bounds[first]:bounds[first + mask]], partner_rank(partner),
                          f"{label} chunks {first}-{first + mask - 1}")]
        mask <<= 1


ALGORITHMS = register("reduce", {
    "linear": linear,
    "binomial": binomial,
    "rabenseifner": rabenseifner,
})


def reduce(tensor, dst: int | None = None, op=None, group=None, async_op: bool = False,
           group_dst: int | None = None, algorithm: str = "auto"):
    """Combine every rank's ``tensor`` with ``op`` (default SUM) into ``tensor`` on
    rank ``dst`` (a global rank, as in torch.distributed; ``group_dst``: numbered
    within ``group``). Other ranks' arrays are left as they were."""
    from minidist.distributed.reduce_op import ReduceOp

    group = call.group_of(group)
    root = call.check_root(dst, group, "reduce", "dst", group_dst)
    array = call.buffer_of(tensor, "reduce", group._global_rank)
    op, ufunc, average = call.reduction(ReduceOp.SUM if op is None else op, array.dtype,
                                        "reduce", group._global_rank)
    is_root = group.rank == root
    if group.size == 1:
        return call.nothing_to_do(async_op)
    comm = call.start("reduce", group, algorithm, nbytes=array.nbytes, op=op, ufunc=ufunc,
                      dtype=array.dtype, count=array.size, root=root)
    if is_root:
        flat, copied = call.flat_view(array)
    else:
        flat, copied = comm.scratch(array), False  # combined into: the input is kept
        flat[:] = array.reshape(-1)
    comm.buffer = flat

    def finish():
        if is_root:
            if average:
                call.finish_average(flat, group.size)
            if copied:
                array[...] = flat.reshape(array.shape)

    return call.execute(comm, call.steps_of(comm)(comm, flat, root), async_op, finish)
