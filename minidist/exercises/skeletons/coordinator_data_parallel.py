"""Exercise coordinator_data_parallel: one data-parallel step through a coordinator.

Check it with `minidist exercise check coordinator_data_parallel coordinator_data_parallel.py`
(real processes, 1 to 4 ranks, uneven shards).

Available: ``import minidist.distributed as dist``; ``dist.get_rank()``,
``dist.get_world_size()``, ``dist.gather(array, list_or_None, dst=0)``
(rank 0 passes a list of one array per rank, the others None),
``dist.broadcast(array, src=0)`` (in place), ``dist.send``/``dist.recv``.
"""

import numpy as np  # noqa: F401

import minidist.distributed as dist  # noqa: F401
from minidist.exercises import NotWrittenYet


def coordinator_step(weights, gradient, batch_size, lr):
    """Update ``weights`` (a flat array, the same on every rank) in place, on every rank.

    ``gradient``: this rank's gradient, a mean over its ``batch_size``
    examples (which may be 0). Rank 0 is the coordinator:

    1. it collects every rank's gradient and batch size;
    2. it averages them as one process would over the whole batch:
       sum_r b_r g_r / sum_r b_r (not the plain mean over ranks: shards are
       uneven), and takes the step weights -= lr * average;
    3. every rank ends with the coordinator's new weights.

    Cost to reach (P: the model's values, n ranks): the coordinator receives
    (n - 1) gradients and sends (n - 1) copies of the weights per step, its
    link carrying n times a worker's: the bottleneck lesson 5 measures.
    """
    raise NotWrittenYet("write coordinator_step: gather, weighted average and SGD step on "
                        "rank 0, then broadcast the weights")
