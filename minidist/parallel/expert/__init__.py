"""Expert parallelism: a mixture of experts with its experts spread over the
ranks, tokens sent to their experts by all_to_all.

Read in this order:

1. :mod:`.dispatch`: the all_to_all dispatch and return as autograd nodes,
   the experts over an ep group, dp x ep gradients;
2. :mod:`.costs`: what the dispatch sends, against the dense MLP's all_reduce.

The router, capacity and load-balancing loss are the model's
(:mod:`minidist.models.moe`); nothing here is of another family.
"""

from __future__ import annotations

from minidist.parallel.expert.costs import (  # noqa: F401
    COUNT_BYTES,
    DispatchBytes,
    balanced_dispatch_bytes,
    dense_mlp_all_reduce_bytes,
    dispatch_bytes,
    dispatch_matrix,
)
from minidist.parallel.expert.dispatch import (  # noqa: F401
    Dispatch,
    ExpertParallelMoE,
    all_to_all_rows,
    allreduce_moe_grads,
    exchange_counts,
    expert_parallel_gpt,
    expert_parameters,
    expert_range,
)

__all__ = ["ExpertParallelMoE", "Dispatch", "all_to_all_rows", "exchange_counts", "expert_range",
           "expert_parallel_gpt", "allreduce_moe_grads", "expert_parameters", "dispatch_matrix",
           "dispatch_bytes", "DispatchBytes", "balanced_dispatch_bytes",
           "dense_mlp_all_reduce_bytes", "COUNT_BYTES"]
