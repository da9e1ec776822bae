"""What every benchmark shares: the machine it ran on, where MPICH's mpiexec
is, the size units, and the environment of the processes it starts. (Sizes
are printed by :func:`minidist.units.format_bytes`, as everywhere else.)"""

from __future__ import annotations

import os
import platform
import shutil
import sys

import numpy as np

KIB, MIB = 1 << 10, 1 << 20


def cores() -> int:
    """The cores this process may run on (what the ranks share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine() -> dict:
    """CPU model, cores and library versions, for the record of a run."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = round(os.getloadavg()[0], 2)  # other programs' share of the cores
    except (AttributeError, OSError):
        load = None
    return {"cpu": model, "cores": cores(), "load": load, "machine": platform.machine(),
            "python": platform.python_version(), "numpy": np.__version__,
            "system": platform.platform()}


def find_mpiexec() -> str | None:
    """The mpiexec next to this Python (the ``mpich`` pip wheel puts it there),
    else the first one on PATH."""
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return candidate if os.path.exists(candidate) else shutil.which("mpiexec")


def child_env(**extra) -> dict:
    """The environment for benchmark processes: one BLAS/OpenMP thread each
    (the ranks already fill the cores), and this ``minidist`` importable even
    when it was found through ``sys.path`` rather than installed."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=package_root + (os.pathsep + path if path else ""))
    env.update(extra)
    return env


def spawn_torch_ranks(target, world_size: int, *args, timeout: float = 900) -> dict:
    """Run ``target(rank, world_size, rendezvous, *args, results)`` in
    ``world_size`` spawned processes (PyTorch's peers of a benchmark: gloo
    meets through the ``rendezvous`` file) and return ``{rank: what it
    put}``; each process puts ``(rank, value)`` on ``results`` once."""
    import multiprocessing
    import tempfile

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        rendezvous = os.path.join(folder, "rendezvous")
        processes = [context.Process(target=target,
                                     args=(rank, world_size, rendezvous, *args, results))
                     for rank in range(world_size)]
        for process in processes:
            process.start()
        try:
            per_rank = dict(results.get(timeout=timeout) for _ in processes)
            for process in processes:
                process.join(60)
                if process.exitcode != 0:
                    raise RuntimeError(f"PyTorch rank {processes.index(process)} exited with "
                                       f"{process.exitcode}")
        finally:
            for process in processes:
                if process.is_alive():
                    process.kill()
                    process.join(10)
            # The spawn context starts multiprocessing's resource tracker, a process
            # that would live as long as this interpreter: stop it, so that a test
            # (or a lesson) calling this leaves no process behind.
            from multiprocessing import resource_tracker
            stop = getattr(resource_tracker._resource_tracker, "_stop", None)
            if stop is not None:
                stop()
    return per_rank
