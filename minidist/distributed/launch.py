"""Start N workers, watch them, tear everything down: ``minidist.launch``
(``minidist run`` is :func:`minidist.run_script.run_command`, built on the same runtime).

Start method: **fork**, on purpose. A forked worker starts as a copy of the
parent, so the function it runs may be defined anywhere a student writes
code: in a script's ``if __name__ == "__main__":`` block, in a notebook cell,
as a lambda or a closure over local data. (``spawn`` would start a fresh
interpreter that must *import* the function, which fails for all of those.)
Fork also makes starting cheap: workers inherit the shared segments and pipes
already mapped, nothing is pickled on the way in. Its known caveats are
handled here: output buffers are flushed before forking (or they would be
printed N+1 times), each worker drops the pipe ends that are not its own,
BLAS thread pools are sized for the workers around the forks (see :mod:`.blas_threads`), and a
worker must not rely on threads of the parent (only the forking thread
exists in a child). Fork is POSIX-only; this runtime targets Linux.

Every exit path ends in the same ``finally``: abort flag raised, workers
stopped (SIGTERM, then SIGKILL), pipes closed, segments unlinked. The parent
turns SIGTERM and Ctrl-C into exceptions while a run is in progress so that
this cleanup also runs when the run is killed politely; the steps a signal
must not cut in two (making a segment, forking, the cleanup itself) hold the
signal back until they are done (see :mod:`.signals`).

More ranks than cores work, slowly: ranks take turns on the cores, and
``launch`` says so once per program (:class:`OversubscriptionWarning`).
"""

from __future__ import annotations

import multiprocessing
import os
import sys

from minidist import trace as _trace
from minidist.distributed import world
from minidist.distributed.shared_array import SharedArrays
from minidist.distributed.transport import check_name, create_resources
from minidist.distributed.transport.mpi_environment import launched_by_mpi
from minidist.distributed.worker import worker_main
from minidist.runtime import blas_threads, console, signals
from minidist.runtime.control import ControlBlock
from minidist.runtime.oversubscription import cores, warn_if_oversubscribed  # noqa: F401
from minidist.runtime.segments import release_run as _release
from minidist.runtime.supervisor import ForkedWorker, Supervisor

_DEFAULT = object()


class _ResultPipe:
    def __init__(self, context):
        self.reader, self.writer = context.Pipe(duplex=False)

    def close_in_child(self):
        self.reader.close()
        self.writer.close()


