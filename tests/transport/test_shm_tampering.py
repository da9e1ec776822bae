"""Another process of the same user can always break a run by writing over
its shared memory; the launcher must survive it, to report and to clean up.
glibc aborts a process that posts to a semaphore whose settings are garbage,
and the launcher posts to every rank's doorbell to stop a run: it checks
them first (transport/doorbell.py)."""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.distributed import world


def _garbage_over_the_doorbells():
    x = np.zeros(4)
    if dist.get_rank() == 1:
        dist.recv(x, src=0)   # asleep on its doorbell
        return "received"
    time.sleep(0.5)
    for sem in world.current().transport._doorbells._sems:
        ctypes.memmove(sem.value, b"\x41" * 32, 32)
    raise RuntimeError("rank 0 wrote garbage over the doorbells")


@pytest.mark.timeout(60)
def test_the_launcher_survives_garbage_over_the_doorbells():
    before = set(os.listdir("/dev/shm"))
    started = time.monotonic()
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(_garbage_over_the_doorbells, world_size=2, transport="shm", timeout=10)
    assert str(caught.value).splitlines()[0].startswith(
        "rank 0 failed with RuntimeError: rank 0 wrote garbage over the doorbells")
    assert time.monotonic() - started < 10
    assert not {name for name in set(os.listdir("/dev/shm")) - before
                if name.startswith(f"minidist_{os.getpid()}_")}
