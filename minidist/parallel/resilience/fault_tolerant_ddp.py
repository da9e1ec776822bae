"""Fault-tolerant data parallel: torchft's ``Manager``, a quorum every step.

Plain DDP (:mod:`minidist.parallel.data.ddp`) all-reduces over a fixed
group: if one replica dies, every other waits in the all_reduce, and the
run ends. torchft (PyTorch's fault-tolerance library) makes the group a
question asked at every step: who is alive? The replicas that are form the
step's quorum, the gradients are averaged over them, and the step is
applied only if that average really was computed. The same shape here:

``Manager.start_quorum()``
    the agreement of :mod:`.quorum` (who trains this step, whose state is
    rolled back, who joins and from whom: :mod:`.recovery`);
``Manager.allreduce(gradient)``
    the sum over the quorum's members divided by *their* count, not the
    world's: with 3 of 4 replicas left each gradient counts a third (the
    rescale). A death during it (``PeerGoneError``) is noted, not raised;
``Manager.should_commit()``
    True only if the all_reduce completed and no member is gone; then the
    optimizer steps. Otherwise the step is *not* applied, and the next
    quorum trains the same step, with the same batch, so that no update is
    lost or applied twice;
:class:`FaultTolerantDDP`, :class:`OptimizerWrapper`
    the model and optimizer wrappers of torchft: backward ends with the
    manager's all_reduce, ``zero_grad()`` starts the quorum and ``step()``
    steps only on commit.

Why a step can need undoing. An all_reduce may complete on some members and
fail on others: a replica killed between two of its messages has sent its
part to one neighbour and not to the other. The members that completed
commit; the others do not. The next agreement sees two counts of committed
steps and the ones ahead restore the state they kept before their last step
(a copy taken at every commit). So "committed" here means: applied, and
confirmed by the next quorum.

A loop, on every rank (spares included: they take part in the agreements)::

    manager = Manager(state_dict=..., load_state_dict=..., replicas=4, total_steps=20)
    model = FaultTolerantDDP(manager, model)
    optimizer = OptimizerWrapper(manager, optimizer)
    while not manager.finished():
        optimizer.zero_grad()                  # the quorum
        if manager.is_participating():
            loss = loss_fn(model(x[manager.batch()]), y[manager.batch()])
            loss.backward()                    # ... and the manager's all_reduce
        optimizer.step()                       # only if manager.should_commit()

Cost per step, over plain DDP: the agreement (:mod:`.quorum`: one small
all_reduce over the live ranks, 2 (c - 1) alpha on a ring), a copy of the
state before the step (P weights and the optimizer's state: memory and a
copy, no message), and one read of the status records. After a death: the
step in flight redone, and, when a spare joins, one message of the state.

Under MPI it is refused: MPICH without ULFM (the fault-tolerant MPI
extension) ends the whole job when one rank dies, so there is no group left
to go on. Use the pipe or shm transports, or restarts from a checkpoint.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

import minidist.distributed as dist
from minidist import backend, nn, trace
from minidist.parallel.resilience import recovery
from minidist.parallel.resilience.quorum import (
    FRESH,
    HOLDER,
    SPARE,
    Quorum,
    QuorumAgreement,
    QuorumRow,
    describe,
)

logger = logging.getLogger("minidist.resilience")

MPI_REFUSAL = ("fault-tolerant data parallel cannot run on the mpi transport: MPICH without "
               "ULFM ends the whole job when one rank dies, so no group is left to go on. "
               "Launch it with transport 'pipe' or 'shm' (minidist.launch(..., "
               "tolerate_failures=True)), or use restarts from a checkpoint under mpiexec.")


@dataclass(frozen=True)
class CommitRecord:
    """One committed step: its quorum, and each member's batch (by world rank)."""

    step: int
    quorum_id: int
    members: tuple
    batches: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Attempt:
    """One step tried in one quorum, as this rank saw it. ``outcome``:
    "committed", "failed" (a member lost: not applied), "rolled back"
    (applied here, undone at the next quorum), "waited" (a spare)."""

    step: int
    quorum_id: int
    members: tuple
    joining: tuple
    outcome: str


