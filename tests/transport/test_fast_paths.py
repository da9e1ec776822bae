"""The fast paths (minidist/distributed/fast_paths.py) change speed, never bits.

Each transport runs the same all_reduces, sends and receives twice in one
launch, with the fast paths on and then switched off inside the workers,
and compares the bytes; counters on the transport's shortcuts show that
"on" took them (on shm) and "off" took none. The transport's own shortcuts
(spinning, rendezvous through CMA) are chosen when it connects: a second
pair of launches, one with the fast paths on and one with them off from the
start, compares the bytes of the same traffic plus messages bigger than the
ring, and shows that "off" has neither a spinning wait nor a rendezvous read.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.distributed import fast_paths
from minidist.distributed.transport import cma
from minidist.distributed.transport.spin import SpinBeforeSleep
from minidist.distributed.world import current

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _data(rank: int, count: int, dtype, salt: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + salt)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(count).astype(dtype)
    return rng.integers(-1000, 1000, count).astype(dtype)


def _cases() -> list[bytes]:
    """Every result this rank gets, as bytes, in a fixed order."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    for dtype in (np.float32, np.float64, np.int32):
        for count in (1, 7, 1000, 5000, 20000):  # the last is too big for a slot
            for algorithm in ("one_shot", "ring", "recursive_doubling", "auto"):
                for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                    for _ in range(3):  # the first one-shot call opens the lane
                        x = _data(rank, count, dtype, count)
                        dist.all_reduce(x, op=op, algorithm=algorithm)
                        out.append(x.tobytes())
    x = _data(rank, 100, np.float64, 1)
    dist.all_reduce(x, op=dist.ReduceOp.AVG, algorithm="one_shot")
    out.append(x.tobytes())
    group = dist.new_group([0, 1])
    if rank in group.ranks:
        x = _data(rank, 64, np.float32, 2)
        dist.all_reduce(x, group=group, algorithm="one_shot")
        out.append(x.tobytes())
    # point to point around the ring: send, isend, recv, recv_reduce
    right, left = (rank + 1) % n, (rank - 1) % n
    for count in (0, 3, 1024, 100_000):
        mine = _data(rank, count, np.float32, 3)
        got = np.empty(count, np.float32)
        if rank % 2 == 0:
            dist.send(mine, right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(mine, right)
        out.append(got.tobytes())
        total = _data(rank, count, np.float32, 4)
        request = dist.isend(mine, right)
        current().group.recv_reduce(total, left)
        request.wait()
        out.append(total.tobytes())
    # A message that is there before its receive starts (sent, then a pause):
    # the receive's shortcut takes it even where nothing spins (more ranks
    # than cores). Without these, whether one of the receives above found its
    # message waiting was up to the scheduler (none did in 1 run of 3).
    for pause in (0.01, 0.03, 0.1):
        mine = _data(rank, 5, np.float32, 5)
        got = np.empty(5, np.float32)
        request = dist.isend(mine, right)
        time.sleep(pause)
        dist.recv(got, left)
        request.wait()
        out.append(got.tobytes())
    return out


def _big_cases() -> list[bytes]:
    """Messages bigger than a small world's ring (4 MiB): by rendezvous when
    the fast paths are on and CMA is available, through the ring otherwise."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    out = []
    for dtype in (np.float32, np.float64):
        count = (5 << 20) // np.dtype(dtype).itemsize + 3
        mine = _data(rank, count, dtype, 6)
        got = np.empty(count, dtype)
        request = dist.isend(mine, right)
        dist.recv(got, left)
        request.wait()
        out.append(got.tobytes())
        total = _data(rank, count, dtype, 7)
        request = dist.isend(mine, right)
        current().group.recv_reduce(total, left)
        request.wait()
        out.append(total.tobytes())
    return out


def _what_the_transport_did():
    """The bytes of every case; whether the transport can spin (its class has
    the spinning wait, and a spin time: spinning itself is not counted, as
    that would cost every wait); and how often it read a peer's memory
    (counted on the reader; a transport without one has nothing to count)."""
    transport = current().transport
    reads = 0
    reader = getattr(transport, "_cma", None)
    if reader is not None:
        read = reader.read

        def counted_read(*args):
            nonlocal reads
            reads += 1
            return read(*args)

        reader.read = counted_read
    out = _cases() + _big_cases()
    spins = isinstance(transport, SpinBeforeSleep) and transport._spin_ns > 0
    return out, spins, reads, type(transport).__name__


@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_off_from_the_start_no_rendezvous_and_no_spinning_and_the_same_bits(transport,
                                                                             monkeypatch):
    # Spin even where ranks outnumber cores (the knob of its own), so that
    # "on" surely spins and "off" shows that the switch beats the knob.
    monkeypatch.setenv("MINIDIST_SPIN_US", "50")
    on = minidist.launch(_what_the_transport_did, world_size=2, transport=transport)
    with fast_paths.disabled():  # as MINIDIST_FAST_PATHS=0: the forked workers start off
        off = minidist.launch(_what_the_transport_did, world_size=2, transport=transport)
    plain = {"shm": "ShmTransport", "pipe": "PipeTransport"}[transport]
    for rank, (with_them, without) in enumerate(zip(on, off)):
        bytes_on, spins_on, reads_on, class_on = with_them
        bytes_off, spins_off, reads_off, class_off = without
        assert bytes_on == bytes_off, rank
        assert len(bytes_on) > 300
        assert class_off == plain and not spins_off and reads_off == 0, without[1:]
        assert class_on != plain and spins_on, with_them[1:]
        if transport == "shm" and cma.available()[0]:
            assert reads_on > 0, with_them[1:]


def _on_and_off():
    transport = current().transport
    taken = {"send_small": 0, "recv_small": 0, "publish": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            result = function(*args, **kwargs)
            if result is not False:
                taken[name] += 1
            return result
        return wrapper

    transport.send_small = counting("send_small", transport.send_small)
    transport.recv_small = counting("recv_small", transport.recv_small)
    if transport.shared_slots is not None:
        slots = transport.shared_slots
        slots.publish = counting("publish", slots.publish)
    assert fast_paths.enabled()
    on = _cases()
    taken_on = dict(taken)
    taken.update(dict.fromkeys(taken, 0))
    dist.barrier()
    with fast_paths.disabled():
        assert not fast_paths.LANES
        off = _cases()
        lanes_off = len(fast_paths.LANES)
    assert fast_paths.enabled()
    return on == off, len(on), taken_on, dict(taken), lanes_off


@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_fast_paths_on_and_off_give_the_same_bits(transport):
    results = minidist.launch(_on_and_off, world_size=3, transport=transport)
    for rank, (same, cases, taken_on, taken_off, lanes_off) in enumerate(results):
        assert same, rank
        assert cases > 300
        assert taken_off == {"send_small": 0, "recv_small": 0, "publish": 0}, rank
        assert lanes_off == 0
        if transport == "shm":  # the shortcuts ran when on
            assert taken_on["send_small"] > 0 and taken_on["recv_small"] > 0, taken_on
            assert taken_on["publish"] > 0, taken_on


def test_the_environment_switch_is_read_at_import():
    code = "from minidist.distributed import fast_paths; print(fast_paths.enabled())"
    for value, expected in (("0", "False"), ("1", "True"), (None, "True")):
        env = dict(os.environ, PYTHONPATH=ROOT)
        env.pop("MINIDIST_FAST_PATHS", None)
        if value is not None:
            env["MINIDIST_FAST_PATHS"] = value
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                text=True, timeout=60, check=True)
        assert result.stdout.strip() == expected, value


def test_enabled_says_the_setting_before_and_disabled_restores_it():
    assert fast_paths.enabled()
    with fast_paths.disabled():
        assert not fast_paths.enabled()
        assert fast_paths.enabled(True) is False
        assert fast_paths.enabled()
        fast_paths.enabled(False)
    assert fast_paths.enabled()
