"""Pipeline schedules as plain data, and a virtual clock that runs them.

A pipeline cuts a model into ``p`` stages, one per rank, and a batch into
``m`` micro-batches. A *schedule* says, for every rank, the exact order of
what it does: forward micro-batch k, backward micro-batch k, send or receive
an activation or a gradient, and finally the optimizer step. Each schedule is
built by a pure function, so it can be printed, tested and drawn without any
process; the runtime (:mod:`minidist.parallel.pipeline`) executes the very
same list, action by action.

The three schedules of the course, and what each costs (f, b: forward and
backward time of one stage on one micro-batch; no transfer time):

* :func:`gpipe` (all forward, then all backward). Every stage forwards all m
  micro-batches, then runs all m backwards. Time (m + p - 1)(f + b); bubble
  (p - 1) / (m + p - 1); each stage holds the activations of all m
  micro-batches at the turn.
* :func:`one_f_one_b` (PipeDream-flush). Stage s runs p - s - 1 forwards
  (warm-up), then alternates one forward and one backward (steady state),
  then runs the backwards left (cool-down). Same time and bubble as GPipe,
  but stage s never holds more than p - s micro-batches' activations.
* :func:`interleaved_one_f_one_b` (Megatron-LM). Each rank holds v
  non-consecutive *virtual stages* (chunks): with p ranks the model is cut
  into p v pieces and rank r holds pieces r, r + p, r + 2p, ... A micro-batch
  goes round the ranks v times, each pass costing f / v and b / v, so the
  fill and drain shrink v-fold: bubble (p - 1) / (v m + p - 1), for v times
  as many messages.

Conventions of the data (shared with the drawings in ``viz/``):

* ``schedule.actions[rank]`` is the ordered list of :class:`Action` of that
  rank; ``chunk`` is the virtual stage's index *on that rank* and the global
  stage is ``chunk * p + rank``.
* A forward at a stage other than the first is preceded by the receive of its
  input activation; a forward is followed by the send of its output to the
  next stage (unless it is the last stage). Backward mirrors it with
  gradients. ``peer`` of a send or receive is the other pipeline rank. With
  one rank and several chunks, neighbouring chunks hand over in memory and
  there are no messages.
* Sends never wait for their receive (the transports buffer them), so a
  schedule can only deadlock through receives: :func:`simulate_schedule`
  finds such a schedule and names the actions that wait for ever.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from minidist import trace as _trace
from minidist.virtual_clock import RankClock

FORWARD = "forward"
BACKWARD = "backward"
SEND_ACTIVATION = "send_activation"
RECV_ACTIVATION = "recv_activation"
SEND_GRAD = "send_grad"
RECV_GRAD = "recv_grad"
OPTIMIZER_STEP = "optimizer_step"
KINDS = (FORWARD, BACKWARD, SEND_ACTIVATION, RECV_ACTIVATION, SEND_GRAD, RECV_GRAD,
         OPTIMIZER_STEP)
PHASES = ("warmup", "steady", "cooldown", "step")

#: The simulator's virtual clock: one unit of ``forward_time`` etc. is this many ns.
UNIT_NS = 1_000_000


@dataclass(frozen=True)
class Action:
    """One thing one rank does; see the module's conventions."""

    kind: str
    microbatch: int | None
    chunk: int = 0
    phase: str = ""
    peer: int | None = None

    def __str__(self) -> str:
        if self.kind == OPTIMIZER_STEP:
            return "step"
        if self.kind in (FORWARD, BACKWARD):
            return compute_text("F" if self.kind == FORWARD else "B", self.microbatch, self.chunk)
        what = f"{self.microbatch}" + (f"c{self.chunk}" if self.chunk else "")
        name = {SEND_ACTIVATION: "send_act", RECV_ACTIVATION: "recv_act",
                SEND_GRAD: "send_grad", RECV_GRAD: "recv_grad"}[self.kind]
        arrow = "->" if self.kind.startswith("send") else "<-"
        return f"{name}({what}){arrow}{self.peer}"