@dataclass
class ManagerResult:
    rank: int
    role: str
    committed: int
    history: list       # CommitRecord per committed step
    attempts: list      # Attempt per quorum this rank took part in
    events: list        # the warnings this rank logged
    commit_times: list = field(default_factory=list)  # time.time() of each commit


def refuse_mpi() -> None:
    """Fault-tolerant DP needs a transport that outlives a rank."""
    if dist.get_backend() == "mpi":
        raise RuntimeError(MPI_REFUSAL)


def model_and_optimizer_state(model, optimizer):
    """(state_dict, load_state_dict) for :class:`Manager`: the parameters'
    arrays and the optimizer's state, as recovery sends them."""
    parameters = list(model.parameters())

    def state_dict() -> dict:
        return {"parameters": [backend.to_numpy(p.data).copy() for p in parameters],
                "optimizer": optimizer.state_dict()}

    def load_state_dict(state: dict) -> None:
        for parameter, array in zip(parameters, state["parameters"]):
            parameter.data[...] = backend.from_numpy(array)
        optimizer.load_state_dict(recovery.snapshot(state["optimizer"]))

    return state_dict, load_state_dict


class Manager:
    """torchft's Manager for one rank: the quorum, the all_reduce over it,
    the commit. ``replicas`` ranks (0 .. replicas-1) train; the ranks above
    are spares. ``batch_indices(step, replica_rank, num_participants)``, if
    given, says which examples a member trains on (it is recorded with
    each commit); ``fault`` is a :class:`~.faults.ReplicaFault` to inject."""

    def __init__(self, *, state_dict, load_state_dict, replicas: int, total_steps: int,
                 spare_joins_after: int = 1, batch_indices=None, fault=None):
        refuse_mpi()
        self.rank = dist.get_rank()
        world_size = dist.get_world_size()
        if not 1 <= replicas <= world_size:
            raise ValueError(f"rank {self.rank}: replicas={replicas} must be 1..{world_size} "
                             "(the world size); the ranks above the replicas are spares")
        self._state_dict, self._load_state_dict = state_dict, load_state_dict
        self.replicas, self.total_steps = replicas, total_steps
        self.batch_indices, self.fault = batch_indices, fault
        self.agreement = QuorumAgreement(replicas, total_steps, spare_joins_after)
        self.role = FRESH if self.rank < replicas else SPARE
        self.committed, self.quorum_id, self.last_members = 0, 0, ()
        self.history: list[CommitRecord] = []
        self.attempts: list[Attempt] = []
        self.events: list[str] = []
        self.commit_times: list[float] = []
        self.quorum: Quorum | None = None
        self._before_step = None  # the state before the last committed step
        self._error = None
        self._finished = False

    # -- the quorum ------------------------------------------------------

    def _row(self) -> QuorumRow:
        short = 0
        for record in reversed(self.history):
            if len(record.members) >= self.replicas:
                break
            short += 1
        return QuorumRow(self.role, self.committed, self.quorum_id, short, self.last_members)

    def start_quorum(self) -> None:
        """Agree on this step's quorum; roll back, send or receive state as it says."""
        while True:
            quorum = self.agreement.agree(self._row())
            if quorum.done:
                self._finished, self.quorum = True, quorum
                return
            if quorum.quorum_id != self.quorum_id:
                self._quorum_changed(quorum)
            self.quorum_id, self.last_members = quorum.quorum_id, quorum.members
            if self.rank in quorum.rollback:
                self._roll_back()
            try:
                if self.rank == quorum.source and quorum.joining:
                    recovery.send_state(quorum, self._state_for_joining())
                elif self.rank in quorum.joining:
                    self._join(recovery.receive_state(quorum))
            except dist.PeerGoneError as error:
                self._say(f"rank {self.rank}: recovery at step {quorum.step} was interrupted "
                          f"({error}); the next quorum starts it again")
                continue
            self.quorum, self._error = quorum, None
            if not self.is_participating():
                self.attempts.append(Attempt(quorum.step, quorum.quorum_id, quorum.members,
                                             quorum.joining, "waited"))
            return

    def _quorum_changed(self, quorum: Quorum) -> None:
        moment = trace.now()
        trace.record("quorum", moment, moment, label=trace.with_info(
            "quorum change", kind="quorum", quorum=quorum.quorum_id, step=quorum.step,
            members=",".join(map(str, quorum.members)),
            joining=",".join(map(str, quorum.joining)) or None))
        if quorum.quorum_id > 1:
            self._say(f"rank {self.rank}: {describe(quorum, self.replicas)}")

    def _state_for_joining(self) -> dict:
        return {"state": self._state_dict(), "committed": self.committed,
                "history": list(self.history)}

    def _join(self, received: dict) -> None:
        self._load_state_dict(received["state"])
        self.committed, self.history = received["committed"], list(received["history"])
        self.role, self._before_step = HOLDER, None

    def _roll_back(self) -> None:
        if self._before_step is None:
            raise RuntimeError(f"rank {self.rank}: asked to undo step {self.committed - 1}, "
                               "but no state from before it was kept")
        self._load_state_dict(self._before_step)
        undone = self.history.pop()
        self.committed -= 1
        self._before_step = None
        for index in range(len(self.attempts) - 1, -1, -1):
            if self.attempts[index].outcome == "committed":
                old = self.attempts[index]
                self.attempts[index] = Attempt(old.step, old.quorum_id, old.members,
                                               old.joining, "rolled back")
                break
        self._say(f"rank {self.rank}: step {undone.step} completed here but not on every "
                  f"member of quorum {undone.quorum_id}; undone, to be redone with the others")

    # -- torchft's questions ---------------------------------------------

    def finished(self) -> bool:
        """True once an agreement found every replica past the last step."""
        return self._finished

    def is_participating(self) -> bool:
        return self.quorum is not None and not self._finished and self.rank in self.quorum.members

    def current_step(self) -> int:
        return self.committed

    def num_participants(self) -> int:
        return len(self.quorum.members) if self.quorum is not None else 0

    def participating_rank(self) -> int:
        """This rank's place among the members (its shard of the data); -1 outside."""
        return self.quorum.replica_rank(self.rank) if self.quorum is not None else -1

    def batch(self):
        """The examples this member trains on in this step (``batch_indices``)."""
        return self.batch_indices(self.committed, self.participating_rank(),
                                  self.num_participants())

    # -- the step --------------------------------------------------------

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        """``array`` replaced by the mean over the quorum's members: their sum
        divided by their count. A death during it is kept for :meth:`should_commit`."""
        quorum = self.quorum
        if not self.is_participating() or self._error is not None:
            return array
        self._maybe_fail("compute")
        group = dist.new_group(quorum.members, use_local_synchronization=True,
                               group_desc="replicas")
        self._maybe_fail("allreduce")
        try:
            dist.all_reduce(array, op=dist.ReduceOp.SUM, group=group, algorithm="ring")
        except dist.PeerGoneError as error:
            self._error = error
            lost = sorted(dist.failed_ranks() & set(quorum.members)) or [error.peer]
            self._say(f"rank {self.rank}: replica rank {', '.join(map(str, lost))} was lost in "
                      f"step {quorum.step}'s gradient all_reduce (quorum {quorum.quorum_id}, "
                      f"ranks {list(quorum.members)}); the step is not applied and its batch "
                      "is redone at the next quorum")
            return array
        array /= len(quorum.members)
        return array

    def _maybe_fail(self, where: str) -> None:
        fault = self.fault
        if fault is None or not fault.due(self.rank, self.committed, where):
            return
        if where == "allreduce":
            fault.between_messages()  # fails at the all_reduce's second message
        else:
            fault.happen()

    def should_commit(self) -> bool:
        """True if this step's all_reduce completed with every member alive;
        then the state before the step is kept (to undo it if a peer did not
        complete) and the step is recorded."""
        quorum = self.quorum
        if not self.is_participating():
            return False
        lost = dist.failed_ranks() & set(quorum.members)
        ok = self._completed(lost)
        if ok:
            self._before_step = recovery.snapshot(self._state_dict())
            batches = {}
            if self.batch_indices is not None:
                batches = {rank: list(map(int, self.batch_indices(quorum.step, index,
                                                                 len(quorum.members))))
                           for index, rank in enumerate(quorum.members)}
            self.history.append(CommitRecord(quorum.step, quorum.quorum_id, quorum.members,
                                             batches))
            self.committed += 1
            self.role = HOLDER
            self.commit_times.append(time.time())
        elif self._error is None:
            self._say(f"rank {self.rank}: replica rank {', '.join(map(str, sorted(lost)))} "
                      f"failed during step {quorum.step} (quorum {quorum.quorum_id}); the step "
                      "is not applied and its batch is redone at the next quorum")
        self.attempts.append(Attempt(quorum.step, quorum.quorum_id, quorum.members,
                                     quorum.joining, "committed" if ok else "failed"))
        return ok

    def _completed(self, lost: set) -> bool:
        """The step's all_reduce completed here and no member of the quorum is
        known gone (``lost``). The quorum_allreduce exercise puts the student's
        answer here."""
        return self._error is None and not lost

    def _say(self, text: str) -> None:
        logger.warning(text)
        self.events.append(text)

    def result(self) -> ManagerResult:
        names = {SPARE: "spare", FRESH: "replica", HOLDER: "replica"}
        return ManagerResult(self.rank, names[self.role], self.committed, list(self.history),
                             list(self.attempts), list(self.events), list(self.commit_times))


