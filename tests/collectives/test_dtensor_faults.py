"""A rank that fails in the middle of a redistribute ends every rank at once.

A redistribute of a DTensor on a 2 x 2 mesh from (Shard(0), Shard(0)) to
(Shard(1), Replicate()) runs several collectives in turn (the inner cut
gathered, then the outer, then cut again). Rank 1 raises between two of
them, while the other ranks already wait in the next one: the launch must
end within seconds (not the timeout), its error's first line naming rank 1,
on pipe and shm, and no shared-memory segment left behind.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor
from minidist.runtime.errors import WorkerError

TIMEOUT = 60
NAMED_WITHIN = 15.0


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"minidist_{os.getpid()}_")}


def _worker():
    from minidist.distributed.tensor import (
        Replicate,
        Shard,
        distribute_tensor,
        init_device_mesh,
        plan,
    )
    from minidist.distributed.tensor import redistribute as steps

    mesh = init_device_mesh("cpu", (2, 2))
    x = distribute_tensor(Tensor(np.arange(48.0).reshape(8, 6)), mesh, [Shard(0), Shard(0)])
    target = [Shard(1), Replicate()]
    assert len(plan(x, target).steps) >= 3, plan(x, target)
    gather = steps._gather
    calls = []

    def gather_then_fail(*args):
        calls.append(1)
        if dist.get_rank() == 1 and len(calls) == 2:
            raise RuntimeError("rank 1 fails between two steps of a redistribute")
        return gather(*args)

    steps._gather = gather_then_fail
    x.redistribute(mesh, target)
    return "finished"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["pipe", "shm"])
def test_a_rank_failing_inside_a_redistribute_is_named_at_once(transport):
    before = _segments()
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        minidist.launch(_worker, world_size=4, transport=transport, timeout=TIMEOUT)
    took = time.monotonic() - start
    first = str(caught.value).splitlines()[0]
    assert first.startswith("rank 1 "), first
    assert "redistribute" in str(caught.value)
    assert took < NAMED_WITHIN, f"named after {took:.1f} s (the timeout is {TIMEOUT} s)"
    assert _segments() <= before
