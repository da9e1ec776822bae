"""The torch.distributed names users reach for next: the ``*_object``
collectives (all_gather, broadcast, gather, scatter), ``P2POp`` + ``batch_isend_irecv``, ``monitored_barrier``,
``get_backend``, ``get_node_local_rank``; torchrun's environment.

One launch per world size runs every case inside the workers (objects of
several kinds, every root, the ring of a batch, the errors a rank can make
alone); the parent compares each result with what torch's semantics say.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import minidist
import minidist.distributed as dist

ROOT = Path(__file__).resolve().parents[2]


def _object_of(rank: int):
    """A different object of every kind on each rank: dict, array, None, nested list."""
    return [{"rank": rank, "name": f"r{rank}" * (rank + 1)},
            np.arange(rank * 3, dtype=np.float64).reshape(rank, 3),
            None,
            [[rank], [rank, [rank * 2.5, "x" * rank]], ()]]


def _error(fn) -> str:
    try:
        fn()
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def _all_cases():
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {"backend": dist.get_backend(), "local_rank": dist.get_node_local_rank()}

    gathered = [None] * n
    dist.all_gather_object(gathered, _object_of(rank))
    out["all_gather_object"] = gathered

    for src in sorted({0, n - 1}):
        objects = _object_of(src) if rank == src else [None] * 4
        dist.broadcast_object_list(objects, src=src)
        out[f"broadcast_object_list src={src}"] = objects
        empty = []
        dist.broadcast_object_list(empty, src=src)  # nothing to send: nothing moves
        out[f"broadcast_object_list empty src={src}"] = empty

    for dst in sorted({0, n - 1}):
        into = [None] * n if rank == dst else None
        dist.gather_object({"from": rank, "big": "y" * (1000 * rank)}, into, dst=dst)
        out[f"gather_object dst={dst}"] = into

    for src in sorted({0, n - 1}):
        mine = ["garbage"]
        dist.scatter_object_list(mine, [_object_of(r) for r in range(n)] if rank == src
                                 else None, src=src)
        out[f"scatter_object_list src={src}"] = mine

    # A ring in one batch: everyone sends right and receives left, no ordering.
    right, left = (rank + 1) % n, (rank - 1) % n
    outgoing = np.full(5, rank, np.int64)
    incoming = np.zeros(5, np.int64)
    big_out = np.full(1 << 18, rank, np.float32)  # 1 MiB: the rendezvous path, not a slot
    big_in = np.zeros(1 << 18, np.float32)
    requests = dist.batch_isend_irecv([
        dist.P2POp(dist.irecv, incoming, left, tag=3),
        dist.P2POp(dist.isend, outgoing, right, tag=3),
        dist.P2POp(dist.isend, big_out, right, tag=4),
        dist.P2POp(dist.irecv, big_in, left, tag=4)])
    for request in requests:
        request.wait()
    out["batch ring"] = (int(incoming[0]), float(big_in.min()), float(big_in.max()),
                         len(requests))

    # Errors a rank finds alone, before anything moves.
    out["errors"] = {
        "short list": _error(lambda: dist.all_gather_object([None] * (n + 1), 1)),
        "tuple": _error(lambda: dist.all_gather_object((None,) * n, 1)),
        "bad op": _error(lambda: dist.P2POp(dist.send, outgoing, right)),
        "empty batch": _error(lambda: dist.batch_isend_irecv([])),
        "not a P2POp": _error(lambda: dist.batch_isend_irecv([(dist.isend, outgoing, 1)])),
        "unpicklable": _error(lambda: dist.all_gather_object([None] * n, lambda: 1)),
        "bad dst": _error(lambda: dist.gather_object(1, None, dst=n)),
        "no output slot": _error(lambda: dist.scatter_object_list([], None, src=0)),
    }
    if rank != 0:
        out["errors"]["list on a non-dst rank"] = _error(
            lambda: dist.gather_object(1, [None] * n, dst=0))
        out["errors"]["input on a non-src rank"] = _error(
            lambda: dist.scatter_object_list([None], [1] * n, src=0))
    else:
        out["errors"]["short list on dst"] = _error(
            lambda: dist.gather_object(1, [None] * (n - 1), dst=0))
        out["errors"]["short input on src"] = _error(
            lambda: dist.scatter_object_list([None], [1] * (n + 1), src=0))

    dist.monitored_barrier(timeout=30)  # everyone comes: no error
    out["after"] = "passed"
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_object_collectives_batch_and_names_on_real_processes(world_size):
    results = minidist.launch(_all_cases, world_size=world_size, transport="shm", timeout=60)
    n = world_size
    for rank, out in enumerate(results):
        assert out["backend"] == "shm"
        assert out["local_rank"] == rank
        _assert_same(out["all_gather_object"], [_object_of(r) for r in range(n)])
        for src in sorted({0, n - 1}):
            _assert_same(out[f"broadcast_object_list src={src}"], _object_of(src))
            assert out[f"broadcast_object_list empty src={src}"] == []
        for dst in sorted({0, n - 1}):
            expected = [{"from": r, "big": "y" * (1000 * r)} for r in range(n)] \
                if rank == dst else None
            assert out[f"gather_object dst={dst}"] == expected
        for src in sorted({0, n - 1}):
            _assert_same(out[f"scatter_object_list src={src}"], [_object_of(rank)])
        assert out["batch ring"] == ((rank - 1) % n, (rank - 1) % n, (rank - 1) % n, 4)
        errors = out["errors"]
        assert errors["short list"].startswith("ValueError") and f"has {n + 1} entries" in \
            errors["short list"] and f"[None] * {n}" in errors["short list"]
        assert errors["tuple"].startswith("TypeError") and "must be a list" in errors["tuple"]
        assert "dist.isend or dist.irecv, got send" in errors["bad op"]
        assert "non-empty" in errors["empty batch"]
        assert "list of dist.P2POp, got a tuple" in errors["not a P2POp"]
        assert errors["unpicklable"].startswith("TypeError") and "cannot pickle" in \
            errors["unpicklable"]
        assert f"dst={n} is out of range" in errors["bad dst"]
        assert "at least one entry; pass [None]" in errors["no output slot"]
        if rank:
            assert "only on the destination rank (dst=0); pass None" in \
                errors["list on a non-dst rank"]
            assert "only on the source rank (src=0); pass None" in \
                errors["input on a non-src rank"]
        else:
            assert f"has {n - 1} entries" in errors["short list on dst"]
            assert f"one object per rank ({n}), got {n + 1} entries" in \
                errors["short input on src"]
        for message in errors.values():
            assert f"rank {rank}" in message or "P2POp" in message or "batch" in message
            assert "\n" not in message
        assert out["after"] == "passed"


def _assert_same(got, expected):
    """Equal, element by element, arrays compared by value, shape and dtype."""
    assert type(got) is type(expected), (got, expected)
    if isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            _assert_same(a, b)
    else:
        assert got == expected


def _lists_of_different_lengths():
    objects = [1, 2, 3] if dist.get_rank() == 0 else [None] * 2
    dist.broadcast_object_list(objects, src=0)


def test_broadcast_object_list_of_another_length_is_named():
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(_lists_of_different_lengths, world_size=2, transport="shm", timeout=60)
    first = str(caught.value).splitlines()[0]
    assert "rank 1 failed with CollectiveMismatchError" in first
    assert "broadcast_object_list: object_list has 2 entries here" in first
    assert "as long as the sender's" in first


def _late_ranks():
    """Two failing monitored barriers (one late rank; two late ranks with
    wait_all_ranks), then one that passes: what each rank was told."""
    rank = dist.get_rank()
    told = []
    dist.barrier()  # start together: only the sleepers are late
    for late, wait_all in (({2}, False), ({1, 2}, True)):
        if rank in late:
            time.sleep(1.5)
        started = time.monotonic()
        try:
            dist.monitored_barrier(timeout=0.5, wait_all_ranks=wait_all)
            told.append(("passed", 0.0))
        except dist.CommTimeoutError as error:
            told.append((str(error), time.monotonic() - started))
    dist.monitored_barrier(timeout=30)
    told.append(("passed", 0.0))
    return told


def test_monitored_barrier_names_the_ranks_that_did_not_arrive():
    results = minidist.launch(_late_ranks, world_size=3, transport="shm", timeout=60)
    for rank, told in enumerate(results):
        (first, first_wait), (second, second_wait), last = told
        assert "monitored_barrier: rank 2 did not arrive within 0.5 s" in first, first
        assert "ranks 1, 2 did not arrive within 0.5 s" in second, second
        assert first.startswith(f"rank {rank}: ") and second.startswith(f"rank {rank}: ")
        assert last == ("passed", 0.0)
    # The late rank finds the verdict waiting: it does not wait its own 2 x 0.5 s.
    assert results[2][0][1] < 0.5


def _python(code: str, **env) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("MINIDIST_") and key not in ("RANK", "WORLD_SIZE")}
    environment.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True,
                          text=True, timeout=60)


def test_torchrun_environment_is_honoured_or_refused_with_what_to_use():
    code = ("import minidist.distributed as dist\n"
            "dist.init_process_group()\n"
            "print(dist.get_rank(), dist.get_world_size(), dist.get_backend(), "
            "dist.get_node_local_rank())\n")
    alone = _python(code, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    assert alone.returncode == 0 and alone.stdout.split() == ["0", "1", "pipe", "0"], alone.stderr
    several = _python(code, RANK="1", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_ADDR="10.0.0.1",
                      MASTER_PORT="29500")
    assert several.returncode != 0
    last = several.stderr.strip().splitlines()[-1]
    assert "RANK=1 and WORLD_SIZE=4" in last and "10.0.0.1:29500" in last
    assert "minidist run -n 4 script.py" in last and "mpiexec -n 4" in last
    garbled = _python(code, RANK="one", WORLD_SIZE="4")
    assert "must be integers" in garbled.stderr.strip().splitlines()[-1]
    no_launcher = _python("import minidist.distributed as dist\n"
                          "print(dist.get_node_local_rank(fallback_rank=7))\n"
                          "dist.get_node_local_rank()\n")
    assert no_launcher.stdout.strip() == "7"
    assert "no LOCAL_RANK in the environment" in no_launcher.stderr.strip().splitlines()[-1]


def test_distributed_data_parallel_has_torch_s_import_path():
    from minidist.parallel import DistributedDataParallel
    from minidist.parallel.data.ddp import DistributedDataParallel as original

    assert DistributedDataParallel is original
