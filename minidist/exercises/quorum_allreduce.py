"""Exercise: the quorum's all_reduce, with the rescale (fault-tolerant data parallel).

torchft's ``Manager.allreduce`` is where fault-tolerant data parallel
differs from plain DDP: the gradient is averaged over the replicas the
step's quorum found alive, so it is the sum over *their* group divided by
*their* count, and when a member dies during the all_reduce the step is
not applied (``should_commit`` says no) and the next quorum redoes it with
the same batch. The student writes that function::

    quorum_allreduce(gradients, group, members, failed_ranks) -> bool

``gradients`` (this replica's arrays) left holding the mean over the live
members, in place; True if the step may be applied, False if it must be
redone. The rest of :class:`~minidist.parallel.resilience.Manager` (the
quorum, the roll back, the commit's bookkeeping) is given: the checker
puts the student's function in the Manager's place
(:class:`_StudentManager`) and trains
:class:`~minidist.parallel.resilience.RegressionProblem` with it.

The check: world 5 (replicas 0-3, rank 4 a spare that never joins, so that
the world size is never the live count), on real processes, a replica
SIGKILLed at a chosen step, once between two of its all_reduce messages
(pipe) and once before its gradient is ready (shm). Every call of the
student's function on every survivor is judged against the mean the
quorum's members' gradients give (the checker recomputes each member's
gradient from the weights and the batch it had), and the mistakes with a
known cause are named: the world size for the live count, the dead
replica counted with a zero or with its last (stale) gradient, a sum not
averaged, the step applied although the all_reduce failed, a step not
applied although nothing failed. Then the run as a whole: every survivor's
weights after each step equal to one process replaying the recorded
quorums (:func:`~minidist.parallel.resilience.replay`, float64, rtol 1e-9).

Costs: two launches of 5 processes, 5 steps each; the judge recomputes
each member's gradient (a 6 x 3 linear layer) once per call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

import minidist.distributed as dist
from minidist.exercises.exercise import CheckResult, Exercise, Failure
from minidist.exercises.process_check import launch_checked
from minidist.parallel.resilience import (
    FaultTolerantDDP,
    Manager,
    OptimizerWrapper,
    RegressionProblem,
    ReplicaFault,
    model_and_optimizer_state,
    replay,
)
from minidist.runtime.errors import PeerGoneError

WORLD, REPLICAS = 5, 4        # rank 4 is a spare that never joins
PROBLEM = RegressionProblem(steps=5)
#: (transport, the replica lost, the step it is lost at, where: inside the
#: all_reduce, after its first message, or before its gradient is ready)
SCENARIOS = (("pipe", 1, 2, "allreduce"), ("shm", 2, 1, "compute"))
#: Quorums a rank may try before the check says the run does not go on
#: (a step never applied is redone forever).
ATTEMPTS = 3 * PROBLEM.steps + 4


# --------------------------------------------------------------------------- the reference


def quorum_allreduce(gradients, group, members, failed_ranks):
    """The reference: sum over the live group, divide by its count; False if
    the all_reduce raised or a member is known gone. Cost: one all_reduce
    per array over the n live members (ring: 2 (n - 1) alpha + 2 (n-1)/n N
    beta), then a division; nothing is sent for the dead or the spares."""
    try:
        for gradient in gradients:
            dist.all_reduce(gradient, op=dist.ReduceOp.SUM, group=group)
    except dist.PeerGoneError:
        return False          # a partial sum: never applied; the next quorum redoes the step
    if failed_ranks() & set(members):
        return False          # complete here, perhaps not on every member: redo it with all
    for gradient in gradients:
        gradient /= len(members)
    return True


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Call:
    """One call of the student's function on one rank, as the checker saw it."""

    rank: int
    step: int
    quorum_id: int
    members: tuple
    weights: tuple        # the parameters' arrays the gradient was computed at
    before: np.ndarray    # this rank's gradient, flat, as it went in
    after: np.ndarray     # ... and as it came out
    verdict: bool         # what the function returned
    peer_gone: bool       # a PeerGoneError was raised inside the call (its all_reduce failed)
    lost: tuple           # members known failed when the call returned


_peer_gone = [0]


