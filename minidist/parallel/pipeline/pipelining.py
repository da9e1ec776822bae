"""torch.distributed.pipelining's names, run by minidist's pipeline: the
schedule classes here, :class:`PipelineStage`
(:mod:`~minidist.parallel.pipeline.pipeline_stage`) and :func:`pipeline`
with ``SplitPoint`` (:mod:`~minidist.parallel.pipeline.split_points`)
imported with them, so that ``from torch.distributed.pipelining import ...``
reads ``from minidist.parallel.pipeline.pipelining import ...``.

A torch pipelining script builds this rank's stages and a schedule over
them, then calls ``step`` once per batch and the optimizer itself::

    stage = PipelineStage(piece, stage_index=rank, num_stages=world, device=None)
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=nn.CrossEntropyLoss())
    for x, y in batches:
        optimizer.zero_grad()
        losses = []
        if rank == 0:
            schedule.step(x)                          # the first stage: the inputs
        elif rank == world - 1:
            output = schedule.step(target=y, losses=losses)  # the last: targets, losses
        else:
            schedule.step()
        optimizer.step()

What each name does here, in torch's meaning:

1. :class:`PipelineStage` ``(submodule, stage_index, num_stages, device,
   ..., group=None)``: one piece of the model and where it sits; ``group``
   is the pipeline's process group (None: the world).
2. A schedule class names one of minidist's schedules
   (:func:`~minidist.parallel.pipeline.schedules.make_schedule`) and its
   placement: :class:`ScheduleGPipe` ("gpipe") and :class:`Schedule1F1B`
   ("1f1b") take one stage per rank; :class:`ScheduleInterleaved1F1B`
   ("interleaved_1f1b") a list, stage ``c p + r`` at rank r;
   :class:`ScheduleInterleavedZeroBubble` ("zb_h1", ZB-H1, what torch's
   implements) a list of one stage a rank, the one minidist's ZB-H1 holds;
   :class:`ScheduleZBVZeroBubble` ("zbv") and :class:`ScheduleDualPipeV`
   ("dualpipev") two stages a rank on the V (stages r and 2p - 1 - r).
3. ``step(*args, target=None, losses=None, return_outputs=True,
   loss_kwargs=None)`` cuts the inputs and the target along their first
   axis into the micro-batches (torch's ``tensor_split``: sizes differing
   by at most one, the first ones larger), runs this rank's actions of the
   schedule on the very runtime of
   :class:`~minidist.parallel.pipeline.executor.Pipeline`
   (:class:`~minidist.parallel.pipeline.steps.BatchRun`), appends each
   micro-batch's loss to ``losses`` and returns the last stage's outputs
   joined along the first axis. The loss of each micro-batch is
   backpropagated as it is, and the gradients, accumulated into ``.grad``
   (nothing is zeroed: that is the user's ``optimizer.zero_grad()``), are
   divided by the number of micro-batches at the end when ``scale_grads``
   (a loss that is a mean: the gradient of the micro-batches' mean loss).
   No optimizer step: the user's ``optimizer.step()``, as in torch.
   ``eval(...)``, or a schedule without ``loss_fn``, runs the forwards only.
4. :func:`pipeline` ``(module, mb_args, split_spec={name: SplitPoint})``
   cuts a module between its children (``Pipe``, whose ``build_stage``
   gives this rank's :class:`PipelineStage`), where its forward is its
   children one after another: an ``nn.Sequential``, or a module that runs
   ``mb_args`` to the same output as its children chained.

What differs, each refused with a line saying what to write: a stage takes
one input array and gives one (no tuples, no keyword inputs);
``args_chunk_spec``, ``kwargs_chunk_spec`` and ``output_merge_spec`` (only
torch's default, the first axis); ``dw_builder`` (minidist's split
backward makes the weight half itself); ``pipe_split()`` and
``split_policy`` (they need torch's tracer); ``ScheduleLoopedBFS``. Data
parallelism beside the pipeline is not here (torch composes it with FSDP or
DDP): ``Pipeline(data_parallel=)`` is minidist's own.

Cost: the schedule's (see :mod:`~minidist.parallel.pipeline.executor`),
plus, with ``scale_grads``, one division of each gradient per batch.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist.parallel.pipeline.executor import Pipeline
from minidist.parallel.pipeline.pipeline_stage import PipelineStage
from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    RECV_GRAD,
    SCHEDULES,
    SEND_GRAD,
    Schedule,
    make_schedule,
)
from minidist.parallel.pipeline.split import split_microbatches
from minidist.parallel.pipeline.split_points import (  # noqa: F401  (torch's names, here too)
    Pipe,
    SplitPoint,
    build_stage,
    pipe_split,
    pipeline,
)
from minidist.parallel.pipeline.steps import BatchRun
from minidist.tensor import Tensor, no_grad

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
           "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV",
           "pipeline", "SplitPoint", "Pipe", "build_stage", "pipe_split"]


class _PipelineSchedule:
    """What the schedule classes share: the stages checked, the Pipeline
    built over them, and ``step``. A subclass names its minidist schedule
    (``_schedule``) and its placement."""

    _schedule = ""
    _placement = "loop"
    _stages_a_rank = None   # any number, or the one minidist's schedule holds

    def _build(self, stages, n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec,
               output_merge_spec, scale_grads):
        who = type(self).__name__
        for name, spec in (("args_chunk_spec", args_chunk_spec),
                           ("kwargs_chunk_spec", kwargs_chunk_spec),
                           ("output_merge_spec", output_merge_spec)):
            if spec is not None:
                raise ValueError(f"{who}({name}=...): minidist cuts every input and the target "
                                 "along their first axis and joins the outputs along it "
                                 "(torch's default, TensorChunkSpec(0)); leave it out")
        if not all(isinstance(stage, PipelineStage) for stage in stages):
            raise TypeError(f"{who} takes PipelineStage objects, got "
                            f"{[type(stage).__name__ for stage in stages]}")
        if len({(s.num_stages, s.group_size, s.group_rank) for s in stages}) != 1:
            raise ValueError(f"{who}: this rank's stages disagree on num_stages or group")
        first = stages[0]
        ranks, total = first.group_size, first.num_stages
        if ranks * len(stages) != total:
            raise ValueError(f"{who}: {total} stages over {ranks} ranks is "
                             f"{total / ranks:g} a rank, this rank passed {len(stages)}; "
                             f"pass {total // ranks} stages a rank, or num_stages="
                             f"{ranks * len(stages)}")
        self._n_microbatches = n_microbatches
        self._loss_fn = loss_fn
        self._has_backward = loss_fn is not None
        self.scale_grads = bool(scale_grads)
        self._stages = list(stages)
        self._num_stages = total
        self.pipe = Pipeline({stage.stage_index: stage.submod for stage in stages},
                             self._minidist_schedule(ranks, n_microbatches, len(stages)),
                             pipeline_group=first.group)
        self._forward_only = _forward_only(self.pipe.schedule)

    def _minidist_schedule(self, ranks, microbatches, per_rank) -> Schedule:
        who = type(self).__name__
        if self._stages_a_rank not in (None, per_rank):
            raise ValueError(f"{who}: minidist's {self._schedule!r} holds {self._stages_a_rank} "
                             f"stage(s) a rank, this rank passed {per_rank}; pass "
                             f"{self._stages_a_rank} a rank ({_OTHER_SHAPES})")
        if self._schedule not in SCHEDULES:
            raise ValueError(f"{who} runs minidist's {self._schedule!r} schedule, which this "
                             f"minidist does not have (it has {sorted(SCHEDULES)})")
        schedule = make_schedule(self._schedule, ranks, microbatches, per_rank)
        if schedule.placement != self._placement or schedule.virtual_stages != per_rank:
            raise ValueError(f"{who}: minidist's {self._schedule!r} puts "
                             f"{schedule.virtual_stages} stage(s) a rank on the "
                             f"{schedule.placement} placement; torch's {who} puts "
                             f"{per_rank} on the {self._placement}")
        return schedule

    def step(self, *args, target=None, losses=None, return_outputs: bool = True,
             loss_kwargs=None, **kwargs):
        """One batch through the schedule: ``args`` (the model's input) on
        the first stage's rank, ``target`` and ``losses`` on the last
        one's; the last stage's outputs joined, None elsewhere (see the
        module)."""
        return self._run(args, kwargs, target, losses, return_outputs, loss_kwargs,
                         self._has_backward)

    def eval(self, *args, target=None, losses=None, **kwargs):
        """The forwards only (and the losses, with a target), as torch's ``eval``."""
        return self._run(args, kwargs, target, losses, True, None, False)

    def _run(self, args, kwargs, target, losses, return_outputs, loss_kwargs, backward):
        who = type(self).__name__
        if kwargs:
            raise ValueError(f"{who}.step({', '.join(f'{k}=' for k in kwargs)}): minidist's "
                             "stages take one positional input; pass the model's input as "
                             "step(x)")
        if losses is not None and not isinstance(losses, list):
            raise TypeError(f"losses must be a list but got a {type(losses)}")
        rules = _TorchStep(self, args, target, loss_kwargs, backward)
        if backward:
            BatchRun(self.pipe, rules).run()
        else:
            with no_grad():
                BatchRun(self.pipe, rules, keep_for_backward=False).run(
                    self._forward_only[self.pipe.rank])
        if self.pipe.is_last and rules.loss is not None and losses is not None:
            losses.clear()
            losses.extend(rules.losses[k] for k in range(self._n_microbatches))
        if self.pipe.is_last and return_outputs:
            return Tensor(np.concatenate([rules.outputs[k].data
                                          for k in range(self._n_microbatches)]))
        return None


class _TorchStep:
    """The rules of one ``step`` (see :mod:`~minidist.parallel.pipeline.steps`):
    each micro-batch's loss as the loss function gives it, the outputs and
    losses kept, the gradients divided by m at the end with ``scale_grads``,
    no optimizer step."""

    def __init__(self, schedule: _PipelineSchedule, args, target, loss_kwargs, backward):
        pipe, rank = schedule.pipe, dist.get_rank()
        self.schedule, self.backward, self.optimizer = schedule, backward, None
        self.loss_kwargs = dict(loss_kwargs or {})
        self.inputs = self.targets = None
        if pipe.is_first:
            if len(args) != 1:
                raise ValueError(f"rank {rank} holds the first stage: step() takes the model's "
                                 f"one input array, got {len(args)} positional arguments")
            self.inputs = self._split(args[0], "the input")
        self.loss = None
        if pipe.is_last and schedule._loss_fn is not None and (backward or target is not None):
            if target is None:
                raise ValueError(f"rank {rank} holds the last stage: step() needs "
                                 "target= for the loss")
            self.targets = self._split(target, "the target")
            self.loss = self._loss
        self.outputs, self.losses = {}, {}

    def _split(self, batch, what):
        try:
            return split_microbatches(batch, self.schedule._n_microbatches)
        except ValueError as error:
            raise ValueError(f"rank {dist.get_rank()}: {what}: {error}") from None

    def _loss(self, outputs, microbatch):
        return self.schedule._loss_fn(outputs, self.targets[microbatch], **self.loss_kwargs)

    def keep(self, microbatch, outputs, loss) -> None:
        self.outputs[microbatch] = outputs
        if loss is not None:
            self.losses[microbatch] = loss

    def finish(self, run) -> None:
        # torch's scale_grads: the sum of the micro-batches' gradients over m,
        # after every backward, whatever .grad held before the step.
        m = self.schedule._n_microbatches
        if self.backward and self.schedule.scale_grads and m != 1:
            for parameter in self.schedule.pipe.parameters():
                if parameter.grad is not None:
                    parameter.grad /= m

    def update(self) -> None:
        """No optimizer step: the user calls ``optimizer.step()``, as in torch."""


def _forward_only(schedule: Schedule) -> list:
    """Every rank's actions of ``schedule`` without its backwards, their
    halves and their gradients: the forwards and their messages in the
    schedule's order, which a backward never waited for."""
    dropped = (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, SEND_GRAD, RECV_GRAD)
    return [[action for action in rank if action.kind not in dropped]
            for rank in schedule.actions]


class _SingleStage(_PipelineSchedule):
    """torch's ``PipelineScheduleSingle``: one stage a rank."""

    def __init__(self, stage, n_microbatches: int, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads: bool = True):
        if isinstance(stage, (list, tuple)):
            raise TypeError(f"{type(self).__name__} takes one PipelineStage (one stage a "
                            "rank); for several a rank use ScheduleInterleaved1F1B")
        self._stage = stage
        self._build([stage], n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec,
                    output_merge_spec, scale_grads)


class _MultiStage(_PipelineSchedule):
    """torch's ``PipelineScheduleMulti``: a list of this rank's stages."""

    def __init__(self, stages, n_microbatches: int, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads: bool = True,
                 backward_requires_autograd: bool = True, defer_pp_recv: bool = False):
        if not isinstance(stages, (list, tuple)) or not stages:
            raise TypeError(f"{type(self).__name__} takes a list of this rank's "
                            f"PipelineStages, got {type(stages).__name__}")
        if not backward_requires_autograd:
            raise ValueError(f"{type(self).__name__}(backward_requires_autograd=False) is "
                             "for a custom backward; minidist's stages run the autograd's")
        # defer_pp_recv only changes when torch posts its receives, not the values.
        self._build(list(stages), n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec,
                    output_merge_spec, scale_grads)


class ScheduleGPipe(_SingleStage):
    """All forwards, then all backwards (minidist's "gpipe")."""

    _schedule = "gpipe"


class Schedule1F1B(_SingleStage):
    """One forward, one backward (minidist's "1f1b")."""

    _schedule = "1f1b"


class ScheduleInterleaved1F1B(_MultiStage):
    """Megatron's interleaved 1F1B, stage c p + r at rank r (minidist's "interleaved_1f1b")."""

    _schedule = "interleaved_1f1b"


class ScheduleInterleavedZeroBubble(_MultiStage):
    """Zero bubble, ZB-H1 ("ZB1P", torch's name for what it implements):
    minidist's "zb_h1", one stage a rank, passed in a list as torch's."""

    _schedule = "zb_h1"
    _stages_a_rank = 1


class ScheduleZBVZeroBubble(_MultiStage):
    """ZB-V: two stages a rank on the V (minidist's "zbv")."""

    _schedule = "zbv"
    _placement = "v"
    _stages_a_rank = 2


class ScheduleDualPipeV(_MultiStage):
    """DeepSeek's DualPipeV: two stages a rank on the V (minidist's "dualpipev")."""

    _schedule = "dualpipev"
    _placement = "v"
    _stages_a_rank = 2


_OTHER_SHAPES = ("several stages a rank: ScheduleInterleaved1F1B; two on the V with the "
                 "backward split: ScheduleZBVZeroBubble or ScheduleDualPipeV")