@dataclass(frozen=True)
class Schedule:
    """What every rank of a pipeline does in one batch, in order.

    ``stages`` is the number of pipeline ranks p; with ``virtual_stages`` v the
    model has p v pieces. ``actions[rank]`` lists that rank's actions."""

    name: str
    stages: int
    microbatches: int
    virtual_stages: int
    actions: list

    @property
    def total_stages(self) -> int:
        """Pieces of the model: p v."""
        return self.stages * self.virtual_stages

    def stage_of(self, rank: int, chunk: int = 0) -> int:
        """The global stage index of ``chunk`` on ``rank``."""
        return chunk * self.stages + rank

    def compute_order(self, rank: int) -> list[str]:
        """The rank's forwards and backwards only, e.g. ``["F0", "F1", "B0", ...]``."""
        return [str(a) for a in self.actions[rank] if a.kind in (FORWARD, BACKWARD)]

    def header(self) -> dict:
        """The trace header fields of a run of this schedule."""
        return {"schedule": self.name, "stages": self.stages,
                "microbatches": self.microbatches, "virtual_stages": self.virtual_stages}

    def __str__(self) -> str:
        rows = [f"{self.name}: {self.stages} stages, {self.microbatches} micro-batches"
                + (f", {self.virtual_stages} virtual stages per rank"
                   if self.virtual_stages > 1 else "")]
        for rank, actions in enumerate(self.actions):
            rows.append(f"  rank {rank}: " + " ".join(map(str, actions)))
        return "\n".join(rows)


