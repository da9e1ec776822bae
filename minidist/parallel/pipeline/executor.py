"""The pipeline runtime: :class:`Pipeline` runs a schedule's actions on
real ranks, one stage of the model per rank, a batch cut into micro-batches
that flow through them.

In the order it is taught (lesson 9):

1. **Split** a Sequential model into p contiguous stages of about equal
   cost, and each batch into m micro-batches
   (:mod:`~minidist.parallel.pipeline.split`).
2. **Place** the ranks on a p x d grid: p stages, d data-parallel replicas
   (:mod:`~minidist.parallel.pipeline.grid`).
3. **Run the schedule**: every rank runs its list of actions from a pure
   schedule function (:mod:`~minidist.parallel.pipeline.schedules`:
   :func:`gpipe`, :func:`one_f_one_b`, :func:`interleaved_one_f_one_b`) in
   one loop, one short step per kind of action:

   * forward: receive the input, run the stage, keep what backward needs,
     send the output;
   * backward: receive the gradient of the output, run the backward, send
     the gradient of the input. Micro-batch k's loss is scaled by b_k / B
     (its share of the batch's B examples), so the gradients accumulated
     over the micro-batches are the whole batch's mean;
   * send and receive: an activation to the next stage, a gradient to the
     one before (a send does not wait, a receive does);
   * optimizer step, once per batch: wait for the sends, all-reduce each
     stage's gradient over its d replicas (replica r weighted by its B_r
     examples), one step.

Beside the steps, each in a file of its own: what a stage keeps from a
forward to its backward, all its layers' outputs or, with
``recompute=True``, only its input
(:mod:`~minidist.parallel.pipeline.held_activations`), and the trace's
record of the batch, its regions and its memory events
(:mod:`~minidist.parallel.pipeline.ledger`).

Cost per batch, with f and b a stage's forward and backward time for one
micro-batch: (m + p - 1)(f + b) for GPipe and 1F1B, a bubble of
(p - 1) / (m + p - 1) of the time; interleaving v chunks per rank cuts it to
(p - 1) / (v m + p - 1); recomputation adds about f per micro-batch and
stage. Messages: each of the p - 1 links carries m activations forward and m
gradients back (v times as many with interleaving), each of one
micro-batch's activation size.

Usage, the same code on every rank of a ``minidist.launch`` with p x d ranks::

    model = build_model()                 # the same weights on every rank (seed)
    pipe = Pipeline(model, schedule="1f1b", microbatches=8)
    optimizer = optim.SGD(pipe.parameters(), lr=0.1)
    for x, y in batches:                  # every rank passes its replica's batch
        loss = pipe.step(x, y, nn.CrossEntropyLoss(), optimizer)  # float on the last stage
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import nn
from minidist import trace as _trace
from minidist.parallel.pipeline.grid import pipeline_grid
from minidist.parallel.pipeline.held_activations import HeldActivations
from minidist.parallel.pipeline.labels import message_label
from minidist.parallel.pipeline.ledger import Ledger
from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    OPTIMIZER_STEP,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    Action,
    Schedule,
    make_schedule,
    message_tag,
)
from minidist.parallel.pipeline.split import split_microbatches, split_model
from minidist.parallel.replicas import all_reduce_gradients, broadcast_module
from minidist.tensor import Tensor, no_grad

__all__ = ["Pipeline", "annotate_trace"]


class Pipeline:
    """Run a model as a pipeline over the launch's ranks: p stages x d
    data-parallel replicas (p = world size / ``data_parallel``).

    * ``model``: an ``nn.Sequential`` built identically on every rank (cut
      with :func:`split_model` into p v pieces, ``split_by`` and ``sample``
      passed on), or a list of p v modules already cut. Rank r keeps pieces
      r, r + p, ... and drops the rest.
    * ``schedule``: "gpipe", "1f1b", "interleaved_1f1b" (with
      ``virtual_stages`` v >= 1), or a :class:`Schedule` built for p stages.
    * ``microbatches``: m; a batch of B examples is cut into m pieces of
      B // m or B // m + 1 examples.
    * ``recompute``: keep only each stage's input in forward, recompute in
      backward.
    * ``data_parallel``: d. Global rank g is stage g % p of replica g // p;
      ``pipeline_group`` holds one replica's p stages (the activations and
      gradients travel there), ``data_parallel_group`` one stage's d
      replicas (gradients are all-reduced there). The replicas' weights
      are made equal with a broadcast from replica 0.
    * ``pipeline_group`` and ``data_parallel_group`` (keywords, ProcessGroups
      or 1-D device meshes such as ``mesh["pp"]``): the groups to use instead
      of making them, for a layout the Pipeline does not know, such as a
      DP x TP x PP mesh where every tensor-parallel rank runs its own
      pipeline. p is then the pipeline group's size and this rank's stage its
      rank there; d the data-parallel group's size (1 without one), and
      ``data_parallel`` may be left out.
    * ``finalize_grads``: a function called with no argument once the
      batch's backwards are done and the gradients all-reduced over the
      replicas, before the optimizer's step (Megatron's
      ``finalize_model_grads``): where a model sums gradients over other
      groups, e.g. a tied embedding between the first and last stage.

    A parameter held by two of a rank's chunks (a tied weight, with one rank
    holding both ends) is in :meth:`parameters` once.

    :meth:`step` runs one batch; :meth:`parameters` gives this rank's
    parameters, for its optimizer.
    """

    def __init__(self, model, schedule="1f1b", microbatches: int = 1, *,
                 virtual_stages: int = 1, recompute: bool = False, data_parallel: int | None = None,
                 split_by: str = "parameters", sample=None, pipeline_group=None,
                 data_parallel_group=None, finalize_grads=None):
        self.global_rank = dist.get_rank()
        world_size = dist.get_world_size()
        self.recompute = bool(recompute)
        self.finalize_grads = finalize_grads
        given_groups = pipeline_group is not None or data_parallel_group is not None
        (self.stages, self.rank, self.data_parallel, self.replica, self.pipeline_group,
         self.data_parallel_group) = pipeline_grid(data_parallel, pipeline_group,
                                                   data_parallel_group)

        if isinstance(schedule, Schedule):
            if schedule.stages != self.stages:
                raise ValueError(f"rank {self.global_rank}: the schedule is for "
                                 f"{schedule.stages} stages, the launch has {self.stages} "
                                 f"(world {world_size} / data_parallel {self.data_parallel})")
            self.schedule = schedule
        else:
            self.schedule = make_schedule(schedule, self.stages, microbatches, virtual_stages)
        self.microbatches = self.schedule.microbatches
        self.virtual_stages = self.schedule.virtual_stages
        # A rank on another schedule would exchange other messages, or the
        # same ones in another order, and may train to other weights without
        # an error: the ranks agree on the schedule first, and the odd rank
        # is named. Over the launch's grid, or over the pipeline group given
        # (a mesh's "pp": whoever built the mesh agrees over all of it first,
        # as GPT3D does, where a majority names the odd rank).
        dist.agree("Pipeline", _schedule_key(self.schedule), describe=_schedule_words,
                   group=self.pipeline_group if given_groups else None,
                   hint="Build every rank's Pipeline with the same schedule, micro-batches "
                        "and virtual stages.")

        pieces = self._pieces(model, split_by, sample)
        self.chunks = [pieces[self.schedule.stage_of(self.rank, chunk)]
                       for chunk in range(self.virtual_stages)]
        # Once each: a tied weight in two of this rank's chunks is one parameter.
        self._parameters = list({id(p): p for chunk in self.chunks
                                 for p in chunk.parameters()}.values())
        if self.data_parallel > 1:
            for chunk in self.chunks:
                broadcast_module(chunk, group=self.data_parallel_group, group_src=0)
        # Both ends of a message compute its tag from the schedule, so that
        # any order of arrival finds the right receive: this rank's, once.
        self.tags = {action: _tag(self.schedule, self.rank, action)
                     for action in self.schedule.actions[self.rank] if action.kind in _CARGO}

    def _pieces(self, model, split_by, sample) -> list:
        total = self.schedule.total_stages
        if isinstance(model, nn.Sequential):
            return split_model(model, total, by=split_by, sample=sample)
        if isinstance(model, (list, tuple)) and all(isinstance(m, nn.Module) for m in model):
            if len(model) != total:
                raise ValueError(f"rank {self.global_rank}: got {len(model)} stages, the "
                                 f"schedule needs {total} ({self.stages} ranks x "
                                 f"{self.virtual_stages} virtual stages)")
            return list(model)
        raise TypeError(f"rank {self.global_rank}: Pipeline takes an nn.Sequential or a list "
                        f"of modules (one per stage), got {type(model).__name__}")

    # ------------------------------------------------------------------ queries

    def parameters(self) -> list:
        """This rank's parameters (all its chunks), for its optimizer."""
        return list(self._parameters)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        """Whether this rank holds the last stage, the one that computes the loss."""
        return self.rank == self.stages - 1

    def trace_header(self) -> dict:
        """The header fields of this run's trace (see :func:`annotate_trace`)."""
        return dict(self.schedule.header(), data_parallel=self.data_parallel,
                    recompute=self.recompute)

    # ------------------------------------------------------------------ one batch

    def step(self, x, y, loss_fn, optimizer):
        """Train on one batch: zero the gradients, run this rank's actions of
        the schedule, all-reduce over the replicas, one optimizer step.

        ``x`` (inputs) is needed on the first stage's rank and ``y`` (targets)
        on the last one's; other ranks may pass None. ``loss_fn(output, y)``
        must be a mean over the examples. Returns the batch's mean loss (a
        float) on the last stage's rank, None elsewhere. ``optimizer`` may be
        None on a rank whose stages have no parameters."""
        run = _Batch(self, x, y, loss_fn, optimizer)
        for index, action in enumerate(self.schedule.actions[self.rank]):
            run.execute(index, action)
        return run.loss if self.is_last else None


