"""A schedule run on a virtual clock: its time, its bubble, its peak memory.

:func:`simulate_schedule` plays a :class:`~minidist.parallel.pipeline.schedules.Schedule`
on :mod:`minidist.virtual_clock` without any process: each rank takes its
actions in order, a forward costs ``forward_time``, a backward
``backward_time`` (split in two, its input half I and its weight half W
share it: ``weight_time`` and the rest), a message ``latency`` (+ its bytes
over a bandwidth), and a receive waits until its send has happened. The
result is a list of trace events in the format the real runtime records,
so the same Gantt charts, :func:`bubble_fraction` and
:func:`peak_live_microbatches` read a plan and a run alike. A schedule that
breaks a rule of :func:`~minidist.parallel.pipeline.validate.validate_schedule` is
refused before it runs; one whose receives can never all be matched is
refused with a :class:`DeadlockError` naming the actions that wait for ever.

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
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    OPTIMIZER_STEP,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    UNIT_NS,
    Schedule,
    message_tag,
)
from minidist.parallel.pipeline.validate import validate_schedule
from minidist.virtual_clock import RankClock


class DeadlockError(RuntimeError):
    """A schedule in which some rank waits for a message nobody will send."""


def _event(rank, kind, start, end, label="", peer=None, nbytes=0, tag=None, seq=None) -> dict:
    return {"rank": rank, "kind": kind, "peer": peer, "bytes": nbytes, "tag": tag,
            "label": label, "start": start, "end": end, "seq": seq, "group": 0, "channel": 0}


def simulate_schedule(schedule: Schedule, forward_time: float = 1.0, backward_time: float = 2.0,
                      transfer_time: float = 0.0, *, recompute: bool = False,
                      optimizer_time: float = 0.0, message_bytes: int = 0,
                      activation_bytes: int = 0, weight_time=None,
                      weight_kept_bytes: int | None = None) -> list[dict]:
    """Run ``schedule`` on a virtual clock (:mod:`minidist.virtual_clock`'s,
    one per rank, in ticks) and return its trace events.

    Every action takes a fixed time: a forward ``forward_time``, a whole
    backward B ``backward_time`` (preceded by a recomputation "R" of
    ``forward_time`` when ``recompute``), a message ``transfer_time`` from
    its send to its arrival, the optimizer step ``optimizer_time``. A split
    backward shares the whole one's time: its weight half W costs
    ``weight_time`` (default: half of ``backward_time``), its input half I
    the rest (with ``recompute``, R comes before the I). In Qi et al.'s
    notation F, B, W: ``forward_time=F, backward_time=B + W,
    weight_time=W``. ``forward_time``, ``backward_time`` and ``weight_time``
    may also be functions ``(stage, microbatch) -> cost``, for unbalanced
    stages or to replay durations measured in a real run (stage: the global
    virtual stage). Costs are in units of :data:`UNIT_NS` nanoseconds (a
    millisecond), rounded to whole ns. A rank runs its actions in order; a
    send never waits (it starts the transfer and the rank goes on), a
    receive waits until its message has arrived. So a forward waits for the
    activation of the previous stage and a backward for the gradient of the
    next, unless the rank itself holds that stage (handed over in memory).

    The events have the shape of a real run's (see the module
    :mod:`minidist.trace`): compute regions labelled as the runtime labels
    them, one send and one recv event per message (paired by ``seq``), and a
    ``memory`` event after each computation whose ``live_microbatches``
    counts the (micro-batch, chunk) activations the rank holds, from a
    forward until its B or its W (``activations``: each of them
    ``activation_bytes``). A schedule with split backwards adds
    ``weights_pending``, the pieces whose I ran and whose W has not, and
    what they keep: ``weight_kept_bytes`` each (default
    ``activation_bytes``: an I frees nothing), counted in ``activations``.

    Raises :class:`~minidist.parallel.pipeline.validate.ScheduleError` (a
    ValueError) when the schedule itself is wrong (a backward before its
    forward, a W before its I, a micro-batch backwarded twice, a message
    sent twice, ...: the rank, the action's index and what is wrong), and
    :class:`DeadlockError` naming every rank's blocked action when no rank
    can go on.
    """
    validate_schedule(schedule)
    backward = _cost("backward_time", backward_time)
    weight = (lambda stage, microbatch: backward(stage, microbatch) // 2) \
        if weight_time is None else _cost("weight_time", weight_time)
    costs = _Costs(_cost("forward_time", forward_time), backward, weight,
                   _ticks("transfer_time", transfer_time),
                   _ticks("optimizer_time", optimizer_time))
    kept = activation_bytes if weight_kept_bytes is None else weight_kept_bytes
    run = _ScheduleRun(schedule, costs, recompute, message_bytes, activation_bytes, kept)
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
    backward: Callable  # (stage, microbatch) -> ticks, the whole backward B
    weight: Callable    # (stage, microbatch) -> ticks of its weight half W
    transfer: int
    step: int

    def input(self, stage, microbatch) -> int:
        """The input half I: what of the whole backward the weight half leaves."""
        whole, weight = self.backward(stage, microbatch), self.weight(stage, microbatch)
        if weight > whole:
            raise ValueError(f"simulate_schedule: at stage {stage}, micro-batch {microbatch} "
                             f"the weight half costs {weight / UNIT_NS:g}, more than the whole "
                             f"backward's {whole / UNIT_NS:g}: weight_time is a part of "
                             "backward_time (pass backward_time = B + W)")
        return whole - weight


class _ScheduleRun:
    """One run of a schedule on the virtual clock: every rank's state, the
    messages in flight, and the events so far (see :func:`simulate_schedule`)."""

    def __init__(self, schedule: Schedule, costs: _Costs, recompute: bool,
                 message_bytes: int, activation_bytes: int, kept_bytes: int):
        self.schedule, self.costs, self.recompute = schedule, costs, recompute
        self.message_bytes, self.activation_bytes = message_bytes, activation_bytes
        self.kept_bytes = kept_bytes
        # Only a schedule with split backwards counts the W's waiting, so
        # that the others' events stay as they always were.
        self.split = any(action.kind in (BACKWARD_INPUT, BACKWARD_WEIGHT)
                         for actions in schedule.actions for action in actions)
        ranks = schedule.stages
        self.ranks, self.total_stages = ranks, schedule.total_stages
        self.where = [0] * ranks                                # next action of each rank
        self.clocks = [RankClock(0) for _ in range(ranks)]      # in ticks of UNIT_NS ns
        self.live = [0] * ranks       # (mb, chunk) with activations held: F until B or W
        self.pending = [0] * ranks    # of those, the ones whose I ran and W has not
        self.in_flight: dict[tuple, tuple[int, int, int]] = {}  # (kind, mb, stage) ->
        self.seq_counter: dict[tuple[int, int], int] = {}       # (arrival, seq, src)
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

    def advance(self, rank) -> bool:
        """Run the rank's next action if it can; False when it must wait."""
        action = self.schedule.actions[rank][self.where[rank]]
        stage = self.schedule.stage_of(rank, action.chunk)
        if action.kind in (RECV_ACTIVATION, RECV_GRAD):
            if not self.receive(rank, action, stage):
                return False
        elif action.kind in (SEND_ACTIVATION, SEND_GRAD):
            self.send(rank, action, stage)
        elif action.kind == OPTIMIZER_STEP:
            self.step(rank)
        else:
            self.compute_action(rank, action, stage)
        self.where[rank] += 1
        return True

    def memory(self, rank, time) -> None:
        live, pending = self.live[rank], self.pending[rank]
        activations = (live - pending) * self.activation_bytes + pending * self.kept_bytes
        split = (pending, pending * self.kept_bytes) if self.split else (None, None)
        self.events.append(_event(rank, "memory", time, time, memory_label(
            self.schedule.stage_of(rank), 0, 0, 0, activations, live, *split)))

    def compute(self, rank, letter, action, ticks) -> None:
        start, end = self.clocks[rank].advance(ticks)
        self.events.append(_event(rank, "compute", start, end, compute_label(
            letter, action.microbatch, action.chunk,
            self.schedule.stage_of(rank, action.chunk), action.phase)))

    def receive(self, rank, action, stage) -> bool:
        """Take the message the receive wants; False while it has not been sent."""
        kind, mb = ("act" if action.kind == RECV_ACTIVATION else "grad"), action.microbatch
        message = self.in_flight.pop((kind, mb, stage), None)
        if message is None:
            return False
        arrival, seq, source = message
        start, end = self.clocks[rank].wait_until(arrival)
        self.events.append(_event(rank, "recv", start, end, message_label(kind, mb),
                                  peer=source, nbytes=self.message_bytes, seq=seq,
                                  tag=message_tag(kind, mb, stage, self.total_stages)))
        return True

    def send(self, rank, action, stage) -> None:
        kind, mb = ("act" if action.kind == SEND_ACTIVATION else "grad"), action.microbatch
        target_stage = stage + (1 if kind == "act" else -1)
        target_rank = self.schedule.rank_of(target_stage)[0]
        seq = self.seq_counter.get((rank, target_rank), 0)
        self.seq_counter[(rank, target_rank)] = seq + 1
        start = self.clocks[rank].clock  # a send never waits: the rank goes on at once
        arrival = start + self.costs.transfer
        self.events.append(_event(rank, "send", start, arrival, message_label(kind, mb),
                                  peer=target_rank, nbytes=self.message_bytes, seq=seq,
                                  tag=message_tag(kind, mb, target_stage, self.total_stages)))
        self.in_flight[(kind, mb, target_stage)] = (arrival, seq, rank)

    def compute_action(self, rank, action, stage) -> None:
        """A forward, a backward or one of its halves, and the memory after it.
        (What each needs has been checked by validate_schedule: its input at hand,
        its forward or its I run before.)"""
        costs, mb = self.costs, action.microbatch
        if action.kind == FORWARD:
            self.compute(rank, "F", action, costs.forward(stage, mb))
            self.live[rank] += 1
        elif action.kind == BACKWARD_WEIGHT:
            self.compute(rank, "W", action, costs.weight(stage, mb))
            self.pending[rank] -= 1
            self.live[rank] -= 1
        else:
            if self.recompute:
                self.compute(rank, "R", action, costs.forward(stage, mb))
            if action.kind == BACKWARD:
                self.compute(rank, "B", action, costs.backward(stage, mb))
                self.live[rank] -= 1
            else:  # its input half: the activations W needs stay held
                self.compute(rank, "I", action, costs.input(stage, mb))
                self.pending[rank] += 1
        self.memory(rank, self.clocks[rank].clock)

    def step(self, rank) -> None:
        start, end = self.clocks[rank].advance(self.costs.step)
        self.events.append(_event(rank, "compute", start, end,
                                  step_label(self.schedule.stage_of(rank))))


#: The compute regions that count as a stage's work (the optimizer step does not).
WORK = ("F", "B", "R", "I", "W")


def _pipeline_regions(events):
    for event in events:
        if event["kind"] == "compute":
            info = _trace.label_info(event.get("label", ""))
            if info.get("pipeline") in WORK:
                yield event


def bubble_fraction(events, stages: int | None = None) -> float:
    """The idle share of the pipeline's time, measured from events.

    Over the makespan of one batch (first work region's start to the last
    one's end: F, B, R, and a split backward's I and W, :data:`WORK`),
    ``1 - (sum of their compute time over all ranks) / (stages *
    makespan)``. ``stages`` is the number of ranks the events come from
    (default: the ranks that have such regions). With equal stage costs, no
    transfer time and no recomputation this is exactly (p - 1) / (m + p - 1)
    for GPipe and 1F1B. Pass the events of one batch.
    The division is done on whole nanoseconds, so equal fractions give
    equal floats."""
    regions = list(_pipeline_regions(events))
    if not regions:
        raise ValueError("bubble_fraction: no pipeline compute regions (labels with "
                         "pipeline=F/B/R/I/W) among the events")
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


