"""torch.distributed.pipelining's ``PipelineStage``: one piece of the model
on this rank and where it sits in the pipeline.

A stage is only a description: its module, its index among ``num_stages``,
and the process group the pipeline talks in (None: the world). The schedule
classes of :mod:`~minidist.parallel.pipeline.pipelining` read this rank's
stages, check that their indices are the ones the schedule's placement
gives this rank, and build a
:class:`~minidist.parallel.pipeline.executor.Pipeline` of them.

Cost: one ``get_rank`` and one ``get_world_size`` of the group; nothing sent.
"""

from __future__ import annotations

import minidist.distributed as dist
from minidist import nn

__all__ = ["PipelineStage"]


class PipelineStage:
    """One stage of the pipeline on this rank: ``submodule`` at
    ``stage_index`` of ``num_stages``, talking over ``group`` (None: the
    world), torch's arguments in torch's order. ``device`` is accepted as
    torch's; where arrays live is minidist's backend's choice (NumPy, or
    CuPy). The example tensors ``input_args`` ... ``input_grads`` (torch's
    shape checks) are accepted and not needed: minidist's messages carry
    their shapes."""

    def __init__(self, submodule, stage_index: int, num_stages: int, device=None,
                 input_args=None, output_args=None, output_grads=None, input_grads=None,
                 group=None, dw_builder=None, get_mesh=None):
        if not isinstance(submodule, nn.Module):
            raise TypeError(f"PipelineStage takes an nn.Module, got {type(submodule).__name__}")
        for name, value in (("stage_index", stage_index), ("num_stages", num_stages)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"PipelineStage: {name} must be an int, got {value!r}")
        if not 0 <= stage_index < num_stages:
            raise ValueError(f"Stage index {stage_index} is out of range of {num_stages}")
        if dw_builder is not None:
            raise ValueError("PipelineStage(dw_builder=...): minidist's split backward "
                             "(minidist.split_backward) makes each weight half W itself; "
                             "leave dw_builder out")
        if get_mesh is not None:
            raise ValueError("PipelineStage(get_mesh=...) infers DTensor meshes; minidist's "
                             "stages pass plain arrays: leave get_mesh out")
        self.submod, self.stage_index, self.num_stages = submodule, stage_index, num_stages
        self.device, self.group = device, group
        self.group_rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        if self.group_size > num_stages:
            raise ValueError(f"Pipeline group size {self.group_size} cannot be larger than "
                             f"number of stages {num_stages}")

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def __repr__(self) -> str:
        return f"PipelineStage({self.stage_index} of {self.num_stages}, rank {self.group_rank})"
