"""Sharding as placements: the strategies written as DTensor layouts (torch's
``torch.distributed.tensor.parallel`` and FSDP2's ``fully_shard``).

The layouts themselves, and the collective that changes one into another,
are :mod:`minidist.distributed.tensor`'s; this family puts them on modules.
It reaches the tensor family only through its face
(:mod:`minidist.parallel.tensor`: the split layer ``PackedColwiseParallel``
builds).

Read in this order:

1. :mod:`.styles`: torch's ColwiseParallel, RowwiseParallel,
   SequenceParallel, PrepareModuleInput / PrepareModuleOutput on DTensors
   (and PackedColwiseParallel, which builds a split layer);
2. :mod:`.parallelize`: ``parallelize_module``, a plan of styles by name;
3. :mod:`.loss_parallel`: the cross entropy of class-sharded logits.
"""

from __future__ import annotations

from minidist.parallel.placements.loss_parallel import loss_parallel
from minidist.parallel.placements.parallelize import parallelize_module
from minidist.parallel.placements.styles import (
    ColwiseParallel,
    PackedColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

__all__ = ["ColwiseParallel", "PackedColwiseParallel", "ParallelStyle",
           "PrepareModuleInput", "PrepareModuleOutput", "RowwiseParallel",
           "SequenceParallel", "loss_parallel", "parallelize_module"]