class FaultTolerantDDP(nn.Module):
    """torchft's ``DistributedDataParallel``: ``module`` whose backward ends
    with the manager's all_reduce of every gradient (one flat message, the
    mean over the quorum's members). Every parameter must get a gradient in
    each backward (the all_reduce starts when the last one is ready)."""

    def __init__(self, manager: Manager, module: nn.Module):
        super().__init__()
        self.manager, self.module = manager, module
        self._parameters_in_order = [p for p in module.parameters() if p.requires_grad]
        self._ready = set()
        for parameter in self._parameters_in_order:
            parameter.register_post_accumulate_grad_hook(self._gradient_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _gradient_ready(self, parameter) -> None:
        self._ready.add(id(parameter))
        if len(self._ready) == len(self._parameters_in_order):
            self._ready.clear()
            self.sync_gradients()

    def sync_gradients(self) -> None:
        parameters = self._parameters_in_order
        flat = np.concatenate([backend.to_numpy(p.grad).reshape(-1) for p in parameters])
        self.manager.allreduce(flat)
        offset = 0
        for parameter in parameters:
            size = parameter.data.size
            parameter.grad[...] = backend.from_numpy(flat[offset:offset + size].reshape(
                parameter.data.shape))
            offset += size


class OptimizerWrapper:
    """torchft's ``OptimizerWrapper``: ``zero_grad()`` starts the quorum,
    ``step()`` steps only if the manager says the step may be committed."""

    def __init__(self, manager: Manager, optimizer):
        self.manager, self.optimizer = manager, optimizer

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.manager.start_quorum()
        self.optimizer.zero_grad(set_to_none)

    def step(self) -> bool:
        """True if the step was applied."""
        if self.manager.should_commit():
            self.optimizer.step()
            return True
        return False
