"""torch's face for tensor parallelism: ``parallelize_module(module, mesh_or_group, plan)``
with the plan's styles, ``ColwiseParallel()`` and ``RowwiseParallel()``, as
torch users write it (``torch.distributed.tensor.parallel``)::

    from minidist.distributed.tensor.parallel import (
        ColwiseParallel, PackedColwiseParallel, RowwiseParallel, parallelize_module)

    for block in model.transformer.h:
        parallelize_module(block, group, {
            "attn.c_attn": PackedColwiseParallel(3),  # q, k, v fused: see style.py
            "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(),
            "mlp.c_proj": RowwiseParallel(),
        })
        block.attn.n_head //= tp                     # as torch users (torchtitan) do

The styles build the Megatron layers of :mod:`minidist.parallel.tensor_parallel`
(:mod:`.style`); :mod:`.api` walks the plan.
"""

from minidist.distributed.tensor.parallel.api import parallelize_module
from minidist.distributed.tensor.parallel.style import (
    ColwiseParallel,
    PackedColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
)

__all__ = ["parallelize_module", "ColwiseParallel", "RowwiseParallel", "PackedColwiseParallel",
           "ParallelStyle"]