def _check_sizes(who: str, stages, microbatches, virtual_stages=1) -> None:
    for name, value in (("stages", stages), ("microbatches", microbatches),
                        ("virtual_stages", virtual_stages)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{who}: {name} must be a whole number >= 1, got {value!r}")


class _RankBuilder:
    """Appends one rank's compute actions together with the messages around
    them, so that every schedule function only decides the order of forwards
    and backwards."""

    def __init__(self, rank: int, ranks: int, virtual_stages: int,
                 microbatches: int | None = None):
        self.rank = rank
        self.ranks = ranks
        self.last_stage = ranks * virtual_stages - 1
        # Micro-batches from here on are padding (interleaved rounds): left out.
        self.microbatches = microbatches
        self.actions: list[Action] = []

    def _exists(self, microbatch: int) -> bool:
        return self.microbatches is None or microbatch < self.microbatches

    def _messages_cross_ranks(self) -> bool:
        # With one rank every neighbouring chunk lives here: handed over in memory.
        return self.ranks > 1

    def forward(self, microbatch: int, chunk: int, phase: str) -> None:
        if not self._exists(microbatch):
            return
        stage = chunk * self.ranks + self.rank
        previous, following = (self.rank - 1) % self.ranks, (self.rank + 1) % self.ranks
        if stage > 0 and self._messages_cross_ranks():
            self.actions.append(Action(RECV_ACTIVATION, microbatch, chunk, phase, previous))
        self.actions.append(Action(FORWARD, microbatch, chunk, phase))
        if stage < self.last_stage and self._messages_cross_ranks():
            self.actions.append(Action(SEND_ACTIVATION, microbatch, chunk, phase, following))

    def backward(self, microbatch: int, chunk: int, phase: str) -> None:
        if not self._exists(microbatch):
            return
        stage = chunk * self.ranks + self.rank
        previous, following = (self.rank - 1) % self.ranks, (self.rank + 1) % self.ranks
        if stage < self.last_stage and self._messages_cross_ranks():
            self.actions.append(Action(RECV_GRAD, microbatch, chunk, phase, following))
        self.actions.append(Action(BACKWARD, microbatch, chunk, phase))
        if stage > 0 and self._messages_cross_ranks():
            self.actions.append(Action(SEND_GRAD, microbatch, chunk, phase, previous))

    def step(self) -> list[Action]:
        self.actions.append(Action(OPTIMIZER_STEP, None, 0, "step"))
        return self.actions


# --------------------------------------------------------------------------- schedules


def gpipe(stages: int, microbatches: int) -> Schedule:
    """All forward, then all backward (GPipe).

    Every rank forwards micro-batches 0..m-1 (phase "warmup": the pipeline
    fills), then backwards 0..m-1 (phase "cooldown": it drains); there is no
    steady state. Time (m + p - 1)(f + b), bubble (p - 1) / (m + p - 1);
    activations of all m micro-batches are alive at the turn, on every stage.
    Messages: m activations and m gradients over each of the p - 1 links."""
    _check_sizes("gpipe", stages, microbatches)
    actions = []
    for rank in range(stages):
        builder = _RankBuilder(rank, stages, 1)
        for microbatch in range(microbatches):
            builder.forward(microbatch, 0, "warmup")
        for microbatch in range(microbatches):
            builder.backward(microbatch, 0, "cooldown")
        actions.append(builder.step())
    return Schedule("gpipe", stages, microbatches, 1, actions)


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """One forward, one backward (PipeDream-flush, "1F1B").

    Stage s: warm-up of min(p - s - 1, m) forwards; steady state of
    m - warm-up rounds "forward the next micro-batch, backward the oldest";
    cool-down: the backwards left. The last stage starts a backward as soon
    as its first forward is done, and a backward frees its micro-batch's
    activations, so stage s holds at most min(p - s, m) micro-batches at
    once (GPipe: m). Time and bubble as GPipe: (m + p - 1)(f + b) and
    (p - 1) / (m + p - 1); the same messages."""
    _check_sizes("one_f_one_b", stages, microbatches)
    actions = []
    for rank in range(stages):
        builder = _RankBuilder(rank, stages, 1)
        warmup = min(stages - rank - 1, microbatches)
        for microbatch in range(warmup):
            builder.forward(microbatch, 0, "warmup")
        for oldest in range(microbatches - warmup):
            builder.forward(warmup + oldest, 0, "steady")
            builder.backward(oldest, 0, "steady")
        for oldest in range(microbatches - warmup, microbatches):
            builder.backward(oldest, 0, "cooldown")
        actions.append(builder.step())
    return Schedule("1f1b", stages, microbatches, 1, actions)


def _interleaved_order(stages: int, rounds: int, virtual_stages: int,
                       backward: bool) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in the order every rank runs them: micro-batches
    in rounds of p; within a round, chunk by chunk (forward 0..v-1, backward
    v-1..0), each chunk over the round's p micro-batches."""
    chunks = range(virtual_stages - 1, -1, -1) if backward else range(virtual_stages)
    return [(first + offset, chunk) for first in range(0, rounds * stages, stages)
            for chunk in chunks for offset in range(stages)]


def interleaved_one_f_one_b(stages: int, microbatches: int, virtual_stages: int) -> Schedule:
    """Interleaved 1F1B with ``virtual_stages`` chunks per rank (Megatron-LM).

    Rank r holds the model's pieces r, r + p, ..., r + (v - 1) p. All ranks
    run the v m (micro-batch, chunk) forwards in one order: rounds of p
    micro-batches, each round through chunk 0, then chunk 1, ...; the
    backwards in the same rounds, chunks in reverse. Rank r warms up with
    min(v m, (v - 1) p + 2 (p - r - 1)) forwards (Megatron-LM's count: the
    first backward of the last chunk needs the whole first round forwarded
    through every chunk; the extra p - r - 1 forwards keep the rank busy
    while gradients travel back, which hides transfer time), then alternates
    one forward and one backward, then drains the backwards.

    Each piece costs f / v and b / v, so fill and drain take (p - 1)(f + b) / v
    and the bubble is (p - 1) / (v m + p - 1) when m is a multiple of p;
    the price is v times as many messages, and more activations in flight
    (rank r holds up to (v - 1) p + 2 (p - r - 1) + 1 pieces' activations,
    each 1 / v of a stage's).

    m not a multiple of p (Megatron-LM refuses it): the schedule of the next
    multiple of p, with the actions of the micro-batches that do not exist
    left out. Leaving out every action of a micro-batch cannot create a
    wait cycle, so it still completes; the missing slots are idle time, so
    the bubble is larger than the formula. With v = 1 this is 1F1B with the
    longer warm-up.
    """
    _check_sizes("interleaved_one_f_one_b", stages, microbatches, virtual_stages)
    rounds = -(-microbatches // stages)
    forwards = _interleaved_order(stages, rounds, virtual_stages, backward=False)
    backwards = _interleaved_order(stages, rounds, virtual_stages, backward=True)
    total = len(forwards)
    actions = []
    for rank in range(stages):
        builder = _RankBuilder(rank, stages, virtual_stages, microbatches)
        warmup = min(total, (virtual_stages - 1) * stages + 2 * (stages - rank - 1))
        for microbatch, chunk in forwards[:warmup]:
            builder.forward(microbatch, chunk, "warmup")
        for index in range(total - warmup):
            builder.forward(*forwards[warmup + index], "steady")
            builder.backward(*backwards[index], "steady")
        for microbatch, chunk in backwards[total - warmup:]:
            builder.backward(microbatch, chunk, "cooldown")
        actions.append(builder.step())
    return Schedule("interleaved_1f1b", stages, microbatches, virtual_stages, actions)


def schedule_from_order(name: str, stages: int, microbatches: int, virtual_stages: int,
                        orders: list) -> Schedule:
    """The schedule whose ranks compute in the given order: ``orders[rank]``
    lists that rank's forwards and backwards as ``(letter, micro-batch,
    chunk, phase)`` with letter "F" or "B" (e.g. read back from a trace).
    The messages around them and the optimizer step are added as every
    schedule adds them, so :func:`simulate_schedule` can replay the order
    on its clock: what a run did, without how long each piece took."""
    _check_sizes("schedule_from_order", stages, microbatches, virtual_stages)
    if len(orders) != stages:
        raise ValueError(f"schedule_from_order: {len(orders)} ranks' orders for "
                         f"{stages} stages")
    actions = []
    for rank, order in enumerate(orders):
        builder = _RankBuilder(rank, stages, virtual_stages)
        for letter, microbatch, chunk, phase in order:
            if letter not in ("F", "B"):
                raise ValueError(f"schedule_from_order: rank {rank}: {letter!r} is not "
                                 "F (forward) or B (backward)")
            (builder.forward if letter == "F" else builder.backward)(microbatch, chunk, phase)
        actions.append(builder.step())
    return Schedule(name, stages, microbatches, virtual_stages, actions)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved_1f1b": interleaved_one_f_one_b}
_ALIASES = {"gpipe": "gpipe", "1f1b": "1f1b", "one_f_one_b": "1f1b",
            "interleaved": "interleaved_1f1b", "interleaved_1f1b": "interleaved_1f1b",
            "interleaved-1f1b": "interleaved_1f1b"}


def make_schedule(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """The schedule called ``name`` ("gpipe", "1f1b", "interleaved_1f1b" or
    "interleaved"). ``virtual_stages`` > 1 needs the interleaved schedule."""
    key = _ALIASES.get(str(name).lower())
    if key is None:
        raise ValueError(f"unknown pipeline schedule {name!r}; choose one of "
                         f"{sorted(SCHEDULES)}")
    if key == "interleaved_1f1b":
        return interleaved_one_f_one_b(stages, microbatches, virtual_stages)
    if virtual_stages != 1:
        raise ValueError(f"schedule {key!r} has one stage per rank; virtual_stages="
                         f"{virtual_stages} needs schedule='interleaved_1f1b'")
    return SCHEDULES[key](stages, microbatches)


# --------------------------------------------------------------------------- labels


def message_tag(kind: str, microbatch: int, receiving_stage: int, total_stages: int) -> int:
    """The tag of the message carrying ``kind`` ("act" or "grad") of
    ``microbatch`` to ``receiving_stage``: both ends compute it, so any
    order of arrival matches the right receive."""
    return 2 * (microbatch * total_stages + receiving_stage) + (kind == "grad")


def compute_text(letter: str, microbatch: int, chunk: int = 0) -> str:
    """How a forward, backward or recomputation is written everywhere (the
    schedule's printout, the trace, the drawings): ``F3``, ``B3``, ``R3``;
    ``F3c1`` on the rank's model chunk 1 (interleaved)."""
    return f"{letter}{microbatch}" + (f"c{chunk}" if chunk else "")


def compute_label(letter: str, microbatch: int, chunk: int, stage: int, phase: str) -> str:
    """A compute region's label: ``F3`` / ``B3`` / ``R3`` with its pairs
    (the chunk is among the pairs, not in the text: the agreed format)."""
    return _trace.with_info(f"{letter}{microbatch}", pipeline=letter, mb=microbatch,
                            chunk=chunk, stage=stage, phase=phase)


def step_label(stage: int) -> str:
    return _trace.with_info("step", pipeline="step", stage=stage)


def message_label(kind: str, microbatch: int) -> str:
    """``kind`` is "act" or "grad"."""
    return _trace.with_info(f"{kind} mb={microbatch}", pipeline=kind, mb=microbatch)


def memory_label(stage: int, params: int, grads: int, optimizer: int, activations: int,
                 live_microbatches: int) -> str:
    return _trace.with_info("memory", params=params, grads=grads, optimizer=optimizer,
                            activations=activations, live_microbatches=live_microbatches,
                            stage=stage)


# --------------------------------------------------------------------------- simulator


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


# --------------------------------------------------------------------------- bubble


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