class _Batch:
    """One batch on one rank: the schedule's actions in order, each by the
    step of its kind (:data:`_STEPS`)."""

    def __init__(self, pipe: Pipeline, x, y, loss_fn, optimizer):
        self.pipe = pipe
        self.schedule = pipe.schedule
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        rank = pipe.global_rank
        if optimizer is None and pipe._parameters:
            raise ValueError(f"rank {rank}: step() needs the optimizer of this rank's "
                             "parameters (pipe.parameters())")
        self.inputs = self.targets = None
        if pipe.is_first:
            if x is None:
                raise ValueError(f"rank {rank} holds the first stage: pass the inputs x")
            self.inputs = self._split(x)
        if pipe.is_last:
            if y is None:
                raise ValueError(f"rank {rank} holds the last stage: pass the targets y")
            self.targets = self._split(y)
            self.batch_size = sum(len(t) for t in self.targets)
        self.held = HeldActivations(pipe.chunks, pipe.recompute)
        # The schedule, not the order of arrival, says when a result leaves and
        # when a message is used: both wait here for their action.
        self.outbox: dict[tuple[str, int, int], np.ndarray] = {}
        self.inbox: dict[tuple[str, int, int], np.ndarray] = {}
        self.sends = []
        self.examples = 0
        self.loss = 0.0
        self.index = 0  # the action running, for a failure to name
        if optimizer is not None:
            optimizer.zero_grad()
        self.ledger = Ledger(self.schedule, pipe.rank, pipe._parameters, optimizer, self.held)

    def _split(self, batch) -> list[np.ndarray]:
        try:
            return split_microbatches(batch, self.pipe.microbatches)
        except ValueError as error:
            raise ValueError(f"rank {self.pipe.global_rank}: {error}") from None

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
        if loss is None:
            self._hand_over("act", microbatch, chunk, outputs.data, chunk + 1)
        else:
            self.loss += float(loss.item())

    def backward(self, action: Action) -> None:
        """Receive the gradient of the output, run the backward, send the
        gradient of the input; a forward that kept only its input is run
        again first."""
        key, stage = (action.microbatch, action.chunk), self._stage(action)
        if key not in self.held:
            self.fail(action, "runs before its forward")
        loss_of = self._loss_of(stage)
        if self.held.recomputing:
            with self.ledger.region(action, "R"):
                self.held.recompute(key, loss_of)
        gradient = None  # the last stage's backward starts from its loss
        if loss_of is None:
            gradient = self._take("grad", action, "the gradient of its output has not been received")
        held = self.held.pop(key)
        with self.ledger.region(action):
            if gradient is None:
                held.loss.backward()
            else:
                held.outputs.backward(gradient)
        if stage > 0:
            self._hand_over("grad", action.microbatch, action.chunk, held.inputs.grad,
                            action.chunk - 1)

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
        """Wait for every send, all-reduce the gradients over the replicas,
        one step of the optimizer."""
        for request in self.sends:
            request.wait()
        if self.held:
            raise RuntimeError(f"rank {self.pipe.global_rank}: the schedule steps with "
                               f"micro-batches {sorted(self.held)} still waiting for their "
                               "backward")
        if self.pipe.data_parallel > 1:
            # Replica r's gradient is its B_r examples' mean: weighed by B_r
            # and divided by the sum of the B_r, exact with uneven replicas.
            all_reduce_gradients(self.pipe._parameters, self.pipe.data_parallel_group,
                                 weight=self.examples)
        if self.pipe.finalize_grads is not None:
            self.pipe.finalize_grads()
        with self.ledger.region(action):
            if self.optimizer is not None:
                with no_grad():
                    self.optimizer.step()

    # ------------------------------------------------------------------ what the steps share

    def _stage(self, action: Action) -> int:
        return self.schedule.stage_of(self.pipe.rank, action.chunk)

    def _input(self, action: Action, stage: int) -> Tensor:
        """The micro-batch itself on the first stage; elsewhere the activation
        the stage before sent, as a leaf that wants a gradient: what the
        backward sends back."""
        if stage == 0:
            return Tensor(self.inputs[action.microbatch])
        return Tensor(self._take("act", action, "its input activation has not been received"),
                      requires_grad=True)

    def _loss_of(self, stage: int):
        """On the last stage, the loss of an output and its micro-batch; None before it."""
        return self._loss if stage == self.schedule.total_stages - 1 else None

    def _loss(self, outputs, microbatch):
        # b_k / B: the micro-batches' losses then add up to the batch's mean.
        targets = self.targets[microbatch]
        return self.loss_fn(outputs, targets) * (len(targets) / self.batch_size)

    def _take(self, kind: str, action: Action, why: str) -> np.ndarray:
        """What the neighbouring stage sent for ``action`` ("act" or "grad")."""
        array = self.inbox.pop((kind, action.microbatch, action.chunk), None)
        if array is None:
            self.fail(action, why)
        return array

    def _hand_over(self, kind, microbatch, chunk, array, neighbour_chunk) -> None:
        """A result for the neighbouring stage: queued for its send action, or,
        with one rank holding every chunk, put straight in this rank's inbox."""
        if self.schedule.stages > 1:
            self.outbox[(kind, microbatch, chunk)] = array
        else:
            self.inbox[(kind, microbatch, neighbour_chunk)] = array

    def fail(self, action: Action, why: str):
        raise RuntimeError(f"rank {self.pipe.global_rank}, pipeline stage "
                           f"{self.pipe.rank}: action {self.index} ({action}) of schedule "
                           f"{self.schedule.name!r}: {why}")