def _count_peer_gone() -> None:
    """Count every PeerGoneError made in this worker: the one a failed
    all_reduce raises is made inside the student's call, caught or not."""
    original = PeerGoneError.__init__

    def counting(self, *args, **kwargs):
        _peer_gone[0] += 1
        original(self, *args, **kwargs)

    PeerGoneError.__init__ = counting


class _StudentManager(Manager):
    """torchft's Manager with the student's function for its all_reduce and
    its answer for ``should_commit``; every call recorded for the judge."""

    def __init__(self, function, **options):
        super().__init__(**options)
        self.function, self.calls, self._verdict = function, [], False

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        quorum = self.quorum
        if not self.is_participating():
            return array
        self._maybe_fail("compute")
        group = dist.new_group(quorum.members, use_local_synchronization=True,
                               group_desc="replicas")
        self._maybe_fail("allreduce")
        parameters = self._state_dict()["parameters"]
        pieces, offset = [], 0
        for parameter in parameters:
            pieces.append(array[offset:offset + parameter.size].reshape(parameter.shape).copy())
            offset += parameter.size
        before, raised = array.copy(), _peer_gone[0]
        verdict = self.function(pieces, group, tuple(quorum.members), dist.failed_ranks)
        peer_gone = _peer_gone[0] > raised
        if not isinstance(verdict, (bool, np.bool_)):
            raise TypeError(f"rank {self.rank}, step {quorum.step}: quorum_allreduce returned "
                            f"{verdict!r}; return True when the step may be applied and False "
                            "when it must be redone (the all_reduce failed)")
        for index, (got, parameter) in enumerate(zip(pieces, parameters)):
            if np.shape(got) != parameter.shape:
                raise ValueError(f"rank {self.rank}, step {quorum.step}: gradients[{index}] "
                                 f"has shape {np.shape(got)} after your call, expected "
                                 f"{parameter.shape}: average each array in place")
        array[...] = np.concatenate([np.asarray(got, np.float64).reshape(-1) for got in pieces])
        self._verdict = bool(verdict)
        self.calls.append(Call(self.rank, quorum.step, quorum.quorum_id, tuple(quorum.members),
                               tuple(parameters), before, array.copy(), bool(verdict),
                               peer_gone, tuple(sorted(dist.failed_ranks() & set(quorum.members)))))
        return array

    def _completed(self, lost: set) -> bool:
        verdict, self._verdict = self._verdict, False
        return verdict


def _worker(function, scenario: int):
    _count_peer_gone()
    _, lost, step, where = SCENARIOS[scenario]
    problem = PROBLEM
    inputs, targets = problem.data()
    model, optimizer = problem.model_and_optimizer()
    state_dict, load_state_dict = model_and_optimizer_state(model, optimizer)
    manager = _StudentManager(function, state_dict=state_dict, load_state_dict=load_state_dict,
                              replicas=REPLICAS, total_steps=problem.steps,
                              spare_joins_after=problem.steps + 1,
                              batch_indices=problem.batch_indices,
                              fault=ReplicaFault(lost, step, "sigkill", where))
    ddp = FaultTolerantDDP(manager, model)
    wrapped = OptimizerWrapper(manager, optimizer)
    weights = {}
    for _ in range(ATTEMPTS):
        if manager.finished():
            break
        wrapped.zero_grad()
        step = manager.current_step()
        if manager.is_participating():
            problem.loss(ddp, manager.batch(), inputs, targets).backward()
        if wrapped.step():
            weights[step] = [p.data.copy() for p in model.parameters()]
    held = {record.step for record in manager.history}
    return (manager.result(), {s: w for s, w in weights.items() if s in held}, manager.calls,
            manager.finished())


# --------------------------------------------------------------------------- the verdict


def _gradient(weights, indices) -> np.ndarray:
    """A member's gradient, flat: the problem's loss on ``indices`` at ``weights``."""
    inputs, targets = PROBLEM.data()
    model, _ = PROBLEM.model_and_optimizer()
    for parameter, array in zip(model.parameters(), weights):
        parameter.data[...] = array
    PROBLEM.loss(model, np.asarray(indices), inputs, targets).backward()
    return np.concatenate([np.asarray(p.grad).reshape(-1) for p in model.parameters()])