def _load_average() -> float | None:
    """The machine's 1-minute load average (other programs count): with the
    cores, it says whether the ranks had the machine to themselves."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    return world_size


def _timeout_seconds(timeout):
    """The timeout in seconds, checked: a positive finite number, or None (no limit)."""
    if timeout is _DEFAULT:
        return world.DEFAULT_TIMEOUT
    import datetime
    import math

    if not (timeout is None or isinstance(timeout, datetime.timedelta)
            or (isinstance(timeout, (int, float)) and not isinstance(timeout, bool))):
        raise TypeError(f"launch(timeout=...) is a number of seconds or None (no limit), got "
                        f"{type(timeout).__name__}")
    seconds = world._seconds(timeout)
    if seconds is not None and (math.isnan(seconds) or seconds <= 0):
        raise ValueError(f"launch(timeout={timeout!r}): the timeout bounds every wait in "
                         "seconds, so it must be a positive number; pass None for no limit.")
    if seconds is not None and math.isinf(seconds):
        raise ValueError("launch(timeout=inf): pass timeout=None for no limit.")
    return seconds


#: File descriptors the launching process holds per rank while it starts
#: them: the result pipe's two ends, the process's sentinel, and one spare.
FDS_PER_RANK = 4

#: The least memory a rank costs: the pages a forked rank writes of its own
#: before any work of the user's (Private_Dirty in /proc/<pid>/smaps_rollup of
#: a rank that ran one small all_reduce: about 8 MiB).
MEMORY_PER_RANK = 8 << 20


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _check_machine_holds(world_size: int, transport: str) -> None:
    """Refuse, before anything starts, a world this machine cannot hold: the
    launcher's open-file limit (it keeps pipes to every rank; the pipe
    transport adds two per ordered pair) and the kernel's process ids."""
    import errno
    import resource

    needed = FDS_PER_RANK * world_size
    if transport == "pipe":
        needed += 2 * world_size * (world_size - 1)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 0
    if soft != resource.RLIM_INFINITY and needed + in_use > soft:
        raise OSError(errno.EMFILE, (
            f"launch(world_size={world_size}, transport={transport!r}) is too big for this "
            f"process: it needs about {needed:,} open files and may open {soft:,} "
            f"({in_use} in use; `ulimit -n`). Use fewer ranks, raise the limit, or simulate "
            "a large world with minidist.distributed.simulate, which runs the same "
            "algorithms on thousands of ranks in one process."))
    available = _available_memory()
    if available is not None and world_size * MEMORY_PER_RANK > available:
        raise OSError(errno.ENOMEM, (
            f"launch(world_size={world_size}) is too big for this machine: each rank costs at "
            f"least {MEMORY_PER_RANK >> 20} MiB of its own, {world_size * MEMORY_PER_RANK >> 20:,} "
            f"MiB in all, and {available >> 20:,} MiB are available. Use fewer ranks, or "
            "simulate a large world with minidist.distributed.simulate."))
    try:
        with open("/proc/sys/kernel/pid_max") as file:
            pid_max = int(file.read())
    except (OSError, ValueError):
        return
    if world_size > pid_max // 2:
        raise OSError(errno.EAGAIN, (
            f"launch(world_size={world_size}) is too big for this machine: the kernel "
            f"allows {pid_max:,} process ids in all. Use fewer ranks, or simulate a large "
            "world with minidist.distributed.simulate."))


def _machine_refused(error: OSError, what: str, world_size: int):
    """An OSError of the machine's limits (no memory, no more processes or
    files) turned into one line that says what failed and what to do."""
    import errno

    if error.errno not in (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE,
                           errno.ENOSPC):
        return error
    return OSError(error.errno, (
        f"launch(world_size={world_size}): the machine refused {what} "
        f"({type(error).__name__}: {os.strerror(error.errno)}), so the world is too big for "
        "it (memory, processes, open files or /dev/shm). Use fewer ranks, or simulate a "
        "large world with minidist.distributed.simulate."))


def _check_call_arguments(args, kwargs, trace) -> None:
    """What launch passes on, checked before any process starts."""
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"launch(args=...) is a tuple of fn's positional arguments, got "
                        f"{type(args).__name__}; write args=(value,) for one.")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"launch(kwargs=...) is a dict of fn's keyword arguments, got "
                        f"{type(kwargs).__name__}; e.g. kwargs={{'steps': 10}}.")
    if trace is not None:
        try:
            path = os.fspath(trace)
        except TypeError:
            raise TypeError(f"launch(trace=...) is a file path, got {type(trace).__name__}") \
                from None
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise ValueError(f"launch(trace={path!r}) is a folder; name a file in it, e.g. "
                             f"{os.path.join(path, 'run.jsonl')!r}.")
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"launch(trace={path!r}): the folder {folder!r} does not "
                                    "exist, so the trace could not be written after the run; "
                                    "create it first.")


