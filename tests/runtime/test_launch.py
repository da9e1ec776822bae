"""minidist.launch: results, where functions may come from, logs, threads, output."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.runtime import blas_threads


def rank_and_size(offset=0, scale=1):
    return (dist.get_rank() + offset) * scale, dist.get_world_size()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_results_come_back_by_rank_with_args_and_kwargs(transport):
    results = minidist.launch(rank_and_size, world_size=3, transport=transport, args=(10,),
                              kwargs={"scale": 2})
    assert results == [(20, 3), (22, 3), (24, 3)]


@pytest.mark.timeout(30)
def test_closures_lambdas_and_local_functions_work():
    data = np.arange(5.0)  # a closure over local data, never pickled on the way in

    def local_worker():
        return float(data.sum()) + dist.get_rank()

    assert minidist.launch(local_worker, world_size=2) == [10.0, 11.0]
    assert minidist.launch(lambda: dist.get_rank() * 3, world_size=2) == [0, 3]


@pytest.mark.timeout(30)
def test_a_world_of_one():
    def alone():
        dist.barrier()
        return dist.get_rank(), dist.get_world_size(), dist.is_initialized()

    assert minidist.launch(alone, world_size=1) == [(0, 1, True)]


@pytest.mark.timeout(30)
def test_init_process_group_inside_launch_is_harmless():
    def worker():
        dist.init_process_group()  # the same code runs under `minidist run`
        dist.init_process_group(world_size=2, rank=dist.get_rank())
        try:
            dist.init_process_group(world_size=5)
        except ValueError as error:
            return str(error)
        return "accepted a wrong world size"

    assert all("this run has 2 ranks" in message
               for message in minidist.launch(worker, world_size=2))


@pytest.mark.timeout(30)
def test_launch_inside_a_worker_is_refused():
    def nested():
        minidist.launch(print, world_size=2)

    with pytest.raises(dist.WorkerError, match="workers cannot start workers"):
        minidist.launch(nested, world_size=1)


@pytest.mark.timeout(30)
def test_numpy_values_and_arrays_are_returned():
    def worker():
        return np.full((2, 2), dist.get_rank(), np.float32)

    results = minidist.launch(worker, world_size=2, transport="pipe")
    assert [r.dtype for r in results] == [np.float32] * 2
    np.testing.assert_array_equal(results[1], np.ones((2, 2)))


@pytest.mark.timeout(30)
def test_blas_threads_are_shared_out_between_workers():
    np.ones((64, 64)) @ np.ones((64, 64))  # make sure BLAS is loaded in the parent
    if not blas_threads.blas_threads():
        pytest.skip("no BLAS library with a thread-count API is loaded")
    expected = blas_threads.threads_per_worker(4)
    before = blas_threads.blas_threads()
    counts = minidist.launch(lambda: sorted(set(blas_threads.blas_threads().values())),
                             world_size=4)
    assert counts == [[expected]] * 4
    assert blas_threads.blas_threads() == before  # the parent's own counts are back


def test_openblas_count_variable_is_the_one_its_getter_reads():
    # launch writes OpenBLAS's count variable instead of calling its setter
    # (which would restart the thread pool): the library must read that variable.
    np.ones((64, 64)) @ np.ones((64, 64))
    variables = [(library, getter) for library, setter, getter in blas_threads._thread_apis()
                 if isinstance(getter, blas_threads._OpenBlasCount)]
    if not variables:
        pytest.skip("no OpenBLAS with an exported blas_cpu_number is loaded")
    for library, variable in variables:
        real_getter = blas_threads._first_symbol(library, blas_threads._LIBRARIES[0][2])
        real_getter.restype = ctypes.c_int
        previous = variable()
        try:
            for count in (1, previous):
                variable(count)
                assert real_getter() == count
            variable(variable.pool.value + 1)  # never above the pool OpenBLAS made
            assert real_getter() == variable.pool.value
        finally:
            variable(previous)


def test_limit_sets_the_count_inside_and_puts_it_back():
    np.ones((64, 64)) @ np.ones((64, 64))
    before = blas_threads.blas_threads()
    if not before:
        pytest.skip("no BLAS library with a thread-count API is loaded")
    with blas_threads.limit(1):
        assert set(blas_threads.blas_threads().values()) == {1}
        with blas_threads.limit(2):
            assert set(blas_threads.blas_threads().values()) <= {1, 2}
        assert set(blas_threads.blas_threads().values()) == {1}
    assert blas_threads.blas_threads() == before


BEYOND_THE_POOL = """
import os, numpy as np
from minidist.runtime import blas_threads
a = np.ones((300, 300), np.float32)
with blas_threads.limit({more}):         # more threads than OpenBLAS made
    (a @ a.T).sum()
with blas_threads.for_forked_workers({more}):
    pid = os.fork()
    if pid == 0:
        (a @ a.T).sum()
        os._exit(0)
