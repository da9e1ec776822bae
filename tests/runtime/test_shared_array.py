"""dist.shared_array: arrays declared at launch, mapped by every rank, released however the run ends."""

from __future__ import annotations

import os

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.runtime.segments import PREFIX


def array_segments(*names) -> set[str]:
    """Segments in /dev/shm that hold one of these shared arrays (by their name's suffix)."""
    suffixes = tuple(f"_array-{name}" for name in names)
    return {entry for entry in os.listdir("/dev/shm")
            if entry.startswith(PREFIX) and entry.endswith(suffixes)}


def every_case():
    rank, size = dist.get_rank(), dist.get_world_size()
    slots = dist.shared_array("test-slots")
    slots[rank] = rank + 1.0  # each rank writes its own slot; the others must see it
    dist.barrier()
    seen_by_all = slots.copy()
    dist.barrier()  # nobody changes the slots again before everyone has read them
    matrix = dist.shared_array("test-matrix")
    empty = dist.shared_array("test-empty")
    try:
        dist.shared_array("not-declared")
        missing = "no error"
    except KeyError as error:
        missing = str(error)
    return {"seen": seen_by_all, "matrix": matrix.copy(), "matrix_dtype": str(matrix.dtype),
            "empty_shape": empty.shape, "missing": missing, "size": size}


@pytest.mark.timeout(60)
def test_every_rank_maps_the_same_memory_and_it_is_released():
    initial_matrix = np.arange(6, dtype=np.int32).reshape(2, 3)
    declared = {"test-slots": np.zeros(3), "test-matrix": initial_matrix,
                "test-empty": np.zeros((0, 4))}
    before = array_segments(*declared)
    results = minidist.launch(every_case, world_size=3, shared_arrays=declared)
    for rank, result in enumerate(results):
        np.testing.assert_array_equal(result["seen"], [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(result["matrix"], initial_matrix)
        assert result["matrix_dtype"] == "int32"
        assert result["empty_shape"] == (0, 4)
        assert f"rank {rank}: no shared array named 'not-declared'" in result["missing"]
        assert "test-slots" in result["missing"] and "shared_arrays=" in result["missing"]
    assert array_segments(*declared) == before
    np.testing.assert_array_equal(declared["test-slots"], np.zeros(3))  # copied in, not shared


def write_then_fail():
    dist.shared_array("test-failing")[dist.get_rank()] = 1.0
    if dist.get_rank() == 1:
        raise RuntimeError("worker 1 fails on purpose")
    dist.barrier()


@pytest.mark.timeout(60)
def test_released_when_a_worker_raises():
    before = array_segments("test-failing")
    with pytest.raises(dist.WorkerError, match="worker 1 fails on purpose"):
        minidist.launch(write_then_fail, world_size=2,
                        shared_arrays={"test-failing": np.zeros(2)})
    assert array_segments("test-failing") == before


@pytest.mark.parametrize("declared, error, message", [
    ({"bad name/with slash": np.zeros(2)}, ValueError, "letters, digits"),
    ({"weights": [0.0, 1.0]}, TypeError, "initial NumPy array"),
    ({"objects": np.array([object()])}, TypeError, "plain numeric"),
    ([("weights", np.zeros(2))], TypeError, "dict of name"),
])
def test_bad_declarations_are_refused_before_anything_starts(declared, error, message):
    before = {entry for entry in os.listdir("/dev/shm") if entry.startswith(PREFIX)}
    with pytest.raises(error, match=message):
        minidist.launch(lambda: None, world_size=2, shared_arrays=declared)
    created = {entry for entry in os.listdir("/dev/shm") if entry.startswith(PREFIX)} - before
    assert not {entry for entry in created if "_array-" in entry}


def test_a_run_without_declarations_has_none():
    def worker():
        with pytest.raises(KeyError, match="declared: none"):
            dist.shared_array("weights")
        return True

    assert minidist.launch(worker, world_size=1) == [True]
