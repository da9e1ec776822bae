"""Exercise quorum_allreduce: fault-tolerant data parallel's all_reduce over the live replicas.

Check it with `minidist exercise check quorum_allreduce`: the checker puts
your function where torchft's Manager does its all_reduce
(minidist/parallel/resilience/fault_tolerant_ddp.py), and trains a small
model on 5 real processes: replicas 0-3 and a spare (rank 4) that never
joins, so the world size is never the number of replicas training. One
replica is killed (SIGKILL) at a chosen step, once inside the all_reduce,
once before it. Every call of your function on every survivor is compared
with the mean of the live members' gradients, and the run's weights with
one process replaying the quorums.

What happens around your function, every step: the live ranks agree on a
*quorum* (who trains this step); each member computes the gradient of its
own part of the batch; then your function averages it over the quorum's
members. If a member dies during that all_reduce, the sum is partial:
that step must not be applied. Return False and the next quorum (without
the dead replica) redoes it, with the same batch, so that no update is
lost or applied twice. The following steps train with 3 of 4: each live
gradient then counts a third.

Available inside: ``import minidist.distributed as dist``, and

    dist.all_reduce(array, op=dist.ReduceOp.SUM, group=group)   # in place
    dist.PeerGoneError      # what a collective raises when a member died during it
"""

import numpy as np  # noqa: F401

import minidist.distributed as dist  # noqa: F401
from minidist.exercises import NotWrittenYet


def quorum_allreduce(gradients, group, members, failed_ranks):
    """Average ``gradients`` over the quorum's live replicas, in place; return
    True if the step may be applied, False if it must be redone.

    gradients: a list of NumPy arrays (float64), this replica's gradient.
    group: the process group of the quorum's members (a collective with
        ``group=group`` involves them and nobody else).
    members: the quorum's members, world ranks, the replicas found alive at
        the start of this step; ``len(members)`` is the live count.
    failed_ranks: a function; ``failed_ranks()`` is the set of world ranks
        known to have failed so far (a member may die during your call).

    The mean is the sum over the live group divided by the live count, not
    by the world size and not counting a dead replica in any way. Return
    False if the all_reduce raised ``dist.PeerGoneError`` or a member is
    among ``failed_ranks()`` when it ends.

    Cost to reach: one all_reduce of each array over the n live members
    (ring: 2 (n - 1) alpha + 2 (n-1)/n N beta), then a division by n.
    """
    raise NotWrittenYet("write quorum_allreduce: all_reduce each gradient over group, "
                        "catch dist.PeerGoneError, divide by len(members), return the verdict")
