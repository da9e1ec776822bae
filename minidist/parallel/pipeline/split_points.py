"""torch.distributed.pipelining's ``pipeline(module, mb_args,
split_spec={name: SplitPoint})``: a module cut into stages between its
children.

1. **Name the cuts**: each ``SplitPoint.BEGINNING`` cuts before the named
   child, each ``SplitPoint.END`` after it; no split_spec, one stage.
2. **Cut**: each stage is an ``nn.Sequential`` of consecutive children,
   under their names and sharing their weights (``Pipe.get_stage_module``),
   and ``Pipe.build_stage(i, device, group)`` makes this rank's
   :class:`~minidist.parallel.pipeline.pipeline_stage.PipelineStage`.
3. **Check**: that holds when the module's forward is its children called
   one after another. An ``nn.Sequential``'s is, by definition; any other
   module is run on ``mb_args`` both ways, with the same random draws and
   nothing changed afterwards, and refused if the outputs differ. torch
   traces the forward instead (``torch.export``), which minidist does not,
   so a cut inside a child, ``pipe_split()`` and ``split_policy`` are
   refused.

Cost: O(children); the check runs the module's forward twice on one
micro-batch, once.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import Enum

import numpy as np

from minidist import nn
from minidist.nn.recompute import ForwardState
from minidist.parallel.pipeline.pipeline_stage import PipelineStage
from minidist.tensor import Tensor, no_grad

__all__ = ["SplitPoint", "Pipe", "pipeline", "build_stage", "pipe_split"]


class SplitPoint(Enum):
    """Where ``pipeline``'s ``split_spec`` cuts: before a child (BEGINNING) or after it (END)."""

    BEGINNING = 1
    END = 2


class Pipe:
    """A module cut into stages by :func:`pipeline`: ``num_stages``,
    ``get_stage_module(i)`` (an ``nn.Sequential`` of the children, under
    their names, sharing their weights) and ``build_stage``."""

    def __init__(self, pieces: list):
        self.pieces = pieces
        self.num_stages = len(pieces)

    def get_stage_module(self, stage_idx: int):
        if not 0 <= stage_idx < self.num_stages:
            raise ValueError(f"Invalid stage index {stage_idx}!")
        return self.pieces[stage_idx]

    def info(self) -> Pipe:
        """What ``build_stage(module, index, pipe_info, ...)`` reads: the pipe itself."""
        return self

    def build_stage(self, stage_index: int, device=None, group=None) -> PipelineStage:
        return PipelineStage(self.get_stage_module(stage_index), stage_index, self.num_stages,
                             device, group=group)


def build_stage(stage_module, stage_index: int, pipe_info: Pipe, device=None,
                group=None) -> PipelineStage:
    """torch's ``build_stage(stage_module, stage_index, pipe.info(), device, group)``."""
    return PipelineStage(stage_module, stage_index, pipe_info.num_stages, device, group=group)


def pipe_split():
    """torch marks a cut inside ``forward`` with it, for its tracer: refused here."""
    raise RuntimeError("pipe_split() marks a cut for torch's tracer, and minidist does not "
                       "trace forward: cut with pipeline(module, mb_args, split_spec={child: "
                       "SplitPoint.BEGINNING}), or build each PipelineStage by hand")


def pipeline(module, mb_args, mb_kwargs=None, split_spec=None, split_policy=None) -> Pipe:
    """``module`` cut between its children at ``split_spec`` ({child name:
    SplitPoint}); ``mb_args`` is one micro-batch of inputs, used to check
    that ``module``'s forward is its children chained (always so for an
    ``nn.Sequential``). No split_spec: one stage."""
    if split_policy is not None:
        raise ValueError("pipeline(split_policy=...) rewrites torch's traced graph; minidist "
                         "does not trace: give split_spec={child name: SplitPoint}")
    if mb_kwargs:
        raise ValueError("pipeline(mb_kwargs=...): minidist's stages take one positional "
                         "input; leave mb_kwargs out")
    if not isinstance(module, nn.Module):
        raise TypeError(f"pipeline cuts an nn.Module, got {type(module).__name__}")
    children = list(module.named_children())
    names = [name for name, _ in children]
    cuts = set()
    for name, point in (split_spec or {}).items():
        if name not in names:
            raise ValueError(f"pipeline: split_spec names {name!r}, which is not a child of "
                             f"the {type(module).__name__}; minidist cuts between its own "
                             f"children: {names}")
        if not isinstance(point, SplitPoint):
            raise TypeError(f"pipeline: split_spec[{name!r}] must be a SplitPoint, got {point!r}")
        cuts.add(names.index(name) + (point is SplitPoint.END))
    cuts = sorted(cuts - {0, len(children)})
    bounds = [0, *cuts, len(children)]
    pieces = [nn.Sequential(OrderedDict(children[a:b])) for a, b in zip(bounds, bounds[1:])]
    if not isinstance(module, nn.Sequential):
        _check_chained(module, pieces, mb_args)
    return Pipe(pieces)


def _check_chained(module, pieces, mb_args) -> None:
    """A module that is not a Sequential may do more in its forward than
    call its children in order: run both on ``mb_args``, with the same
    random draws and nothing changed afterwards, and refuse a difference."""
    args = mb_args if isinstance(mb_args, tuple) else (mb_args,)
    if len(args) != 1:
        raise ValueError(f"pipeline: mb_args has {len(args)} inputs; minidist's stages take one")
    x = Tensor(args[0].data if isinstance(args[0], Tensor) else np.asarray(args[0]))
    state = ForwardState(module)
    with no_grad():
        with state.replay():
            whole = module(x)
        with state.replay():
            chained = x
            for piece in pieces:
                chained = piece(chained)
    if whole.shape != chained.shape or not np.array_equal(whole.data, chained.data):
        raise ValueError(f"pipeline: {type(module).__name__}'s forward is not its children "
                         "called one after another (on mb_args they give another output), so "
                         "it cannot be cut between them; wrap the pieces in nn.Sequential, or "
                         "build each PipelineStage by hand")
