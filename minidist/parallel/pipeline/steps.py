"""One batch on one pipeline rank: the schedule's actions in order, one short
step per kind of action. :class:`~minidist.parallel.pipeline.executor.Pipeline`
and torch's names (:mod:`~minidist.parallel.pipeline.pipelining`) both run
their batches here; what differs between them (how a loss is scaled, what
ends the batch) each says in a small object of *rules*.

The steps, in the order a micro-batch meets them:

* **forward**: receive the input (or take the micro-batch itself on the
  first stage), run the chunk, keep what its backward needs, send the
  output (or, on the last stage, turn it into the loss);
* **backward** (B): receive the gradient of the output (the last stage
  starts from its loss), run the whole backward, send the gradient of the
  input; a forward that kept only its input is run again first;
* **its input half** (I): the same messages as B, but only the gradients
  of the chunk's input are computed
  (:func:`minidist.split_backward.backward_input`): the stage before gets
  its gradient as early as the schedule allows, and what the weights'
  gradients need is kept;
* **its weight half** (W): the parameters' gradients from what I kept, no
  message; the schedule puts it where the rank would otherwise wait;
* **send** and **receive**: an activation to the next stage, a gradient to
  the one before (a send does not wait, a receive does). Both ends
  compute a message's tag from the schedule, so any order of arrival finds
  its receive; two neighbouring stages on one rank (one rank, or the turn
  of a V placement) hand over in memory, without a message;
* **the step**, once per batch: wait for every send, refuse a backward or
  a W that never ran, then the rules' end of the batch (an all-reduce over
  the replicas and the optimizer's step, or torch's gradient scaling).

Cost: the schedule's, nothing added: one region and one memory event per
compute action when tracing, a dictionary look-up per message.

The rules (duck-typed, see :class:`~minidist.parallel.pipeline.executor.Pipeline`'s
``_Training``): ``inputs`` (the micro-batches, on the first stage's rank),
``optimizer`` (for the ledger; None allowed), ``loss(outputs, microbatch)``
(the last stage's loss to backpropagate), ``keep(microbatch, outputs,
loss)`` (a last-stage forward's result), ``finish(batch)`` (after the
backwards, before the step's region) and ``update()`` (inside it).
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist.parallel.pipeline.held_activations import HeldActivations
from minidist.parallel.pipeline.labels import message_label
from minidist.parallel.pipeline.ledger import Ledger
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
    Action,
    Schedule,
    message_tag,
)
from minidist.split_backward import backward_input
from minidist.tensor import Tensor

__all__ = ["BatchRun", "message_tags"]


class BatchRun:
    """One batch on one rank of ``pipe`` (a Pipeline: its schedule, pipeline
    rank, chunks, groups and tags) under ``rules`` (see the module).
    ``keep_for_backward=False`` runs forwards that keep nothing (inference)."""

    def __init__(self, pipe, rules, keep_for_backward: bool = True):
        self.pipe = pipe
        self.keep_for_backward = keep_for_backward
        self.schedule = pipe.schedule
        self.rules = rules
        self.held = HeldActivations(pipe.chunks, pipe.recompute)
        # The schedule, not the order of arrival, says when a result leaves and
        # when a message is used: both wait here for their action.
        self.outbox: dict[tuple[str, int, int], np.ndarray] = {}
        self.inbox: dict[tuple[str, int, int], np.ndarray] = {}
        self.sends = []
        self.examples = 0  # this replica's examples, counted once per micro-batch
        self.index = 0  # the action running, for a failure to name
        self.ledger = Ledger(self.schedule, pipe.rank, pipe._parameters, rules.optimizer,
                             self.held)

    def run(self, actions=None) -> None:
        """Every action of this rank's schedule (or ``actions``), in order."""
        for index, action in enumerate(actions or self.schedule.actions[self.pipe.rank]):
            self.execute(index, action)

    def execute(self, index: int, action: Action) -> None:
        """Action ``index`` of this rank's schedule: the step of its kind."""
        self.index = index
        step = _STEPS.get(action.kind)
        if step is None:
            self.fail(action, f"unknown action kind {action.kind!r}")
        step(self, action)

    # ------------------------------------------------------------------ the steps

    def forward(self, action: Action) -> None:
        """Receive the input, run the stage, keep what backward needs, send the output."""
        microbatch, chunk, stage = action.microbatch, action.chunk, self._stage(action)
        inputs = self._input(action, stage)
        if chunk == 0:  # once per micro-batch: a replica's gradient is weighed by its examples
            self.examples += len(inputs.data)
        with self.ledger.region(action):
            outputs, loss = self.held.forward((microbatch, chunk), inputs, self._loss_of(stage))
            if not self.keep_for_backward:
                self.held.pop((microbatch, chunk))
        if stage < self.schedule.total_stages - 1:
            self._hand_over("act", action, outputs.data)
        else:
            self.rules.keep(microbatch, outputs, loss)

    def backward(self, action: Action) -> None:
        """Receive the gradient of the output, run the backward, send the
        gradient of the input; a forward that kept only its input is run
        again first."""
        held, gradient = self._ready_for_backward(action)
        with self.ledger.region(action):
            if gradient is None:
                held.loss.backward()
            else:
                held.outputs.backward(gradient)
        if self._stage(action) > 0:
            self._hand_over("grad", action, held.inputs.grad)

    def backward_input(self, action: Action) -> None:
        """I: as backward, but only the gradient of the stage's input; what
        the weights' gradients need is kept for the W of this micro-batch."""
        held, gradient = self._ready_for_backward(action)
        first = self._stage(action) == 0
        # The first stage's input is the data: no gradient wanted, I computes
        # nothing the stage before waits for (W does the work).
        inputs = [] if first else [held.inputs]
        with self.ledger.region(action):
            output = held.loss if gradient is None else held.outputs
            self.held.keep_for_weights((action.microbatch, action.chunk),
                                       backward_input(output, gradient, inputs=inputs))
        if not first:
            self._hand_over("grad", action, held.inputs.grad)

    def backward_weight(self, action: Action) -> None:
        """W: the parameters' gradients of a micro-batch whose I has run."""
        pending = self.held.take_for_weights((action.microbatch, action.chunk))
        if pending is None:
            self.fail(action, "runs before its input half I (or twice)")
        with self.ledger.region(action):
            pending.backward_weight()

    def send(self, action: Action) -> None:
        """Send what a forward (an activation) or a backward (a gradient) left
        for the neighbouring stage; the send does not wait, the optimizer
        step waits for them all."""
        kind = _CARGO[action.kind]
        array = self.outbox.pop((kind, action.microbatch, action.chunk), None)
        if array is None:
            self.fail(action, f"there is no {kind} of micro-batch {action.microbatch} to send: "
                              "its forward/backward has not run")
        self.sends.append(dist.isend(
            array, group_dst=action.peer, group=self.pipe.pipeline_group,
            tag=self.pipe.tags[action],
            label=message_label(kind, action.microbatch) if self.ledger.tracing else ""))

    def receive(self, action: Action) -> None:
        """Receive an activation (for a forward) or a gradient (for a
        backward) from the neighbouring stage, waiting for it."""
        kind = _CARGO[action.kind]
        self.inbox[(kind, action.microbatch, action.chunk)] = dist.recv_array(
            group_src=action.peer, group=self.pipe.pipeline_group,
            tag=self.pipe.tags[action],
            label=message_label(kind, action.microbatch) if self.ledger.tracing else "")

    def optimizer_step(self, action: Action) -> None:
        """Wait for every send, check that every backward and every W ran,
        then the rules' end of the batch (the optimizer's step in its region)."""
        for request in self.sends:
            request.wait()
        rank = self.pipe.global_rank
        if self.held:
            raise RuntimeError(f"rank {rank}: the schedule steps with micro-batches "
                               f"{sorted(self.held)} still waiting for their backward")
        if self.held.weights_pending:
            raise RuntimeError(
                f"rank {rank}: schedule {self.schedule.name!r} steps before the weight half W "
                f"of (micro-batch, chunk) {self.held.weights_pending} has run: their "
                "parameters' gradients are not complete. Give every I its W before the step.")
        self.rules.finish(self)
        with self.ledger.region(action):
            self.rules.update()

    # ------------------------------------------------------------------ what the steps share

    def _stage(self, action: Action) -> int:
        return self.schedule.stage_of(self.pipe.rank, action.chunk)

    def _input(self, action: Action, stage: int) -> Tensor:
        """The micro-batch itself on the first stage; elsewhere the activation
        the stage before sent, as a leaf that wants a gradient: what the
        backward sends back."""
        if stage == 0:
            return Tensor(self.rules.inputs[action.microbatch])
        return Tensor(self._take("act", action, "its input activation has not been received"),
                      requires_grad=True)

    def _loss_of(self, stage: int):
        """On the last stage, the loss of an output and its micro-batch; None before it."""
        return self.rules.loss if stage == self.schedule.total_stages - 1 else None

    def _ready_for_backward(self, action: Action):
        """What a backward or an I starts from: the forward's record (run
        again if it kept only its input), no longer held, and the gradient
        of its output (None on the last stage: it starts from the loss)."""
        key, stage = (action.microbatch, action.chunk), self._stage(action)
        if key not in self.held:
            self.fail(action, "runs before its forward")
        loss_of = self._loss_of(stage)
        if self.held.recomputing:
            with self.ledger.region(action, "R"):
                self.held.recompute(key, loss_of)
        gradient = None
        if loss_of is None:
            gradient = self._take("grad", action, "the gradient of its output has not been received")
        return self.held.pop(key), gradient

    def _take(self, kind: str, action: Action, why: str) -> np.ndarray:
        """What the neighbouring stage sent for ``action`` ("act" or "grad")."""
        array = self.inbox.pop((kind, action.microbatch, action.chunk), None)
        if array is None:
            self.fail(action, why)
        return array

    def _hand_over(self, kind: str, action: Action, array) -> None:
        """A result for the neighbouring stage (the next for an activation, the
        one before for a gradient): queued for its send action, or, when this
        rank holds that stage too, put straight in this rank's inbox."""
        neighbour = self._stage(action) + (1 if kind == "act" else -1)
        rank, chunk = self.schedule.rank_of(neighbour)
        if rank == self.pipe.rank:
            self.inbox[(kind, action.microbatch, chunk)] = array
        else:
            self.outbox[(kind, action.microbatch, action.chunk)] = array

    def fail(self, action: Action, why: str):
        raise RuntimeError(f"rank {self.pipe.global_rank}, pipeline stage "
                           f"{self.pipe.rank}: action {self.index} ({action}) of schedule "
                           f"{self.schedule.name!r}: {why}")


