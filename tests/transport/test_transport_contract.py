"""The contract every transport keeps, checked on "pipe" and "shm".

All cases run inside ONE launch per (transport, world size): starting
processes is the slow part, so each worker runs every case in turn and
reports, per case, "ok" or the traceback. Each case is then its own pytest
item reading that report. A case that fails on one rank stops the run (the
other ranks could not stay in step); the cases after it report that.
"""

from __future__ import annotations

import re
import traceback

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.distributed import MessageMismatchError, ReduceOp

CASES = []


def case(min_size=2):
    def register(function):
        function.min_size = min_size
        CASES.append(function)
        return function

    return register


def rank_size():
    return dist.get_rank(), dist.get_world_size()


def pattern(shape, dtype, seed):
    """Deterministic test data of any dtype."""
    count = int(np.prod(shape)) if shape else 1
    values = (np.arange(count) * 7 + seed * 13) % 97
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        data = values % 2 == 1
    elif dtype.kind == "M":
        data = values.astype("datetime64[ns]")
    elif dtype.kind == "m":
        data = values.astype("timedelta64[s]")
    elif dtype.kind == "U":
        data = np.array([f"u{v}" for v in values])
    elif dtype.kind == "S":
        data = np.array([f"s{v}".encode() for v in values])
    elif dtype.kind == "c":
        data = values + 1j * (values + 1)
    else:
        data = values
    return data.astype(dtype).reshape(shape)


DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128", "datetime64[ns]",
          "timedelta64[s]", "<U5", "S4", ">f4", ">i8"]
SHAPES = [(), (0,), (3, 0, 2), (1,), (5,), (2, 3, 4), (1,) * 32]


# --------------------------------------------------------------------------- cases


@case()
def every_dtype_new_array_and_into_buffer():
    rank, _ = rank_size()
    for index, dtype in enumerate(DTYPES):
        expected = pattern((3, 4), dtype, index)
        if rank == 0:
            dist.send(expected, 1, tag=index)
            dist.send(expected, 1, tag=index)
        elif rank == 1:
            got = dist.recv_array(0, tag=index)
            assert got.dtype == expected.dtype and got.shape == expected.shape, (dtype, got.dtype)
            np.testing.assert_array_equal(got, expected)
            buffer = np.zeros_like(expected)
            assert dist.recv(buffer, 0, tag=index) == 0
            np.testing.assert_array_equal(buffer, expected)


@case()
def every_shape_including_zero_d_and_empty():
    rank, _ = rank_size()
    for index, shape in enumerate(SHAPES):
        expected = pattern(shape, "float32", index)
        if rank == 0:
            dist.send(expected, 1, tag=index)
            dist.send(expected, 1, tag=index)
        elif rank == 1:
            got = dist.recv_array(0, tag=index)
            assert got.shape == shape, (got.shape, shape)
            np.testing.assert_array_equal(got, expected)
            buffer = np.empty(shape, np.float32)
            dist.recv(buffer, 0, tag=index)
            np.testing.assert_array_equal(buffer, expected)


@case()
def non_contiguous_inputs_are_sent_as_their_values():
    rank, _ = rank_size()
    base = pattern((6, 8), "float64", 3)
    views = [base[::2], base.T, base[::-1, ::-3], np.asfortranarray(base), base[:, 1]]
    for index, view in enumerate(views):
        if rank == 0:
            dist.send(view, 1, tag=index)
        elif rank == 1:
            got = dist.recv_array(0, tag=index)
            np.testing.assert_array_equal(got, view)
            assert got.flags.c_contiguous


@case()
def recv_into_a_strided_buffer():
    rank, _ = rank_size()
    if rank == 0:
        dist.send(np.arange(10, dtype=np.int32), 1)
        dist.send(np.arange(10, dtype=np.int32), 1)
    elif rank == 1:
        big = np.full(20, -1, np.int32)
        dist.recv(big[::2], 0)
        np.testing.assert_array_equal(big[::2], np.arange(10))
        assert (big[1::2] == -1).all()
        dist.recv_reduce(big[::2], 0, op=ReduceOp.SUM)
        np.testing.assert_array_equal(big[::2], 2 * np.arange(10))


