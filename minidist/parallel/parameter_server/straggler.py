"""Straggler injection: make chosen ranks k times slower, to watch everyone wait for them.

A synchronous step (data parallel with all-reduce or a coordinator, a
parameter server in BSP mode) cannot finish before the last worker has sent
its gradient. If one worker computes k times slower than the others (a busier
machine, a slower card, a thermally throttled chip), every worker's step lasts
as long as that one's: with per-rank compute times ``t_r`` and communication
time ``c``, a step costs

    max over r of t_r  +  c

and the fast ranks spend ``max t - t_r`` idle inside the collective. With n
workers the step pays for the *slowest* of n, so the more workers, the more
likely one of them is slow at any moment.

Emulating a k times slower worker without k times fewer cores: time the
rank's real compute, ``t``, then sleep ``(k - 1) t`` on the slow rank, so its
compute region lasts ``k t``. Sleeping uses no CPU, so the experiment runs on
a machine with fewer cores than workers::

    straggler = Straggler({1: 3.0})          # rank 1 is 3x slower, the rest normal
    for x, y in batches:
        optimizer.zero_grad()
        with straggler.compute("forward+backward"):
            loss = loss_fn(model(Tensor(x)), y)
            loss.backward()
        coordinated.step(batch_size=len(x))  # everyone waits here for rank 1

Wrap the compute that comes *before* the step's communication. DDP
all-reduces inside ``loss.backward()``, so with DDP wrap the forward pass
(and any other work before backward): the slow rank's gradients then leave
``(k - 1)`` forward-times late, and the others wait for them in the
all-reduce.

The trace shows it: the body is a compute region (``label``) and the added
delay a second compute region right after it, labelled
``straggler wait #factor=k compute_ns=t wait_ns=w``, on the slow rank only.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import time

import minidist.distributed as dist
from minidist import trace
from minidist.distributed.device_mesh import as_group


class Straggler:
    """``Straggler(slow_ranks={rank: factor, ...}, group=None)``: inside
    :meth:`compute`, each listed rank of ``group`` (the world by default)
    takes ``factor`` times as long as its body did; every other rank runs
    unchanged.

    A factor is a real number >= 1 (1 changes nothing). The same object is
    built on every rank, with the same mapping, as the rest of the program.
    """

    def __init__(self, slow_ranks: dict, group=None):
        if not isinstance(slow_ranks, dict):
            raise TypeError("Straggler needs a dict {rank: slowdown factor}, e.g. {1: 3.0}, "
                            f"got {type(slow_ranks).__name__}")
        group = as_group(group, "Straggler")
        self.rank = dist.get_rank() if group is None else group.rank
        world_size = dist.get_world_size() if group is None else group.size
        for rank, factor in slow_ranks.items():
            if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) \
                    or not 0 <= rank < world_size:
                raise ValueError(f"rank {self.rank}: Straggler got slow rank {rank!r}, but the "
                                 f"ranks are 0..{world_size - 1}")
            if isinstance(factor, bool) or not isinstance(factor, numbers.Real) \
                    or not math.isfinite(factor) or factor < 1:
                raise ValueError(f"rank {self.rank}: Straggler factor {factor!r} for rank "
                                 f"{rank} is not a finite number >= 1 (3.0 means three times "
                                 "slower; 1 means normal speed)")
        self.slow_ranks = {int(rank): float(factor) for rank, factor in slow_ranks.items()}
        self.factor = self.slow_ranks.get(self.rank, 1.0)

    @property
    def is_slow(self) -> bool:
        return self.factor > 1.0

    @contextlib.contextmanager
    def compute(self, label: str | None = "compute"):
        """Run the body; on a slow rank, then wait ``(factor - 1)`` times as
        long as the body took. Traces the body as a compute region named
        ``label`` (None: not traced, e.g. when already inside a region) and
        the added wait as ``straggler wait``."""
        start = trace.now()
        yield self
        end = trace.now()
        if label is not None:
            trace.record("compute", start, end, label=label)
        if not self.is_slow:
            return
        wait_ns = int((self.factor - 1.0) * (end - start))
        deadline = end + wait_ns
        # sleep() may return early on a signal; the loop makes the delay a lower bound.
        while (remaining := deadline - trace.now()) > 0:
            time.sleep(remaining / 1e9)
        trace.record("compute", end, trace.now(),
                     label=trace.with_info("straggler wait", factor=self.factor,
                                           compute_ns=end - start, wait_ns=wait_ns))
