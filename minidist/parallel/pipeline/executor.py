"""Pipeline parallelism: the model cut into stages, one per rank, a batch cut
into micro-batches that flow through them.

The slide's order:

1. **Split** a Sequential model into p contiguous stages of about equal cost
   (:func:`~minidist.parallel.pipeline.split.split_model`: by parameter count,
   or by measured time).
2. **Cut** each batch into m micro-batches
   (:func:`~minidist.parallel.pipeline.split.split_microbatches`).
3. **Schedule**: every rank runs its list of actions from a pure schedule
   function (:mod:`~minidist.parallel.pipeline.schedules`: :func:`gpipe`,
   :func:`one_f_one_b`, :func:`interleaved_one_f_one_b`), literally: a
   forward receives its input activation from the previous stage and sends
   its output to the next; a backward receives the gradient of its output
   from the next stage and sends the gradient of its input back.
4. **Accumulate** gradients over the micro-batches: micro-batch k's loss is
   scaled by b_k / B (its share of the batch's B examples), so the sum is
   the whole batch's mean and so is the accumulated gradient.
5. With **data parallelism** (a p x d grid of ranks), each stage all-reduces
   its gradient over its d replicas, weighting replica r by its B_r examples.
6. **One optimizer step** per batch.

Cost per batch, with f and b a stage's forward and backward time for one
micro-batch: (m + p - 1)(f + b) for GPipe and 1F1B, a bubble of
(p - 1) / (m + p - 1) of the time; interleaving v chunks per rank cuts it to
(p - 1) / (v m + p - 1). Messages: each of the p - 1 links carries m
activations forward and m gradients back (v times as many with
interleaving), each of one micro-batch's activation size.

**Activation recomputation** (GPipe's re-materialisation, ``recompute=True``):
a forward keeps only its stage's input; the backward first runs the forward
again (an "R" region in the trace; replayed by ``nn.recompute.ForwardState``,
the same Dropout masks, BatchNorm statistics updated once) and then the backward. Memory per held
micro-batch drops from all the stage's layer outputs to its input, for one
more forward per micro-batch (about f more per micro-batch and stage).

**What the trace shows** (labels shared with ``viz/``): a compute region per
forward ``F3``, recomputation ``R3``, backward ``B3`` and optimizer ``step``,
each with ``pipeline=``, ``mb=``, ``chunk=``, ``stage=``, ``phase=``; each
activation and gradient message labelled ``act mb=3`` / ``grad mb=3``; and a
**memory ledger**: a ``memory`` event after every change, with the bytes of
parameters, gradients, optimizer state and held activations, and the number
of (micro-batch, chunk) activations held (``live_microbatches``).

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
from minidist.distributed.device_mesh import as_group
from minidist.nn.recompute import ForwardState
from minidist.parallel.pipeline.labels import (
    compute_label,
    memory_label,
    message_label,
    step_label,
)
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

# --------------------------------------------------------------------------- runtime


def _run_layers(module, inputs: Tensor) -> tuple[Tensor, int]:
    """``module(inputs)`` and the bytes of every layer output the backward keeps."""
    layers = list(module) if isinstance(module, nn.Sequential) else [module]
    kept, current = 0, inputs
    for layer in layers:
        current = layer(current)
        kept += current.data.nbytes
    return current, kept


class _Held:
    """What a forward leaves for its backward."""

    __slots__ = ("inputs", "outputs", "loss", "nbytes", "replay")

    def __init__(self, inputs, outputs, loss, nbytes, replay=None):
        self.inputs, self.outputs, self.loss, self.nbytes = inputs, outputs, loss, nbytes
        self.replay = replay  # a ForwardState when recomputing


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
        if pipeline_group is not None or data_parallel_group is not None:
            self._use_groups(pipeline_group, data_parallel_group, data_parallel)
        else:
            data_parallel = 1 if data_parallel is None else data_parallel
            if isinstance(data_parallel, bool) or not isinstance(data_parallel, int) \
                    or data_parallel < 1 or world_size % data_parallel:
                raise ValueError(f"rank {self.global_rank}: data_parallel={data_parallel!r} must "
                                 f"be a whole number >= 1 that divides the world size "
                                 f"{world_size}")
            self.data_parallel = data_parallel
            self.stages = world_size // data_parallel
            self.rank = self.global_rank % self.stages          # position in the pipeline
            self.replica = self.global_rank // self.stages
            self.pipeline_group, self.data_parallel_group = self._make_groups()

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

        pieces = self._pieces(model, split_by, sample)
        self.chunks = [pieces[self.schedule.stage_of(self.rank, chunk)]
                       for chunk in range(self.virtual_stages)]
        # Once each: a tied weight in two of this rank's chunks is one parameter.
        self._parameters = list({id(p): p for chunk in self.chunks
                                 for p in chunk.parameters()}.values())
        if self.data_parallel > 1:
            for chunk in self.chunks:
                broadcast_module(chunk, group=self.data_parallel_group, group_src=0)

    def _use_groups(self, pipeline_group, data_parallel_group, data_parallel) -> None:
        """Take the caller's groups (a mesh's "pp" and "dp") instead of making them."""
        pipeline_group = as_group(pipeline_group, "Pipeline pipeline_group")
        data_parallel_group = as_group(data_parallel_group, "Pipeline data_parallel_group")
        replicas = 1 if data_parallel_group is None else dist.get_world_size(data_parallel_group)
        if pipeline_group is None and replicas > 1:
            raise ValueError(f"rank {self.global_rank}: a data_parallel_group of {replicas} ranks "
                             "needs its pipeline_group too (None would be the whole world); pass "
                             "both, e.g. mesh.get_group('pp') and mesh.get_group('dp')")
        if data_parallel is not None and data_parallel != replicas:
            raise ValueError(f"rank {self.global_rank}: data_parallel={data_parallel!r} but the "
                             f"data_parallel_group has {replicas} ranks; leave data_parallel "
                             "out when passing the groups")
        self.data_parallel = replicas
        self.stages = dist.get_world_size(pipeline_group)
        self.rank = dist.get_rank(pipeline_group)
        self.replica = 0 if data_parallel_group is None else dist.get_rank(data_parallel_group)
        if self.rank < 0 or self.replica < 0:
            raise ValueError(f"rank {self.global_rank} is not a member of the pipeline_group or "
                             "data_parallel_group it was given: pass this rank's groups "
                             "(mesh.get_group('pp'), mesh.get_group('dp'))")
        self.pipeline_group, self.data_parallel_group = pipeline_group, data_parallel_group

    def _make_groups(self):
        """Every rank creates every group, in the same order (``new_group``'s rule)."""
        p, d = self.stages, self.data_parallel
        if d == 1:
            return None, None
        pipeline_group = data_parallel_group = None
        for replica in range(d):
            group = dist.new_group([replica * p + stage for stage in range(p)])
            if replica == self.replica:
                pipeline_group = group
        for stage in range(p):
            group = dist.new_group([replica * p + stage for replica in range(d)])
            if stage == self.rank:
                data_parallel_group = group
        return pipeline_group, data_parallel_group

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
    """One batch's execution on one rank: the schedule's actions, in order."""

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
        self.held: dict[tuple[int, int], _Held] = {}
        self.inbox: dict[tuple[str, int, int], np.ndarray] = {}
        self.outbox: dict[tuple[str, int, int], np.ndarray] = {}
        self.sends = []
        self.examples = 0
        self.loss = 0.0
        self.tracing = _trace.enabled()
        if optimizer is not None:
            optimizer.zero_grad()
        self.ledger()

    def _split(self, batch) -> list[np.ndarray]:
        try:
            return split_microbatches(batch, self.pipe.microbatches)
        except ValueError as error:
            raise ValueError(f"rank {self.pipe.global_rank}: {error}") from None

    # ------------------------------------------------------------------ bookkeeping

    def ledger(self) -> None:
        if not self.tracing:
            return
        pipe = self.pipe
        grads = sum(p.grad.nbytes for p in pipe._parameters if p.grad is not None)
        state = 0
        if self.optimizer is not None:
            for per_parameter in self.optimizer.state.values():
                state += sum(v.nbytes for v in per_parameter.values()
                             if isinstance(v, np.ndarray))
        now = _trace.now()
        _trace.record("memory", now, now, label=memory_label(
            self.schedule.stage_of(pipe.rank), sum(p.data.nbytes for p in pipe._parameters),
            grads, state, sum(h.nbytes for h in self.held.values()), len(self.held)))

    def fail(self, index: int, action: Action, why: str):
        raise RuntimeError(f"rank {self.pipe.global_rank}, pipeline stage "
                           f"{self.pipe.rank}: action {index} ({action}) of schedule "
                           f"{self.schedule.name!r}: {why}")

    def _stage(self, action: Action) -> int:
        return self.schedule.stage_of(self.pipe.rank, action.chunk)

    # ------------------------------------------------------------------ actions

    def execute(self, index: int, action: Action) -> None:
        kind = action.kind
        if kind == FORWARD:
            self.forward(index, action)
        elif kind == BACKWARD:
            self.backward(index, action)
        elif kind in (SEND_ACTIVATION, SEND_GRAD):
            self.send(index, action)
        elif kind in (RECV_ACTIVATION, RECV_GRAD):
            self.receive(action)
        elif kind == OPTIMIZER_STEP:
            self.optimizer_step()
        else:
            self.fail(index, action, f"unknown action kind {kind!r}")

    def forward(self, index: int, action: Action) -> None:
        mb, chunk, stage = action.microbatch, action.chunk, self._stage(action)
        last = stage == self.schedule.total_stages - 1
        if stage == 0:
            inputs = Tensor(self.inputs[mb])
        else:
            received = self.inbox.pop(("act", mb, chunk), None)
            if received is None:
                self.fail(index, action, "its input activation has not been received")
            # A leaf that wants a gradient: what the backward sends to the previous stage.
            inputs = Tensor(received, requires_grad=True)
        if chunk == 0:
            self.examples += len(inputs.data)
        with _trace.region(compute_label("F", mb, chunk, stage, action.phase)):
            replay = None
            if self.pipe.recompute:
                replay = ForwardState(self.pipe.chunks[chunk])
                with no_grad():
                    outputs, _ = _run_layers(self.pipe.chunks[chunk], inputs)
                    loss = self._loss(outputs, mb) if last else None
                kept = inputs.data.nbytes
            else:
                outputs, kept = _run_layers(self.pipe.chunks[chunk], inputs)
                loss = self._loss(outputs, mb) if last else None
                kept += inputs.data.nbytes
        if last:
            self.loss += float(loss.item())
        else:
            self._hand_over("act", mb, chunk, outputs.data, chunk + 1)
        self.held[(mb, chunk)] = _Held(inputs, None if self.pipe.recompute else outputs,
                                       loss, kept, replay)
        self.ledger()

    def _loss(self, outputs, microbatch):
        # b_k / B: the micro-batches' losses then add up to the batch's mean.
        targets = self.targets[microbatch]
        return self.loss_fn(outputs, targets) * (len(targets) / self.batch_size)

    def _hand_over(self, kind, microbatch, chunk, array, neighbour_chunk) -> None:
        """A result for the neighbouring stage: queued for its send action, or,
        with one rank holding every chunk, put straight in this rank's inbox."""
        if self.schedule.stages > 1:
            self.outbox[(kind, microbatch, chunk)] = array
        else:
            self.inbox[(kind, microbatch, neighbour_chunk)] = array

    def backward(self, index: int, action: Action) -> None:
        mb, chunk, stage = action.microbatch, action.chunk, self._stage(action)
        last = stage == self.schedule.total_stages - 1
        held = self.held.get((mb, chunk))
        if held is None:
            self.fail(index, action, "runs before its forward")
        if self.pipe.recompute:
            with _trace.region(compute_label("R", mb, chunk, stage, action.phase)):
                inputs = Tensor(held.inputs.data, requires_grad=stage > 0)
                # The same Dropout masks, BatchNorm statistics updated once.
                with held.replay.replay():
                    outputs, kept = _run_layers(self.pipe.chunks[chunk], inputs)
                held.inputs, held.outputs = inputs, outputs
                held.loss = self._loss(outputs, mb) if last else None
                held.nbytes += kept
            self.ledger()
        gradient = None
        if not last:
            gradient = self.inbox.pop(("grad", mb, chunk), None)
            if gradient is None:
                self.fail(index, action, "the gradient of its output has not been received")
        with _trace.region(compute_label("B", mb, chunk, stage, action.phase)):
            if last:
                held.loss.backward()
            else:
                held.outputs.backward(gradient)
        if stage > 0:
            self._hand_over("grad", mb, chunk, held.inputs.grad, chunk - 1)
        del self.held[(mb, chunk)]
        self.ledger()

    def send(self, index: int, action: Action) -> None:
        kind = "act" if action.kind == SEND_ACTIVATION else "grad"
        array = self.outbox.pop((kind, action.microbatch, action.chunk), None)
        if array is None:
            self.fail(index, action, f"there is no {kind} of micro-batch {action.microbatch} "
                                     "to send: its forward/backward has not run")
        receiver = self._stage(action) + (1 if kind == "act" else -1)
        self.sends.append(dist.isend(
            array, group_dst=action.peer, group=self.pipe.pipeline_group,
            tag=message_tag(kind, action.microbatch, receiver, self.schedule.total_stages),
            label=self._label(kind, action.microbatch)))

    def _label(self, kind: str, microbatch: int) -> str:
        # A message's label is read by the trace alone: not built when nothing records.
        return message_label(kind, microbatch) if self.tracing else ""

    def receive(self, action: Action) -> None:
        kind = "act" if action.kind == RECV_ACTIVATION else "grad"
        self.inbox[(kind, action.microbatch, action.chunk)] = dist.recv_array(
            group_src=action.peer, group=self.pipe.pipeline_group,
            tag=message_tag(kind, action.microbatch, self._stage(action),
                            self.schedule.total_stages),
            label=self._label(kind, action.microbatch))

    def optimizer_step(self) -> None:
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
        with _trace.region(step_label(self.schedule.stage_of(self.pipe.rank))):
            if self.optimizer is not None:
                with no_grad():
                    self.optimizer.step()
        self.ledger()


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
