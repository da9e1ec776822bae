"""Model parallelism of the course: the model's layers split across ranks
(each rank the whole batch, a part of the model).

Read in this order:

1. :mod:`.distbelief`: every layer's units partitioned, activations
   exchanged between layers (DistBelief);
2. :mod:`.hybrid`: Krizhevsky's hybrid, the convolutions data parallel and
   the dense layers model parallel;
3. :mod:`.split_conv`: one convolution split across ranks, what the two
   splits share (the band rule); :mod:`.channel_parallel`, split by output
   channel; :mod:`.spatial_parallel`, split by image rows, with the halo
   exchange;
4. :mod:`.costs`: a dense layer's bytes, data parallel against the two
   splits (Dettmers' 1000 x 500 layer).

From another family: the tensor family's split ``Linear`` layers and
communication regions, through its face :mod:`minidist.parallel.tensor`.
"""

from __future__ import annotations

from minidist.parallel.model.channel_parallel import (  # noqa: F401
    ChannelParallelConv2d,
    channel_parallel_bytes,
)
from minidist.parallel.model.costs import (  # noqa: F401
    STRATEGIES,
    SplitBytes,
    Traffic,
    format_table,
    split_bytes,
)
from minidist.parallel.model.distbelief import (  # noqa: F401
    DEFAULT_EXCHANGE_ALGORITHM,
    DEFAULT_GATHER_ALGORITHM,
    DistBeliefMLP,
    DistBeliefTraffic,
    PartitionedLinear,
    distbelief_bytes,
    exchange_activations,
)
from minidist.parallel.model.hybrid import (  # noqa: F401
    DEFAULT_ALGORITHM,
    STRATEGY_NAMES,
    DenseModelParallel,
    HybridParallel,
    LayerTraffic,
    StrategyBytes,
    all_gather_batch,
    format_strategy_table,
    gather_batch,
    split_at_first_linear,
    strategy_bytes,
)
from minidist.parallel.model.spatial_parallel import (  # noqa: F401
    HaloPlan,
    SpatialParallelConv2d,
    halo_context,
    halo_plan,
)
from minidist.parallel.model.split_conv import (  # noqa: F401
    band,
)

__all__ = ["DEFAULT_EXCHANGE_ALGORITHM", "DEFAULT_GATHER_ALGORITHM", "exchange_activations",
           "PartitionedLinear", "DistBeliefMLP", "DistBeliefTraffic", "distbelief_bytes",
           "DEFAULT_ALGORITHM", "all_gather_batch", "gather_batch", "split_at_first_linear",
           "HybridParallel", "DenseModelParallel", "LayerTraffic", "StrategyBytes",
           "STRATEGY_NAMES", "strategy_bytes", "format_strategy_table", "ChannelParallelConv2d",
           "SpatialParallelConv2d", "band", "halo_plan", "HaloPlan", "halo_context",
           "channel_parallel_bytes", "STRATEGIES", "Traffic", "SplitBytes", "split_bytes",
           "format_table"]
