"""Exercise diloco_outer_step: DiLoCo's outer step after H inner steps.

Check it with `minidist exercise check diloco_outer_step diloco_outer_step.py`
(real processes, 2 and 3 ranks, three outer steps in a row).

Available: ``import minidist.distributed as dist``; ``dist.get_rank()``,
``dist.get_world_size()``, ``dist.all_reduce(array)`` (sums over the ranks,
in place). NumPy's in-place operators (``a *= 2``, ``a[...] = b``) change an
array the caller holds; ``a = a * 2`` makes a new one it never sees.
"""

import numpy as np  # noqa: F401

import minidist.distributed as dist  # noqa: F401
from minidist.exercises import NotWrittenYet


def diloco_outer_step(weights, last_sync, momentum, lr, mu):
    """One outer step of DiLoCo (Douillard et al., 2023); all three arrays
    (flat, float64, P values) updated in place, on every rank.

    ``last_sync``: theta, the weights of the last sync, the same on every
    rank. ``weights``: this rank's weights after its H inner steps (theta_r,
    different on every rank). ``momentum``: the outer optimizer's buffer,
    the same on every rank (zeros before the first outer step).

    1. the pseudo-gradient of this rank: theta - theta_r (last sync minus
       now: it points like a gradient);
    2. its mean g over the ranks;
    3. SGD with Nesterov momentum, as torch's ``SGD(nesterov=True)``:
       buf = mu * buf + g, update = g + mu * buf, and the new weights are
       theta - lr * update, taken from theta (not from theta_r);
    4. every rank ends with ``weights`` and ``last_sync`` both equal to the
       new weights, and ``momentum`` holding buf for the next outer step.

    Cost to reach: one all_reduce of P values per outer step, that is
    2 (n - 1) / n P values sent per rank on the ring once every H steps:
    DDP's bytes divided by H.
    """
    raise NotWrittenYet("write diloco_outer_step: the mean pseudo-gradient (one all_reduce), "
                        "then the outer Nesterov step from the last-sync weights")
