"""A schedule run on a virtual clock: its time, its bubble, its peak memory.

:func:`simulate_schedule` plays a :class:`~minidist.parallel.pipeline.schedules.Schedule`
on :mod:`minidist.virtual_clock` without any process: each rank takes its
actions in order, a forward costs ``forward_time``, a backward
``backward_time``, a message ``latency`` (+ its bytes over a bandwidth), and
a receive waits until its send has happened. The result is a list of trace
events in the format the real runtime records, so the same Gantt charts,
:func:`bubble_fraction` and :func:`peak_live_microbatches` read a plan and a
run alike. A schedule whose receives can never all be matched is refused
with a :class:`DeadlockError` naming the actions that wait for ever.

Cost: one pass over the actions, O(p m) for p stages and m micro-batches
(v times more with v chunks a rank).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from minidist import trace as _trace
from minidist.parallel.pipeline.labels import compute_label, memory_label, message_label, step_label
from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    KINDS,
    OPTIMIZER_STEP,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    UNIT_NS,
    Schedule,
    message_tag,
)
from minidist.virtual_clock import RankClock


class DeadlockError(RuntimeError):
    """A schedule in which some rank waits for a message nobody will send."""


def _event(rank, kind, start, end, label="", peer=None, nbytes=0, tag=None, seq=None) -> dict:
    return {"rank": rank, "kind": kind, "peer": peer, "bytes": nbytes, "tag": tag,
            "label": label, "start": start, "end": end, "seq": seq, "group": 0, "channel": 0}


def simulate_schedule(schedule: Schedule, forward_time: float = 1.0, backward_time: float = 2.0,
                      transfer_time: float = 0.0, *, recompute: bool = False,
                      optimizer_time: float = 0.0, message_bytes: int = 0,
                      activation_bytes: int = 0) -> list[dict]:
    """Run ``schedule`` on a virtual clock (:mod:`minidist.virtual_clock`'s,
    one per rank, in ticks) and return its trace events.

    Every action takes a fixed time: a forward ``forward_time``, a backward
    ``backward_time`` (preceded by a recomputation "R" of ``forward_time``
    when ``recompute``), a message ``transfer_time`` from its send to its
    arrival, the optimizer step ``optimizer_time``. ``forward_time`` and
    ``backward_time`` may also be functions ``(stage, microbatch) -> cost``,
    for unbalanced stages or to replay durations measured in a real run
    (stage: the global virtual stage). Costs are in units of
    :data:`UNIT_NS` nanoseconds (a millisecond), rounded to whole ns. A rank
    runs its actions in order; a send never waits (it starts the transfer and
    the rank goes on), a receive waits until its message has arrived. So a
    forward waits for the activation of the previous stage and a backward for
    the gradient of the next.

    The events have the shape of a real run's (see the module
    :mod:`minidist.trace`): compute regions labelled as the runtime labels
    them, one send and one recv event per message (paired by ``seq``), and a
    ``memory`` event after each forward and backward whose
    ``live_microbatches`` counts the (micro-batch, chunk) activations the rank
    holds (``activations`` = that count times ``activation_bytes``).

    Raises :class:`DeadlockError` naming every rank's blocked action when no
    rank can go on, and ValueError when the schedule itself is wrong (a
    backward before its forward, a message sent twice, a send nobody receives).
    """
    costs = _Costs(_cost("forward_time", forward_time), _cost("backward_time", backward_time),
                   _ticks("transfer_time", transfer_time),
                   _ticks("optimizer_time", optimizer_time))
    run = _ScheduleRun(schedule, costs, recompute, message_bytes, activation_bytes)
    run.run()
    return run.events


def _ticks(name: str, value) -> int:
    """A cost in whole ticks (ns)."""
    if not value >= 0:
        raise ValueError(f"simulate_schedule: {name} must be >= 0, got {value!r}")
    return int(round(value * UNIT_NS))


def _cost(name: str, value):
    """Ticks of a compute action: a fixed cost, or one per (stage, micro-batch)."""
    if callable(value):
        return lambda stage, microbatch: _ticks(name, value(stage, microbatch))
    fixed = _ticks(name, value)
    return lambda stage, microbatch: fixed


@dataclass(frozen=True)
class _Costs:
    forward: Callable   # (stage, microbatch) -> ticks
    backward: Callable  # (stage, microbatch) -> ticks
    transfer: int
    step: int


class _ScheduleRun:
    """One run of a schedule on the virtual clock: every rank's state, the
    messages in flight, and the events so far (see :func:`simulate_schedule`)."""

    def __init__(self, schedule: Schedule, costs: _Costs, recompute: bool,
                 message_bytes: int, activation_bytes: int):
        self.schedule, self.costs, self.recompute = schedule, costs, recompute
        self.message_bytes, self.activation_bytes = message_bytes, activation_bytes
        ranks = schedule.stages
        self.ranks, self.total_stages = ranks, schedule.total_stages
        self.where = [0] * ranks                                # next action of each rank
        self.clocks = [RankClock(0) for _ in range(ranks)]      # in ticks of UNIT_NS ns
        self.live = [0] * ranks
        self.forwarded = [set() for _ in range(ranks)]   # (mb, chunk) with activations held
        self.inputs = [set() for _ in range(ranks)]      # ("act"|"grad", mb, chunk) at hand
        self.in_flight: dict[tuple, tuple[int, int, int]] = {}  # (kind, mb, stage) ->
        self.sent_keys = set()                                  # (arrival, seq, src)
        self.seq_counter: dict[tuple[int, int], int] = {}
        self.events: list[dict] = []

    def run(self) -> None:
        """Move every rank on, in rank order, until none can; then check the end."""
        actions, where = self.schedule.actions, self.where
        progress = True
        while progress:
            progress = False
            for rank in range(self.ranks):
                while where[rank] < len(actions[rank]) and self.advance(rank):
                    progress = True
        self.check_finished()

    def check_finished(self) -> None:
        schedule, where = self.schedule, self.where
        stuck = [rank for rank in range(self.ranks) if where[rank] < len(schedule.actions[rank])]
        if stuck:
            waits = "; ".join(f"rank {rank} waits at action {where[rank]} "
                              f"({schedule.actions[rank][where[rank]]})" for rank in stuck)
            raise DeadlockError(f"schedule {schedule.name!r} ({schedule.stages} stages, "
                                f"{schedule.microbatches} micro-batches) deadlocks: {waits}, "
                                "and no message they wait for will ever be sent")
        if self.in_flight:
            lost = ", ".join(f"{kind} of micro-batch {mb} to stage {stage}"
                             for kind, mb, stage in sorted(self.in_flight))
            raise ValueError(f"schedule {schedule.name!r}: sent but never received: {lost}")

    def advance(self, rank) -> bool:
        """Run the rank's next action if it can; False when it must wait."""
        index = self.where[rank]
        action = self.schedule.actions[rank][index]
        stage = self.schedule.stage_of(rank, action.chunk)
        if action.kind in (RECV_ACTIVATION, RECV_GRAD):
            if not self.receive(rank, index, action, stage):
                return False
        elif action.kind in (SEND_ACTIVATION, SEND_GRAD):
            self.send(rank, index, action, stage)
        elif action.kind == FORWARD:
            self.forward(rank, index, action, stage)
        elif action.kind == BACKWARD:
            self.backward(rank, index, action, stage)
        elif action.kind == OPTIMIZER_STEP:
            self.step(rank, index, action)
        else:
            self.fail(rank, index, action, f"unknown kind {action.kind!r}; kinds are {KINDS}")
        self.where[rank] += 1
        return True

    def fail(self, rank, index, action, why):
        raise ValueError(f"schedule {self.schedule.name!r}: rank {rank}, action {index} "
                         f"({action}): {why}")

    def memory(self, rank, time) -> None:
        live = self.live[rank]
        self.events.append(_event(rank, "memory", time, time, memory_label(
            self.schedule.stage_of(rank), 0, 0, 0, live * self.activation_bytes, live)))

    def compute(self, rank, letter, action, ticks) -> None:
        start, end = self.clocks[rank].advance(ticks)
        self.events.append(_event(rank, "compute", start, end, compute_label(
            letter, action.microbatch, action.chunk,
            self.schedule.stage_of(rank, action.chunk), action.phase)))

    def receive(self, rank, index, action, stage) -> bool:
        """Take the message the receive wants; False while it has not been sent."""
        kind, mb = ("act" if action.kind == RECV_ACTIVATION else "grad"), action.microbatch
        message = self.in_flight.pop((kind, mb, stage), None)
        if message is None:
            return False
        arrival, seq, source = message
        if source != rank and action.peer != source:
            self.fail(rank, index, action, f"the message comes from rank {source}, "
                                           f"not {action.peer}")
        start, end = self.clocks[rank].wait_until(arrival)
        self.events.append(_event(rank, "recv", start, end, message_label(kind, mb),
                                  peer=source, nbytes=self.message_bytes, seq=seq,
                                  tag=message_tag(kind, mb, stage, self.total_stages)))
        self.inputs[rank].add((kind, mb, action.chunk))
        return True

    def send(self, rank, index, action, stage) -> None:
        kind, mb, chunk = ("act" if action.kind == SEND_ACTIVATION else "grad",
                           action.microbatch, action.chunk)
        if kind == "act" and (mb, chunk) not in self.forwarded[rank]:
            self.fail(rank, index, action, "sends an activation it has not computed")
        if kind == "grad" and ("done", mb, chunk) not in self.inputs[rank]:
            self.fail(rank, index, action, "sends a gradient before its backward")
        target_stage = stage + (1 if kind == "act" else -1)
        target_rank = target_stage % self.ranks
        if not 0 <= target_stage < self.total_stages or action.peer != target_rank:
            self.fail(rank, index, action, f"stage {target_stage} is not on rank "
                                           f"{action.peer}")
        key = (kind, mb, target_stage)
        if key in self.sent_keys:
            self.fail(rank, index, action, "sends the same message twice")
        self.sent_keys.add(key)
        seq = self.seq_counter.get((rank, target_rank), 0)
        self.seq_counter[(rank, target_rank)] = seq + 1
        start = self.clocks[rank].clock  # a send never waits: the rank goes on at once
        arrival = start + self.costs.transfer
        self.events.append(_event(rank, "send", start, arrival, message_label(kind, mb),
                                  peer=target_rank, nbytes=self.message_bytes, seq=seq,
                                  tag=message_tag(kind, mb, target_stage, self.total_stages)))
        self.in_flight[key] = (arrival, seq, rank)

    def forward(self, rank, index, action, stage) -> None:
        mb, chunk = action.microbatch, action.chunk
        if (mb, chunk) in self.forwarded[rank]:
            self.fail(rank, index, action, "forwards the same micro-batch twice")
        if stage > 0 and ("act", mb, chunk) not in self.inputs[rank]:
            if self.ranks == 1:
                self.fail(rank, index, action, "runs before the forward of chunk "
                                               f"{chunk - 1} on this rank")
            self.fail(rank, index, action, "runs before its activation was received")
        self.compute(rank, "F", action, self.costs.forward(stage, mb))
        self.forwarded[rank].add((mb, chunk))
        if self.ranks == 1 and stage < self.total_stages - 1:
            self.inputs[rank].add(("act", mb, chunk + 1))
        self.live[rank] += 1
        self.memory(rank, self.clocks[rank].clock)

    def backward(self, rank, index, action, stage) -> None:
        mb, chunk = action.microbatch, action.chunk
        if (mb, chunk) not in self.forwarded[rank]:
            self.fail(rank, index, action, "runs before its forward")
        if stage < self.total_stages - 1 and ("grad", mb, chunk) not in self.inputs[rank]:
            self.fail(rank, index, action, "runs before its gradient was received"
                      if self.ranks > 1
                      else f"runs before the backward of chunk {chunk + 1} on this rank")
        if self.recompute:
            self.compute(rank, "R", action, self.costs.forward(stage, mb))
        self.compute(rank, "B", action, self.costs.backward(stage, mb))
        self.forwarded[rank].discard((mb, chunk))
        self.inputs[rank].add(("done", mb, chunk))
        if self.ranks == 1 and stage > 0:
            self.inputs[rank].add(("grad", mb, chunk - 1))
        self.live[rank] -= 1
        self.memory(rank, self.clocks[rank].clock)

    def step(self, rank, index, action) -> None:
        if self.forwarded[rank]:
            self.fail(rank, index, action, "steps with micro-batches still waiting for their "
                                           "backward")
        start, end = self.clocks[rank].advance(self.costs.step)
        self.events.append(_event(rank, "compute", start, end,
                                  step_label(self.schedule.stage_of(rank))))