#: The step of each action kind.
_STEPS = {FORWARD: _Batch.forward, BACKWARD: _Batch.backward,
          SEND_ACTIVATION: _Batch.send, SEND_GRAD: _Batch.send,
          RECV_ACTIVATION: _Batch.receive, RECV_GRAD: _Batch.receive,
          OPTIMIZER_STEP: _Batch.optimizer_step}
#: What a message action carries, and where a sent one goes.
_CARGO = {SEND_ACTIVATION: "act", RECV_ACTIVATION: "act", SEND_GRAD: "grad", RECV_GRAD: "grad"}
_TOWARDS = {SEND_ACTIVATION: 1, SEND_GRAD: -1}


def _schedule_key(schedule: Schedule) -> tuple:
    """What every rank's schedule must share: its name, stages, micro-batches
    and chunks per rank."""
    return (schedule.name, schedule.stages, schedule.microbatches, schedule.virtual_stages)


def _schedule_words(key: tuple) -> str:
    name, stages, microbatches, virtual = key
    return (f"schedule {name!r} ({stages} stages, {microbatches} micro-batches, {virtual} "
            f"chunk{'s' if virtual != 1 else ''} per rank)")


def _tag(schedule: Schedule, rank: int, action: Action) -> int:
    """The tag of a send's or receive's message (:func:`message_tag`): what it
    carries, its micro-batch and the stage receiving it (the next for an
    activation sent, the one before for a gradient, this one for a receive)."""
    receiver = schedule.stage_of(rank, action.chunk) + _TOWARDS.get(action.kind, 0)
    return message_tag(_CARGO[action.kind], action.microbatch, receiver, schedule.total_stages)


def annotate_trace(path, pipeline_or_schedule) -> None:
    """Add the pipeline's fields (schedule, stages, microbatches,
    virtual_stages) to the header of the trace file at ``path``, as written
    by ``minidist.launch(..., trace=path)``, so a drawing knows what ran."""
    if isinstance(pipeline_or_schedule, Pipeline):
        fields = pipeline_or_schedule.trace_header()
    elif isinstance(pipeline_or_schedule, Schedule):
        fields = pipeline_or_schedule.header()
    else:
        fields = dict(pipeline_or_schedule)
    written = _trace.read_jsonl(path)
    header = dict(written.header, **fields)
    header.pop("events", None)
    _trace.write_jsonl(path, written.events, header)
