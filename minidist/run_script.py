"""``minidist run -n N script.py``: N copies of a script, watched like launch's workers.

Each rank is a **fork of this launching process** that becomes the script's
main program (:mod:`minidist.runtime.program`: its own session, file
descriptors, environment, ``sys.argv`` and ``__main__``, and an interpreter's
exit), with MINIDIST_RANK, MINIDIST_WORLD_SIZE, MINIDIST_TRANSPORT and
MINIDIST_RUN_FD in its environment (and torchrun's RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE); its ``dist.init_process_group()`` reads the
run's description (the shared-memory names, the timeout, where to log) from
that pipe.

Why fork and not ``python script.py``: a fresh interpreter per rank costs
its start and every import again, N times on the same cores; a
fork has what the launcher imported. So the launcher imports, before forking,
what every rank needs to join a run and it needs itself (the package face,
the transports' layouts, the supervisor's connections: once, not N + 1
times), and nothing more.

Why a pipe rather than the environment: order. Most of a short run is the
ranks importing NumPy, which the launcher never needs. So it forks the ranks
first, then imports the rest of what it needs and makes the run's shared
memory *while the ranks import NumPy*, and writes each one its description
when the run is ready; a rank that gets there first waits on the pipe (a
launcher that dies first closes it: the rank stops with an error). (With
``--transport pipe`` the pipes themselves must exist before the ranks are
forked, as they inherit them: that transport is made first.)

``benchmarks/bench_launch.py`` times a `minidist run -n 2` of a hello against
``mpiexec -n 2`` of an mpi4py hello (benchmarks/README.md, "Starting workers").

This module imports nothing heavy at its top for that reason; keep it so.
"""

from __future__ import annotations

import json
import os

from minidist.runtime import program, signals
from minidist.runtime.blas_threads import environment_for
from minidist.runtime.workers import ProgramWorker


def run_command(args) -> int:
    """``minidist run -n N [--transport T] [--trace FILE] [--timeout S] script.py [args]``.

    Returns the exit status: 0 when every rank exits 0; otherwise the first
    failure is printed (rank, traceback) and the status is 1. (With
    ``--max-restarts``, :mod:`minidist.run_elastic` runs attempts of
    :func:`run_attempt` instead.)
    """
    world_size = args.nproc
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if args.transport == "mpi":
        from minidist.commands import _run_under_mpiexec

        return _run_under_mpiexec(args, world_size)
    check_arguments(args)
    return run_attempt(args, world_size).code


def check_arguments(args) -> None:
    """The mistakes a run can be refused for before anything starts, one line each."""
    if args.transport != "shm":  # shm's names are checked when its segment is made
        from minidist.distributed.transport import check_name

        check_name(args.transport)
    if not os.path.isfile(args.script):
        raise SystemExit(f"minidist run: error: no such script: {args.script} (give the path "
                         "of a Python file, e.g. examples/hello.py)")
    if args.trace is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.trace))):
        raise SystemExit(f"minidist run: error: --trace {args.trace}: the folder "
                         f"{os.path.dirname(os.path.abspath(args.trace))} does not exist")


class Attempt:
    """What one attempt of a run ended with: ``code`` (0 or 1), ``error`` (the
    WorkerError naming the culprit, or None), ``exit_codes`` (rank -> exit
    status, of the ranks that failed), ``events`` (its trace's events, when
    the caller collects them), ``started``/``ended`` (the trace's clock)."""

    def __init__(self):
        self.code, self.error, self.exit_codes, self.events = 1, None, {}, None
        self.started = self.ended = None


