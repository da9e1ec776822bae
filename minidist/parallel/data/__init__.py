"""Data parallelism: every rank holds the model (or its shard) and trains on
its own slice of each batch.

Read in this order:

1. :mod:`.coordinator`: every gradient to one rank, which averages, steps
   and sends the weights back (the course's before);
2. :mod:`.ddp`: ``DistributedDataParallel``, the gradients all-reduced as
   backward produces them, in the buckets of :mod:`.buckets`
   (:mod:`.checks`: what every data-parallel wrapper refuses);
3. :mod:`.compression`: DDP's communication hooks that send fewer bits or
   fewer values (fp16, bf16, int8, sign, threshold, top-k, random-k), with
   error feedback;
4. :mod:`.powersgd`: the low-rank hook, PowerSGD; :mod:`.hooks` names every
   hook;
5. :mod:`.local_sgd`: fewer messages instead of fewer bits, ``LocalSGD``
   (every rank steps alone, the weights averaged every H steps); then
   :mod:`.diloco`: ``DiLoCo``, an inner optimizer for H steps and an outer
   Nesterov step on the averaged pseudo-gradient, its streaming form by
   fragments;
6. :mod:`.zero`: ZeRO stage 1, the optimizer state sharded;
7. :mod:`.fsdp`: stages 2 and 3 as ``FullyShardedDataParallel``, gradients
   and then weights sharded, one layer (a unit) at a time; :mod:`.fsdp_units`:
   which unit holds each parameter, a tied one included; :mod:`.zero_stages`
   builds any stage by number;
8. :mod:`.costs`: what each stage holds and sends, by formula;
9. :mod:`.sync_batchnorm`: batch statistics over the global batch;
10. :mod:`.checkpoint_files`: saving and resuming a data-parallel run;
11. :mod:`.inference`: a data set's predictions split over ranks.

What the other families use from here: nothing (the replicas' glue,
broadcasting weights and all-reducing gradients, is
:mod:`minidist.parallel.replicas`).
"""

from __future__ import annotations

from minidist.parallel.data.buckets import (  # noqa: F401
    GradBucket,
)
from minidist.parallel.data.checkpoint_files import (  # noqa: F401
    FORMAT,
    VERSION,
    load_checkpoint,
    save_checkpoint,
)
from minidist.parallel.data.compression import (  # noqa: F401
    ErrorFeedbackState,
    Int8State,
    RandomKState,
    ThresholdState,
    TopKState,
    allreduce_hook,
    bf16_compress_hook,
    compress_randomk,
    compress_sign,
    compress_threshold,
    compress_topk,
    expand_bf16,
    fp16_compress_hook,
    int8_hook,
    quantize_int8,
    randomk_hook,
    sign_hook,
    threshold_hook,
    topk_hook,
    truncate_bf16,
)
from minidist.parallel.data.coordinator import (  # noqa: F401
    CoordinatorDataParallel,
)
from minidist.parallel.data.costs import (  # noqa: F401
    zero_bytes_per_step,
    zero_model_state_bytes,
)
from minidist.parallel.data.ddp import (  # noqa: F401
    DistributedDataParallel,
)
from minidist.parallel.data.diloco import (  # noqa: F401
    DiLoCo,
)
from minidist.parallel.data.fsdp import (  # noqa: F401
    STRATEGIES,
    FreedParameter,
    FullyShardedDataParallel,
    ShardingStrategy,
    freed_parameter,
)
from minidist.parallel.data.hooks import (  # noqa: F401
    HOOKS,
)
from minidist.parallel.data.inference import (  # noqa: F401
    OUTPUTS,
    parallel_predict,
    predict,
    shard_bounds,
)
from minidist.parallel.data.local_sgd import (  # noqa: F401
    LocalSGD,
)
from minidist.parallel.data.powersgd import (  # noqa: F401
    PowerSGDState,
    orthogonalize,
    powersgd_hook,
)
from minidist.parallel.data.sync_batchnorm import (  # noqa: F401
    SyncBatchNorm,
    sync_batch_norm,
    sync_batchnorm_bytes,
)
from minidist.parallel.data.zero import (  # noqa: F401
    ZeroRedundancyOptimizer,
)
from minidist.parallel.data.zero_stages import (  # noqa: F401
    STAGES,
    wrap,
)

__all__ = ["CoordinatorDataParallel", "GradBucket", "DistributedDataParallel",
           "ErrorFeedbackState", "Int8State", "ThresholdState", "TopKState", "RandomKState",
           "PowerSGDState", "quantize_int8", "truncate_bf16", "expand_bf16", "orthogonalize",
           "compress_sign", "compress_threshold", "compress_topk", "compress_randomk",
           "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "int8_hook", "sign_hook",
           "threshold_hook", "topk_hook", "randomk_hook", "powersgd_hook", "HOOKS",
           "LocalSGD", "DiLoCo",
           "ZeroRedundancyOptimizer", "ShardingStrategy", "STRATEGIES", "FreedParameter",
           "freed_parameter", "FullyShardedDataParallel", "STAGES", "wrap",
           "zero_model_state_bytes", "zero_bytes_per_step", "SyncBatchNorm", "sync_batch_norm",
           "sync_batchnorm_bytes", "FORMAT", "VERSION", "save_checkpoint", "load_checkpoint",
           "parallel_predict", "predict", "shard_bounds", "OUTPUTS"]
