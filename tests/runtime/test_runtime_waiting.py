"""Waiting costs no CPU, many ranks on few cores do not starve each other, and
the shared-memory geometry adapts to the number of ranks."""

from __future__ import annotations

import time

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.distributed.transport import default_spin_ns, shm_rings


def idle_wait_cpu_seconds():
    """Every rank but 0 waits ~1 s for rank 0; returns the CPU time the wait cost."""
    rank = dist.get_rank()
    dist.barrier()
    if rank == 0:
        time.sleep(1.0)
        for peer in range(1, dist.get_world_size()):
            dist.send(np.zeros(1), peer)
        return 0.0
    before = time.process_time()
    dist.recv(np.zeros(1), 0)
    return time.process_time() - before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
@pytest.mark.parametrize("world_size", [2, 8])
def test_a_blocked_rank_sleeps_instead_of_spinning(transport, world_size):
    cpu = minidist.launch(idle_wait_cpu_seconds, world_size=world_size, transport=transport)
    assert max(cpu) < 0.25, f"waiting ranks burned CPU: {cpu}"


def ring_many_times(rounds):
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    token = np.zeros(16, np.int64)
    for step in range(rounds):
        if rank == 0:
            token += 1
            dist.send(token, right, tag=step % 7)
            dist.recv(token, left, tag=step % 7)
        else:
            dist.recv(token, left, tag=step % 7)
            token += 1
            dist.send(token, right, tag=step % 7)
    return int(token[0])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_eight_ranks_on_few_cores_pass_a_token_many_times(transport):
    rounds = 300
    results = minidist.launch(ring_many_times, world_size=8, transport=transport, args=(rounds,))
    assert results[0] == 8 * rounds


def test_spinning_only_when_every_rank_has_a_core(monkeypatch):
    monkeypatch.delenv("MINIDIST_SPIN_US", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert default_spin_ns(2) > 0 and default_spin_ns(3) == 0
    monkeypatch.setenv("MINIDIST_SPIN_US", "0")
    assert default_spin_ns(2) == 0


def test_ring_geometry_shrinks_with_many_ranks_and_little_shared_memory(monkeypatch):
    monkeypatch.delenv("MINIDIST_SHM_SLOT_BYTES", raising=False)
    monkeypatch.delenv("MINIDIST_SHM_SLOTS", raising=False)

    class Usage:
        free = 64 << 30

    monkeypatch.setattr(shm_rings, "free_bytes", lambda path: Usage.free)
    slots, slot_bytes = shm_rings.choose_geometry(2)
    assert slots == shm_rings.DEFAULT_SLOTS and slot_bytes == shm_rings.MAX_SLOT_BYTES
    slots, slot_bytes = shm_rings.choose_geometry(64)
    assert 64 * 63 * slots * slot_bytes <= shm_rings.MAX_RING_MEMORY
    Usage.free = 64 << 20  # a container's default /dev/shm
    slots, slot_bytes = shm_rings.choose_geometry(4)
    assert slot_bytes == shm_rings.MIN_SLOT_BYTES or 4 * 3 * slots * slot_bytes <= 32 << 20
