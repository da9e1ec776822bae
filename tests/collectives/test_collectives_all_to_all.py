"""all_gather, reduce_scatter and all_to_all: every algorithm against a NumPy
reference, on 1, 2, 3, 4, 5 and 8 ranks, over "shm" and "pipe".

One launch per (transport, world size) runs every case inside the workers
and returns what each call produced; the parent computes the reference from
the same deterministic inputs. Large results come back as a digest of their
bytes plus a strided sample, to keep the reports small: the digest checks
the exact cases bit for bit, the sample the rounded ones.

Inputs: integers in [-14, 14] (every sum exact); floats are random normals
for the small sizes (sums compared with a tolerance, as the order of
combination differs between algorithms and ranks) and quarter-integers for
the large one (every sum exact, so compared bit for bit).

A traced launch checks that each algorithm sends exactly the messages and
bytes :data:`minidist.costmodel.TRAFFIC` says.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import costmodel
from minidist import trace as trace_file
from minidist.distributed import ReduceOp
from minidist.distributed.collectives import ALGORITHMS
from minidist.distributed.collectives.all_reduce import _heights_and_depths, double_binary_trees

LARGE = 65536  # 256 KiB of float32 per rank
SIZES = (0, 1, 3, LARGE)
DTYPES = ("float16", "float32", "float64", "int32", "int64")
OTHER_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "uint32", "uint64", "complex64",
                "complex128")
SAMPLE_STRIDE = 61
WORLD_SIZES = (1, 2, 3, 4, 5, 8)
TRANSPORTS = ("shm", "pipe")


def ops_for(dtype):
    return ("SUM", "MAX", "AVG") if np.dtype(dtype).kind == "f" else ("SUM", "MAX")


@functools.lru_cache(maxsize=256)
def contribution(rank: int, count: int, dtype, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s deterministic input of ``count`` elements (read-only, cached)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f" and count < LARGE:
        generator = np.random.default_rng([rank, count, salt, dtype.itemsize])
        values = generator.standard_normal(count).astype(dtype)
    else:
        values = (np.arange(count) * 7 + rank * 13 + salt) % 29 - 14
        values = (values * 0.25 if dtype.kind == "f" else values).astype(dtype)
    values.flags.writeable = False
    return values


def summary(array: np.ndarray):
    """What a worker sends back: the array, or its digest and a sample if large."""
    array = np.ascontiguousarray(array).reshape(-1)
    if array.size < LARGE:
        return array
    return hashlib.sha256(array.tobytes()).hexdigest(), array[::SAMPLE_STRIDE].copy()


# --------------------------------------------------------------------------- references


@functools.lru_cache(maxsize=64)
def inputs_of_every_rank(n, count, dtype, salt=0) -> np.ndarray:
    """Row r: rank r's input of ``count`` elements (read-only, cached)."""
    rows = np.stack([contribution(rank, count, dtype, salt) for rank in range(n)])
    rows.flags.writeable = False
    return rows


def gathered(n, count, dtype, salt=0):
    return inputs_of_every_rank(n, count, dtype, salt).reshape(-1)


@functools.lru_cache(maxsize=64)
def combined(n, count, dtype, op, salt=0) -> np.ndarray:
    """The combination over ranks of their inputs of ``count`` elements
    (in float64 / complex128 / int64 for sums)."""
    inputs = inputs_of_every_rank(n, count, dtype, salt)
    if op == "MAX":
        return inputs.max(axis=0)
    wide = inputs.astype(WIDE.get(np.dtype(dtype).kind, np.int64)).sum(axis=0)
    return wide / n if op == "AVG" else wide


def reduced_piece(n, rank, count, dtype, op, salt=0):
    return combined(n, n * count, dtype, op, salt)[rank * count:(rank + 1) * count]


def exchanged(n, rank, count, dtype, salt=0):
    return inputs_of_every_rank(n, n * count, dtype, salt)[:, rank * count:
                                                           (rank + 1) * count].reshape(-1)


def exact(dtype, count, op):
    """Whether the result must equal the reference bit for bit."""
    return np.dtype(dtype).kind != "f" or op == "MAX" or (count >= LARGE and op != "AVG")


WIDE = {"f": np.float64, "c": np.complex128}
TOLERANCE = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}


