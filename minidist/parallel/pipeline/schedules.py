"""Pipeline schedules as plain data (the virtual clock that runs them:
:mod:`minidist.parallel.pipeline.simulate`).

A pipeline cuts a model into ``p`` stages, one per rank, and a batch into
``m`` micro-batches. A *schedule* says, for every rank, the exact order of
what it does: forward micro-batch k, backward micro-batch k, send or receive
an activation or a gradient, and finally the optimizer step. Each schedule is
built by a pure function, so it can be printed, tested and drawn without any
process; the runtime (:mod:`minidist.parallel.pipeline.executor`) executes the very
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
  schedule can only deadlock through receives:
  :func:`~minidist.parallel.pipeline.simulate.simulate_schedule`
  finds such a schedule and names the actions that wait for ever.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.parallel.pipeline.labels import compute_text

FORWARD = "forward"
BACKWARD = "backward"
SEND_ACTIVATION = "send_activation"
RECV_ACTIVATION = "recv_activation"
SEND_GRAD = "send_grad"
RECV_GRAD = "recv_grad"
OPTIMIZER_STEP = "optimizer_step"
# The backward split in two (zero-bubble schedules): its input half "I"
# (the gradient of the stage's input, which the stage before waits for) and
# its weight half "W" (the weights' gradients, needed only by the step).
# Qi et al. call the input half B; here B stays the whole backward, as in
# GPipe and 1F1B, and the halves take torch.distributed.pipelining's letters.
BACKWARD_INPUT = "backward_input"
BACKWARD_WEIGHT = "backward_weight"
KINDS = (FORWARD, BACKWARD, SEND_ACTIVATION, RECV_ACTIVATION, SEND_GRAD, RECV_GRAD,
         OPTIMIZER_STEP, BACKWARD_INPUT, BACKWARD_WEIGHT)
#: The letter of each compute kind, in printouts, traces and charts.
LETTERS = {FORWARD: "F", BACKWARD: "B", BACKWARD_INPUT: "I", BACKWARD_WEIGHT: "W"}
#: Where a rank's chunks sit: "loop" puts chunk c of rank r at stage c p + r
#: (interleaved 1F1B); "v" puts chunk 0 at stage r and chunk 1 at stage
#: 2 p - 1 - r, so rank 0 holds the first and the last stage (ZB-V, DualPipeV).
PLACEMENTS = ("loop", "v")
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
        if self.kind in LETTERS:
            return compute_text(LETTERS[self.kind], self.microbatch, self.chunk)
        what = f"{self.microbatch}" + (f"c{self.chunk}" if self.chunk else "")
        name = {SEND_ACTIVATION: "send_act", RECV_ACTIVATION: "recv_act",
                SEND_GRAD: "send_grad", RECV_GRAD: "recv_grad"}[self.kind]
        arrow = "->" if self.kind.startswith("send") else "<-"
        return f"{name}({what}){arrow}{self.peer}"


@dataclass(frozen=True)
class Schedule:
    """What every rank of a pipeline does in one batch, in order.

    ``stages`` is the number of pipeline ranks p; with ``virtual_stages`` v the
    model has p v pieces. ``actions[rank]`` lists that rank's actions.
    ``placement`` says which pieces a rank holds (:data:`PLACEMENTS`)."""

    name: str
    stages: int
    microbatches: int
    virtual_stages: int
    actions: list
    placement: str = "loop"

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise ValueError(f"schedule {self.name!r}: placement must be one of {PLACEMENTS}, "
                             f"got {self.placement!r}")
        if self.placement == "v" and self.virtual_stages != 2:
            raise ValueError(f"schedule {self.name!r}: the V placement holds 2 chunks per "
                             f"rank, got virtual_stages={self.virtual_stages}")

    @property
    def total_stages(self) -> int:
        """Pieces of the model: p v."""
        return self.stages * self.virtual_stages

    def stage_of(self, rank: int, chunk: int = 0) -> int:
        """The global stage index of ``chunk`` on ``rank``."""
        if self.placement == "v" and chunk == 1:
            return 2 * self.stages - 1 - rank
        return chunk * self.stages + rank

    def rank_of(self, stage: int) -> tuple[int, int]:
        """``(rank, chunk)`` holding global ``stage`` (the inverse of :meth:`stage_of`)."""
        chunk, rank = divmod(stage, self.stages)
        if self.placement == "v" and chunk == 1:
            rank = self.stages - 1 - rank
        return rank, chunk

    def compute_order(self, rank: int) -> list[str]:
        """The rank's compute actions only, e.g. ``["F0", "F1", "B0", ...]``
        (``I0``, ``W0`` for a split backward)."""
        return [str(a) for a in self.actions[rank] if a.kind in LETTERS]

    def header(self) -> dict:
        """The trace header fields of a run of this schedule."""
        fields = {"schedule": self.name, "stages": self.stages,
                  "microbatches": self.microbatches, "virtual_stages": self.virtual_stages}
        if self.placement != "loop":
            fields["placement"] = self.placement
        return fields

    def __str__(self) -> str:
        rows = [f"{self.name}: {self.stages} stage{'s' if self.stages != 1 else ''}, "
                f"{self.microbatches} micro-batch{'es' if self.microbatches != 1 else ''}"
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
                 microbatches: int | None = None, placement: str = "loop"):
        self.rank = rank
        self.ranks = ranks
        self.last_stage = ranks * virtual_stages - 1
        # Micro-batches from here on are padding (interleaved rounds): left out.
        self.microbatches = microbatches
        # Only its stage arithmetic is used: which stage a chunk is, which rank a stage.
        self.layout = Schedule("", ranks, 1, virtual_stages, [], placement)
        self.actions: list[Action] = []

    def _exists(self, microbatch: int) -> bool:
        return self.microbatches is None or microbatch < self.microbatches

    def _peer(self, stage: int) -> int | None:
        """The rank holding ``stage``, or None when it is this rank: neighbouring
        chunks on one rank hand over in memory, without a message."""
        rank = self.layout.rank_of(stage)[0]
        return None if rank == self.rank else rank

    def forward(self, microbatch: int, chunk: int, phase: str) -> None:
        if not self._exists(microbatch):
            return
        stage = self.layout.stage_of(self.rank, chunk)
        if stage > 0 and (previous := self._peer(stage - 1)) is not None:
            self.actions.append(Action(RECV_ACTIVATION, microbatch, chunk, phase, previous))
        self.actions.append(Action(FORWARD, microbatch, chunk, phase))
        if stage < self.last_stage and (following := self._peer(stage + 1)) is not None:
            self.actions.append(Action(SEND_ACTIVATION, microbatch, chunk, phase, following))

    def backward(self, microbatch: int, chunk: int, phase: str,
                 kind: str = BACKWARD) -> None:
        """The whole backward (``kind`` BACKWARD) or its input half
        (BACKWARD_INPUT): both take the gradient of the stage's output and
        send the gradient of its input."""
        if not self._exists(microbatch):
            return
        stage = self.layout.stage_of(self.rank, chunk)
        if stage < self.last_stage and (following := self._peer(stage + 1)) is not None:
            self.actions.append(Action(RECV_GRAD, microbatch, chunk, phase, following))
        self.actions.append(Action(kind, microbatch, chunk, phase))
        if stage > 0 and (previous := self._peer(stage - 1)) is not None:
            self.actions.append(Action(SEND_GRAD, microbatch, chunk, phase, previous))

    def backward_input(self, microbatch: int, chunk: int, phase: str) -> None:
        """I: the input half of the backward, with its messages."""
        self.backward(microbatch, chunk, phase, BACKWARD_INPUT)

    def backward_weight(self, microbatch: int, chunk: int, phase: str) -> None:
        """W: the weight half; no message (nobody else waits for it)."""
        if self._exists(microbatch):
            self.actions.append(Action(BACKWARD_WEIGHT, microbatch, chunk, phase))

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
                        orders: list, placement: str = "loop") -> Schedule:
    """The schedule whose ranks compute in the given order: ``orders[rank]``
    lists that rank's compute actions as ``(letter, micro-batch, chunk,
    phase)`` with letter "F" (forward), "B" (whole backward), "I" or "W"
    (its input and weight halves), e.g. read back from a trace. The
    messages around them and the optimizer step are added as every
    schedule adds them, so :func:`simulate_schedule` can replay the order
    on its clock: what a run did, without how long each piece took."""
    _check_sizes("schedule_from_order", stages, microbatches, virtual_stages)
    if len(orders) != stages:
        raise ValueError(f"schedule_from_order: {len(orders)} ranks' orders for "
                         f"{stages} stages")
    actions = []
    for rank, order in enumerate(orders):
        builder = _RankBuilder(rank, stages, virtual_stages, placement=placement)
        steps = {"F": builder.forward, "B": builder.backward, "I": builder.backward_input,
                 "W": builder.backward_weight}
        for letter, microbatch, chunk, phase in order:
            if letter not in steps:
                raise ValueError(f"schedule_from_order: rank {rank}: {letter!r} is not "
                                 "F (forward), B (backward), I (its input half) or W (its "
                                 "weight half)")
            steps[letter](microbatch, chunk, phase)
        actions.append(builder.step())
    return Schedule(name, stages, microbatches, virtual_stages, actions, placement)


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


# --------------------------------------------------------------------------- simulator


# --------------------------------------------------------------------------- bubble