print(os.waitpid(pid, 0)[1])
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("user_threads", ["1", None])
def test_more_threads_than_openblas_made_is_never_asked_for(user_threads):
    # OpenBLAS makes its pool at load time (one thread per core, or
    # OPENBLAS_NUM_THREADS); a count written above it sent a product to
    # threads that do not exist, and it waited for them for ever (a lesson's
    # worker under OPENBLAS_NUM_THREADS=1 hung for 14 minutes).
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    if user_threads:
        env["OPENBLAS_NUM_THREADS"] = user_threads
    more = blas_threads.available_cores() + 2
    done = subprocess.run([sys.executable, "-c", BEYOND_THE_POOL.format(more=more)], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


@pytest.mark.timeout(30)
def test_a_worker_starts_with_no_thread_but_its_own():
    # The BLAS count is set before fork, so no library starts a pool of
    # threads (spinning) in a worker that has not asked for one.
    np.ones((64, 64)) @ np.ones((64, 64))
    threads = minidist.launch(lambda: len(os.listdir("/proc/self/task")), world_size=2)
    assert threads == [1, 1]


def test_thread_variables_for_worker_programs_leave_user_settings_alone():
    env = blas_threads.environment_for(8, environ={"OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in env
    assert env["OPENBLAS_NUM_THREADS"] == str(blas_threads.threads_per_worker(8))


@pytest.mark.timeout(30)
def test_worker_logs_reach_the_parent_with_their_rank():
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    root = logging.getLogger()
    handler = Collect()
    root.addHandler(handler)
    try:
        def worker():
            logging.getLogger("lesson").info("step %d done", 7)
            logging.getLogger("lesson").warning("careful\nsecond line")

        minidist.launch(worker, world_size=3)
    finally:
        root.removeHandler(handler)
    for rank in range(3):
        assert f"[rank {rank}] step 7 done" in records
        assert f"[rank {rank}] careful\nsecond line" in records
    assert root.handlers.count(handler) == 0  # the run's wrappers are gone


@pytest.mark.timeout(60)
def test_many_log_records_arrive_in_order_before_the_result():
    # More records than a pipe holds (64 KiB), from the main thread and from a
    # thread of the worker's own, on the pipe that also carries the result.
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append((record.rank, record.getMessage()))

    def worker():
        import threading

        log = logging.getLogger("chatty")
        side = threading.Thread(target=lambda: [log.info("side %d", i) for i in range(300)])
        side.start()
        for i in range(1500):
            log.info("main %d %s", i, "x" * 40)
        side.join()
        return dist.get_rank()

    root = logging.getLogger()
    handler = Collect()
    root.addHandler(handler)
    try:
        assert minidist.launch(worker, world_size=2) == [0, 1]
    finally:
        root.removeHandler(handler)
    for rank in range(2):
        mine = [text.split("] ", 1)[1] for r, text in records if r == rank]
        main = [text for text in mine if text.startswith("main")]
        assert main == [f"main {i} {'x' * 40}" for i in range(1500)]
        assert sorted(text for text in mine if text.startswith("side")) == \
            sorted(f"side {i}" for i in range(300))


@pytest.mark.timeout(60)
def test_a_rank_that_logs_without_pause_does_not_hide_a_failure():
    # Its records share the supervisor's attention with the other ranks' pipes.
    class Count(logging.Handler):
        count = 0

        def emit(self, record):
            Count.count += 1

    def worker():
        if dist.get_rank() == 0:
            while True:
                logging.getLogger("chatty").info("still here")
        raise ValueError("rank 1 gives up")

    root = logging.getLogger()
    handler = Count()
    root.addHandler(handler)
    try:
        with pytest.raises(dist.WorkerError, match="rank 1 failed with ValueError"):
            minidist.launch(worker, world_size=2)
    finally:
        root.removeHandler(handler)
    assert Count.count > 0


@pytest.mark.timeout(30)
def test_print0_prints_on_rank_zero_only(capfd):
    def worker():
        dist.print0("from the first rank", dist.get_rank())

    minidist.launch(worker, world_size=3)
    out, _ = capfd.readouterr()
    assert out.count("from the first rank") == 1 and "from the first rank 0" in out


@pytest.mark.timeout(30)
def test_progress0_iterates_everywhere():
    def worker():
        return sum(dist.progress0(range(5), description="counting"))

    assert minidist.launch(worker, world_size=2) == [10, 10]


@pytest.mark.timeout(30)
def test_workers_do_not_keep_each_others_pipe_ends():
    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    small, large = (minidist.launch(open_fds, world_size=n, transport="pipe")[0]
                    for n in (2, 5))
    # Each rank holds 2 (n - 1) pipe ends of its own, not 2 n (n - 1).
    assert large - small == 2 * (5 - 1) - 2 * (2 - 1)


@pytest.mark.timeout(30)
def test_destroy_process_group_leaves_the_run():
    def worker():
        dist.barrier()
        dist.destroy_process_group()
        return dist.is_initialized()

    assert minidist.launch(worker, world_size=2) == [False, False]


def _connected():
    from minidist.distributed import world

    return world.current().connected


def _connected_as_the_function_goes():
    from minidist.distributed import world

    seen = [world.current().connected]
    seen.append((dist.get_rank(), dist.get_world_size(), world.current().connected))
    dist.barrier()
    seen.append(world.current().connected)
    return seen


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_a_rank_connects_its_transport_at_its_first_message(transport):
    # A function that sends nothing never pays for connecting; its rank and
    # world size are known without it.
    assert minidist.launch(_connected, world_size=2, transport=transport) == [False, False]
    assert minidist.launch(_connected_as_the_function_goes, world_size=2,
                           transport=transport) == [[False, (0, 2, False), True],
                                                    [False, (1, 2, False), True]]