#: The step of each action kind.
_STEPS = {FORWARD: BatchRun.forward, BACKWARD: BatchRun.backward,
          BACKWARD_INPUT: BatchRun.backward_input, BACKWARD_WEIGHT: BatchRun.backward_weight,
          SEND_ACTIVATION: BatchRun.send, SEND_GRAD: BatchRun.send,
          RECV_ACTIVATION: BatchRun.receive, RECV_GRAD: BatchRun.receive,
          OPTIMIZER_STEP: BatchRun.optimizer_step}
#: What a message action carries, and where a sent one goes.
_CARGO = {SEND_ACTIVATION: "act", RECV_ACTIVATION: "act", SEND_GRAD: "grad", RECV_GRAD: "grad"}
_TOWARDS = {SEND_ACTIVATION: 1, SEND_GRAD: -1}


def message_tags(schedule: Schedule, rank: int) -> dict:
    """The tag of each of ``rank``'s sends and receives (:func:`message_tag`):
    what it carries, its micro-batch and the stage receiving it (the next for
    an activation sent, the one before for a gradient, this one for a
    receive). Both ends compute it from the schedule, so that any order of
    arrival finds the right receive."""
    tags = {}
    for action in schedule.actions[rank]:
        if action.kind in _CARGO:
            receiver = schedule.stage_of(rank, action.chunk) + _TOWARDS.get(action.kind, 0)
            tags[action] = message_tag(_CARGO[action.kind], action.microbatch, receiver,
                                       schedule.total_stages)
    return tags

