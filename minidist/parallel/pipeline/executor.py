"""The pipeline runtime: :class:`Pipeline` runs a schedule's actions on
real ranks, one stage of the model per rank (or several: virtual stages),
a batch cut into micro-batches that flow through them.

In the order it is taught (lesson 9):

1. **Split** a Sequential model into p v contiguous stages of about equal
   cost, and each batch into m micro-batches
   (:mod:`~minidist.parallel.pipeline.split`).
2. **Place** the ranks on a p x d grid: p stages, d data-parallel replicas
   (:mod:`~minidist.parallel.pipeline.grid`), and each rank's v chunks on
   the schedule's placement: chunk c of rank r at stage c p + r ("loop"), or
   stages r and 2p - 1 - r ("v": rank 0 holds the first and the last stage).
3. **Run the schedule**: every rank runs its list of actions from a pure
   schedule function (:mod:`~minidist.parallel.pipeline.schedules`:
   :func:`gpipe`, :func:`one_f_one_b`, :func:`interleaved_one_f_one_b`, the
   zero-bubble schedules, or any order :func:`schedule_from_order` builds)
   in one loop, one short step per kind of action
   (:mod:`~minidist.parallel.pipeline.steps`):

   * forward: receive the input, run the stage, keep what backward needs,
     send the output;
   * backward: receive the gradient of the output, run the backward, send
     the gradient of the input. Micro-batch k's loss is scaled by b_k / B
     (its share of the batch's B examples), so the gradients accumulated
     over the micro-batches are the whole batch's mean;
   * or the backward split in two (zero-bubble schedules): I, the input's
     gradient, sent at once to the stage before, and later W, the
     weights' gradients, where the rank would otherwise wait;
   * send and receive: an activation to the next stage, a gradient to the
     one before (a send does not wait, a receive does; neighbouring stages
     on one rank hand over in memory);
   * optimizer step, once per batch: wait for the sends, all-reduce each
     stage's gradient over its d replicas (replica r weighted by its B_r
     examples), one step.

Beside the steps, each in a file of its own: what a stage keeps from a
forward to its backward, all its layers' outputs or, with
``recompute=True``, only its input, and what a split backward keeps from I
to W (:mod:`~minidist.parallel.pipeline.held_activations`), and the trace's
record of the batch, its regions and its memory events
(:mod:`~minidist.parallel.pipeline.ledger`).

Cost per batch, with f and b a stage's forward and backward time for one
micro-batch: (m + p - 1)(f + b) for GPipe and 1F1B, a bubble of
(p - 1) / (m + p - 1) of the time; interleaving v chunks per rank cuts it to
(p - 1) / (v m + p - 1); splitting b into I and W lets a schedule fill the
bubble with W (zero-bubble schedules), for the bytes each W keeps until it
runs; recomputation adds about f per micro-batch and stage. Messages: each
of the p - 1 links carries m activations forward and m gradients back (v
times as many with interleaving), each of one micro-batch's activation size.

Usage, the same code on every rank of a ``minidist.launch`` with p x d ranks::

    model = build_model()                 # the same weights on every rank (seed)
    pipe = Pipeline(model, schedule="1f1b", microbatches=8)
    optimizer = optim.SGD(pipe.parameters(), lr=0.1)
    for x, y in batches:                  # every rank passes its replica's batch
        loss = pipe.step(x, y, nn.CrossEntropyLoss(), optimizer)  # float on the last stage

torch.distributed.pipelining's names (``PipelineStage``, ``ScheduleGPipe``,
...) build a Pipeline from this rank's stages and run the same steps:
:mod:`~minidist.parallel.pipeline.pipelining`.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import nn
from minidist import trace as _trace
from minidist.distributed.tensor.grad_norm import clip_grad_norm_, clip_over_stages
from minidist.parallel.pipeline.grid import pipeline_grid
from minidist.parallel.pipeline.schedules import Schedule, make_schedule
from minidist.parallel.pipeline.split import split_microbatches, split_model
from minidist.parallel.pipeline.steps import BatchRun, message_tags
from minidist.parallel.replicas import all_reduce_gradients, broadcast_module
from minidist.tensor import no_grad

__all__ = ["Pipeline", "annotate_trace", "clip_grad_norm_"]


class Pipeline:
    """Run a model as a pipeline over the launch's ranks: p stages x d
    data-parallel replicas (p = world size / ``data_parallel``).

    * ``model``: an ``nn.Sequential`` built identically on every rank (cut
      with :func:`split_model` into p v pieces, ``split_by`` and ``sample``
      passed on), or a list of p v modules already cut. Rank r keeps the
      pieces its chunks sit at (r, r + p, ... on the loop placement; r and
      2p - 1 - r on the V) and drops the rest. Or a dict ``{stage index:
      module}`` of this rank's pieces only (what torch's ``PipelineStage``
      gives).
    * ``schedule``: "gpipe", "1f1b", "interleaved_1f1b" (with
      ``virtual_stages`` v >= 1), a zero-bubble schedule of
      :func:`make_schedule`, or a :class:`Schedule` built for p stages: its
      actions may split a backward into I and W, on either placement.
    * ``microbatches``: m; a batch of B examples is cut into m pieces of
      B // m or B // m + 1 examples.
    * ``recompute``: keep only each stage's input in forward, recompute in
      backward (before the I of a split one).
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

    A schedule that splits its backwards (the zero-bubble ones, or any
    order with I and W) runs each I as a B for its messages (the gradient of
    the output in, the gradient of the input out) but leaves the weights'
    gradients pending until the micro-batch's W; the step refuses a W that
    never ran. Each split backward gives the bits of its whole one
    (:mod:`minidist.split_backward`); the sum over micro-batches follows the
    order of the Ws. On the V placement rank 0 holds the first and the last
    stage, so it passes both the inputs and the targets, and its
    :meth:`step` returns the loss.

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
        self.total_norm = None     # the last step's gradient norm, when it clipped
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
        self.tags = message_tags(self.schedule, self.rank)

    def _pieces(self, model, split_by, sample):
        total = self.schedule.total_stages
        if isinstance(model, dict) and all(isinstance(m, nn.Module) for m in model.values()):
            # This rank's stages only, by global stage index (torch's PipelineStage).
            mine = sorted(self.schedule.stage_of(self.rank, chunk)
                          for chunk in range(self.virtual_stages))
            if sorted(model) != mine:
                raise ValueError(
                    f"rank {self.global_rank}: got stages {sorted(model)}; on schedule "
                    f"{self.schedule.name!r} ({self.schedule.placement} placement, "
                    f"{self.stages} ranks x {self.virtual_stages} stages) this rank holds "
                    f"stages {mine}")
            return model
        if isinstance(model, nn.Sequential):
            return split_model(model, total, by=split_by, sample=sample)
        if isinstance(model, (list, tuple)) and all(isinstance(m, nn.Module) for m in model):
            if len(model) != total:
                raise ValueError(f"rank {self.global_rank}: got {len(model)} stages, the "
                                 f"schedule needs {total} ({self.stages} ranks x "
                                 f"{self.virtual_stages} virtual stages)")
            return list(model)
        raise TypeError(f"rank {self.global_rank}: Pipeline takes an nn.Sequential, a list "
                        "of modules (one per stage) or a dict {stage index: module} of this "
                        f"rank's stages, got {type(model).__name__}")

    # ------------------------------------------------------------------ queries

    def parameters(self) -> list:
        """This rank's parameters (all its chunks), for its optimizer."""
        return list(self._parameters)

    @property
    def is_first(self) -> bool:
        """Whether this rank holds the first stage, the one that reads the inputs."""
        return self.schedule.rank_of(0)[0] == self.rank

    @property
    def is_last(self) -> bool:
        """Whether this rank holds the last stage, the one that computes the loss
        (pipeline rank p - 1, or rank 0 with the V placement)."""
        return self.schedule.rank_of(self.schedule.total_stages - 1)[0] == self.rank

    def trace_header(self) -> dict:
        """The header fields of this run's trace (see :func:`annotate_trace`)."""
        return dict(self.schedule.header(), data_parallel=self.data_parallel,
                    recompute=self.recompute)

    # ------------------------------------------------------------------ one batch

    def step(self, x, y, loss_fn, optimizer, *, max_norm: float | None = None,
             norm_type: float = 2.0):
        """Train on one batch: zero the gradients, run this rank's actions of
        the schedule, all-reduce over the replicas, one optimizer step.

        ``max_norm``: clip the gradients before the step, their total
        ``norm_type``-norm summed over the stages (torchtitan's
        ``clip_grad_norm_(..., pp_mesh=)``: the pipeline group; a replicated
        or tensor-parallel parameter counted as ``clip_grad_norm_`` counts
        it, a Parameter flagged ``shared`` not at all); the norm before
        clipping is kept in ``self.total_norm`` (a 0-d Tensor, every rank).
        One all-reduce of one element over the pipeline group.

        ``x`` (inputs) is needed on the first stage's rank and ``y`` (targets)
        on the last one's; other ranks may pass None. ``loss_fn(output, y)``
        must be a mean over the examples. Returns the batch's mean loss (a
        float) on the last stage's rank, None elsewhere. ``optimizer`` may be
        None on a rank whose stages have no parameters."""
        rules = _Training(self, x, y, loss_fn, optimizer)
        rules.max_norm, rules.norm_type = max_norm, norm_type
        BatchRun(self, rules).run()
        return rules.total if self.is_last else None


