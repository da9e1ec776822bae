"""minidist.parallel: one file per way of training on many ranks.

torch's names import as torch users write them: ``DistributedDataParallel``
(``torch.nn.parallel``), ``FullyShardedDataParallel`` and ``ShardingStrategy``
(``torch.distributed.fsdp``), ``ZeroRedundancyOptimizer``
(``torch.distributed.optim``), ``SyncBatchNorm`` (torch.nn's, which needs the
collectives, so it is here: minidist.nn says so if asked), and tensor
parallelism's plan: ``parallelize_module``, ``ColwiseParallel``,
``RowwiseParallel`` (``torch.distributed.tensor.parallel``; they build this
package's split layers, so they stand here, above ``minidist.distributed``). Every other strategy is imported from its own
file (``minidist.parallel.pipeline``, ``.tensor_parallel``, ...).
"""

from minidist.parallel.data_parallel import DistributedDataParallel
from minidist.parallel.parallel_styles import (
    ColwiseParallel,
    PackedColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
)
from minidist.parallel.parallelize import parallelize_module
from minidist.parallel.sync_batchnorm import SyncBatchNorm
from minidist.parallel.zero import (
    FullyShardedDataParallel,
    ShardingStrategy,
    ZeroRedundancyOptimizer,
)

__all__ = ["ColwiseParallel", "DistributedDataParallel", "FullyShardedDataParallel",
           "PackedColwiseParallel", "ParallelStyle", "RowwiseParallel", "ShardingStrategy",
           "SyncBatchNorm", "ZeroRedundancyOptimizer", "parallelize_module"]
