"""Resilience: training that survives the loss of ranks.

Read in this order:

# fault-tolerant data parallel (torchft's Manager, a quorum every step)
1. :mod:`.quorum`: who trains this step, agreed by every live rank from
   the runtime's status records, with the spares waiting to join;
2. :mod:`.fault_tolerant_ddp`: ``Manager`` (``start_quorum``, ``allreduce``
   over the live replicas, ``should_commit``), ``FaultTolerantDDP`` and
   ``OptimizerWrapper``: a step applied only if its all_reduce completed;
3. :mod:`.recovery`: a spare that joins receives the weights and the
   optimizer's state from a live replica;
4. :mod:`.faults`: failures made on purpose (raise, SIGKILL, os._exit,
   SIGSTOP), for the tests, the chaos script and the lessons;
5. :mod:`.replay`: the check: one process replays the recorded quorums.
# end of fault-tolerant data parallel

To write the Manager's all_reduce over the live replicas yourself:
``minidist exercise start quorum_allreduce``.

What the other families use from here: nothing.
"""

from __future__ import annotations

# fault-tolerant data parallel
from minidist.parallel.resilience.fault_tolerant_ddp import (  # noqa: F401
    MPI_REFUSAL,
    Attempt,
    CommitRecord,
    FaultTolerantDDP,
    Manager,
    ManagerResult,
    OptimizerWrapper,
    model_and_optimizer_state,
)
from minidist.parallel.resilience.faults import InjectedFault, ReplicaFault  # noqa: F401
from minidist.parallel.resilience.quorum import Quorum, QuorumAgreement, decide  # noqa: F401
from minidist.parallel.resilience.replay import RegressionProblem, replay, train  # noqa: F401

__all__ = [
    # fault-tolerant data parallel
    "Attempt", "CommitRecord", "FaultTolerantDDP", "InjectedFault", "MPI_REFUSAL", "Manager",
    "ManagerResult", "OptimizerWrapper", "Quorum", "QuorumAgreement", "ReplicaFault", "decide",
    "model_and_optimizer_state", "RegressionProblem", "replay", "train",
]
