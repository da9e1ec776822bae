"""The shared-memory transport's two shortcuts, checked against NumPy.

* Rendezvous (transport/cma.py): a message bigger than the ring is read
  straight out of the sender's memory, copied or combined block by block.
* Shared slots (transport/shared_slots.py, used by distributed/fast_paths.py):
  the one-shot all_reduce of small arrays without messages, and the fast
  lane that reaches it.

Each world size runs all its cases in one launch; each test also checks that
the shortcut really ran (so it cannot pass by taking the ordinary road).
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.distributed import fast_paths
from minidist.distributed.transport import cma, memcopy, shared_slots
from minidist.distributed.world import current

BIG = 5 << 20  # bytes: more than the 4 MiB ring of a small world

pytestmark = pytest.mark.timeout(180)


def _data(rank: int, count: int, dtype, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + salt)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(count).astype(dtype)
    return rng.integers(-1000, 1000, count).astype(dtype)


def _rendezvous_cases():
    rank, n = dist.get_rank(), dist.get_world_size()
    transport = current().transport
    checked = 0
    for dtype in (np.float32, np.float64, np.int64, np.float16):
        count = BIG // np.dtype(dtype).itemsize + 3  # not a multiple of the block
        mine = _data(rank, count, dtype)
        left, right = (rank - 1) % n, (rank + 1) % n
        theirs = _data(left, count, dtype)
        # recv into a buffer
        got = np.empty(count, dtype)
        send = dist.isend(mine, right)
        dist.recv(got, left)
        send.wait()
        assert np.array_equal(got, theirs), ("recv", dtype)
        # recv_reduce: combined block by block
        total = _data(rank, count, dtype, salt=7)
        expected = total + theirs
        send = dist.isend(mine, right)
        current().group.recv_reduce(total, left)
        send.wait()
        assert np.array_equal(total, expected), ("recv_reduce", dtype)
        # a strided buffer (received whole, then copied)
        wide = np.zeros((count, 2), dtype)
        send = dist.isend(mine, right)
        dist.recv(wide[:, 1], left)
        send.wait()
        assert np.array_equal(wide[:, 1], theirs) and not wide[:, 0].any()
        checked += 3
    # A receive posted late: the message waits in its slot, then is read.
    count = BIG // 4
    if rank == 0:
        dist.send(np.arange(count, dtype=np.float32), 1)
    elif rank == 1:
        import time

        time.sleep(0.2)
        got = current().group.recv_array(0)
        assert np.array_equal(got, np.arange(count, dtype=np.float32))
    # all_reduce whose chunks (count / n float64 each, about 10 MB) are rendezvous messages
    count = 3 * BIG // 4
    for algorithm in ("ring", "two_shot", "rabenseifner", "recursive_doubling"):
        x = _data(rank, count, np.float64, salt=3)
        expected = sum(_data(r, count, np.float64, salt=3) for r in range(n))
        dist.all_reduce(x, algorithm=algorithm)
        np.testing.assert_allclose(x, expected, rtol=1e-12, atol=1e-12)
        checked += 1
    return transport._cma is not None, checked


@pytest.mark.parametrize("cma_setting", ["on", "off"])
def test_big_messages_arrive_whole_with_and_without_rendezvous(monkeypatch, cma_setting):
    if cma_setting == "off":
        monkeypatch.setenv("MINIDIST_SHM_CMA", "0")
    elif not cma.available()[0]:
        pytest.skip(f"this machine does not allow process_vm_readv: {cma.available()[1]}")
    results = minidist.launch(_rendezvous_cases, world_size=3, transport="shm")
    for used_cma, checked in results:
        assert used_cma == (cma_setting == "on")
        assert checked == 16


def _offset_view(count: int, dtype, offset: int, fill) -> np.ndarray:
    """``count`` elements of ``dtype`` starting ``offset`` bytes into a fresh
    page-aligned allocation, filled from ``fill``."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.zeros(count * itemsize + offset + 2 * memcopy.PAGE, np.uint8)
    start = (-raw.ctypes.data) % memcopy.PAGE + offset
    view = raw[start:start + count * itemsize].view(dtype)
    view[:] = fill
    return view


