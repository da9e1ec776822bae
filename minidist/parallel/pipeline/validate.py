"""Is a schedule one that can run? Every rule a rank's list of actions must
keep, checked without running it, each broken one named with the rank, the
action's index and what is wrong.

:func:`validate_schedule` reads each rank's actions in order, keeping what the rank
has done so far, and then matches the messages across the ranks:

1. every action is of a known kind, on a chunk the rank holds, for a
   micro-batch of the batch;
2. a forward runs once per (micro-batch, chunk), after its input is at
   hand: received, or handed over in memory by the rank's own previous
   stage;
3. a backward, whole (B) or its input half (I), runs once, after its
   forward and after the gradient of its output is at hand (received, or
   handed over by the rank's own next stage); a (micro-batch, chunk) runs
   one B, or one I and one W;
4. a weight half (W) runs once, after its I, never beside a B;
5. a send follows the computation whose result it carries, goes to the
   rank holding the neighbouring stage, and is sent once; a receive comes
   from that rank, once;
6. the optimizer step comes after every backward and every W;
7. across the ranks, every message sent is received and every receive is
   sent.

What it cannot see is left to the simulator: the order of two ranks'
receives can still wait for each other for ever (a deadlock, found by
:func:`~minidist.parallel.pipeline.simulate.simulate_schedule`).

Cost: one pass over the actions, O(actions), and a set of the messages.
"""

from __future__ import annotations

from minidist.parallel.pipeline.actions import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    KINDS,
    OPTIMIZER_STEP,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    Schedule,
)
from minidist.parallel.pipeline.labels import compute_text

#: What a message carries and which way it goes: (cargo, stage of its other end - this stage).
_MESSAGES = {SEND_ACTIVATION: ("act", 1), RECV_ACTIVATION: ("act", -1),
             SEND_GRAD: ("grad", -1), RECV_GRAD: ("grad", 1)}


class ScheduleError(ValueError):
    """A schedule that breaks one of the rules of :func:`validate_schedule`."""