def _pipeline_regions(events):
    for event in events:
        if event["kind"] == "compute":
            info = _trace.label_info(event.get("label", ""))
            if info.get("pipeline") in ("F", "B", "R"):
                yield event


def bubble_fraction(events, stages: int | None = None) -> float:
    """The idle share of the pipeline's time, measured from events.

    Over the makespan of one batch (first F/B/R region's start to the last
    one's end), ``1 - (sum of F/B/R compute time over all ranks) /
    (stages * makespan)``. ``stages`` is the number of ranks the events come
    from (default: the ranks that have such regions). With equal stage
    costs, no transfer time and no recomputation this is exactly
    (p - 1) / (m + p - 1) for GPipe and 1F1B. Pass the events of one batch.
    The division is done on whole nanoseconds, so equal fractions give
    equal floats."""
    regions = list(_pipeline_regions(events))
    if not regions:
        raise ValueError("bubble_fraction: no pipeline compute regions (labels with "
                         "pipeline=F/B/R) among the events")
    if stages is None:
        stages = len({event["rank"] for event in regions})
    start = min(event["start"] for event in regions)
    makespan = max(event["end"] for event in regions) - start
    if makespan <= 0:
        raise ValueError("bubble_fraction: the pipeline regions take no time")
    busy = sum(event["end"] - event["start"] for event in regions)
    return float(1 - Fraction(busy, stages * makespan))


def peak_live_microbatches(events) -> dict[int, int]:
    """The largest ``live_microbatches`` of each rank's memory ledger."""
    peaks: dict[int, int] = {}
    for event in events:
        if event["kind"] == "memory":
            info = _trace.label_info(event.get("label", ""))
            peaks[event["rank"]] = max(peaks.get(event["rank"], 0),
                                       info.get("live_microbatches", 0))
    return peaks