def _page_distance_cases():
    """Messages whose source and destination sit at every byte distance that
    matters for memcopy (the slow band and its neighbours), through a single
    slot, several pieces and rendezvous: bit-exact, and the fast road taken."""
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    slow_copies = []
    plain = memcopy.copy

    def counting(dst, src, dst_address, src_address):
        slow_copies.append(memcopy.slow(dst_address, src_address))
        plain(dst, src, dst_address, src_address)

    memcopy.copy = counting
    checked = 0
    for nbytes in (96 << 10, 1 << 20, 6 << 20):  # one slot, pieces, rendezvous
        count = nbytes // 8
        for send_offset in (0, 16, 40):
            for recv_offset in (0, 8, 16, 24, 48, 64):
                values = _data(0, count, np.float64, salt=send_offset)
                if rank == 0:
                    dist.send(_offset_view(count, np.float64, send_offset, values), peer)
                    dist.send(_offset_view(count, np.float64, send_offset, values), peer)
                    dist.send(_offset_view(count * 8, np.uint8, send_offset + 3,
                                           values.view(np.uint8)), peer)
                else:
                    got = _offset_view(count, np.float64, recv_offset, 0.0)
                    dist.recv(got, peer)
                    assert np.array_equal(got, values), (nbytes, send_offset, recv_offset)
                    total = _offset_view(count, np.float64, recv_offset, 1.5)
                    current().group.recv_reduce(total, peer)
                    assert np.array_equal(total, values + 1.5), (nbytes, send_offset,
                                                                 recv_offset)
                    odd = _offset_view(count * 8, np.uint8, recv_offset + 1, 0)
                    dist.recv(odd, peer)
                    assert np.array_equal(odd, values.view(np.uint8)), (nbytes, recv_offset)
                    checked += 3
    memcopy.copy = plain
    return checked, sum(slow_copies)


def test_copies_at_slow_page_distances_are_exact_and_take_the_fast_road():
    results = minidist.launch(_page_distance_cases, world_size=2, transport="shm")
    checked, slow_copies = results[1]
    assert checked == 3 * 3 * 6 * 3
    # Some copies are in the slow band on both sides (a slot's payload starts
    # 0 or 64 bytes into a page; the arrays 0 to 67): they must have gone by
    # memcopy's road, so the exactness above covers it.
    assert slow_copies > 0 and results[0][1] > 0


def _slot_cases():
    rank, n = dist.get_rank(), dist.get_world_size()
    slots = current().transport.shared_slots
    counts = [1, 5, 1000, shared_slots.SLOT_BYTES // 4, shared_slots.SLOT_BYTES // 4 + 1]
    for dtype in (np.float32, np.float64, np.int32, np.float16):
        for count in counts:
            for op, reduce in ((dist.ReduceOp.SUM, np.add), (dist.ReduceOp.MAX, np.maximum)):
                arrays = [_data(r, count, dtype, salt=count) for r in range(n)]
                expected = arrays[0].copy()
                for other in arrays[1:]:  # rank order: the bits every rank must get
                    expected = reduce(expected, other)
                for _ in range(3):  # the first call opens the lane, the next ones take it
                    x = arrays[rank].copy()
                    dist.all_reduce(x, op=op, algorithm="one_shot")
                    assert x.tobytes() == expected.tobytes(), (dtype, count, op)
    x = np.full(8, float(rank), np.float64)
    dist.all_reduce(x, op=dist.ReduceOp.AVG, algorithm="one_shot")
    assert np.all(x == (n - 1) / 2)
    # auto picks the slots for small arrays on shm
    x = np.ones(16, np.float32)
    dist.all_reduce(x)
    assert np.all(x == n)
    # subgroups: the first ones get channels, later ones send messages; both work
    groups = [dist.new_group([0, 1]), dist.new_group(list(range(n))),
              dist.new_group([1, 2, 3]), dist.new_group([0, 3]), dist.new_group([0, 1, 2])]
    for group in groups:
        if rank in group.ranks:
            x = np.full(100, rank + 1, np.int64)
            dist.all_reduce(x, group=group, algorithm="one_shot")
            assert np.all(x == sum(r + 1 for r in group.ranks))
    # async: the same algorithm by messages, the same result
    x = np.full(10, rank + 1.0)
    dist.all_reduce(x, algorithm="one_shot", async_op=True).wait()
    assert np.all(x == n * (n + 1) / 2)
    return len(slots._last), len(fast_paths.LANES)


def test_one_shot_through_shared_slots_matches_rank_order_sums():
    results = minidist.launch(_slot_cases, world_size=4, transport="shm")
    for used_slots, lanes in results:
        assert used_slots > 0 and lanes > 0


def _mismatched_slot_counts():
    dist.all_reduce(np.ones(10 + dist.get_rank(), np.float32), algorithm="one_shot")


def test_one_shot_mismatch_is_reported_not_summed():
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(_mismatched_slot_counts, world_size=2, transport="shm", timeout=60)
    text = str(caught.value)
    assert "CollectiveMismatchError" in text and "one-shot all_reduce" in text
    assert "timed out" not in text


def test_rendezvous_errors_say_what_to_do():
    error = cma.ReadError(1, cma._explain(1, 1234))
    assert "MINIDIST_SHM_CMA=0" in str(error) and not error.gone
    assert cma.ReadError(3, cma._explain(3, 1234)).gone
