"""A pipeline rank's ledger of one batch, in the trace: a region for each
forward, recomputation, backward (or its input half I and weight half W)
and optimizer step, and a ``memory`` event after each of them (and one at
the batch's start) with what the rank holds.

The regions carry the words of :mod:`~minidist.parallel.pipeline.labels`
(``F3``, ``R3``, ``B3``, ``I3``, ``W3`` and ``step``, with ``pipeline=``,
``mb=``, ``chunk=``, ``stage=``, ``phase=``), which the drawings in ``viz/``
read. A rank's memory changes only inside those regions: a forward keeps
activations, a recomputation brings back the rest of them, a backward frees
them and fills gradients, an I frees them but keeps what its W needs, a W
frees that and fills gradients, the step fills the optimizer's state. So an
event after each region sees every change. Each ``memory`` event carries
the bytes of the parameters, the gradients, the optimizer's state and the
held activations, and ``live_microbatches``, the number of (micro-batch,
chunk) pieces whose forward has run and whose backward has not finished
(its B, or its W: the simulator counts them the same way). A schedule that
splits its backwards also counts ``weights_pending``, the pieces whose I
has run and whose W has not, and ``weights_pending_bytes``, what they keep
(included in the activations); a schedule without the split writes
neither, so its events are those of before the split existed.

Cost: with tracing off, one test per region, and no label is built; with it
on, each event sums the bytes of every parameter, gradient and state array,
O(number of parameters) per region, two to four regions (F, R, B or I and
W) per micro-batch and stage.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from minidist import trace as _trace
from minidist.parallel.pipeline.labels import compute_label, memory_label, step_label
from minidist.parallel.pipeline.schedules import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    LETTERS,
    OPTIMIZER_STEP,
    Action,
)

_UNTRACED = nullcontext()


class Ledger:
    """The trace of one batch on ``rank`` of ``schedule``; ``held`` is the
    rank's :class:`~minidist.parallel.pipeline.held_activations.HeldActivations`.
    Tracing is looked at once, when the batch starts."""

    def __init__(self, schedule, rank: int, parameters, optimizer, held):
        self.tracing = _trace.enabled()
        self.schedule, self.rank = schedule, rank
        self.parameters, self.optimizer, self.held = parameters, optimizer, held
        self.splits = self.tracing and any(action.kind in (BACKWARD_INPUT, BACKWARD_WEIGHT)
                                           for actions in schedule.actions for action in actions)
        self.note()

    def region(self, action: Action, letter: str = ""):
        """``with ledger.region(action):`` the trace region of a forward
        ("F"), a backward ("B"), its input or weight half ("I", "W"), a
        recomputation ("R", given as ``letter``) or the optimizer step, and
        a memory event when it ends."""
        if not self.tracing:
            return _UNTRACED
        if action.kind == OPTIMIZER_STEP:
            label = step_label(self.schedule.stage_of(self.rank))
        else:
            letter = letter or LETTERS[action.kind]
            label = compute_label(letter, action.microbatch, action.chunk,
                                  self.schedule.stage_of(self.rank, action.chunk), action.phase)
        return _NotedRegion(self, label)

    def note(self) -> None:
        """A ``memory`` event: what the rank holds now."""
        if not self.tracing:
            return
        grads = sum(p.grad.nbytes for p in self.parameters if p.grad is not None)
        state = 0
        if self.optimizer is not None:
            for per_parameter in self.optimizer.state.values():
                state += sum(v.nbytes for v in per_parameter.values()
                             if isinstance(v, np.ndarray))
        activations, live, split = self.held.nbytes, len(self.held), {}
        if self.splits:
            pending = self.held.weights_pending
            kept = self.held.weights_pending_bytes
            activations, live = activations + kept, live + len(pending)
            split = dict(weights_pending=len(pending), weights_pending_bytes=kept)
        now = _trace.now()
        _trace.record("memory", now, now, label=memory_label(
            self.schedule.stage_of(self.rank), sum(p.data.nbytes for p in self.parameters),
            grads, state, activations, live, **split))


class _NotedRegion:
    """A trace region that ends with the ledger's memory event (none when
    the work inside raised)."""

    __slots__ = ("ledger", "region")

    def __init__(self, ledger: Ledger, label: str):
        self.ledger, self.region = ledger, _trace.region(label)

    def __enter__(self):
        self.region.__enter__()
        return self

    def __exit__(self, kind, error, traceback):
        self.region.__exit__(kind, error, traceback)
        if kind is None:
            self.ledger.note()
        return False

