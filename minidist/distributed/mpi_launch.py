"""``minidist.launch`` in a script that mpiexec started: the same script, on a cluster.

On a laptop, ``minidist.launch(train, world_size=2)`` forks two workers.
Under ``mpiexec -n 2 python lesson.py`` the processes already exist, one per
MPI rank, and each runs the whole script (SPMD, as every MPI program does).
So here ``launch`` does not start anything; on every rank it:

1. splits the job: the first ``world_size`` MPI ranks get a fresh
   communicator of their own for this launch (a new, empty world, as a
   fork launch's fresh processes are); the others sit this launch out;
2. on those ranks, makes the world (the mpi transport on that
   communicator) and runs ``fn(*args, **kwargs)``, recording the trace if
   asked;
3. shares every rank's result (and trace events) with every MPI rank, so the
   code after ``launch`` (printing, plotting) sees the same list of results,
   by rank, on every rank, exactly as it would after a fork launch; with
   ``trace=path`` each rank writes the whole trace there (written to a
   temporary name and renamed: ranks on one machine write the same bytes).

A rank whose ``fn`` raises reports its rank and error and ends the whole
job with MPI_Abort: there is no parent to raise a WorkerError in.

More ranks asked than mpiexec started: MPI cannot add processes to a running
job here, so MPI rank 0 runs that launch on its own machine with forked
workers (the ``transport`` the script names), says so on stderr, and hands
the results to the other ranks; ``mpiexec -n <world_size>`` runs it over MPI.
``shared_arrays`` need one machine's shared memory and are refused.
"""

from __future__ import annotations

import logging
import sys

from minidist import trace as _trace
from minidist.distributed import world


def launch_under_mpi(fn, world_size: int, transport: str, args, kwargs, *, trace, timeout,
                     shared_arrays, launch_locally):
    """What :func:`minidist.launch` does when mpiexec started this process."""
    from minidist.distributed.transport.mpi import MpiJob

    job = MpiJob.from_environment()
    _abort_on_uncaught_errors(job)
    if shared_arrays:
        raise ValueError(
            f"rank {job.rank}: launch(shared_arrays=...) maps one machine's shared memory, "
            "which ranks started by mpiexec (perhaps on other machines) do not have. Run "
            "this launch without mpiexec, or send the arrays with dist.broadcast.")
    if world_size > job.size:
        return _run_on_rank_zero(job, world_size, transport, launch_locally, trace)
    resources = job.split(world_size)
    result = events = None
    if resources is not None:
        result, events = _run_here(fn, args, kwargs, resources, world_size, trace, timeout,
                                   job)
    shared = job.share((result, events))[:world_size]
    if trace is not None:
        every = [event for _, rank_events in shared for event in rank_events or ()]
        _trace.write_jsonl(trace, every, _trace.make_header(world_size, transport="mpi"))
    return [rank_result for rank_result, _ in shared]


def _run_here(fn, args, kwargs, resources, world_size, trace, timeout, job):
    """Be rank ``job.rank`` of this launch's world and run ``fn``."""
    rank = resources.rank
    control = resources.control_block()  # shared with this machine's ranks: see mpi_node.py
    if trace is not None:
        _trace.start_recording(rank)
    # What fn logs is printed by this rank, with its rank, as a forked
    # worker's records are by its launcher (no parent gathers them here).
    from minidist.runtime import console

    level = logging.getLogger().level
    logs = console.configure_mpi_logging(rank, "INFO")  # launch()'s default, as forked
    try:
        world.start_worker(rank, world_size, resources, control, timeout, "launch")
        result = fn(*args, **kwargs)
        world.finish_worker()
    except BaseException as error:  # noqa: B036 - every failure must end the job
        world.mark_failed()
        world.report_failure_and_abort(job.abort, rank, world_size, error)
        raise  # not reached: abort_reporting ends the process
    finally:
        resources.close()
        if logs is not None:  # the script's own logging as it was
            logging.getLogger().removeHandler(logs)
            logging.getLogger().setLevel(level)
    events = _trace.stop_recording() if trace is not None else None
    return result, events


def _run_on_rank_zero(job, world_size, transport, launch_locally, trace):
    results = events = None
    if job.rank == 0:
        sys.stderr.write(
            f"minidist: this launch asks for {world_size} ranks but mpiexec started "
            f"{job.size}: MPI rank 0 runs it with {world_size} local processes ({transport!r} "
            f"transport); start `mpiexec -n {world_size}` to run it over MPI.\n")
        sys.stderr.flush()
        try:
            results = launch_locally()
            if trace is not None:
                events = _trace.read_jsonl(trace).events
        except BaseException as failure:  # noqa: B036
            world.report_failure_and_abort(job.abort, 0, job.size, failure)
    results, events = job.broadcast_from_zero((results, events))
    if trace is not None and job.rank != 0:
        # The others' code after the launch reads its trace too (perhaps on
        # another machine): each writes the one rank 0 recorded.
        _trace.write_jsonl(trace, events, _trace.make_header(world_size, transport=transport))
    return results


_hook_installed = False


def _abort_on_uncaught_errors(job) -> None:
    """An error in the script between launches (on any rank) must end the job
    too: the other ranks would wait in the next launch forever."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def abort_job(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            previous(kind, value, tb)
        world.report_failure_and_abort(job.abort, job.rank, job.size, value)

    sys.excepthook = abort_job