def check(got, expected, dtype, count, op, what):
    expected = np.asarray(expected)
    if isinstance(got, tuple):  # a large result: digest and sample
        digest, sample = got
        if exact(dtype, count, op):
            assert digest == hashlib.sha256(expected.astype(dtype).tobytes()).hexdigest(), what
            return
        got, expected = sample, expected[::SAMPLE_STRIDE]
    assert got.dtype == np.dtype(dtype) and got.shape == expected.shape, (what, got.dtype,
                                                                          got.shape)
    if exact(dtype, count, op):
        np.testing.assert_array_equal(got, expected.astype(dtype), err_msg=what)
    else:
        tolerance = TOLERANCE[str(np.dtype(dtype))]
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tolerance,
                                   atol=tolerance * max(1, np.abs(expected).max(initial=0)),
                                   err_msg=what)


# --------------------------------------------------------------------------- inside the workers


def every_algorithm():
    rank, n = dist.get_rank(), dist.get_world_size()
    results = {}
    for count in SIZES:
        for dtype in DTYPES:
            for algorithm in ALGORITHMS["all_gather"]:
                output = np.full(n * count, 99, dtype)
                dist.all_gather_into_tensor(output, contribution(rank, count, dtype),
                                            algorithm=algorithm)
                results["all_gather", algorithm, count, dtype, None] = summary(output)
            for algorithm in ALGORITHMS["reduce_scatter"]:
                for op in ops_for(dtype):
                    source = contribution(rank, n * count, dtype).copy()
                    output = np.full(count, 99, dtype)
                    dist.reduce_scatter_tensor(output, source, op=ReduceOp[op],
                                               algorithm=algorithm)
                    assert np.array_equal(source, contribution(rank, n * count, dtype)), \
                        f"reduce_scatter {algorithm} changed its input"
                    results["reduce_scatter", algorithm, count, dtype, op] = summary(output)
            for algorithm in ALGORITHMS["all_to_all"]:
                source = contribution(rank, n * count, dtype).copy()
                output = np.full(n * count, 99, dtype)
                dist.all_to_all_single(output, source, algorithm=algorithm)
                assert np.array_equal(source, contribution(rank, n * count, dtype)), \
                    f"all_to_all {algorithm} changed its input"
                results["all_to_all", algorithm, count, dtype, None] = summary(output)
            for op in ops_for(dtype):
                array = contribution(rank, count, dtype).copy()
                dist.all_reduce(array, op=ReduceOp[op], algorithm="double_binary_tree")
                results["all_reduce", "double_binary_tree", count, dtype, op] = summary(array)
    return results