@case()
def sizes_across_slot_and_ring_boundaries():
    rank, _ = rank_size()
    mib = 1 << 20
    sizes = [1, 7, 4096, mib - 7, mib, mib + 13, 5 * mib + 3, 17 * mib + 1]
    for index, size in enumerate(sizes):
        for dtype in ("uint8", "float64", "complex128"):
            itemsize = np.dtype(dtype).itemsize
            count = max(size // itemsize, 1)
            expected = pattern((count,), dtype, index)
            if rank == 0:
                dist.send(expected, 1, tag=index)
            elif rank == 1:
                buffer = np.empty(count, dtype)
                dist.recv(buffer, 0, tag=index)
                np.testing.assert_array_equal(buffer, expected)


@case()
def messages_with_one_tag_arrive_in_order():
    rank, _ = rank_size()
    sizes = [1, 3000, 1 << 20, 5, (3 << 20) + 1, 2]
    if rank == 0:
        for index in range(60):
            dist.send(np.full(sizes[index % len(sizes)], index, np.int32), 1, tag=4)
    elif rank == 1:
        for index in range(60):
            got = dist.recv_array(0, tag=4)
            assert got.size == sizes[index % len(sizes)] and (got == index).all(), index


@case()
def tags_select_messages_and_keep_per_tag_order():
    rank, _ = rank_size()
    if rank == 0:
        for value, tag in [(1, 10), (2, 20), (3, 10), (4, 30), (5, 20)]:
            dist.send(np.array([value]), 1, tag=tag)
    elif rank == 1:
        order = [(20, 2), (30, 4), (10, 1), (20, 5), (10, 3)]
        for tag, value in order:
            assert dist.recv_array(0, tag=tag)[0] == value, (tag, value)


@case()
def any_tag_takes_the_next_message():
    rank, _ = rank_size()
    if rank == 0:
        dist.send(np.array([1.5]), 1, tag=77)
        dist.send(np.array([2.5]), 1, tag=78)
    elif rank == 1:
        first = dist.irecv_array(0, tag=None)
        first.wait()
        assert first.array[0] == 1.5
        assert dist.recv_array(0, tag=None)[0] == 2.5


@case(min_size=3)
def any_source_receives_from_everyone():
    rank, size = rank_size()
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            buffer = np.zeros(3, np.int64)
            source = dist.recv(buffer, src=None, tag=5)
            assert (buffer == source).all()
            seen.add(source)
        assert seen == set(range(1, size))
    else:
        dist.send(np.full(3, rank, np.int64), 0, tag=5)


@case()
def irecv_posted_before_the_send_and_test_polling():
    rank, _ = rank_size()
    if rank == 1:
        buffer = np.zeros(1000, np.float32)
        request = dist.irecv(buffer, 0, tag=3)
        assert not request.is_completed()
        dist.barrier()
        while not request.test():
            pass
        assert request.wait() is True
        np.testing.assert_array_equal(buffer, np.arange(1000, dtype=np.float32))
    else:
        dist.barrier()
        if rank == 0:
            dist.send(np.arange(1000, dtype=np.float32), 1, tag=3)


@case()
def many_isends_queue_beyond_ring_capacity():
    rank, _ = rank_size()
    count, size = 12, (1 << 20) + 5
    if rank == 0:
        arrays = [np.full(size, index, np.uint8) for index in range(count)]
        requests = [dist.isend(array, 1, tag=index % 3) for index, array in enumerate(arrays)]
        dist.wait_all(requests)
        assert all(request.is_completed() for request in requests)
    elif rank == 1:
        for index in range(count):
            got = dist.recv_array(0, tag=index % 3)
            assert (got == index).all()


@case()
def simultaneous_large_sends_do_not_deadlock():
    rank, size = rank_size()
    peer = rank ^ 1
    if peer >= size:
        return
    outgoing = np.full((9 << 20) // 8, rank, np.float64)
    incoming = np.empty_like(outgoing)
    dist.send(outgoing, peer, tag=1)  # both sides send first: needs buffering of one side
    dist.recv(incoming, peer, tag=1)
    assert (incoming == peer).all()


@case()
def isend_irecv_exchange_around_a_ring():
    rank, size = rank_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    outgoing = np.full(3 << 20, rank, np.int16)
    incoming = np.empty_like(outgoing)
    receive = dist.irecv(incoming, left, tag=2)
    send = dist.isend(outgoing, right, tag=2)
    dist.wait_all([send, receive])
    assert (incoming == left).all()


@case()
def probe_describes_without_receiving():
    rank, _ = rank_size()
    if rank == 0:
        dist.barrier()
        dist.send(np.zeros((3, 4), np.float64), 1, tag=9)
        dist.send(np.ones(2, np.int8), 1, tag=1)
        dist.send(np.ones(5, np.int16), 1, tag=2)
    elif rank == 1:
        assert dist.iprobe(0, tag=9) is None
        dist.barrier()
        info = dist.probe(0, tag=9)
        assert (info.source, info.tag, info.shape, info.dtype, info.nbytes) == \
            (0, 9, (3, 4), np.dtype(np.float64), 96)
        # Looking past a message that does not match keeps both.
        info = dist.probe(0, tag=2)
        assert info.shape == (5,) and info.dtype == np.int16
        assert dist.probe(None, tag=None).source == 0
        buffer = np.empty(info.shape, info.dtype)
        dist.recv(buffer, 0, tag=2)
        assert (dist.recv_array(0, tag=1) == 1).all()
        assert dist.recv_array(0, tag=9).shape == (3, 4)
        assert dist.iprobe(0, tag=None) is None
    else:
        dist.barrier()


@case()
def recv_reduce_every_op_across_slots():
    rank, _ = rank_size()
    count = (5 << 20) // 8 + 3
    ops = [(ReduceOp.SUM, np.add), (ReduceOp.PRODUCT, np.multiply), (ReduceOp.MIN, np.minimum),
           (ReduceOp.MAX, np.maximum), ("sum", np.add), (np.maximum, np.maximum)]
    for dtype in ("float64", "int64", "float32", "int8"):
        mine = (np.arange(count) % 5 + 1).astype(dtype)
        theirs = (np.arange(count) % 3 + 2).astype(dtype)
        for index, (op, ufunc) in enumerate(ops):
            if rank == 0:
                dist.send(theirs, 1, tag=index)
            elif rank == 1:
                buffer = mine.copy()
                assert dist.recv_reduce(buffer, 0, op=op, tag=index) == 0
                np.testing.assert_array_equal(buffer, ufunc(mine, theirs))
    if rank == 1:
        try:
            dist.recv_reduce(np.zeros(2), 0, op=ReduceOp.AVG)
        except ValueError as error:
            assert "AVG" in str(error)
        else:
            raise AssertionError("ReduceOp.AVG was accepted by recv_reduce")


@case()
def irecv_reduce_and_small_reduce():
    rank, _ = rank_size()
    if rank == 0:
        dist.send(np.array([1.0, 2.0]), 1)
        dist.send(np.array(3, np.int32), 1)
    elif rank == 1:
        buffer = np.array([10.0, 20.0])
        dist.irecv_reduce(buffer, 0, op=ReduceOp.SUM).wait()
        np.testing.assert_array_equal(buffer, [11.0, 22.0])
        scalar = np.array(4, np.int32)
        dist.recv_reduce(scalar, 0, op=ReduceOp.PRODUCT)
        assert scalar == 12


@case()
def small_isends_and_reductions_of_every_shape():
    rank, _ = rank_size()
    shapes = [(), (1,), (7,), (3, 5)]
    dtypes = ["float32", "float64", "int32", "int64", "complex64", "bool"]
    if rank == 0:
        requests = []
        for index, (shape, dtype) in enumerate((s, d) for s in shapes for d in dtypes):
            data = pattern(shape, dtype, index)
            requests.append(dist.isend(data, 1, tag=index))
            assert isinstance(requests[-1].test(), bool)
        dist.wait_all(requests)
        assert all(request.wait() is True for request in requests)
    elif rank == 1:
        for index, (shape, dtype) in enumerate((s, d) for s in shapes for d in dtypes):
            mine = pattern(shape, dtype, index + 100)
            theirs = pattern(shape, dtype, index)
            buffer = mine.copy()
            dist.recv_reduce(buffer, 0, op=ReduceOp.SUM, tag=index)  # bool: logical or
            np.testing.assert_array_equal(buffer, np.add(mine, theirs))


@case()
def python_objects_by_pickle():
    rank, _ = rank_size()
    payload = {"step": 3, "names": ["a", "b"], "array": np.arange(3)}
    if rank == 0:
        dist.send_object(payload, 1, tag=6)
    elif rank == 1:
        got = dist.recv_object(0, tag=6)
        assert got["step"] == 3 and got["names"] == ["a", "b"]
        np.testing.assert_array_equal(got["array"], np.arange(3))


@case()
def tensors_are_accepted_through_their_data():
    rank, _ = rank_size()
    tensor = minidist.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    if rank == 0:
        dist.send(tensor, 1)
    elif rank == 1:
        target = minidist.Tensor(np.zeros((2, 3), np.float32))
        dist.recv(target, 0)
        np.testing.assert_array_equal(target.data, np.arange(6).reshape(2, 3))


@case(min_size=4)
def groups_map_ranks_and_keep_traffic_apart():
    rank, size = rank_size()
    evens = dist.new_group([0, 2])
    odds = dist.new_group([3, 1])  # sorted: group rank 0 is global 1
    assert dist.get_world_size(evens) == (2 if rank in (0, 2) else -1)  # -1: not a member (torch)
    if rank in (0, 2):
        assert dist.get_rank(evens) == rank // 2 and dist.get_rank(odds) == -1
    else:
        assert dist.get_rank(odds) == (rank - 1) // 2 and dist.get_rank(evens) == -1
    assert dist.get_global_rank(odds, 1) == 3 and dist.get_group_rank(odds, 1) == 0
    # Same pair of processes, same tag, two groups: the messages must not cross.
    if rank == 0:
        dist.send(np.array([111]), 2, tag=5)            # world
        dist.send(np.array([222]), 2, group=evens, tag=5)  # global ranks, as torch
    elif rank == 2:
        assert dist.recv_array(0, group=evens, tag=5)[0] == 222
        assert dist.recv_array(0, tag=5)[0] == 111
    elif rank == 3:
        dist.send(np.array([3]), 1, group=odds, tag=0)
    elif rank == 1:
        buffer = np.zeros(1, np.int64)
        assert dist.recv(buffer, src=None, group=odds, tag=0) == 3  # the global rank, as torch
        assert buffer[0] == 3
        try:
            dist.send(np.zeros(1), dst=0, group=evens)
        except ValueError as error:
            assert "not a member" in str(error)
        else:
            raise AssertionError("a non-member sent in a group")
    dist.barrier(evens if rank in (0, 2) else odds)


@case()
def contexts_keep_library_traffic_apart():
    rank, _ = rank_size()
    library = dist.world_group().with_context("contract-test")
    if rank == 0:
        dist.send(np.array([1]), 1, tag=0)
        library.send(np.array([2]), 1, tag=0)
    elif rank == 1:
        assert library.recv_array(0, tag=0)[0] == 2
        assert dist.recv_array(0, tag=0)[0] == 1


@case()
def barrier_many_times():
    for _ in range(20):
        dist.barrier()


def expect(error_type, function, *args, text="", **kwargs):
    try:
        function(*args, **kwargs)
    except error_type as error:
        assert text in str(error), (text, str(error))
        return error
    raise AssertionError(f"{function.__name__}{args} did not raise {error_type.__name__}")


def still_works():
    """After a refused call, normal traffic is intact."""
    rank, _ = rank_size()
    if rank == 0:
        dist.send(np.arange(4.0), 1, tag=99)
    elif rank == 1:
        np.testing.assert_array_equal(dist.recv_array(0, tag=99), np.arange(4.0))


@case()
def bad_input_is_refused_and_nothing_breaks():
    rank, size = rank_size()
    x = np.zeros(3)
    peer = 1 if rank == 0 else 0
    expect(ValueError, dist.send, x, size, text="out of range")
    expect(ValueError, dist.send, x, -1, text="out of range")
    expect(TypeError, dist.send, x, 1.0, text="must be an int")
    expect(ValueError, dist.send, x, rank, text="itself")
    expect(ValueError, dist.recv, x, rank, text="itself")
    expect(ValueError, dist.isend, x, size + 3, text="out of range")
    expect(ValueError, dist.irecv, x, -2, text="out of range")
    expect(TypeError, dist.send, [1, 2, 3], peer, text="NumPy array")
    expect(TypeError, dist.send, 3.5, peer, text="NumPy array")
    expect(TypeError, dist.send, np.array([object()]), peer, text="Python objects")
    expect(TypeError, dist.send, np.zeros(2, dtype=[("a", "f4")]), peer, text="structured")
    expect(ValueError, dist.send, x, peer, tag=-1, text="tag")
    expect(ValueError, dist.send, x, peer, tag=2**31, text="tag")
    expect(TypeError, dist.send, x, peer, tag="7", text="tag")
    read_only = np.zeros(3)
    read_only.flags.writeable = False
    expect(ValueError, dist.recv, read_only, peer, text="writeable")
    expect(TypeError, dist.recv, "buffer", peer, text="NumPy array")
    still_works()


@case()
def wrong_buffer_is_refused_and_the_message_kept():
    rank, _ = rank_size()
    if rank == 0:
        dist.send(np.arange(4, dtype=np.float32), 1, tag=8)
        dist.send(np.arange(4, dtype=np.float32), 1, tag=8)
    elif rank == 1:
        expect(MessageMismatchError, dist.recv, np.zeros(5, np.float32), 0, tag=8,
               text="shape (4,)")
        expect(MessageMismatchError, dist.recv, np.zeros(4, np.float64), 0, tag=8,
               text="float32")
        expect(MessageMismatchError, dist.recv_reduce, np.zeros((2, 2), np.float32), 0, tag=8)
        request = dist.irecv(np.zeros(3, np.int8), 0, tag=8)
        expect(MessageMismatchError, request.wait)
        buffer = np.zeros(4, np.float32)
        dist.recv(buffer, 0, tag=8)
        np.testing.assert_array_equal(buffer, np.arange(4))
        dist.recv_reduce(buffer, 0, tag=8)
        np.testing.assert_array_equal(buffer, 2 * np.arange(4))
    still_works()


@case()
def a_timed_out_recv_is_withdrawn():
    rank, _ = rank_size()
    if rank == 1:
        buffer = np.zeros(2)
        error = expect(dist.CommTimeoutError, dist.recv, buffer, 0, tag=12, timeout=0.2,
                       text="recv from 0, tag 12")
        assert "rank 0:" in error.report
        dist.barrier()
        fresh = np.zeros(2)
        dist.recv(fresh, 0, tag=12)
        assert (fresh == 7).all() and (buffer == 0).all()
    else:
        dist.barrier()
        if rank == 0:
            dist.send(np.full(2, 7.0), 1, tag=12)


# --------------------------------------------------------------------------- harness


def run_all_cases():
    """Inside each worker: every case in turn, stopping at the first failure."""
    size = dist.get_world_size()
    report = {}
    for function in CASES:
        if size < function.min_size:
            report[function.__name__] = "skipped"
            continue
        try:
            function()
            dist.barrier()
        except Exception:
            report[function.__name__] = traceback.format_exc()
            raise RuntimeError(f"case {function.__name__} failed:\n{report[function.__name__]}") from None
        report[function.__name__] = "ok"
    return report


@pytest.fixture(scope="module", params=[("pipe", 2), ("shm", 2), ("pipe", 4), ("shm", 4)],
                ids=lambda param: f"{param[0]}-{param[1]}ranks")
def contract_report(request):
    transport, world_size = request.param
    try:
        reports = minidist.launch(run_all_cases, world_size=world_size, transport=transport,
                                  timeout=20)
    except dist.WorkerError as error:
        return {"error": str(error)}
    return {"reports": reports}


CASE_NAMES = [function.__name__ for function in CASES]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_contract(contract_report, name):
    if "error" in contract_report:
        error = contract_report["error"]
        failed = re.search(r"case (\w+) failed", error)
        if failed is None or failed.group(1) == name:
            pytest.fail(error)
        if CASE_NAMES.index(name) > CASE_NAMES.index(failed.group(1)):
            pytest.fail(f"not run: case {failed.group(1)} failed before it")
        return  # ran, and passed, before the failing case
    outcomes = [report[name] for report in contract_report["reports"]]
    if all(outcome == "skipped" for outcome in outcomes):
        pytest.skip("needs more ranks")
    assert outcomes == ["ok"] * len(outcomes)
