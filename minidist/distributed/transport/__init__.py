"""How bytes move between ranks.

* :mod:`.base`    the contract every transport keeps, and the shared progress engine
  (:mod:`.failures` what a wait that cannot end raises, and why;
  :mod:`.collective_hooks` what the collectives register on a transport)
* :mod:`.message` the header that travels before every array
* :mod:`.pipe`    one OS pipe per pair of ranks: simplest, for reading first
* :mod:`.shm`     rings of slots in shared memory, doorbells to sleep on
  (:mod:`.shm_rings` the segment's layout and its making, without NumPy;
  :mod:`.slots_area` the size of the shared slots' part of it)
* :mod:`.doorbell` process-shared semaphores living in shared memory
* the speed shortcuts, subclasses and mixins of the above, all off with
  ``MINIDIST_FAST_PATHS=0`` (listed in :mod:`minidist.distributed.fast_paths`):
  :mod:`.spin` spinning before sleeping; :mod:`.shm_fast` the shm transport
  with rendezvous (:mod:`.cma`), copies around slow page distances
  (:mod:`.memcopy`), small messages without the engine and shared slots
  (:mod:`.shared_slots`)
* :mod:`.mpi`     MPI point-to-point (mpi4py), for scripts started by ``mpiexec``
  (joined by ``init_process_group()``, not started by launch)
* :mod:`.sim`     many simulated ranks in one process, on a virtual clock
  (driven by :func:`minidist.distributed.simulator.simulate`, not by launch)

A transport is used in two halves. The parent creates its *resources* (pipes,
a segment) before the workers start; each worker then *connects* to them and
gets a :class:`~.base.Transport` for its rank.
"""

from __future__ import annotations

import os

#: The contract's names, imported from :mod:`.base` when first asked for
#: (PEP 562): making a run's resources needs neither them nor NumPy, and
#: ``minidist run`` makes its run while the workers import (see run_script).
_FROM_BASE = ("ANY_SOURCE", "ANY_TAG", "MessageInfo", "Request", "Transport")


def __getattr__(name):
    if name in _FROM_BASE:
        from minidist.distributed.transport import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: What minidist.launch and `minidist run` can start workers on.
TRANSPORTS = ("shm", "pipe")
#: Transports that exist but that those launchers cannot start (see check_name).
OTHER_TRANSPORTS = ("mpi", "sim")

__all__ = ["ANY_SOURCE", "ANY_TAG", "MessageInfo", "Request", "Transport", "TRANSPORTS",
           "OTHER_TRANSPORTS", "create_resources", "resources_from_spec", "check_name", "default_spin_ns"]


def check_name(name: str) -> str:
    if name == "sim":
        raise ValueError(
            "the 'sim' transport simulates ranks inside one process on a virtual clock; it "
            "does not run a function on worker processes. Time a collective with "
            "`minidist simulate all_reduce -n 1024 --size 100MB` or "
            "minidist.distributed.simulate('all_reduce', 'ring', world_size=1024, "
            "nbytes=100_000_000).")
    if name == "mpi":
        raise ValueError(
            "the 'mpi' transport joins processes that mpiexec started; minidist.launch and "
            "`minidist run` start their own. Run the script as `mpiexec -n 4 python "
            "script.py`, with dist.init_process_group() in it: under mpiexec it picks the "
            "mpi transport by itself (needs `pip install -e '.[mpi]'`); under mpiexec, "
            "minidist.launch(fn, world_size=N) also runs fn over MPI, on the job's first N "
            "ranks.")
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; choose one of {list(TRANSPORTS)}")
    return name


def create_resources(name: str, world_size: int):
    """Parent side: make the pipes or the segment for ``world_size`` ranks."""
    check_name(name)
    if name == "shm":
        from minidist.distributed.transport.shm_rings import ShmResources

        return ShmResources.create(world_size)
    from minidist.distributed.transport.pipe import PipeResources

    return PipeResources.create(world_size)


def resources_from_spec(spec: dict):
    """Worker side (separate program): find the parent's resources from their description."""
    if spec["transport"] == "shm":
        from minidist.distributed.transport.shm_rings import ShmResources

        return ShmResources.from_spec(spec)
    from minidist.distributed.transport.pipe import PipeResources

    return PipeResources.from_spec(spec)


def default_spin_ns(world_size: int) -> int:
    """How long a waiting rank spins before sleeping, while the fast paths are
    on (:mod:`.spin`; with ``MINIDIST_FAST_PATHS=0`` no rank spins).

    Spinning answers in well under a microsecond instead of the 20 to 100
    microseconds a sleep and wake-up take (more in a VM), but it only helps
    when every rank has a core of its own: with more ranks than cores a
    spinning rank steals the CPU from the rank it is waiting for. So: 200 us
    when ranks <= cores (long enough to cover a peer's copy of a 1 MiB
    message, short enough to cost nothing while a peer computes), else 0.
    MINIDIST_SPIN_US overrides (microseconds; a finer knob for benchmarks).
    """
    if "MINIDIST_SPIN_US" in os.environ:
        return int(float(os.environ["MINIDIST_SPIN_US"]) * 1000)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return 200_000 if world_size <= cores else 0