def list_forms_strided_and_groups():
    """The list forms, strided buffers, auto, and a subgroup (salt 1)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    results = {}
    count, dtype = 5, "float64"
    for algorithm in ALGORITHMS["all_gather"]:
        parts = [np.zeros((count,), dtype) for _ in range(n)]
        dist.all_gather(parts, contribution(rank, count, dtype, 1), algorithm=algorithm)
        results["all_gather list", algorithm] = np.concatenate(parts)
    for algorithm in ALGORITHMS["reduce_scatter"]:
        source = contribution(rank, n * count, "int64", 1)
        output = np.zeros(count, "int64")
        dist.reduce_scatter(output, list(source.reshape(n, count)), algorithm=algorithm)
        results["reduce_scatter list", algorithm] = output
    for algorithm in ALGORITHMS["all_to_all"]:
        source = contribution(rank, n * count, "int32", 1)
        outputs = [np.zeros(count, "int32") for _ in range(n)]
        dist.all_to_all(outputs, list(source.reshape(n, count)), algorithm=algorithm)
        results["all_to_all list", algorithm] = np.concatenate(outputs)
    for dtype in OTHER_DTYPES:
        for algorithm in ALGORITHMS["all_gather"]:
            output = np.zeros(n * count, dtype)
            dist.all_gather_into_tensor(output, contribution(rank, count, dtype),
                                        algorithm=algorithm)
            results["all_gather", algorithm, dtype] = output
        for algorithm in ALGORITHMS["reduce_scatter"]:
            output = np.zeros(count, dtype)
            dist.reduce_scatter_tensor(output, contribution(rank, n * count, dtype),
                                       algorithm=algorithm)
            results["reduce_scatter", algorithm, dtype] = output
        for algorithm in ALGORITHMS["all_to_all"]:
            output = np.zeros(n * count, dtype)
            dist.all_to_all_single(output, contribution(rank, n * count, dtype),
                                   algorithm=algorithm)
            results["all_to_all", algorithm, dtype] = output
    # Strided outputs (and input) are gathered into a copy and written back.
    wide = np.zeros((n * count, 2), "int64")
    dist.all_gather_into_tensor(wide[:, 1], contribution(rank, count, "int64", 1))
    results["all_gather strided"] = wide.copy()
    wide = np.zeros((count, 3), "int64")
    dist.reduce_scatter_tensor(wide[:, 0], contribution(rank, n * count, "int64", 1))
    results["reduce_scatter strided"] = wide.copy()
    source = np.zeros((n * count, 2), "int32")
    source[:, 0] = contribution(rank, n * count, "int32", 1)
    wide = np.zeros((n * count, 2), "int32")
    dist.all_to_all_single(wide[:, 1], source[:, 0])
    results["all_to_all strided"] = wide.copy()
    # Group ranks, not global ones: a group of every rank but 0.
    group = dist.new_group(list(range(1, n))) if n > 1 else None
    if group is not None and rank > 0:
        size, me = n - 1, rank - 1
        for algorithm in ALGORITHMS["all_gather"]:
            output = np.zeros(size * count, "int64")
            dist.all_gather_into_tensor(output, contribution(me, count, "int64", 1), group=group,
                                        algorithm=algorithm)
            results["group all_gather", algorithm] = output
        for algorithm in ALGORITHMS["reduce_scatter"]:
            output = np.zeros(count, "int64")
            dist.reduce_scatter_tensor(output, contribution(me, size * count, "int64", 1),
                                       group=group, algorithm=algorithm)
            results["group reduce_scatter", algorithm] = output
        for algorithm in ALGORITHMS["all_to_all"]:
            output = np.zeros(size * count, "int64")
            dist.all_to_all_single(output, contribution(me, size * count, "int64", 1),
                                   group=group, algorithm=algorithm)
            results["group all_to_all", algorithm] = output
    return results


def asynchronous():
    """Three calls in flight at once, moved on by test() and finished by wait()."""
    rank, n = dist.get_rank(), dist.get_world_size()
    results = {}
    for count in (3, 1000):
        gathered_output = np.zeros(n * count, "float32")
        scattered_output = np.zeros(count, "float32")
        exchanged_parts = [np.zeros(count, "float32") for _ in range(n)]
        works = [
            dist.all_gather_into_tensor(gathered_output, contribution(rank, count, "float32"),
                                        async_op=True, algorithm="ring"),
            dist.reduce_scatter_tensor(scattered_output,
                                       contribution(rank, n * count, "float32"),
                                       op=ReduceOp.MAX, async_op=True,
                                       algorithm="recursive_halving"),
            dist.all_to_all(exchanged_parts,
                            list(contribution(rank, n * count, "float32").reshape(n, count)),
                            async_op=True, algorithm="bruck"),
        ]
        polls = 0
        while not all(work.test() for work in works):
            polls += 1
        assert all(work.wait() is True for work in works)
        results["all_gather", count] = gathered_output
        results["reduce_scatter", count] = scattered_output
        results["all_to_all", count] = np.concatenate(exchanged_parts)
    return results


def expect(error_type, text, function, *args, **kwargs):
    rank = dist.get_rank()
    try:
        function(*args, **kwargs)
    except error_type as error:
        message = str(error)
        assert text in message and f"rank {rank}" in message, message
        return
    raise AssertionError(f"{function.__name__} accepted bad input: expected {error_type.__name__}"
                         f" mentioning {text!r}")


def bad_input_is_refused():
    """Each error is raised on every rank before any message, so the ranks stay
    in step: the last call must still work."""
    rank, n = dist.get_rank(), dist.get_world_size()
    x = np.ones(2, "float32")
    expect(ValueError, f"one array per rank of the group, {n}, got {n + 1}",
           dist.all_gather, [np.zeros(2, "float32") for _ in range(n + 1)], x)
    expect(ValueError, "tensor_list[0] is (3,)",
           dist.all_gather, [np.zeros(3, "float32") for _ in range(n)], x)
    expect(ValueError, f"output of {n} x 2", dist.all_gather_into_tensor,
           np.zeros(2 * n + 1, "float32"), x)
    expect(TypeError, "one dtype", dist.all_gather_into_tensor, np.zeros(2 * n, "float64"), x)
    if n > 1:  # a world of one returns before choosing an algorithm
        expect(ValueError, "has no algorithm 'tree'", dist.all_gather_into_tensor,
               np.zeros(2 * n, "float32"), x, algorithm="tree")
    expect(ValueError, "equal pieces", dist.reduce_scatter_tensor, np.zeros(2, "float32"),
           np.zeros(2 * n + 1, "float32"))
    expect(ValueError, f"got {n - 1}", dist.reduce_scatter, np.zeros(2, "float32"),
           [np.zeros(2, "float32") for _ in range(n - 1)])
    expect(TypeError, "ReduceOp.AVG needs a floating point", dist.reduce_scatter_tensor,
           np.zeros(2, "int32"), np.zeros(2 * n, "int32"), op=ReduceOp.AVG)
    expect(ValueError, "is read-only", dist.reduce_scatter_tensor,
           np.broadcast_to(np.zeros(1, "float32"), (2,)), np.zeros(2 * n, "float32"))
    if n > 1:
        expect(ValueError, f"not a multiple of {n}", dist.all_to_all_single,
               np.zeros(2 * n + 1, "float32"), np.zeros(2 * n + 1, "float32"))
        uneven = [3] + [2] * (n - 2) + [1]
        expect(ValueError, "only run the pairwise exchange, not 'bruck'",
               dist.all_to_all_single, np.zeros(2 * n, "float32"), np.zeros(2 * n, "float32"),
               input_split_sizes=uneven, output_split_sizes=uneven, algorithm="bruck")
        expect(ValueError, f"sum to {2 * n + 1} rows, but dim 0 has {2 * n}",
               dist.all_to_all_single, np.zeros(2 * n, "float32"), np.zeros(2 * n, "float32"),
               input_split_sizes=[3] + [2] * (n - 1))
    expect(ValueError, "output_tensor_list to hold one array per rank", dist.all_to_all,
           [np.zeros(2, "float32")] * (n + 1), [np.zeros(2, "float32")] * n)
    expect(ValueError, "output and input of one size", dist.all_to_all_single,
           np.zeros(2 * n, "float32"), np.zeros(2 * n + 2, "float32"))
    output = np.zeros(n, "int64")
    dist.all_gather_into_tensor(output, np.array([rank], "int64"))
    return output


def run_everything():
    return {"algorithms": every_algorithm(), "forms": list_forms_strided_and_groups(),
            "async": asynchronous(), "errors": bad_input_is_refused()}


@pytest.fixture(scope="module", params=[(transport, n) for n in WORLD_SIZES
                                        for transport in TRANSPORTS],
                ids=lambda param: f"{param[0]}-{param[1]}ranks")
def report(request):
    transport, world_size = request.param
    return world_size, minidist.launch(run_everything, world_size=world_size,
                                       transport=transport, timeout=60)


# --------------------------------------------------------------------------- checks


@pytest.mark.timeout(600)
def test_all_gather_every_algorithm_size_and_dtype(report):
    n, reports = report
    for algorithm in ALGORITHMS["all_gather"]:
        for count in SIZES:
            for dtype in DTYPES:
                key = ("all_gather", algorithm, count, dtype, None)
                expected = gathered(n, count, dtype)
                answers = [ranks["algorithms"][key] for ranks in reports]
                for rank, got in enumerate(answers):
                    check(got, expected, dtype, count, None, f"{key} rank {rank}")
                first = answers[0] if count < LARGE else answers[0][0]
                for got in answers[1:]:  # replicated: identical bits on every rank
                    if count < LARGE:
                        assert got.tobytes() == first.tobytes(), key
                    else:
                        assert got[0] == first, key


def test_reduce_scatter_every_algorithm_size_dtype_and_op(report):
    n, reports = report
    for algorithm in ALGORITHMS["reduce_scatter"]:
        for count in SIZES:
            for dtype in DTYPES:
                for op in ops_for(dtype):
                    key = ("reduce_scatter", algorithm, count, dtype, op)
                    for rank, ranks in enumerate(reports):
                        check(ranks["algorithms"][key], reduced_piece(n, rank, count, dtype, op),
                              dtype, count, op, f"{key} rank {rank}")


def test_all_to_all_every_algorithm_size_and_dtype(report):
    n, reports = report
    for algorithm in ALGORITHMS["all_to_all"]:
        for count in SIZES:
            for dtype in DTYPES:
                key = ("all_to_all", algorithm, count, dtype, None)
                for rank, ranks in enumerate(reports):
                    check(ranks["algorithms"][key], exchanged(n, rank, count, dtype), dtype,
                          count, None, f"{key} rank {rank}")


def test_double_binary_tree_all_reduce_every_size_dtype_and_op(report):
    n, reports = report
    for count in SIZES:
        for dtype in DTYPES:
            for op in ops_for(dtype):
                key = ("all_reduce", "double_binary_tree", count, dtype, op)
                answers = [ranks["algorithms"][key] for ranks in reports]
                for rank, got in enumerate(answers):
                    check(got, combined(n, count, dtype, op), dtype, count, op,
                          f"{key} rank {rank}")
                for got in answers[1:]:  # replicated: identical bits on every rank
                    if count < LARGE:
                        assert got.tobytes() == answers[0].tobytes(), key
                    else:
                        assert got[0] == answers[0][0], key


@pytest.mark.parametrize("n", range(1, 66))
def test_the_two_trees_span_every_rank_and_share_few_interior_nodes(n):
    trees = double_binary_trees(n)
    interior = []
    for parents, children in trees:
        assert parents.count(-1) == 1
        for rank in range(n):
            assert all(parents[kid] == rank for kid in children[rank])
            assert parents[rank] < 0 or rank in children[parents[rank]]
            assert len(children[rank]) <= 2
        heights, depths = _heights_and_depths(parents, children)
        assert max(depths) == max(heights) == (n - 1).bit_length()
        interior.append({rank for rank in range(n) if children[rank]})
    assert interior[0] & interior[1] == (set() if n % 2 == 0 or n == 1 else {0})


def test_list_forms_strided_buffers_and_subgroups(report):
    n, reports = report
    count = 5
    for rank, ranks in enumerate(reports):
        forms = ranks["forms"]
        for algorithm in ALGORITHMS["all_gather"]:
            np.testing.assert_array_equal(forms["all_gather list", algorithm],
                                          gathered(n, count, "float64", 1))
        for algorithm in ALGORITHMS["reduce_scatter"]:
            np.testing.assert_array_equal(forms["reduce_scatter list", algorithm],
                                          reduced_piece(n, rank, count, "int64", "SUM", 1))
        for algorithm in ALGORITHMS["all_to_all"]:
            np.testing.assert_array_equal(forms["all_to_all list", algorithm],
                                          exchanged(n, rank, count, "int32", 1))
        for dtype in OTHER_DTYPES:  # SUM of bools is their logical or
            for algorithm in ALGORITHMS["all_gather"]:
                check(forms["all_gather", algorithm, dtype], gathered(n, count, dtype), dtype,
                      count, None, f"all_gather {algorithm} {dtype}")
            for algorithm in ALGORITHMS["reduce_scatter"]:
                check(forms["reduce_scatter", algorithm, dtype],
                      reduced_piece(n, rank, count, dtype, "SUM"), dtype, count, "SUM",
                      f"reduce_scatter {algorithm} {dtype}")
            for algorithm in ALGORITHMS["all_to_all"]:
                check(forms["all_to_all", algorithm, dtype], exchanged(n, rank, count, dtype),
                      dtype, count, None, f"all_to_all {algorithm} {dtype}")
        assert not forms["all_gather strided"][:, 0].any()
        np.testing.assert_array_equal(forms["all_gather strided"][:, 1],
                                      gathered(n, count, "int64", 1))
        assert not forms["reduce_scatter strided"][:, 1:].any()
        np.testing.assert_array_equal(forms["reduce_scatter strided"][:, 0],
                                      reduced_piece(n, rank, count, "int64", "SUM", 1))
        assert not forms["all_to_all strided"][:, 0].any()
        np.testing.assert_array_equal(forms["all_to_all strided"][:, 1],
                                      exchanged(n, rank, count, "int32", 1))
        if rank > 0:
            size, me = n - 1, rank - 1
            for algorithm in ALGORITHMS["all_gather"]:
                np.testing.assert_array_equal(forms["group all_gather", algorithm],
                                              gathered(size, count, "int64", 1))
            for algorithm in ALGORITHMS["reduce_scatter"]:
                np.testing.assert_array_equal(forms["group reduce_scatter", algorithm],
                                              reduced_piece(size, me, count, "int64", "SUM", 1))
            for algorithm in ALGORITHMS["all_to_all"]:
                np.testing.assert_array_equal(forms["group all_to_all", algorithm],
                                              exchanged(size, me, count, "int64", 1))


def test_async_op_returns_work_that_test_and_wait_complete(report):
    n, reports = report
    for rank, ranks in enumerate(reports):
        for count in (3, 1000):
            np.testing.assert_array_equal(ranks["async"]["all_gather", count],
                                          gathered(n, count, "float32"))
            np.testing.assert_array_equal(ranks["async"]["reduce_scatter", count],
                                          reduced_piece(n, rank, count, "float32", "MAX"))
            np.testing.assert_array_equal(ranks["async"]["all_to_all", count],
                                          exchanged(n, rank, count, "float32"))


def test_bad_input_is_refused_on_every_rank_and_the_ranks_stay_in_step(report):
    n, reports = report
    for ranks in reports:
        np.testing.assert_array_equal(ranks["errors"], np.arange(n))


# --------------------------------------------------------------------------- traffic


def traced_calls(count):
    rank, n = dist.get_rank(), dist.get_world_size()
    for algorithm in ALGORITHMS["all_gather"]:
        dist.all_gather_into_tensor(np.zeros(n * count, "float64"),
                                    contribution(rank, count, "float64"), algorithm=algorithm)
    for algorithm in ALGORITHMS["reduce_scatter"]:
        dist.reduce_scatter_tensor(np.zeros(count, "float64"),
                                   contribution(rank, n * count, "float64"), algorithm=algorithm)
    for algorithm in ALGORITHMS["all_to_all"]:
        dist.all_to_all_single(np.zeros(n * count, "float64"),
                               contribution(rank, n * count, "float64"), algorithm=algorithm)
    dist.all_reduce(contribution(rank, n * count, "float64").copy(),
                    algorithm="double_binary_tree")


@pytest.mark.parametrize("world_size, count", [(3, 3), (4, 3), (5, 3), (8, 3), (5, 0)])
def test_messages_and_bytes_match_the_traffic_formulas(tmp_path, world_size, count):
    """``count`` elements per piece; empty pieces are messages too."""
    path = tmp_path / "collectives.trace.jsonl"
    minidist.launch(traced_calls, world_size=world_size, args=(count,), trace=str(path))
    sent: dict[tuple[str, str], list[int]] = {}
    for event in trace_file.read_jsonl(path).events:
        if event["kind"] == "send":
            collective, algorithm = event["label"].split(":")[0].split()
            totals = sent.setdefault((collective, algorithm), [0, 0])
            totals[0] += 1
            totals[1] += event["bytes"]
    family = {**{c: costmodel.TRAFFIC[c] for c in ("all_gather", "reduce_scatter", "all_to_all")},
              "all_reduce": {"double_binary_tree": costmodel.TRAFFIC["all_reduce"]["double_binary_tree"]}}
    for collective, algorithms in family.items():
        if collective != "all_reduce":
            assert set(algorithms) == set(ALGORITHMS[collective])
        for algorithm, traffic in algorithms.items():
            expected = traffic(world_size, world_size * count, 8)
            assert tuple(sent[collective, algorithm]) == expected, (collective, algorithm)


def test_every_algorithm_has_a_cost_formula_that_auto_can_use():
    for collective in ("all_gather", "reduce_scatter", "all_to_all"):
        assert set(costmodel.FORMULAS[collective]) == set(ALGORITHMS[collective])
        for n in (2, 3, 4, 5, 8, 64):
            for nbytes in (8, 1 << 20):
                predictions = costmodel.predict_all(collective, n, nbytes)
                assert all(seconds > 0 for seconds in predictions.values()), predictions
                assert costmodel.best(collective, n, nbytes) in ALGORITHMS[collective]
    # Bandwidth terms that the docstrings promise for a power of two.
    params = costmodel.Params(alpha=0.0, beta=1.0, gamma=0.0)
    assert costmodel.predict("all_gather", "recursive_doubling", 8, 800, params) == 700
    assert costmodel.predict("reduce_scatter", "recursive_halving", 8, 800, params) == 700
    assert costmodel.predict("all_to_all", "bruck", 8, 800, params) == 3 * 400
    # The double binary tree: ring-like bandwidth with log n latency.
    sim = costmodel.PARAMS["sim"]
    assert (costmodel.predict("all_reduce", "double_binary_tree", 1024, 1 << 20, sim)
            < costmodel.predict("all_reduce", "ring", 1024, 1 << 20, sim) / 5)
