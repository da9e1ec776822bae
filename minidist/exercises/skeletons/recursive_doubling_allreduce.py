"""Exercise recursive_doubling_allreduce: write the recursive-doubling all_reduce.

Check it with `minidist exercise check recursive_doubling_allreduce
recursive_doubling_allreduce.py`.

``comm`` is your rank's view of the call: ``comm.rank``, ``comm.size``,
``comm.isend(array, to, "label")``, ``comm.irecv(array, source, "label")``
(replaces ``array``'s values), ``comm.irecv_reduce(array, source, "label")``
(adds the message into ``array``), and ``comm.combine(buffer, incoming)``
(``buffer += incoming``, charged by the simulator as the gamma term). Each
``yield [request, ...]`` is one step: your code goes on when all of the
step's requests are done. Do not change an array a pending isend reads.
"""

import numpy as np  # noqa: F401  (np.empty_like(buffer): room for the partner's array)

from minidist.distributed.collectives.chunks import largest_power_of_two  # noqa: F401
from minidist.exercises import NotWrittenYet


def recursive_doubling_allreduce(comm, buffer):
    """Leave on every rank the element-wise sum of all ranks' ``buffer``s, in place.

    Recursive doubling on p = largest_power_of_two(n) ranks: in round k each
    rank swaps its whole partial sum with the rank whose number differs in
    bit k (rank ^ (1 << k)) and adds what it receives. After log2 p rounds
    every rank has everything, with no rank in charge.

    A world that is not a power of two (n = 6: p = 4), as MPICH does it:
    of the first 2 (n - p) ranks, each even rank sends its array to the odd
    rank after it and sits out; the odd rank adds it in and stands for both.
    The p ranks left run the rounds above, numbered 0..p-1 (odd rank r of
    the first pairs is member r // 2, the others r - (n - p)). At the end
    each odd rank sends the result back to its even neighbour.

    Cost to reach: log2 p (alpha + N beta + N gamma), plus 2 (alpha + N beta)
    + N gamma for the fold when n != p: 2 (n - p) + p log2 p messages of the
    whole array, summed over ranks. The checker counts them.
    """
    raise NotWrittenYet("write recursive_doubling_allreduce: the fold in, log2 p rounds "
                        "of yield [comm.isend(buffer, partner), comm.irecv(incoming, "
                        "partner)], the fold out")