def validate_schedule(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` (a ValueError) at the first broken rule,
    "schedule 'x': rank r, action i (B3): runs before its forward", and
    return None when every rank's actions can run."""
    sent, received = {}, {}
    for rank, actions in enumerate(schedule.actions):
        _Rank(schedule, rank, sent, received).check(actions)
    for key, (rank, index, action) in sorted(sent.items()):
        if key not in received:
            kind, microbatch, stage = key
            _fail(schedule, rank, index, action,
                  f"sends the {_cargo_words(kind)} of micro-batch {microbatch} to stage "
                  f"{stage}, which rank {action.peer} never receives")
    for key, (rank, index, action) in sorted(received.items()):
        if key not in sent:
            _fail(schedule, rank, index, action,
                  f"waits for a message rank {action.peer} never sends")


def _cargo_words(kind: str) -> str:
    return "activation" if kind == "act" else "gradient"


def _fail(schedule, rank, index, action, why):
    raise ScheduleError(f"schedule {schedule.name!r}: rank {rank}, action {index} "
                        f"({action}): {why}")


class _Rank:
    """One rank's actions read in order, with what it has done so far."""

    def __init__(self, schedule: Schedule, rank: int, sent: dict, received: dict):
        self.schedule, self.rank = schedule, rank
        self.sent, self.received = sent, received   # (cargo, mb, receiving stage) -> where
        self.forwarded = {}                         # (mb, chunk) -> action index
        self.backwarded = {}                        # (mb, chunk) -> (index, letter)
        self.weighed = {}                           # (mb, chunk) -> action index
        self.at_hand = set()                        # (cargo, mb, chunk) received or handed over
        self.index, self.action = 0, None

    def fail(self, why: str):
        _fail(self.schedule, self.rank, self.index, self.action, why)

    def check(self, actions) -> None:
        steps = {FORWARD: self.forward, BACKWARD: self.backward,
                 BACKWARD_INPUT: self.backward, BACKWARD_WEIGHT: self.weight,
                 SEND_ACTIVATION: self.message, SEND_GRAD: self.message,
                 RECV_ACTIVATION: self.message, RECV_GRAD: self.message,
                 OPTIMIZER_STEP: self.step}
        for self.index, self.action in enumerate(actions):
            if self.action.kind not in KINDS:
                self.fail(f"unknown kind {self.action.kind!r}; kinds are {KINDS}")
            if self.action.kind != OPTIMIZER_STEP:
                self.check_place()
            steps[self.action.kind]()

    def check_place(self) -> None:
        action, schedule = self.action, self.schedule
        if not 0 <= action.chunk < schedule.virtual_stages:
            self.fail(f"chunk {action.chunk}: each rank holds chunks 0.."
                      f"{schedule.virtual_stages - 1}")
        if not (isinstance(action.microbatch, int)
                and 0 <= action.microbatch < schedule.microbatches):
            self.fail(f"micro-batch {action.microbatch!r}: the batch has micro-batches 0.."
                      f"{schedule.microbatches - 1}")

    def neighbour(self, stage: int):
        """(rank, chunk) of ``stage``, or None past either end of the pipeline."""
        if 0 <= stage < self.schedule.total_stages:
            return self.schedule.rank_of(stage)
        return None

    def forward(self) -> None:
        key = (self.action.microbatch, self.action.chunk)
        if key in self.forwarded:
            self.fail(f"forwards the same micro-batch twice (action {self.forwarded[key]})")
        stage = self.schedule.stage_of(self.rank, self.action.chunk)
        previous = self.neighbour(stage - 1)
        if previous is not None and ("act",) + key not in self.at_hand:
            self.fail(f"runs before the forward of chunk {previous[1]} on this rank"
                      if previous[0] == self.rank
                      else "runs before its activation was received")
        self.forwarded[key] = self.index
        following = self.neighbour(stage + 1)
        if following is not None and following[0] == self.rank:
            self.at_hand.add(("act", key[0], following[1]))

    def backward(self) -> None:
        key = (self.action.microbatch, self.action.chunk)
        letter = "B" if self.action.kind == BACKWARD else "I"
        if key not in self.forwarded:
            self.fail("runs before its forward")
        if key in self.backwarded:
            index, done = self.backwarded[key]
            self.fail(f"backwards micro-batch {key[0]} twice: action {index} ran its "
                      f"{'whole backward B' if done == 'B' else 'input half I'} already")
        stage = self.schedule.stage_of(self.rank, self.action.chunk)
        following = self.neighbour(stage + 1)
        if following is not None and ("grad",) + key not in self.at_hand:
            self.fail(f"runs before the backward of chunk {following[1]} on this rank"
                      if following[0] == self.rank
                      else "runs before its gradient was received")
        self.backwarded[key] = (self.index, letter)
        previous = self.neighbour(stage - 1)
        if previous is not None and previous[0] == self.rank:
            self.at_hand.add(("grad", key[0], previous[1]))

    def weight(self) -> None:
        key = (self.action.microbatch, self.action.chunk)
        index, letter = self.backwarded.get(key, (None, None))
        if letter == "B":
            self.fail(f"its whole backward B (action {index}) already computed the weights' "
                      "gradients: a micro-batch runs one B, or one I and one W")
        if key in self.weighed:
            self.fail(f"runs the weight half of micro-batch {key[0]} twice (action "
                      f"{self.weighed[key]})")
        if letter != "I":
            self.fail(f"runs before its input half {compute_text('I', *key)} (a W needs what "
                      "its I kept)")
        self.weighed[key] = self.index

    def message(self) -> None:
        action = self.action
        cargo, towards = _MESSAGES[action.kind]
        key = (action.microbatch, action.chunk)
        sending = action.kind in (SEND_ACTIVATION, SEND_GRAD)
        if sending and cargo == "act" and key not in self.forwarded:
            self.fail("sends an activation it has not computed")
        if sending and cargo == "grad" and key not in self.backwarded:
            self.fail("sends a gradient before its backward")
        stage = self.schedule.stage_of(self.rank, action.chunk)
        other = self.neighbour(stage + towards)
        if other is None or other[0] != action.peer:
            self.fail(f"stage {stage + towards} is not on rank {action.peer}")
        if other[0] == self.rank:
            self.fail(f"stage {stage + towards} is on this rank: neighbouring stages of one "
                      "rank hand over in memory, without a message")
        receiver = stage + towards if sending else stage
        book = self.sent if sending else self.received
        message = (cargo, action.microbatch, receiver)
        if message in book:
            self.fail(f"{'sends' if sending else 'receives'} the same message twice "
                      f"(action {book[message][1]})")
        book[message] = (self.rank, self.index, action)
        if not sending:
            self.at_hand.add((cargo,) + key)

    def step(self) -> None:
        waiting = sorted(key for key in self.forwarded if key not in self.backwarded)
        if waiting:
            self.fail("steps with micro-batches still waiting for their backward: "
                      + ", ".join(compute_text("F", *key) for key in waiting))
        unweighed = sorted(key for key, (_, letter) in self.backwarded.items()
                           if letter == "I" and key not in self.weighed)
        if unweighed:
            self.fail("steps with micro-batches whose weight half W has not run: "
                      + ", ".join(compute_text("I", *key) for key in unweighed)
                      + " (each I needs its W before the step)")
