"""Resilience: training that survives the failure of a rank.

Read in this order:

Elastic restarts (torchrun's ``--max-restarts``): the whole job starts again.

1. :mod:`.global_batches`: the global batch of step ``s``, whatever the
   world size (a data order that resumes on fewer ranks);
2. :mod:`.elastic_resume`: ``ElasticCheckpointer``, a whole checkpoint every
   ``every`` steps and the resume from the latest, on any world size
   (the launcher's side is ``minidist/run_elastic.py`` and
   ``minidist/runtime/restarts.py``).

Fault-tolerant data parallel (torchft's Manager, a quorum every step): the
others go on.

3. :mod:`.quorum`: who trains this step, agreed by every live rank from
   the runtime's status records, with the spares waiting to join;
4. :mod:`.fault_tolerant_ddp`: ``Manager`` (``start_quorum``, ``allreduce``
   over the live replicas, ``should_commit``), ``FaultTolerantDDP`` and
   ``OptimizerWrapper``: a step applied only if its all_reduce completed;
5. :mod:`.recovery`: a spare that joins receives the weights and the
   optimizer's state from a live replica;
6. :mod:`.faults`: failures made on purpose (raise, SIGKILL, os._exit,
   SIGSTOP), for the tests, the chaos script and the lessons;
7. :mod:`.replay`: the check: one process replays the recorded quorums.

To write the Manager's all_reduce over the live replicas yourself:
``minidist exercise start quorum_allreduce``.

What the other families use from here: nothing. This family uses the
distributed checkpoints (``minidist.distributed.checkpoint``) and no other
family.
"""

from __future__ import annotations

# Elastic restarts (torchrun's --max-restarts): resume from a checkpoint.
from minidist.parallel.resilience.elastic_resume import (  # noqa: F401
    CheckpointMismatchError,
    ElasticCheckpointer,
    ResumeReport,
)
# Fault-tolerant data parallel (torchft's Manager).
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
from minidist.parallel.resilience.global_batches import (  # noqa: F401
    GlobalBatchSampler,
    local_batch,
)
from minidist.parallel.resilience.quorum import Quorum, QuorumAgreement, decide  # noqa: F401
from minidist.parallel.resilience.replay import RegressionProblem, replay, train  # noqa: F401

__all__ = [
    # Elastic restarts
    "CheckpointMismatchError", "ElasticCheckpointer", "GlobalBatchSampler", "ResumeReport",
    "local_batch",
    # Fault-tolerant data parallel
    "Attempt", "CommitRecord", "FaultTolerantDDP", "InjectedFault", "MPI_REFUSAL", "Manager",
    "ManagerResult", "OptimizerWrapper", "Quorum", "QuorumAgreement", "ReplicaFault", "decide",
    "model_and_optimizer_state", "RegressionProblem", "replay", "train",
]
