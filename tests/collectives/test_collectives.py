"""all_reduce: every algorithm against NumPy, on real processes.

One launch per (world size, transport) runs every case (algorithm x size x
dtype x op) inside the workers; the parent checks each result against a
NumPy reference and that all ranks hold identical bits. The other tests
cover what a student trips on: mismatched calls, async handles, bad input.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.distributed.collectives.all_reduce import ALGORITHMS

WORLD_SIZES = (1, 2, 3, 4, 5, 8)
DTYPES = ("float16", "float32", "float64", "int32", "int64")
MIB_FLOATS = (1 << 20) // 4


def _sizes(world_size: int) -> list[int]:
    # 0, 1, fewer elements than ranks, not divisible by the world
    return sorted({0, 1, max(world_size - 1, 1), 7 * world_size + 3})


def _input(rank: int, size: int, dtype: str, op: str) -> np.ndarray:
    rng = np.random.default_rng([rank, size, len(dtype), len(op)])
    if op == "product":
        values = rng.choice([-1.0, 1.0, 2.0], size)
    else:
        values = rng.integers(-50, 50, size) if dtype.startswith("int") else \
            rng.standard_normal(size) * 4
    return values.astype(dtype)


def _cases(world_size: int):
    for algorithm in ALGORITHMS:
        for size in _sizes(world_size):
            for dtype in DTYPES:
                for op in ("sum", "max"):
                    yield algorithm, size, dtype, op
        yield algorithm, 5, "float32", "avg"
        yield algorithm, 6, "int64", "product"
        yield algorithm, 5, "int32", "min"
        yield algorithm, MIB_FLOATS, "float32", "sum"


def _run_all_cases():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    results = []
    for algorithm, size, dtype, op in _cases(world_size):
        array = _input(rank, size, dtype, op)
        dist.all_reduce(array, op=op, algorithm=algorithm)
        results.append(array.tobytes())
    return results


def _reference(world_size: int, size: int, dtype: str, op: str) -> np.ndarray:
    inputs = [_input(rank, size, dtype, op).astype(np.float64) for rank in range(world_size)]
    if op in ("sum", "avg"):
        total = np.sum(inputs, axis=0)
        return total / world_size if op == "avg" else total
    return {"max": np.max, "min": np.min, "product": np.prod}[op](inputs, axis=0)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce_every_algorithm_matches_numpy(world_size, transport):
    results = minidist.launch(_run_all_cases, world_size=world_size, transport=transport,
                              timeout=120)
    for index, (algorithm, size, dtype, op) in enumerate(_cases(world_size)):
        case = f"{algorithm} n={world_size} size={size} {dtype} {op}"
        bits = results[0][index]
        for rank in range(1, world_size):
            assert results[rank][index] == bits, f"{case}: rank {rank} differs from rank 0"
        got = np.frombuffer(bits, dtype).astype(np.float64)
        expected = _reference(world_size, size, dtype, op)
        if dtype.startswith("int") or op in ("max", "min", "product"):
            np.testing.assert_array_equal(got, expected, err_msg=case)
        else:
            tolerance = {"float16": 5e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
            np.testing.assert_allclose(got, expected, rtol=tolerance,
                                       atol=tolerance * 4 * world_size, err_msg=case)


def _identical_bits_on_awkward_floats():
    rank = dist.get_rank()
    rng = np.random.default_rng(rank)
    # Wildly different magnitudes make the result depend on the order of the adds.
    array = (rng.standard_normal(1001) * 10.0 ** rng.integers(-8, 8, 1001)).astype(np.float32)
    out = []
    for algorithm in ALGORITHMS:
        copy = array.copy()
        dist.all_reduce(copy, algorithm=algorithm)
        out.append(copy.tobytes())
    return out


@pytest.mark.timeout(120)
def test_every_rank_ends_with_identical_bits():
    results = minidist.launch(_identical_bits_on_awkward_floats, world_size=5, transport="shm")
    for per_algorithm in zip(*results):
        assert len(set(per_algorithm)) == 1


def _shapes_and_views():
    rank = dist.get_rank()
    matrix = np.full((4, 6), rank + 1, np.float64)
    view = matrix[:, ::2]  # strided: reduced through a contiguous copy and written back
    dist.all_reduce(view, algorithm="ring")
    scalar = np.array(float(rank))  # 0-d
    dist.all_reduce(scalar, op=dist.ReduceOp.MAX)
    tensor = minidist.Tensor(np.full(3, float(rank)))
    dist.all_reduce(tensor, op="avg")
    return matrix, scalar, tensor.data


@pytest.mark.timeout(60)
def test_strided_views_scalars_and_tensors():
    for matrix, scalar, tensor in minidist.launch(_shapes_and_views, world_size=3,
                                                  transport="pipe"):
        assert (matrix[:, ::2] == 6).all()
        assert (matrix[:, 1::2] != 6).all()  # the columns not in the view were left alone
        assert scalar == 2.0
        np.testing.assert_allclose(tensor, 1.0)


def _async_overlapping_calls():
    rank = dist.get_rank()
    first = np.full(10_000, float(rank))
    second = np.full(7, 1.0)
    work_first = dist.all_reduce(first, algorithm="ring", async_op=True)
    work_second = dist.all_reduce(second, algorithm="rabenseifner", async_op=True)
    polls = 0
    while not work_first.test():
        polls += 1
    work_second.wait()
    auto = np.full(3, 2.0)
    assert dist.all_reduce(auto) is None  # blocking calls return nothing, as in torch
    return first[0], second[0], auto[0], work_first.is_completed()


@pytest.mark.timeout(60)
def test_async_op_returns_work_that_finishes_on_test_and_wait():
    results = minidist.launch(_async_overlapping_calls, world_size=4, transport="shm")
    assert results == [(6.0, 4.0, 8.0, True)] * 4


def _mismatched_collectives():
    x = np.ones(10, np.float32)
    if dist.get_rank() == 1:
        dist.broadcast(x, src=0, algorithm="binomial")
    else:
        dist.all_reduce(x, algorithm="ring")


def _mismatched_counts():
    dist.all_reduce(np.ones(10 + dist.get_rank(), np.float32), algorithm="recursive_doubling")


def _mismatched_algorithms():
    algorithm = "ring" if dist.get_rank() == 0 else "recursive_doubling"
    dist.all_reduce(np.ones(8, np.float32), algorithm=algorithm)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker, needle", [
    (_mismatched_collectives, "is in broadcast (binomial, float32, src=0), call 0, but rank 0 sent it "
                              "a message of all_reduce (ring, SUM, float32)"),
    (_mismatched_counts, "different element count or root"),
    (_mismatched_algorithms, "all_reduce (recursive_doubling, SUM, float32)"),
])
def test_mismatched_calls_fail_at_once_naming_both_calls(worker, needle):
    # The timeout is long: the error must come from the fingerprint check, not a timeout.
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(worker, world_size=3, transport="shm", timeout=60)
    text = str(caught.value)
    assert "CollectiveMismatchError" in text
    assert needle in text
    assert "timed out" not in text


def _bad_input(case):
    x = np.ones(4, np.float32)
    if case == "algorithm":
        dist.all_reduce(x, algorithm="bogus")
    elif case == "op":
        dist.all_reduce(x, op="median")
    elif case == "int_avg":
        dist.all_reduce(np.ones(3, np.int32), op=dist.ReduceOp.AVG)
    elif case == "readonly":
        dist.all_reduce(np.broadcast_to(np.float32(1), (4,)))
    elif case == "list":
        dist.all_reduce([1.0, 2.0])
    elif case == "root":
        dist.broadcast(x, src=5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case, needle", [
    ("algorithm", "has no algorithm 'bogus'; choose one of ['coordinator'"),
    ("op", "unknown reduction 'median'"),
    ("int_avg", "needs a floating point array, got int32"),
    ("readonly", "read-only"),
    ("list", "expects a NumPy array (or a minidist Tensor), got list"),
    ("root", "src=5 is out of range; the group has ranks 0..1"),
])
def test_bad_input_is_named(case, needle):
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(_bad_input, world_size=2, args=(case,), transport="pipe", timeout=30)
    assert needle in str(caught.value)


def test_collective_before_init_says_how_to_start():
    with pytest.raises(dist.NotInitializedError, match="minidist.launch"):
        dist.all_reduce(np.ones(3))


def _subgroups():
    rank = dist.get_rank()
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    mine = evens if rank % 2 == 0 else odds
    x = np.full(5, float(rank))
    dist.all_reduce(x, group=mine, algorithm="ring")
    y = np.full(5, float(rank))
    dist.all_reduce(y)  # the world, interleaved with the subgroup calls
    z = np.full(2, float(rank))
    dist.broadcast(z, src=2 if rank % 2 == 0 else 3, group=mine)  # a global rank, as torch
    w = np.full(2, float(rank))
    dist.broadcast(w, group=mine, group_src=1)  # the same root, numbered in the group
    assert w[0] == z[0]
    return x[0], y[0], z[0]


@pytest.mark.timeout(60)
def test_subgroups_keep_their_collectives_apart():
    results = minidist.launch(_subgroups, world_size=4, transport="shm")
    assert results == [(2.0, 6.0, 2.0), (4.0, 6.0, 3.0), (2.0, 6.0, 2.0), (4.0, 6.0, 3.0)]
