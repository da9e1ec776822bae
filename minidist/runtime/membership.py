"""This process's place in its run, (rank, world size), for the layers that
must not import :mod:`minidist.distributed`.

torch's ``DistributedSampler(dataset)`` reads its rank and world size from
the default process group. minidist's data layer sits below the processes
and may not import them (docs/ARCHITECTURE.md), so the dependency is turned
around: :mod:`minidist.distributed.world` writes the place here when the
process joins a run and clears it when it leaves, and the sampler reads it.
Nothing flows upward, and a process that never joins a run reads None.

Cost: two module globals; no import, so a light process stays light.
"""

from __future__ import annotations

_place: tuple[int, int] | None = None


def join(rank: int, world_size: int) -> None:
    """Called by minidist.distributed when this process becomes ``rank`` of ``world_size``."""
    global _place
    _place = (int(rank), int(world_size))


def leave() -> None:
    """Called by minidist.distributed when this process leaves its run."""
    global _place
    _place = None


def place() -> tuple[int, int] | None:
    """(rank, world size) of the run this process is in, or None outside one."""
    return _place