def run_attempt(args, world_size: int, extra_env: dict | None = None,
                collect_trace: bool = False) -> Attempt:
    """Fork ``world_size`` ranks of the script, watch them, release everything.

    ``extra_env`` is added to every rank's environment (the restarts' names);
    with ``collect_trace`` the ranks' events come back in ``Attempt.events``
    instead of being written to ``--trace`` (the caller writes every
    attempt's at the end)."""
    import time

    now = time.monotonic_ns  # the trace's clock (minidist.trace.now), without its import here
    attempt = Attempt()
    attempt.started = now()
    transport = args.transport
    late = transport == "shm"  # its segment is made after the workers start
    script = args.script
    script_args = list(args.script_args or [])
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    control = resources = listener = supervisor = run_dir = None
    workers, log_pipes, log_fds, description_pipes = [], [], [], []
    with signals.as_exceptions() as guard:
        try:
            if not late:
                with guard.deferred():
                    control, resources = _make_run(transport, world_size)
            blas_env = environment_for(world_size)
            _import_what_ranks_need()
            environ = {key: value for key, value in os.environ.items() if key != "MINIDIST_RUN"}
            environ.update(extra_env or {})
            for rank in range(world_size):
                with guard.deferred():  # a started program is always in `workers`
                    log_read, log_write = os.pipe()
                    log_pipes.append(log_read)
                    log_fds.append(log_write)  # its number in the worker (pass_fds keeps it)
                    description_read, description_write = os.pipe()
                    description_pipes.append(description_write)
                    # torchrun's names too, for scripts that read them (one machine:
                    # the local rank is the rank).
                    env = dict(environ, **blas_env, MINIDIST_RANK=str(rank),
                               MINIDIST_WORLD_SIZE=str(world_size), MINIDIST_TRANSPORT=transport,
                               MINIDIST_RUN_FD=str(description_read),
                               RANK=str(rank), WORLD_SIZE=str(world_size),
                               LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
                    fds = [log_write, description_read]
                    if resources is not None:
                        fds += resources.fds_for(rank)
                    try:
                        forked = program.start(script, script_args, env, fds)
                    finally:
                        os.close(log_write)
                        os.close(description_read)
                    workers.append(ProgramWorker(rank, forked))
            # The rest of minidist, while the workers import theirs; the
            # folder for their errors and traces too (only their description,
            # written below, names it).
            import tempfile

            from minidist.distributed import world
            from minidist.runtime import console, segment_reaper
            from minidist.runtime.oversubscription import warn_if_oversubscribed
            from minidist.runtime.supervisor import Supervisor

            with guard.deferred():
                # Named after this process, so that its segment reaper removes
                # the folder if this process is killed outright.
                prefix = segment_reaper.run_folder_prefix(os.getpid(), tempfile.gettempdir())
                run_dir = tempfile.mkdtemp(prefix=os.path.basename(prefix),
                                           dir=os.path.dirname(prefix))
            error_dir = os.path.join(run_dir, "errors")
            trace_dir = os.path.join(run_dir, "trace") if args.trace else None
            os.makedirs(error_dir)
            if trace_dir:
                os.makedirs(trace_dir)

            warn_if_oversubscribed(world_size)
            if late:
                with guard.deferred():
                    control, resources = _make_run(transport, world_size)
            timeout = world.DEFAULT_TIMEOUT if args.timeout is None else args.timeout
            # Listening before any rank can log (each waits for its description).
            listener = console.PipeLogListener(log_pipes)
            listener.start()
            for rank in range(world_size):
                description = {"control": control.name, "transport": resources.spec_for(rank),
                               "timeout": timeout, "parent_pid": os.getpid(),
                               "log_fd": log_fds[rank], "trace_dir": trace_dir,
                               "error_dir": error_dir}
                _send_description(description_pipes, rank, description)
            resources.release_worker_ends()
            supervisor = Supervisor(workers, control, resources.wake_all, error_dir=error_dir)
            try:
                supervisor.run()
                supervisor.reap()
            except Exception as error:
                if not hasattr(error, "rank"):
                    raise
                stderr = _stderr_console()
                stderr.print("minidist run:", style="bold red", end=" ")
                stderr.print(str(error), markup=False, highlight=False, soft_wrap=True)
                attempt.error = error
                attempt.exit_codes = {rank: failure.get("exitcode")
                                      for rank, failure in supervisor.failures.items()}
                return attempt
            attempt.code = 0
            return attempt
        finally:
            with guard.deferred():
                try:
                    for rank in range(len(description_pipes)):
                        _close(description_pipes, rank)  # a waiting worker sees the end
                    if workers:
                        from minidist.runtime.supervisor import Supervisor

                        wake = resources.wake_all if resources is not None else (lambda: None)
                        (supervisor or Supervisor(workers, _control_for_stop(control,
                                                                             world_size),
                                                  wake)).stop()
                    if listener is not None:
                        listener.stop()
                    else:
                        for fd in log_pipes:
                            os.close(fd)
                    for worker in workers:
                        worker.close()
                    if run_dir and args.trace and os.path.isdir(os.path.join(run_dir, "trace")):
                        events = read_traces(os.path.join(run_dir, "trace"))
                        if collect_trace:
                            attempt.events = events
                        else:
                            write_trace(events, args.trace, world_size, transport)
                    attempt.ended = now()
                finally:
                    if resources is not None or control is not None:
                        from minidist.runtime.segments import release_run

                        release_run(resources, control)
                    if run_dir:
                        import shutil

                        shutil.rmtree(run_dir, ignore_errors=True)


def _import_what_ranks_need() -> None:
    """Before the forks: what every rank imports to join the run and this
    process needs as well (the package face with the world and the console,
    the transports' layouts, the supervisor's connections). A fork inherits
    them; imported after it, they would be imported N + 1 times, on the same
    cores. NumPy is not among them: this process never needs it, and the
    ranks import it in parallel while it makes the run."""
    import multiprocessing.connection  # noqa: F401 - the log pipes, the supervisor's waits

    import minidist.distributed  # noqa: F401 - the face: world, console, errors
    import minidist.distributed.transport.mpi_environment  # noqa: F401 - init asks it
    import minidist.distributed.transport.shm_rings  # noqa: F401 - the layout ranks attach to


def _make_run(transport: str, world_size: int):
    from minidist.distributed.transport import create_resources
    from minidist.runtime.control import ControlBlock

    control = ControlBlock.create(world_size)
    try:
        return control, create_resources(transport, world_size)
    except BaseException:
        control.unlink()
        control.close()
        raise


def _send_description(pipes: list, rank: int, description: dict) -> None:
    """Write rank ``rank`` its run's description and close the pipe (it reads to the end)."""
    data = json.dumps(description).encode()
    view = memoryview(data)
    while view:
        try:
            written = os.write(pipes[rank], view)
        except BrokenPipeError:
            break  # that worker is gone already; the supervisor will say how
        view = view[written:]
    _close(pipes, rank)


def _close(pipes: list, rank: int) -> None:
    if pipes[rank] is not None:
        os.close(pipes[rank])
        pipes[rank] = None


def _control_for_stop(control, world_size: int):
    if control is not None:
        return control
    from minidist.runtime.control import ControlBlock

    return ControlBlock.local(world_size)  # the run was never made: stop the workers all the same


def _stderr_console():
    # Rich is imported only when there is something to print: before the
    # workers start, every import of the launching process delays them all.
    from rich.console import Console

    return Console(stderr=True)


def read_traces(trace_dir) -> list[dict]:
    """Every rank's events of one run, from the files the ranks wrote."""
    from minidist import trace as _trace

    events = []
    for name in sorted(os.listdir(trace_dir)):
        events.extend(_trace.read_jsonl(os.path.join(trace_dir, name)).events)
    return events


def write_trace(events, path, world_size, transport, **header) -> None:
    from minidist import trace as _trace

    count = _trace.write_jsonl(path, events, _trace.make_header(world_size, transport=transport,
                                                                **header))
    _stderr_console().print(f"trace: {count} events written to {path}", highlight=False)
