"""ZeRO's stages by number: which wrapper and optimizer each one is.

Stage 0 is :class:`~minidist.parallel.data.ddp.DistributedDataParallel` with
a whole optimizer on every rank, stage 1 the same with a
:class:`~minidist.parallel.data.zero.ZeroRedundancyOptimizer`, stages 2 and 3
:class:`~minidist.parallel.data.fsdp.FullyShardedDataParallel` with
``SHARD_GRAD_OP`` and ``FULL_SHARD``. :func:`wrap` builds any of them the
same way, so a lesson, a demo or a benchmark compares the four with one loop,
and :func:`clip_grad_norm_` clips whichever of them ``wrap`` built (DeepSpeed
clips every stage with one setting, ``gradient_clipping``; here it is torch's
function name with the wrapper first, since the stages need two different
calls: stages 0 and 1 hold replicated gradients after DDP's all_reduce, so
``minidist.nn.utils.clip_grad_norm_`` on them is already the whole norm;
stages 2 and 3 hold shards, so it is FSDP's ``clip_grad_norm_`` method, one
all-reduce of one number).
"""

from __future__ import annotations

from minidist.distributed.device_mesh import as_group
from minidist.nn.utils import clip_grad_norm_ as _clip_whole
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.fsdp import FullyShardedDataParallel, ShardingStrategy
from minidist.parallel.data.zero import ZeroRedundancyOptimizer

STAGES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def wrap(model, stage: int, optimizer_class, *, group=None, algorithm: str = "auto",
         **defaults):
    """``(the module to call, its optimizer)`` for ZeRO ``stage`` (0: plain
    DDP), the way the lesson, the demo and the benchmark compare them:

    * 0: ``DistributedDataParallel`` + ``optimizer_class`` on every parameter;
    * 1: ``DistributedDataParallel`` + ``ZeroRedundancyOptimizer``;
    * 2, 3: ``FullyShardedDataParallel`` (``SHARD_GRAD_OP``, ``FULL_SHARD``)
      + ``optimizer_class`` on its shards.

    ``defaults`` go to the optimizer (``lr=...``)."""
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be 0 (plain DDP), 1, 2 or 3, got {stage!r}")
    group = as_group(group, "wrap")
    if stage in (0, 1):
        wrapped = DistributedDataParallel(model, process_group=group, algorithm=algorithm)
        if stage == 0:
            return wrapped, optimizer_class(wrapped.parameters(), **defaults)
        return wrapped, ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class,
                                                process_group=group, algorithm=algorithm,
                                                **defaults)
    strategy = ShardingStrategy.SHARD_GRAD_OP if stage == 2 else ShardingStrategy.FULL_SHARD
    wrapped = FullyShardedDataParallel(model, process_group=group, sharding_strategy=strategy,
                                       algorithm=algorithm)
    return wrapped, optimizer_class(wrapped.parameters(), **defaults)




def clip_grad_norm_(wrapped, max_norm: float, norm_type: float = 2.0):
    """Clip the gradients of the module :func:`wrap` returned, for any stage,
    to a total ``norm_type``-norm of ``max_norm`` (call after backward,
    before the optimizer's step, on every rank); returns the whole model's
    norm, one process's, on every rank. Stages 0 and 1: the replicated
    gradients, nothing sent; 2 and 3: ``wrapped.clip_grad_norm_``, the
    shards' terms summed over the group (one all-reduce of one element)."""
    if isinstance(wrapped, FullyShardedDataParallel):
        return wrapped.clip_grad_norm_(max_norm, norm_type)
    if isinstance(wrapped, DistributedDataParallel):
        return _clip_whole(wrapped.parameters(), max_norm, norm_type)
    raise TypeError(f"clip_grad_norm_ takes the module zero_stages.wrap returned (a "
                    f"DistributedDataParallel or FullyShardedDataParallel), got "
                    f"{type(wrapped).__name__}")
