"""Sharding as placements: the strategies written as DTensor layouts (torch's
``torch.distributed.tensor.parallel`` and FSDP2's ``fully_shard``).

The layouts themselves, and the collective that changes one into another,
are :mod:`minidist.distributed.tensor`'s; this family puts them on modules.

Read in this order:

1. :mod:`.mixed_precision_policy`: FSDP2's ``MixedPrecisionPolicy``, the
   dtypes of a unit's gathered weights and reduced gradients;
2. :mod:`.fsdp_params`: one unit's parameters as ``Shard(0)`` DTensors, the
   one all_gather that unshards them all and the one reduce_scatter (and
   HSDP's all_reduce) that brings their gradients back;
3. :mod:`.fsdp_state`: the hooks that gather, free, prefetch and reduce
   around each unit's forward and backward;
4. :mod:`.fully_shard`: torch's ``fully_shard`` and ``FSDPModule``, which
   put them on a module, bottom-up.

What the other families give here: nothing (FSDP1, the flat-buffer
``FullyShardedDataParallel`` of :mod:`minidist.parallel.data`, is the
comparison, not a part).
"""

from __future__ import annotations

from minidist.parallel.placements.fully_shard import (  # noqa: F401
    FSDPModule,
    UnshardHandle,
    fully_shard,
)
from minidist.parallel.placements.mixed_precision_policy import (  # noqa: F401
    MixedPrecisionPolicy,
)

__all__ = ["fully_shard", "FSDPModule", "UnshardHandle", "MixedPrecisionPolicy"]
