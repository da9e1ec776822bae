"""What a pipeline rank does, as data: the kinds of action, one
:class:`Action`, a :class:`Schedule` of them (which model chunks a rank
holds and where each sits in the pipeline), and the builder that puts the
messages around each computation, so that a schedule function decides only
the order of its computations.

The schedules themselves are built on this in
:mod:`~minidist.parallel.pipeline.schedules` (GPipe, 1F1B, interleaved) and
:mod:`~minidist.parallel.pipeline.zero_bubble` (ZB-H1, ZB-H2, ZB-V,
DualPipeV).

Conventions of the data (shared with the simulator, the runtime and the
drawings in ``viz/``):

* ``schedule.actions[rank]`` is the ordered list of :class:`Action` of that
  rank; ``chunk`` is the virtual stage's index *on that rank*;
  :meth:`Schedule.stage_of` gives its place in the pipeline (the global
  stage) by the schedule's ``placement``.
* A forward at a stage other than the first is preceded by the receive of its
  input activation; a forward is followed by the send of its output to the
  next stage (unless it is the last stage). A backward, whole (B) or its
  input half (I), mirrors it with gradients; the weight half (W) sends and
  receives nothing. ``peer`` of a send or receive is the other pipeline
  rank. Neighbouring stages held by one rank hand over in memory: no
  message between them.
* For each (micro-batch, chunk) a rank runs one forward and then either one
  B, or one I and later one W. The activations a forward keeps are held
  until its B or its W.
* Sends never wait for their receive (the transports buffer them), so a
  schedule can only deadlock through receives:
  :func:`~minidist.parallel.pipeline.simulate.simulate_schedule` finds
  such a schedule and names the actions that wait for ever.
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
#: "overlap" marks a forward and a backward of two micro-batches that
#: DualPipe runs at once (one receives both inputs first and sends both
#: results after); one process runs them one after the other.
PHASES = ("warmup", "steady", "cooldown", "step", "overlap")

#: The simulator's virtual clock: one unit of ``forward_time`` etc. is this many ns.
UNIT_NS = 1_000_000

_MESSAGE_NAMES = {SEND_ACTIVATION: "send_act", RECV_ACTIVATION: "recv_act",
                  SEND_GRAD: "send_grad", RECV_GRAD: "recv_grad"}


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
        arrow = "->" if self.kind.startswith("send") else "<-"
        return f"{_MESSAGE_NAMES.get(self.kind, self.kind)}({what}){arrow}{self.peer}"


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
                   if self.virtual_stages > 1 else "")
                + (" in a V (rank r holds stages r and 2p-1-r)"
                   if self.placement == "v" else "")]
        for rank, actions in enumerate(self.actions):
            rows.append(f"  rank {rank}: " + " ".join(_words(actions)))
        return "\n".join(rows)


def _words(actions) -> list[str]:
    """A rank's actions as printed; the actions of a pair that overlaps
    (phase "overlap": two receives, a forward and a backward, two sends)
    in one bracket, "[recv_act(3)<-0 F3 B1c1 send_act(3)->1 ...]"."""
    words, pair, computed = [], [], 0
    for action in actions:
        if action.phase != "overlap":
            if pair:
                words.append("[" + " ".join(pair) + "]")
                pair, computed = [], 0
            words.append(str(action))
            continue
        # A new pair starts at its first receive or compute after a finished one.
        if computed == 2 and action.kind not in (SEND_ACTIVATION, SEND_GRAD):
            words.append("[" + " ".join(pair) + "]")
            pair, computed = [], 0
        pair.append(str(action))
        computed += action.kind in LETTERS
    if pair:
        words.append("[" + " ".join(pair) + "]")
    return words


def check_sizes(who: str, stages, microbatches, virtual_stages=1) -> None:
    """Whole numbers >= 1, or a ValueError naming the one that is not."""
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

    def _receive_activation(self, microbatch, chunk, phase) -> None:
        stage = self.layout.stage_of(self.rank, chunk)
        if stage > 0 and (previous := self._peer(stage - 1)) is not None:
            self.actions.append(Action(RECV_ACTIVATION, microbatch, chunk, phase, previous))

    def _send_activation(self, microbatch, chunk, phase) -> None:
        stage = self.layout.stage_of(self.rank, chunk)
        if stage < self.last_stage and (following := self._peer(stage + 1)) is not None:
            self.actions.append(Action(SEND_ACTIVATION, microbatch, chunk, phase, following))

    def _receive_gradient(self, microbatch, chunk, phase) -> None:
        stage = self.layout.stage_of(self.rank, chunk)
        if stage < self.last_stage and (following := self._peer(stage + 1)) is not None:
            self.actions.append(Action(RECV_GRAD, microbatch, chunk, phase, following))

    def _send_gradient(self, microbatch, chunk, phase) -> None:
        stage = self.layout.stage_of(self.rank, chunk)
        if stage > 0 and (previous := self._peer(stage - 1)) is not None:
            self.actions.append(Action(SEND_GRAD, microbatch, chunk, phase, previous))

    def forward(self, microbatch: int, chunk: int, phase: str) -> None:
        if not self._exists(microbatch):
            return
        self._receive_activation(microbatch, chunk, phase)
        self.actions.append(Action(FORWARD, microbatch, chunk, phase))
        self._send_activation(microbatch, chunk, phase)

    def backward(self, microbatch: int, chunk: int, phase: str,
                 kind: str = BACKWARD) -> None:
        """The whole backward (``kind`` BACKWARD) or its input half
        (BACKWARD_INPUT): both take the gradient of the stage's output and
        send the gradient of its input."""
        if not self._exists(microbatch):
            return
        self._receive_gradient(microbatch, chunk, phase)
        self.actions.append(Action(kind, microbatch, chunk, phase))
        self._send_gradient(microbatch, chunk, phase)

    def backward_input(self, microbatch: int, chunk: int, phase: str) -> None:
        """I: the input half of the backward, with its messages."""
        self.backward(microbatch, chunk, phase, BACKWARD_INPUT)

    def backward_weight(self, microbatch: int, chunk: int, phase: str) -> None:
        """W: the weight half; no message (nobody else waits for it)."""
        if self._exists(microbatch):
            self.actions.append(Action(BACKWARD_WEIGHT, microbatch, chunk, phase))

    def overlapped(self, forward: tuple[int, int], backward: tuple[int, int],
                   kind: str = BACKWARD) -> None:
        """The forward of (micro-batch, chunk) ``forward`` paired with the
        backward (``kind``: whole B or its input half I) of ``backward``, as
        DualPipe overlaps them: both inputs received first, both results
        sent after both computations, every action in phase "overlap"."""
        (f_microbatch, f_chunk), (b_microbatch, b_chunk) = forward, backward
        self._receive_activation(f_microbatch, f_chunk, "overlap")
        self._receive_gradient(b_microbatch, b_chunk, "overlap")
        self.actions.append(Action(FORWARD, f_microbatch, f_chunk, "overlap"))
        self.actions.append(Action(kind, b_microbatch, b_chunk, "overlap"))
        self._send_activation(f_microbatch, f_chunk, "overlap")
        self._send_gradient(b_microbatch, b_chunk, "overlap")

    def step(self) -> list[Action]:
        self.actions.append(Action(OPTIMIZER_STEP, None, 0, "step"))
        return self.actions