def launch(fn, world_size: int = 2, transport: str = "shm", args=(), kwargs=None, *,
           trace=None, timeout=_DEFAULT, log_level="INFO", shared_arrays=None,
           tolerate_failures=False, max_restarts: int = 0) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` worker processes; return the
    list of their return values, by rank.

    Inside ``fn``, ``minidist.distributed`` is initialized: ``dist.get_rank()``,
    ``dist.send``, ... work directly. ``transport`` is "shm" (shared memory,
    fast) or "pipe" (OS pipes, simplest). ``trace`` is a path: every message
    (and marked region) of every rank is written there as JSON lines, also when
    the run fails. ``timeout`` (seconds, default 120, None for no limit) bounds
    how long any single blocking call may wait; past it the call fails with a
    report of what every rank was doing. ``shared_arrays`` (a dict of name ->
    initial NumPy array) declares arrays every rank maps at once, read with
    ``dist.shared_array(name)`` (see :mod:`.shared_array`); they are released
    when the run ends, however it ends.

    If any worker raises or dies, all others are stopped within a few seconds
    and :class:`~minidist.runtime.errors.WorkerError` is raised here,
    naming the rank and carrying its traceback.

    ``tolerate_failures`` (True for every rank, or a collection of ranks) is
    for fault-tolerant strategies: a tolerated rank that raises or dies does
    not stop the run. A warning names it; the others go on, and any call of
    theirs that waits on it ends with
    :class:`~minidist.runtime.errors.PeerGoneError`, which the strategy
    catches to fail over (``dist.failed_ranks()`` lists who is gone). Its
    entry in the returned list is the :class:`WorkerError` describing its
    failure instead of a result.

    ``max_restarts=K`` (torchrun's ``--max-restarts``): after a failure,
    every worker is ended as above, everything released, and ``fn`` runs
    again on fresh workers, up to K times; ``os.environ`` holds
    ``TORCHELASTIC_RESTART_COUNT`` (0, 1, ...), ``TORCHELASTIC_MAX_RESTARTS``
    and ``TORCHELASTIC_RUN_ID`` in the workers (``fn`` resumes from its own
    checkpoint, see :mod:`minidist.parallel.resilience`). The world keeps its
    size (``minidist run -n MIN:MAX`` shrinks a script's). The last
    attempt's error is raised when the restarts are spent; ``trace`` holds
    the last attempt.
    """
    if not callable(fn):
        raise TypeError(f"launch needs a function to run, got {type(fn).__name__}")
    world_size = _check_world_size(world_size)
    timeout = _timeout_seconds(timeout)
    _check_call_arguments(args, kwargs, trace)
    if launched_by_mpi() and not world.is_initialized():
        # mpiexec started this script: the ranks exist already (see mpi_launch.py).
        from minidist.distributed.mpi_launch import launch_under_mpi

        if tolerate_failures or max_restarts:
            raise ValueError("launch(tolerate_failures=..., max_restarts=...) needs the forked "
                             "workers' supervisor; under mpiexec a failing rank ends the job.")
        local = "shm" if transport == "mpi" else transport
        if transport != "mpi":
            check_name(transport)
        return launch_under_mpi(
            fn, world_size, local, args, dict(kwargs or {}), trace=trace,
            timeout=_timeout_seconds(timeout), shared_arrays=shared_arrays,
            launch_locally=lambda: _launch_forked(fn, world_size, local, args, kwargs,
                                                  trace, timeout, log_level, shared_arrays,
                                                  tolerate_failures))
    check_name(transport)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a whole number, 0 or more, got {max_restarts!r}")
    if max_restarts == 0:
        return _launch_forked(fn, world_size, transport, args, kwargs, trace, timeout,
                              log_level, shared_arrays, tolerate_failures)
    from minidist.runtime.restarts import run_with_restarts

    return run_with_restarts(
        lambda: _launch_forked(fn, world_size, transport, args, kwargs, trace, timeout,
                               log_level, shared_arrays, tolerate_failures),
        max_restarts, say=lambda line: print(f"minidist.launch: {line}", file=sys.stderr,
                                             flush=True))


def _launch_forked(fn, world_size, transport, args, kwargs, trace, timeout, log_level,
                   shared_arrays, tolerate_failures) -> list:
    """The launch of this machine: fork ``world_size`` workers and watch them."""
    if world.is_initialized():
        raise RuntimeError(
            f"minidist.launch was called inside rank {world.get_rank()} of a running launch; "
            "workers cannot start workers. Call launch from the top-level program.")
    if not hasattr(os, "fork"):
        raise OSError("minidist.launch needs fork (Linux or another POSIX system)")
    kwargs = dict(kwargs or {})
    tolerated = _tolerated_ranks(tolerate_failures, world_size)
    _check_machine_holds(world_size, transport)
    warn_if_oversubscribed(world_size, stacklevel=4)  # launch -> _launch_forked -> here
    context = multiprocessing.get_context("fork")
    options = {"timeout": _timeout_seconds(timeout), "trace": trace is not None,
               "log_level": log_level, "parent_pid": os.getpid()}
    arrays = control = resources = supervisor = None
    workers = []
    with signals.as_exceptions() as guard:
        try:
            # Each resource is in a variable the cleanup sees before a signal
            # can interrupt: a segment made but not yet remembered would leak.
            with guard.deferred():
                try:
                    arrays = SharedArrays.create(shared_arrays)
                    options["shared_arrays"] = arrays
                    control = ControlBlock.create(world_size)
                    resources = create_resources(transport, world_size)
                    pipes = [_ResultPipe(context) for _ in range(world_size)]
                except OSError as error:
                    raise _machine_refused(error, f"the {transport} transport's memory and "
                                           "pipes", world_size) from error
            sys.stdout.flush()
            sys.stderr.flush()
            # Each worker is born with its share of the BLAS threads (see
            # blas_threads). The parent's own count comes back once the workers
            # are gone, not right after the forks: putting it back restarts
            # OpenBLAS's pool, and its threads then take the cores from the
            # ranks while they start (bench_launch.py measures a launch).
            with blas_threads.for_forked_workers(blas_threads.threads_per_worker(world_size)):
                for rank in range(world_size):
                    options_for_rank = dict(options, other_pipes=[p for r, p in enumerate(pipes)
                                                                  if r != rank],
                                            log_handler=console.worker_log_handler(rank))
                    process = context.Process(
                        target=worker_main, name=f"minidist-rank-{rank}", daemon=False,
                        args=(rank, world_size, fn, args, kwargs, resources, control,
                              pipes[rank], options_for_rank))
                    with guard.deferred():  # not inside fork's at-fork hooks (logging's locks)
                        try:
                            process.start()
                        except OSError as error:
                            raise _machine_refused(error, f"to start rank {rank} (ranks 0.."
                                                   f"{rank - 1} had started)", world_size) \
                                from error
                        workers.append(ForkedWorker(rank, process, pipes[rank].reader))
                        pipes[rank].writer.close()
                # At once: a rank whose peer failed must see that peer's pipes end.
                resources.release_worker_ends()
                supervisor = Supervisor(workers, control, resources.wake_all,
                                        tolerated=tolerated)
                results = supervisor.run()
                supervisor.reap()
            return [results[rank] if rank in results else supervisor.tolerated_error(rank)
                    for rank in range(world_size)]
        finally:
            with guard.deferred():
                _clean_up(workers, supervisor, control, resources, arrays,
                          trace, world_size, transport)


def _clean_up(workers, supervisor, control, resources, arrays, trace, world_size,
              transport) -> None:
    """Whatever happened: no worker left running, every segment unlinked, the
    trace written (also of a failed run)."""
    try:
        if workers and control is not None:
            if supervisor is None:
                wake = resources.wake_all if resources is not None else (lambda: None)
                supervisor_ = Supervisor(workers, control, wake)
            else:
                supervisor_ = supervisor
            supervisor_.stop()
        for worker in workers:  # a stop cut short by an exception leaves some
            if worker.exitcode() is None:
                worker.kill()
                worker.join(1.0)
        for worker in workers:
            worker.close()
        if trace is not None and supervisor is not None:
            _trace.write_jsonl(trace, supervisor.events,
                               _trace.make_header(world_size, transport=transport,
                                                  cores=cores(), load=_load_average()))
    finally:
        _release(resources, control, arrays)


def _tolerated_ranks(tolerate_failures, world_size: int) -> frozenset:
    if tolerate_failures is True:
        return frozenset(range(world_size))
    if tolerate_failures is False or tolerate_failures is None:
        return frozenset()
    try:
        ranks = frozenset(int(rank) for rank in tolerate_failures)
    except (TypeError, ValueError):
        raise TypeError("tolerate_failures must be True, False or a collection of ranks, got "
                        f"{tolerate_failures!r}") from None
    outside = sorted(rank for rank in ranks if not 0 <= rank < world_size)
    if outside:
        raise ValueError(f"tolerate_failures names ranks {outside} outside the world "
                         f"0..{world_size - 1}")
    return ranks
