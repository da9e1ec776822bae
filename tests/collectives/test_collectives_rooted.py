"""broadcast, reduce, scatter, gather and barrier: every algorithm, on real processes.

One launch per (world size, transport) runs every case (collective x
algorithm x size x dtype x root) inside the workers; the parent checks each
result against NumPy. Traced runs check that every algorithm sends exactly the
messages and bytes :data:`minidist.costmodel.TRAFFIC` says. The rest covers
async handles, bad input and that a barrier really holds everyone back.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import costmodel, trace
from minidist.distributed.collectives import trees
from minidist.distributed.collectives.call import ALGORITHMS

WORLD_SIZES = (1, 2, 3, 4, 5, 8)
DTYPES = ("float16", "float32", "float64", "int32", "int64")
MIB_FLOATS = (1 << 20) // 4
ROOTED = ("broadcast", "reduce", "scatter", "gather")


def _sizes(world_size: int) -> list[int]:
    # 0, 1, fewer elements than ranks, not divisible by the world
    return sorted({0, 1, max(world_size - 1, 1), 7 * world_size + 3})


def _roots(world_size: int) -> list[int]:
    return sorted({0, world_size - 1, world_size // 2})


def _input(rank: int, size: int, dtype: str, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([rank, size, len(dtype), salt])
    values = rng.integers(-50, 50, size) if dtype.startswith("int") else \
        rng.standard_normal(size) * 4
    return values.astype(dtype)


def _garbage(size: int, dtype: str) -> np.ndarray:
    return np.full(size, 99, dtype)


def _cases(world_size: int):
    for collective in ROOTED:
        for algorithm in ALGORITHMS[collective]:
            for root in _roots(world_size):
                for size in _sizes(world_size):
                    for dtype in DTYPES:
                        yield collective, algorithm, root, size, dtype
                yield collective, algorithm, root, MIB_FLOATS, "float32"


def _digest(array) -> str:
    return hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()


def _compact(array, size):
    """Large results travel back as a digest (exact checks) to keep the pipes light."""
    return _digest(array) if size >= MIB_FLOATS else array


def _run_case(collective, algorithm, root, size, dtype):
    rank, n = dist.get_rank(), dist.get_world_size()
    salt = ROOTED.index(collective)
    if collective == "broadcast":
        array = _input(root, size, dtype, salt) if rank == root else _garbage(size, dtype)
        dist.broadcast(array, src=root, algorithm=algorithm)
        return _compact(array, size)
    if collective == "reduce":
        array = _input(rank, size, dtype, salt)
        dist.reduce(array, dst=root, algorithm=algorithm)
        if rank == root:
            return array
        return _compact(array, size)  # must still be the input
    if collective == "scatter":
        pieces = [_input(r, size, dtype, salt + root) for r in range(n)] if rank == root else None
        array = _garbage(size, dtype)
        dist.scatter(array, pieces, src=root, algorithm=algorithm)
        return _compact(array, size)
    pieces = [_garbage(size, dtype) for _ in range(n)] if rank == root else None
    dist.gather(_input(rank, size, dtype, salt), pieces, dst=root, algorithm=algorithm)
    return None if pieces is None else [_compact(piece, size) for piece in pieces]


def _run_all_cases():
    return [_run_case(*case) for case in _cases(dist.get_world_size())]


def _assert_exact(got, expected, case):
    if isinstance(got, str):
        assert got == _digest(expected), f"{case}: wrong result (digest differs)"
    else:
        assert got.dtype == expected.dtype, case
        np.testing.assert_array_equal(got, expected, err_msg=case)


def _check_case(results, index, world_size, collective, algorithm, root, size, dtype):
    case = f"{collective} {algorithm} n={world_size} root={root} size={size} {dtype}"
    salt = ROOTED.index(collective)
    for rank in range(world_size):
        got = results[rank][index]
        where = f"{case}, rank {rank}"
        if collective == "broadcast":
            _assert_exact(got, _input(root, size, dtype, salt), where)
        elif collective == "scatter":
            _assert_exact(got, _input(rank, size, dtype, salt + root), where)
        elif collective == "gather":
            if rank != root:
                assert got is None, where
                continue
            assert len(got) == world_size, where
            for source in range(world_size):
                _assert_exact(got[source], _input(source, size, dtype, salt),
                              f"{where}, piece of rank {source}")
        elif rank != root:
            _assert_exact(got, _input(rank, size, dtype, salt), f"{where} (input changed)")
        else:
            inputs = [_input(r, size, dtype, salt).astype(np.float64) for r in range(world_size)]
            expected = np.sum(inputs, axis=0)
            assert got.dtype == np.dtype(dtype), where
            if dtype.startswith("int"):
                np.testing.assert_array_equal(got, expected, err_msg=where)
            else:
                tolerance = {"float16": 5e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
                np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tolerance,
                                           atol=tolerance * 4 * world_size, err_msg=where)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_rooted_algorithm_matches_numpy(world_size, transport):
    results = minidist.launch(_run_all_cases, world_size=world_size, transport=transport,
                              timeout=120)
    for index, case in enumerate(_cases(world_size)):
        _check_case(results, index, world_size, *case)


# --------------------------------------------------------------------------- traffic


def _traffic_calls(world_size: int):
    chain_sized = 150_000  # float32: 600 kB, three segments of the chain
    for collective in ROOTED:
        for algorithm in ALGORITHMS[collective]:
            for root in sorted({0, 1, world_size - 1}):
                for size, dtype in ((0, "float32"), (3, "int64"), (37, "float16"),
                                    (chain_sized, "float32")):
                    yield collective, algorithm, root, size, dtype
    for algorithm in ALGORITHMS["all_reduce"]:
        for size, dtype in ((0, "float32"), (3, "int64"), (37, "float16")):
            yield "all_reduce", algorithm, 0, size, dtype
    for algorithm in ALGORITHMS["barrier"]:
        yield "barrier", algorithm, 0, 0, "uint8"


def _traced_worker():
    n = dist.get_world_size()
    calls = list(_traffic_calls(n))
    for collective, algorithm, root, size, dtype in calls:
        if collective == "all_reduce":
            dist.all_reduce(np.ones(size, dtype), algorithm=algorithm)
        elif collective == "barrier":
            dist.barrier(algorithm=algorithm)
        else:
            _run_case(collective, algorithm, root, size, dtype)
    return len(calls)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size, transport", [(5, "shm"), (4, "pipe"), (3, "shm")])
def test_traced_messages_and_bytes_equal_the_traffic_table(tmp_path, world_size, transport):
    path = tmp_path / "rooted.trace.jsonl"
    calls = list(_traffic_calls(world_size))
    assert len(calls) < 256  # call numbers in the tag wrap at 256
    assert minidist.launch(_traced_worker, world_size=world_size, transport=transport,
                           trace=str(path)) == [len(calls)] * world_size
    sends = [event for event in trace.read_jsonl(path).events if event["kind"] == "send"]
    for number, (collective, algorithm, root, size, dtype) in enumerate(calls):
        prefix = f"{collective} {algorithm}:"
        mine = [event for event in sends
                if event["tag"] >> 23 == number and event["label"].startswith(prefix)]
        expected = costmodel.TRAFFIC[collective][algorithm](
            world_size, size, np.dtype(dtype).itemsize, root=root)
        got = (len(mine), sum(event["bytes"] for event in mine))
        assert got == expected, (f"{collective} {algorithm} n={world_size} root={root} "
                                 f"size={size} {dtype}: traced (messages, bytes) {got}, "
                                 f"TRAFFIC says {expected}")


def test_every_algorithm_has_a_formula_and_a_traffic_entry():
    for collective in ROOTED + ("all_reduce", "barrier"):
        assert set(costmodel.FORMULAS[collective]) == set(ALGORITHMS[collective]), collective
        assert set(costmodel.TRAFFIC[collective]) == set(ALGORITHMS[collective]), collective
        for algorithm in ALGORITHMS[collective]:
            assert costmodel.TRAFFIC[collective][algorithm](1, 10, 4) == (0, 0)  # one rank
            for n in (2, 5, 8):
                assert costmodel.predict(collective, algorithm, n, 1 << 20) > 0


def test_scatter_and_gather_formulas_follow_the_docstrings():
    params = costmodel.Params(alpha=1.0, beta=1.0, gamma=1.0)
    # 8 ranks, N = 8 bytes: binomial 3 alpha + 7 beta; linear 7 (alpha + beta)
    assert costmodel.predict("scatter", "binomial", 8, 8, params) == 3 + 7
    assert costmodel.predict("gather", "linear", 8, 8, params) == 7 * 2
    assert costmodel.predict("barrier", "tree", 5, 0, params) == 6
    assert costmodel.predict("barrier", "dissemination", 5, 0, params) == 3
    # chain: one segment below 256 KiB, so n - 1 full messages
    assert costmodel.predict("broadcast", "chain", 4, 100, params) == 3 * (1 + 100)
    assert costmodel.best("scatter", 8, 1 << 20) == "binomial"


@pytest.mark.parametrize("n", range(1, 18))
def test_binomial_subtrees_are_ranges_that_cover_every_rank_once(n):
    for virtual in range(n):
        owned = [virtual]
        for child in trees.children(virtual, n):
            assert trees.parent(child) == virtual
            owned += range(child, child + trees.subtree_size(child, n))
        assert sorted(owned) == list(range(virtual, virtual + trees.subtree_size(virtual, n)))
    assert max((trees.round_of(v) for v in range(1, n)), default=-1) + 1 == (n - 1).bit_length()


# --------------------------------------------------------------------------- async, shapes


def _async_and_shapes():
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    x = np.full(1000, float(rank))
    work = dist.broadcast(x, src=2, algorithm="scatter_allgather", async_op=True)
    while not work.test():
        pass
    out["broadcast"] = x[0]
    y = np.full(10, rank + 1, np.int64)
    work = dist.reduce(y, dst=1, algorithm="rabenseifner", async_op=True)
    pieces = [np.full((2, 3), 10 * r, np.float32) for r in range(n)] if rank == 0 else None
    matrix = np.zeros((2, 6), np.float32)
    scattered = dist.scatter(matrix[:, ::2], pieces, src=0, algorithm="binomial",
                             async_op=True)  # a strided view
    gathered = [np.zeros((), np.int32) for _ in range(n)] if rank == 3 else None
    gather_work = dist.gather(np.array(rank * 7, np.int32), gathered, dst=3, async_op=True)
    barrier_work = dist.barrier(algorithm="tree", async_op=True)
    for handle in (work, scattered, gather_work, barrier_work):
        assert handle.wait() is True
    out["reduce"] = int(y[0])
    out["scatter"] = matrix.copy()
    out["gather"] = None if gathered is None else [int(value) for value in gathered]
    tensor = minidist.Tensor(np.full(3, float(rank)))
    dist.broadcast(tensor, src=1, algorithm="chain")
    out["tensor"] = tensor.data[0]
    assert dist.scatter(np.empty(0), [np.empty(0)] * n if rank == 0 else None) is None
    assert dist.barrier() is None
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_async_op_strided_views_scalars_and_tensors(transport):
    results = minidist.launch(_async_and_shapes, world_size=5, transport=transport)
    for rank, out in enumerate(results):
        assert out["broadcast"] == 2.0 and out["tensor"] == 1.0
        assert out["reduce"] == (15 if rank == 1 else rank + 1)
        assert (out["scatter"][:, ::2] == 10 * rank).all()
        assert (out["scatter"][:, 1::2] == 0).all()  # the columns outside the view untouched
        assert out["gather"] == ([0, 7, 14, 21, 28] if rank == 3 else None)


# --------------------------------------------------------------------------- bad input


def _bad_inputs():
    """Each bad call fails on its own rank before any message moves, so the
    others skip it and the group stays in step; returns the messages."""
    rank = dist.get_rank()
    x = np.ones(4, np.float32)
    messages = []

    def expect_error(call):
        try:
            call()
        except (ValueError, TypeError) as error:
            messages.append(f"{type(error).__name__}: {error}")
        else:
            messages.append("no error")

    for call in (lambda: dist.scatter(x, None, src=3), lambda: dist.gather(x, None, dst=-1),
                 lambda: dist.reduce(x, dst=2), lambda: dist.broadcast(x, src=1.0),
                 lambda: dist.barrier(algorithm="bogus")):
        expect_error(call)
    if rank == 0:
        expect_error(lambda: dist.scatter(x, [x, x, x], src=0))
        expect_error(lambda: dist.scatter(x, [x, np.ones(5, np.float32)], src=0))
        expect_error(lambda: dist.scatter(x, [x, np.ones(4, np.float64)], src=0))
        expect_error(lambda: dist.scatter(x, x, src=0))
        expect_error(lambda: dist.gather(x, [x], dst=0))
        expect_error(lambda: dist.gather(x, [x, np.ones((2, 2), np.float32)], dst=0))
    else:
        expect_error(lambda: dist.scatter(x, [x, x], src=0))
        expect_error(lambda: dist.gather(x, [x, x], dst=0))
    pieces = [np.full(4, 5.0, np.float32)] * 2 if rank == 0 else None
    dist.scatter(x, pieces, src=0)  # the group is still in step
    return messages, float(x[0])


@pytest.mark.timeout(60)
def test_bad_input_is_named_on_the_rank_that_made_it():
    (root, root_value), (other, other_value) = minidist.launch(
        _bad_inputs, world_size=2, transport="pipe", timeout=30)
    assert root_value == other_value == 5.0
    for messages in (root, other):
        assert "src=3 is out of range; the group has ranks 0..1" in messages[0]
        assert "dst=-1 is out of range" in messages[1]
        assert "dst=2 is out of range" in messages[2]
        assert "src must be an int" in messages[3]
        assert "barrier has no algorithm 'bogus'; choose one of ['dissemination'" in messages[4]
    assert ("rank 0: scatter on the source rank (src=0) needs scatter_list to hold one array "
            "per rank of the group, 2, got 3") in root[5]
    assert ("rank 0: scatter on the source rank (src=0) needs every array of scatter_list shaped "
            "like tensor ((4,) float32), but scatter_list[1] is (5,) float32") in root[6]
    assert "scatter_list[1] is (4,) float64" in root[7]
    assert "TypeError: rank 0: scatter on the source rank (src=0) needs scatter_list" in root[8]
    assert ("rank 0: gather on the destination rank needs gather_list to hold one array per "
            "rank of the group, 2, got 1") in root[9]
    assert "gather_list[1] is (2, 2) float32" in root[10]
    assert "rank 1: scatter_list is only read on the source rank (src=0); pass None" in other[5]
    assert "rank 1: gather_list is only written on the destination rank (dst=0)" in other[6]


# --------------------------------------------------------------------------- barrier


def _late_arrival(late_rank, algorithm):
    rank = dist.get_rank()
    dist.barrier(algorithm=algorithm)  # everyone is running before the clock starts
    if rank == late_rank:
        time.sleep(0.3)
    entered = time.monotonic()
    dist.barrier(algorithm=algorithm)
    left = time.monotonic()
    return entered, left


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algorithm", ["dissemination", "tree"])
@pytest.mark.parametrize("world_size, late_rank", [(5, 0), (5, 4), (4, 2)])
def test_no_rank_leaves_the_barrier_before_the_last_one_enters(algorithm, world_size,
                                                               late_rank):
    # CLOCK_MONOTONIC is one counter for the whole machine, so the ranks' times
    # compare directly. An ordering check: how long anything took is not tested.
    times = minidist.launch(_late_arrival, world_size=world_size, transport="shm",
                            args=(late_rank, algorithm))
    last_entry = max(entered for entered, _ in times)
    for rank, (_, left) in enumerate(times):
        assert left >= last_entry, f"rank {rank} left the {algorithm} barrier early"


def _barrier_with_a_missing_rank():
    if dist.get_rank() == 0:
        dist.barrier(timeout=0.5)
    else:
        time.sleep(10)


@pytest.mark.timeout(60)
def test_barrier_timeout_is_honoured():
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(_barrier_with_a_missing_rank, world_size=2, transport="shm",
                        timeout=30)
    assert caught.value.rank == 0 and "timed out after 0.5 s" in str(caught.value)


def _scatter_meets_gather():
    x = np.ones(6, np.float32)
    if dist.get_rank() == 1:  # waits for pieces, and receives rank 0's scatter message
        dist.gather(x, [x.copy() for _ in range(2)], dst=1, algorithm="linear")
    else:
        dist.scatter(x, [x, x], src=0, algorithm="linear")


@pytest.mark.timeout(60)
def test_mismatched_rooted_calls_fail_at_once_naming_both():
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(_scatter_meets_gather, world_size=2, transport="shm", timeout=60)
    text = str(caught.value)
    assert "CollectiveMismatchError" in text and "timed out" not in text
    assert ("rank 1 is in gather (linear, float32, dst=1), call 0, but rank 0 sent it a "
            "message of scatter (linear, float32, src=0), call 0") in text


def _roots_disagree(collective, algorithm):
    """Rank 1 says the root is rank 1, ranks 0 and 2 say rank 0.
    A broadcast or scatter then completes on every rank, each root's
    messages left unread by the other side: before the fix it returned
    [0, 10, 0]."""
    rank = dist.get_rank()
    root = rank % 2
    x = np.full(3, 10.0 * rank, np.float32)
    if collective == "broadcast":
        dist.broadcast(x, src=root, algorithm=algorithm)
    elif collective == "scatter":
        pieces = [x.copy() for _ in range(3)] if rank == root else None
        dist.scatter(x, pieces, src=root, algorithm=algorithm)
    elif collective == "reduce":
        dist.reduce(x, dst=root, algorithm=algorithm)
    else:
        pieces = [x.copy() for _ in range(3)] if rank == root else None
        dist.gather(x, pieces, dst=root, algorithm=algorithm)
    return x.tolist()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_ranks_that_disagree_on_the_root_are_a_collective_mismatch(transport):
    cases = [("broadcast", "binomial"), ("broadcast", "linear"), ("scatter", "binomial"),
             ("scatter", "linear"), ("reduce", "binomial"), ("gather", "linear")]
    for collective, algorithm in cases:
        with pytest.raises(dist.WorkerError) as caught:
            minidist.launch(_roots_disagree, world_size=3, transport=transport, timeout=30,
                            args=(collective, algorithm))
        error = caught.value
        first = str(error).splitlines()[0]
        assert error.remote_type == "CollectiveMismatchError", (collective, algorithm, first)
        assert "timed out" not in str(error)
        key = "src" if collective in ("broadcast", "scatter") else "dst"
        op = "SUM, " if collective == "reduce" else ""
        assert f"{collective} ({algorithm}, {op}float32, {key}=0) on rank" in first, first
        assert f"{collective} ({algorithm}, {op}float32, {key}=1) on rank 1" in first, first
