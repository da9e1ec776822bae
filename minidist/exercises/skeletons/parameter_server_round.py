"""Exercise parameter_server_round: one push/pull round of a parameter server.

Check it with `minidist exercise check parameter_server_round parameter_server_round.py`
(real processes, 2 to 5 ranks).

Available: ``import minidist.distributed as dist``; ``dist.get_rank()``,
``dist.get_world_size()``, ``dist.send(array, dst, tag=...)``,
``dist.recv(array, src, tag=...)`` (fills ``array`` in place).
"""

import numpy as np  # noqa: F401

import minidist.distributed as dist  # noqa: F401
from minidist.exercises import NotWrittenYet


def parameter_server_round(weights, gradient, lr):
    """One synchronous round; ``weights`` (a flat array, the same everywhere at the
    start) updated in place on every rank.

    Rank 0 is the server: it has no gradient of its own (ignore ``gradient``
    there). Push: every worker (ranks 1..n-1) sends its ``gradient`` to the
    server. The server averages the n - 1 workers' gradients and takes the
    step weights -= lr * average. Pull: every worker receives the new
    weights from the server.

    Cost to reach: 2 (n - 1) messages of P values, all through the server's
    link: the server is the bottleneck lesson 7 measures. Use tags to keep
    pushes and pulls apart.
    """
    raise NotWrittenYet("write parameter_server_round: workers send, the server receives, "
                        "steps and sends back")
