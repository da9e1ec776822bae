"""GPU arrays are staged through host memory by the public calls
(minidist/distributed/device_arrays.py). Checked here without a GPU: a
stand-in array class whose module is named like CuPy's holds its data out of
NumPy's reach (get() copies it out, set() copies it in), as CuPy's do; the
workers install the staging as ``backend.use("cupy")`` does. The real thing
runs in tests/gpu on a machine with a GPU."""

from __future__ import annotations

import sys

import numpy as np

import minidist
import minidist.distributed as dist


class FakeDeviceArray:
    """What the staging uses of a CuPy array: get, set, flags, shape, dtype."""

    def __init__(self, values):
        self._values = np.array(values)
        self.copies = 0

    def get(self):
        self.copies += 1
        return self._values.copy()

    def set(self, host):
        self.copies += 1
        self._values[...] = host

    @property
    def flags(self):
        return self._values.flags

    shape = property(lambda self: self._values.shape)
    dtype = property(lambda self: self._values.dtype)


FakeDeviceArray.__module__ = "cupy_stand_in"


def _ranks():
    from minidist.distributed import device_arrays

    # What backend.use("cupy") does on a machine with CuPy (this worker only).
    device_arrays.install(sys.modules["minidist.distributed"])
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    x = FakeDeviceArray(np.arange(4.0) + rank)
    dist.all_reduce(x)
    out["all_reduce"] = (x._values.tolist(), x.copies)  # one copy out, one back
    x = FakeDeviceArray(np.full(3, float(rank)))
    work = dist.all_reduce(x, async_op=True)
    before = x._values.tolist()  # not yet written back
    work.wait()
    out["async"] = (before, x._values.tolist())
    source = FakeDeviceArray(np.full(2, 10.0 + rank))
    dist.send(source, dst=(rank + 1) % n) if rank == 0 else None
    if rank == 1:
        into = FakeDeviceArray(np.zeros(2))
        request = dist.irecv(into, src=0)
        request.wait()
        out["irecv"] = into._values.tolist()
    out["send copies"] = source.copies  # a send reads its array: nothing written back
    parts = [FakeDeviceArray(np.zeros(2)) for _ in range(n)]
    dist.all_gather(parts, FakeDeviceArray(np.full(2, float(rank))))
    out["all_gather"] = [p._values.tolist() for p in parts]
    return out


def test_public_calls_stage_device_arrays_through_host_memory():
    first, second = minidist.launch(_ranks, world_size=2, transport="pipe")
    assert first["all_reduce"] == ([1.0, 3.0, 5.0, 7.0], 2)
    assert first["async"] == ([0.0] * 3, [1.0] * 3)
    assert second["irecv"] == [10.0, 10.0]
    assert first["send copies"] == 1
    assert first["all_gather"] == second["all_gather"] == [[0.0, 0.0], [1.0, 1.0]]


def test_numpy_arrays_go_straight_through():
    from minidist.distributed import device_arrays

    calls = []

    def all_reduce(tensor, op=None, group=None, async_op=False, algorithm="auto"):
        calls.append(tensor)

    wrapped = device_arrays.staged(all_reduce)
    array = np.ones(3)
    wrapped(array)
    assert calls[0] is array  # no copy of a host array
