"""Named shared-memory segments that never outlive their run.

Every segment minidist creates is called
``minidist_<creator's pid>_<24 random hex digits>_<what>``: unguessable
(another user cannot open or pre-create it), yet easy to count in
``/dev/shm`` when checking for leaks, all of them or one run's
(:func:`count_segments` with ``pid``). The process that starts a run creates
the segments and is the only one that unlinks them, on every exit path; its
reaper (:mod:`.segment_reaper`) unlinks them if that process itself is killed
with SIGKILL.

Segments are made with ``shm_open`` and ``mmap`` directly (what
``multiprocessing.shared_memory`` does on Linux, without its imports or its
resource tracker). Workers of ``minidist.launch`` inherit the mapping through
fork and never open a segment by name; ranks of ``minidist run`` are forked
before their run's segments exist and attach by name, unwatched: only the
creator unlinks (a tracker per rank would unlink a segment when that one rank
exits, under the feet of the others: the known trap of
``multiprocessing.shared_memory`` before Python 3.13).
"""

from __future__ import annotations

import _posixshmem
import mmap
import os

from minidist.runtime import segment_reaper

PREFIX = "minidist_"


def creator_prefix(pid: int | None = None) -> str:
    """The start of every name made by process ``pid`` (this one by default)."""
    return f"{PREFIX}{os.getpid() if pid is None else pid}_"


def new_name(what: str) -> str:
    # os.urandom is what secrets.token_hex reads, without importing secrets
    # (hmac, hashlib) into every `minidist run` worker.
    return f"{creator_prefix()}{os.urandom(12).hex()}_{what}"


class Segment:
    """A mapped shared-memory segment: ``buf`` is a writable memoryview of it."""

    def __init__(self, name: str, buf: memoryview, closer, unlinker):
        self.name = name
        self.buf = buf
        self.size = len(buf)
        self._closer = closer
        self._unlinker = unlinker

    @classmethod
    def create(cls, size: int, what: str) -> Segment:
        """A new segment of ``size`` bytes, watched by this process's reaper."""
        segment_reaper.ensure_running(creator_prefix())
        name = new_name(what)
        # shm_open, as multiprocessing.shared_memory does, without its imports
        # (secrets, hashlib) and its resource tracker (see segment_reaper).
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.ftruncate(fd, max(size, 1))
            mapping = mmap.mmap(fd, max(size, 1))
        except BaseException:
            _unlink(name)
            raise
        finally:
            os.close(fd)
        return cls(name, *_view_and_closer(mapping), lambda: _unlink(name))

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map the existing segment ``name`` (a rank of ``minidist run``). No
        reaper, no tracker: only its creator unlinks it."""
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"shared-memory segment {name} does not exist: the run that created it has "
                "ended (or this process was not started by `minidist run`)"
            ) from None
        try:
            mapping = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        return cls(name, *_view_and_closer(mapping), None)

    def close(self) -> None:
        """Unmap (if nothing still points into it; otherwise the unmapping waits
        for process exit, which is harmless once the name is unlinked)."""
        try:
            self._closer()
        except (BufferError, ValueError):
            pass

    def unlink(self) -> None:
        """Remove the name (owner only). Safe to call twice."""
        if self._unlinker is not None:
            unlinker, self._unlinker = self._unlinker, None
            try:
                unlinker()
            except FileNotFoundError:
                pass


def _view_and_closer(mapping):
    view = memoryview(mapping)

    def close():
        view.release()
        mapping.close()

    return view, close


def _unlink(name: str) -> None:
    _posixshmem.shm_unlink("/" + name)


class LocalSegment:
    """Process-private memory with a Segment's interface (a world of one needs
    no sharing)."""

    name = "local"

    def __init__(self, size: int):
        self.buf = memoryview(bytearray(size))
        self.size = size

    def close(self) -> None:
        """Nothing is mapped."""

    def unlink(self) -> None:
        """Nothing is named."""


def release_run(resources, control, arrays=None) -> None:
    """Unlink and unmap everything a run created (its transport's resources,
    its control block, its shared arrays: each with ``unlink`` and ``close``),
    whatever else fails. (Names go first: a segment that still has a name is
    always mapped by its run.) Both launchers end with it."""
    try:
        if resources is not None:
            resources.unlink()
            resources.close()
    finally:
        try:
            if control is not None:
                control.unlink()
                control.close()
        finally:
            if arrays is not None:
                arrays.release()


def count_segments(directory: str = "/dev/shm", pid: int | None = None) -> int:
    """How many minidist segments exist on this machine, or were made by
    process ``pid`` (for leak checks)."""
    prefix = PREFIX if pid is None else creator_prefix(pid)
    try:
        return sum(1 for entry in os.listdir(directory) if entry.startswith(prefix))
    except FileNotFoundError:
        return 0