class _Training:
    """:meth:`Pipeline.step`'s rules for its batch (see
    :mod:`~minidist.parallel.pipeline.steps`): micro-batch k's loss is scaled
    by b_k / B, so the gradients accumulated over the micro-batches are the
    batch's mean; the batch ends with the replicas' all-reduce, the model's
    own sums (``finalize_grads``) and one step of the optimizer."""

    def __init__(self, pipe: Pipeline, x, y, loss_fn, optimizer):
        rank = pipe.global_rank
        if optimizer is None and pipe._parameters:
            raise ValueError(f"rank {rank}: step() needs the optimizer of this rank's "
                             "parameters (pipe.parameters())")
        self.pipe, self.loss_fn, self.optimizer = pipe, loss_fn, optimizer
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
        self.total = 0.0
        self.max_norm, self.norm_type = None, 2.0
        if optimizer is not None:
            optimizer.zero_grad()

    def _split(self, batch) -> list[np.ndarray]:
        try:
            return split_microbatches(batch, self.pipe.microbatches)
        except ValueError as error:
            raise ValueError(f"rank {self.pipe.global_rank}: {error}") from None

    def loss(self, outputs, microbatch):
        # b_k / B: the micro-batches' losses then add up to the batch's mean.
        targets = self.targets[microbatch]
        return self.loss_fn(outputs, targets) * (len(targets) / self.batch_size)

    def keep(self, microbatch, outputs, loss) -> None:
        self.total += float(loss.item())

    def finish(self, run: BatchRun) -> None:
        if self.pipe.data_parallel > 1:
            # Replica r's gradient is its B_r examples' mean: weighed by B_r
            # and divided by the sum of the B_r, exact with uneven replicas.
            all_reduce_gradients(self.pipe._parameters, self.pipe.data_parallel_group,
                                 weight=run.examples)
        if self.pipe.finalize_grads is not None:
            self.pipe.finalize_grads()
        if self.max_norm is not None:
            # After every sum over ranks: the gradients are the batch's, as
            # one process would clip them.
            self.pipe.total_norm = clip_over_stages(self.pipe._parameters, self.max_norm,
                                                    self.norm_type, False,
                                                    [self.pipe.pipeline_group])

    def update(self) -> None:
        if self.optimizer is not None:
            with no_grad():
                self.optimizer.step()


def _schedule_key(schedule: Schedule) -> tuple:
    """What every rank's schedule must share: its name, stages, micro-batches
    and chunks per rank."""
    return (schedule.name, schedule.stages, schedule.microbatches, schedule.virtual_stages)


def _schedule_words(key: tuple) -> str:
    name, stages, microbatches, virtual = key
    return (f"schedule {name!r} ({stages} stages, {microbatches} micro-batches, {virtual} "
            f"chunk{'s' if virtual != 1 else ''} per rank)")


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
