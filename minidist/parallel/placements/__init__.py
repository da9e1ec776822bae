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
3. :mod:`.loss_parallel`: the cross entropy of class-sharded logits;
4. :mod:`.mixed_precision_policy`: FSDP2's ``MixedPrecisionPolicy``, the
   dtypes of a unit's gathered weights and reduced gradients;
5. :mod:`.fsdp_params`: one unit's parameters as ``Shard(0)`` DTensors, the
   one all_gather that unshards them all and the one reduce_scatter (and
   HSDP's all_reduce) that brings their gradients back;
6. :mod:`.fsdp_state`: the hooks that gather, free, prefetch and reduce
   around each unit's forward and backward;
7. :mod:`.fully_shard`: torch's ``fully_shard`` and ``FSDPModule``, which
   put them on a module, bottom-up.

FSDP1, the flat-buffer ``FullyShardedDataParallel`` of
:mod:`minidist.parallel.data`, is FSDP2's comparison, not a part of it.
"""

from __future__ import annotations

from minidist.parallel.placements.fully_shard import (  # noqa: F401
    FSDPModule,
    UnshardHandle,
    fully_shard,
)
from minidist.parallel.placements.loss_parallel import loss_parallel
from minidist.parallel.placements.mixed_precision_policy import (  # noqa: F401
    MixedPrecisionPolicy,
)
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
           "SequenceParallel", "loss_parallel", "parallelize_module",
           "fully_shard", "FSDPModule", "UnshardHandle", "MixedPrecisionPolicy"]
