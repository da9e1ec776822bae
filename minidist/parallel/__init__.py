"""minidist.parallel: one file per way of training on many ranks.

torch's names import as torch users write them: ``DistributedDataParallel``
(``torch.nn.parallel``), ``FullyShardedDataParallel`` and ``ShardingStrategy``
(``torch.distributed.fsdp``), ``ZeroRedundancyOptimizer``
(``torch.distributed.optim``). Every other strategy is imported from its own
file (``minidist.parallel.pipeline``, ``.tensor_parallel``, ...).
"""

from minidist.parallel.data_parallel import DistributedDataParallel
from minidist.parallel.zero import (
    FullyShardedDataParallel,
    ShardingStrategy,
    ZeroRedundancyOptimizer,
)

__all__ = ["DistributedDataParallel", "FullyShardedDataParallel", "ShardingStrategy",
           "ZeroRedundancyOptimizer"]
