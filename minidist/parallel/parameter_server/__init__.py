"""Parameter servers: workers push gradients, servers hold the weights.

Read in this order:

1. :mod:`.layout`: which ranks serve and which work, which keys each
   server owns (the weights as one flat vector, sharded);
2. :mod:`.messages`: a worker's request (push, pull) and a server's reply;
3. :mod:`.shard`: one server's key range and the consistency modes
   (bulk synchronous, stale synchronous, asynchronous, dropping stale
   pushes): when a push is applied;
4. :mod:`.server`: ``ParameterServer``, the servers' and the workers' loops;
5. :mod:`.fault_tolerant`: every key range on two servers, a crashed
   server's range taken over by its copy (the overview, and the workers'
   side), then :mod:`.failures` (crashes made on purpose, faults reported),
   :mod:`.replicated_shard` (a range's copy: each push applied once) and
   :mod:`.replication` (a server rank's loop: forward, acknowledge, take
   over);
6. :mod:`.hogwild`: no server at all, lock-free updates of one shared array;
7. :mod:`.delayed_proximal`: D2P, delayed proximal gradient on a sparse
   problem;
8. :mod:`.straggler`: ranks made slower, to watch the others wait.

What the other families use from here: nothing.
"""

from __future__ import annotations

from minidist.parallel.parameter_server.delayed_proximal import (  # noqa: F401
    SERVER,
    D2PResult,
    block_bounds,
    block_order,
    default_step_size,
    delayed_proximal_gradient,
    delayed_proximal_reference,
    max_delay_schedule,
    objective,
    proximal_block_step,
    shard_block_gradient,
    shard_rows,
    significant_positions,
    soft_threshold,
    sum_in_worker_order,
)
from minidist.parallel.parameter_server.failures import (  # noqa: F401
    CRASH_MOMENTS,
    ServerCrash,
)
from minidist.parallel.parameter_server.fault_tolerant import (  # noqa: F401
    FAULT_TOLERANT_MODES,
    Failover,
    FaultTolerantParameterServer,
    FaultTolerantWorkerResult,
    final_weights,
)
from minidist.parallel.parameter_server.hogwild import (  # noqa: F401
    WEIGHTS,
    WRITES,
    HogwildResult,
    SparseRows,
    example_order,
    hogwild_worker,
    learning_rates,
    logistic_loss,
    pass_length_of_rank,
    run_hogwild,
    serial_sgd,
    sgd_update,
    shared_arrays,
    updates_of_rank,
)
from minidist.parallel.parameter_server.layout import (  # noqa: F401
    Layout,
    flat_parameters,
    load_flat_parameters,
    shard_ranges,
)
from minidist.parallel.parameter_server.messages import (  # noqa: F401
    HEADER_SIZE,
    NO_STEP,
    PendingPush,
    Push,
    Request,
)
from minidist.parallel.parameter_server.replicated_shard import (  # noqa: F401
    RangeCopy,
    RangeReport,
    ReplicatedShard,
)
from minidist.parallel.parameter_server.replication import (  # noqa: F401
    IDENTITY_SIZE,
    POLL_SECONDS,
    RANGE_TAG_STRIDE,
    REQUEST_SIZE,
    FaultTolerantServerResult,
)
from minidist.parallel.parameter_server.server import (  # noqa: F401
    ORDERS,
    ParameterServer,
    ServerResult,
    WorkerResult,
)
from minidist.parallel.parameter_server.shard import (  # noqa: F401
    MODES,
    PushRecord,
    ServerShard,
)
from minidist.parallel.parameter_server.straggler import (  # noqa: F401
    Straggler,
)

__all__ = ["MODES", "ORDERS", "NO_STEP", "shard_ranges", "Layout", "Request", "HEADER_SIZE",
           "Push", "PushRecord", "ServerResult", "WorkerResult", "PendingPush", "ServerShard",
           "flat_parameters", "load_flat_parameters", "ParameterServer", "FAULT_TOLERANT_MODES",
           "CRASH_MOMENTS", "RANGE_TAG_STRIDE", "POLL_SECONDS", "REQUEST_SIZE", "IDENTITY_SIZE",
           "ServerCrash", "ReplicatedShard", "RangeCopy", "RangeReport",
           "FaultTolerantServerResult", "Failover", "FaultTolerantWorkerResult", "final_weights",
           "FaultTolerantParameterServer", "WEIGHTS", "WRITES", "SparseRows", "logistic_loss",
           "sgd_update", "example_order", "learning_rates", "serial_sgd", "shared_arrays",
           "updates_of_rank", "pass_length_of_rank", "hogwild_worker", "HogwildResult",
           "run_hogwild", "SERVER", "soft_threshold", "block_bounds", "block_order", "shard_rows",
           "objective", "shard_block_gradient", "significant_positions", "sum_in_worker_order",
           "proximal_block_step", "default_step_size", "D2PResult", "max_delay_schedule",
           "delayed_proximal_reference", "delayed_proximal_gradient", "Straggler"]