def _member_gradients(call: Call) -> dict:
    n = len(call.members)
    return {member: _gradient(call.weights, PROBLEM.batch_indices(call.step, index, n))
            for index, member in enumerate(call.members)}


def _close(got, want) -> bool:
    return bool(np.allclose(got, want, rtol=1e-9, atol=1e-12))


def _scenario_text(scenario: int) -> str:
    transport, lost, step, where = SCENARIOS[scenario]
    how = ("between two of its all_reduce messages" if where == "allreduce"
           else "before its gradient was ready")
    return (f"world {WORLD} on {transport} (replicas 0-{REPLICAS - 1}, rank {WORLD - 1} a "
            f"spare that never joins), replica {lost} SIGKILLed at step {step} {how}")


def _call_text(call: Call) -> str:
    return (f"rank {call.rank}, step {call.step} (quorum {call.quorum_id}: ranks "
            f"{list(call.members)}, {len(call.members)} of {REPLICAS} replicas alive, "
            f"world size {WORLD})")


def _judge_call(scenario: int, call: Call, earlier: list) -> Failure | None:
    where = f"{_scenario_text(scenario)}; {_call_text(call)}"
    n = len(call.members)
    if call.peer_gone:
        if call.verdict:
            return Failure("applied a failed step", (
                f"{where}: the all_reduce failed (a member died during it: PeerGoneError was "
                "raised inside your call), yet you returned True, so the step was applied "
                "with a partial sum. Return False: the step must not be applied, and the "
                "next quorum redoes it, with the same batch, over the survivors (torchft's "
                "should_commit)"), rank=call.rank, step=call.step)
        return None
    if not call.verdict:
        if call.lost:
            return None       # a member died: redoing the step is right
        return Failure("step not applied", (
            f"{where}: the all_reduce completed and every member is alive, yet you returned "
            "False: the step is not applied and the next quorum tries it again, forever. "
            "Return True once the sum over the group is complete and divided"),
            rank=call.rank, step=call.step)
    gradients = _member_gradients(call)
    total = sum(gradients.values())
    right = total / n
    if _close(call.after, right):
        return None
    dead = [rank for rank in range(REPLICAS) if rank not in call.members]
    named = _named_mistake(call, total, dead, earlier)
    if named:
        return Failure("wrong result", f"{where}: {named}", rank=call.rank, step=call.step)
    wrong = int(np.flatnonzero(~np.isclose(call.after, right, rtol=1e-9, atol=1e-12))[0])
    return Failure("wrong result", (
        f"{where}: element {wrong} of the gradient is {call.after[wrong]:.6g}, expected "
        f"{right[wrong]:.6g}, the mean of the {n} live members' gradients (their sum over "
        "the group, divided by len(members))"), rank=call.rank, element=wrong, step=call.step)


def _named_mistake(call: Call, total, dead, earlier) -> str:
    n = len(call.members)
    if _close(call.after, total / WORLD) and WORLD != n:
        return (f"your mean is the sum divided by {WORLD}, the world size; divide by the "
                f"quorum's live count, len(members) = {n}. The world holds ranks that send "
                "nothing to this sum: a spare waiting to join, a replica that died "
                "(torchft's Manager divides by num_participants())")
    if dead and _close(call.after, total / (n + len(dead))):
        return (f"your mean is the sum divided by {n + len(dead)}: replica "
                f"{', '.join(map(str, dead))} died and counts as if it had sent a zero "
                f"gradient. Divide by the {n} live members: with {n} of {REPLICAS} left "
                f"each gradient counts 1/{n}")
    for rank in dead:
        for old in earlier:
            if rank not in old.members:
                continue
            index = old.members.index(rank)
            stale = _gradient(old.weights, PROBLEM.batch_indices(old.step, index,
                                                                 len(old.members)))
            for count in sorted({n, n + len(dead), WORLD}):
                if _close(call.after, (total + stale) / count):
                    return (f"your result holds replica {rank}'s gradient of step "
                            f"{old.step} (kept from quorum {old.quorum_id}), and replica "
                            f"{rank} died: this quorum's batch is split among its {n} live "
                            "members only, so a dead replica's gradient, kept from before, "
                            "must not count. Sum over the live group only and divide by "
                            f"its {n} members")
    if _close(call.after, total):
        return (f"your result is the sum of the {n} members' gradients, not their mean: "
                f"divide it by len(members) = {n} (the optimizer expects the mean a single "
                "process would compute on the whole batch)")
    return ""


