"""Doorbells: one process-shared POSIX semaphore per rank, living inside a
shared-memory segment, for sleeping without spinning.

A rank with nothing to do sleeps on its own doorbell (``sem_clockwait`` on
CLOCK_MONOTONIC, in short slices); whoever changes something that rank may
be waiting for (publishes a message to it, frees a slot it wants to write)
rings it. Because the semaphores are *unnamed* (``sem_init`` with
``pshared=1`` in the segment), nothing but the segment itself exists in the
system: no semaphore names to leak, and processes started as separate
programs reach them by mapping the segment.

The calls go through ctypes to glibc (Linux). Each costs a few hundred
nanoseconds, so the shared-memory transport rings a doorbell only when the
owner has said it is about to sleep (see ``ShmTransport._sleep``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import sys
import time

SEM_BYTES = 64  # sizeof(sem_t) is 32 on 64-bit glibc; one cache line each
#: Where a semaphore's settings (not its counter) lie: glibc's 64-bit sem_t
#: is an 8-byte counter (value and waiters), then its sharing flag.
SETTINGS_OFFSET, SETTINGS_BYTES = 8, 8

_libc = None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load():
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            raise OSError(
                "the shared-memory transport needs Linux (process-shared POSIX semaphores); "
                "use transport='pipe' on this system"
            )
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        for name in ("sem_init", "sem_post", "sem_trywait"):
            getattr(libc, name).argtypes = [ctypes.c_void_p] + (
                [ctypes.c_int, ctypes.c_uint] if name == "sem_init" else [])
        if hasattr(libc, "sem_clockwait"):
            libc.sem_clockwait.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                           ctypes.POINTER(_Timespec)]
        libc.sem_timedwait.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Timespec)]
        _libc = libc
    return _libc


class Doorbells:
    """``count`` semaphores at ``address`` (inside a mapped shared segment)."""

    def __init__(self, address: int, count: int):
        self._libc = _load()
        self._sems = [ctypes.c_void_p(address + index * SEM_BYTES) for index in range(count)]
        self._post = self._libc.sem_post
        self._deadline = _Timespec()
        self._clockwait = getattr(self._libc, "sem_clockwait", None)

    def initialize(self) -> None:
        """Create the semaphores (once, by the process that made the segment)."""
        for sem in self._sems:
            if self._libc.sem_init(sem, 1, 0) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"sem_init failed: {errno.errorcode.get(code, code)}")
        self._settings = self._settings_of(self._sems[0])

    @staticmethod
    def _settings_of(sem) -> bytes:
        # Past the counter, a semaphore holds what sem_init set and nothing
        # changes (glibc: whether it is shared between processes). glibc aborts
        # the process that posts to a semaphore whose settings are garbage
        # ("The futex facility returned an unexpected error code").
        return ctypes.string_at(sem.value + SETTINGS_OFFSET, SETTINGS_BYTES)

    def ring(self, rank: int) -> None:
        # EOVERFLOW (a sleeper woken 2**31 times without sleeping) is harmless.
        self._post(self._sems[rank])

    def ring_all(self) -> list[int]:
        """Ring every rank's doorbell; returns the ranks whose semaphore was
        found overwritten (by another process that maps the segment), which
        are not rung.

        The launcher rings them all to stop a run. It is the one process that
        must survive whatever the ranks did to their shared memory, to report
        and clean up, so it checks each semaphore's settings against those
        sem_init wrote before posting (ranks, which ring one doorbell per
        message, do not: a rank that crashes on a broken semaphore is
        reported like any rank that dies). A rank whose doorbell is not rung
        still wakes: it sleeps in short slices and then reads the abort."""
        settings = getattr(self, "_settings", None)
        broken = []
        for rank, sem in enumerate(self._sems):
            if settings is not None and self._settings_of(sem) != settings:
                broken.append(rank)
                continue
            self._post(sem)
        return broken

    def sleep(self, rank: int, seconds: float) -> None:
        """Wait until rung or ``seconds`` pass (also returns on signals)."""
        deadline = self._deadline
        if self._clockwait is not None:
            target = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + int(seconds * 1e9)
            deadline.tv_sec, deadline.tv_nsec = divmod(target, 1_000_000_000)
            self._clockwait(self._sems[rank], time.CLOCK_MONOTONIC, ctypes.byref(deadline))
        else:
            target = time.time_ns() + int(seconds * 1e9)
            deadline.tv_sec, deadline.tv_nsec = divmod(target, 1_000_000_000)
            self._libc.sem_timedwait(self._sems[rank], ctypes.byref(deadline))

    def drain(self, rank: int) -> None:
        """Forget rings that arrived while the owner was awake."""
        trywait, sem = self._libc.sem_trywait, self._sems[rank]
        for _ in range(64):
            if trywait(sem) != 0:
                return
