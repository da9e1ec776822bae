"""The rings segment of one run of the shared-memory transport: where
everything sits in it, how big it is, and its two halves' handles (the
launching process makes it; a worker attaches or inherits it).

Apart from :mod:`.shm` (the transport that moves messages through it) so that
making a run needs neither NumPy nor the progress engine: ``minidist run``
makes the run while its workers import theirs, and every import of the
launching process there delays them all (NumPy's, in particular, takes
the cores from the workers' own: bench_launch measures it).
"""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING

from minidist.distributed.transport import cma
from minidist.distributed.transport.doorbell import SEM_BYTES, Doorbells
from minidist.distributed.transport.slots_area import area_bytes as slots_area_bytes
from minidist.runtime.segments import Segment

if TYPE_CHECKING:
    from minidist.distributed.transport.shm import ShmTransport

_MAGIC = 0x6D64736D72696E67  # "mdsmring"
_HEADER_WORDS = 8
_LINE = 64
_PAGE = 4096

DEFAULT_SLOTS = 8
MAX_SLOT_BYTES = 1 << 19
MIN_SLOT_BYTES = 16 << 10
MAX_RING_MEMORY = 1 << 30

def free_bytes(path: str) -> int:
    """Free bytes of the file system at ``path`` (what ``shutil.disk_usage``
    says, without importing shutil)."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def check_platform() -> None:
    machine = os.uname().machine  # what platform.machine() reads, without its import
    if machine.lower() not in ("x86_64", "amd64"):
        raise OSError(
            f"the shared-memory transport relies on x86-64 memory ordering; this machine is "
            f"{machine}. Use transport='pipe' here."
        )
    if not os.path.isdir("/dev/shm"):
        raise OSError("the shared-memory transport needs /dev/shm (Linux); use transport='pipe'")


def choose_geometry(world_size: int) -> tuple[int, int]:
    """(slots per ring, bytes per slot).

    Four slots of up to 1 MiB per ordered pair keep a sender and a receiver
    both busy; with many ranks the slots shrink so that all rings together stay
    under 1 GiB and under half of the free space in /dev/shm (the pages are only
    used once written, but a full /dev/shm turns a write into SIGBUS).
    Overridable with MINIDIST_SHM_SLOTS and MINIDIST_SHM_SLOT_BYTES.
    """
    slots = int(os.environ.get("MINIDIST_SHM_SLOTS", DEFAULT_SLOTS))
    if "MINIDIST_SHM_SLOT_BYTES" in os.environ:
        return slots, _align(int(os.environ["MINIDIST_SHM_SLOT_BYTES"]), _LINE)
    pairs = max(world_size * (world_size - 1), 1)
    try:
        free = free_bytes("/dev/shm")
    except OSError:
        free = MAX_RING_MEMORY
    budget = min(MAX_RING_MEMORY, free // 2)
    per_slot = max(budget // (pairs * slots), 1)
    slot_bytes = 1 << (per_slot.bit_length() - 1)
    return slots, max(MIN_SLOT_BYTES, min(MAX_SLOT_BYTES, slot_bytes))


class _Layout:
    """Where everything sits in the rings segment."""

    def __init__(self, world_size: int, slots: int, slot_bytes: int):
        self.world_size = world_size
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.doorbells = _PAGE
        self.flags = _align(self.doorbells + world_size * SEM_BYTES, _LINE)
        self.counters = _align(self.flags + world_size * _LINE, _PAGE)
        self.small = _align(self.counters + world_size * world_size * 2 * _LINE, _PAGE)
        self.data = _align(self.small + slots_area_bytes(world_size), _PAGE)
        self.size = self.data + world_size * world_size * slots * slot_bytes

    def words(self, cma_on: bool) -> list[int]:
        return [_MAGIC, self.world_size, self.slots, self.slot_bytes, int(cma_on), 0, 0, 0]


class ShmResources:
    """The parent-side (or attached) rings segment of one run."""

    name = "shm"

    def __init__(self, segment: Segment, layout: _Layout, owner: bool, cma_on: bool = False):
        self.segment = segment
        self.layout = layout
        self.owner = owner
        self.cma = cma_on  # messages bigger than a ring may go by rendezvous (see .shm_fast)
        self._base_address = ctypes.addressof(ctypes.c_char.from_buffer(segment.buf))
        self.doorbells = Doorbells(self._base_address + layout.doorbells, layout.world_size)

    @classmethod
    def create(cls, world_size: int) -> ShmResources:
        check_platform()
        slots, slot_bytes = choose_geometry(world_size)
        layout = _Layout(world_size, slots, slot_bytes)
        cma_on = cma.available()[0]
        segment = Segment.create(layout.size, "rings")
        try:
            header = segment.buf[:_HEADER_WORDS * 8].cast("Q")
            for index, word in enumerate(layout.words(cma_on)):
                header[index] = word
            header.release()
            resources = cls(segment, layout, owner=True, cma_on=cma_on)
            resources.doorbells.initialize()
        except BaseException:
            segment.close()
            segment.unlink()
            raise
        return resources

    @classmethod
    def from_spec(cls, spec: dict) -> ShmResources:
        check_platform()
        segment = Segment.attach(spec["segment"])
        header = segment.buf[:_HEADER_WORDS * 8].cast("Q")
        magic, world_size, slots, slot_bytes = header[0], header[1], header[2], header[3]
        cma_on = bool(header[4])
        header.release()
        if magic != _MAGIC:
            segment.close()
            raise RuntimeError(f"{spec['segment']} is not a minidist rings segment")
        return cls(segment, _Layout(int(world_size), int(slots), int(slot_bytes)), owner=False,
                   cma_on=cma_on)

    def spec_for(self, rank: int) -> dict:
        return {"transport": "shm", "segment": self.segment.name}

    def fds_for(self, rank: int) -> list[int]:
        return []

    def after_fork(self, rank: int) -> None:
        """Nothing to do: the mapping is inherited."""

    def release_worker_ends(self) -> None:
        """The parent keeps its mapping: it rings the doorbells on abort."""

    def close_unconnected(self) -> None:
        """A rank that never connected holds nothing of its own here."""

    def connect(self, rank: int, control, timeout, spin_ns: int, fast: bool = True
                ) -> ShmTransport:
        """This rank's transport: with ``fast`` (the fast paths on) the one with
        the shortcuts (:mod:`.shm_fast`), else the plain ring of slots (:mod:`.shm`)."""
        if fast:
            from minidist.distributed.transport.shm_fast import FastShmTransport

            return FastShmTransport(self, rank, control, timeout, spin_ns)
        from minidist.distributed.transport.shm import ShmTransport

        return ShmTransport(self, rank, control, timeout)

    def wake_all(self) -> None:
        broken = self.doorbells.ring_all()
        if broken and not getattr(self, "_told_broken", False):
            self._told_broken = True
            import logging

            logging.getLogger("minidist").warning(
                "the doorbells of ranks %s in the run's shared memory were overwritten by a "
                "process that maps it; they are not rung (posting to them could crash this "
                "process), and those ranks notice the end of the run by themselves",
                ", ".join(map(str, broken)))

    def close(self) -> None:
        self.segment.close()

    def unlink(self) -> None:
        if self.owner:
            self.segment.unlink()