def _judge_run(scenario: int, results) -> Failure | None:
    _, lost, _, _ = SCENARIOS[scenario]
    survivors = [result for rank, result in enumerate(results)
                 if rank != lost and result[0].role != "spare"]
    calls = sorted((call for result in survivors for call in result[2]),
                   key=lambda call: (call.quorum_id, call.step, call.rank))
    for call in calls:
        earlier = [old for old in calls if old.rank == call.rank
                   and (old.quorum_id, old.step) < (call.quorum_id, call.step)]
        failure = _judge_call(scenario, call, earlier)
        if failure is not None:
            return failure
    where = _scenario_text(scenario)
    for result, _, _, finished in survivors:
        if not finished or result.committed != PROBLEM.steps:
            return Failure("did not go on", (
                f"{where}: rank {result.rank} committed {result.committed} of "
                f"{PROBLEM.steps} steps in {ATTEMPTS} quorums: the group did not go on "
                "after the death"), rank=result.rank)
    history = survivors[0][0].history
    reference = replay(PROBLEM, history)
    for result, weights, _, _ in survivors:
        for step, arrays in sorted(weights.items()):
            if not all(_close(got, want) for got, want in zip(arrays, reference[step])):
                return Failure("wrong result", (
                    f"{where}: rank {result.rank}'s weights after step {step} differ from one "
                    "process replaying the recorded quorums: a step applied twice, or an "
                    "update lost"), rank=result.rank, step=step)
    return None


def _explain(failure: Failure, scenario: int) -> Failure:
    lost = SCENARIOS[scenario][1]
    first = failure.message.splitlines()[0] if failure.message else ""
    if failure.kind == "raised" and f"rank {lost} was killed by SIGKILL" in first:
        # The run ended at the checker's own fault: the survivors did not go on.
        failure.message = (
            f"{_scenario_text(scenario)}: the survivors stopped with PeerGoneError instead "
            "of going on. A member died during your all_reduce, and the PeerGoneError it "
            "raised left your function. Catch it (except dist.PeerGoneError) and return "
            "False: the step is not applied, and the next quorum, without the dead replica, "
            "redoes it.\nThe run's report:\n" + failure.message)
    elif failure.kind in ("hang", "deadlock", "unmatched"):
        failure.message += (
            "\nAn all_reduce over the world group waits for ranks that never call it (the "
            "spare, a dead replica): pass group=group, the quorum's live members")
    return failure


class _QuietAboutTheFault(logging.Filter):
    """The launcher's warning that a tolerated rank died: here the checker
    killed it on purpose, and the student need not read it."""

    def filter(self, record) -> bool:
        return "its failure is tolerated" not in record.getMessage()


def check(function, **options) -> CheckResult:
    report = CheckResult("quorum_allreduce")
    quiet, logger = _QuietAboutTheFault(), logging.getLogger("minidist")
    logger.addFilter(quiet)
    try:
        for scenario, (transport, lost, _, _) in enumerate(SCENARIOS):
            results, failure = launch_checked(_worker, WORLD, (function, scenario),
                                              "quorum_allreduce", transport=transport,
                                              tolerate_failures=[lost], log_level="ERROR")
            if failure is None:
                failure = _judge_run(scenario, results)
            if failure is not None:
                report.failure = _explain(failure, scenario)
                return report
    finally:
        logger.removeFilter(quiet)
    report.passed += [
        f"real processes (pipe and shm, float64), world {WORLD}: replicas 0-{REPLICAS - 1} "
        "and a spare, one replica SIGKILLed inside the all_reduce and one before it: every "
        "call averaged over the live members, and no step applied when its all_reduce failed",
        "every survivor's weights, step by step, equal to one process replaying the quorums"]
    return report


EXERCISE = Exercise(
    name="quorum_allreduce", function="quorum_allreduce",
    summary="fault-tolerant DP: the mean over the live replicas, no step when the all_reduce fails",
    lesson="lessons/22_failures_and_slow_links.py", reference=quorum_allreduce,
    check=check)
