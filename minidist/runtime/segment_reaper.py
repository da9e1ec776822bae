"""The last line of defence for shared memory: a process that unlinks a
launcher's segments if the launcher dies without doing it.

The launcher unlinks every segment it made on every exit path it can see
(:func:`.segments.release_run`). The one it cannot see is its own sudden
death: SIGKILL, the out-of-memory killer, a crash in C. Its workers then die
with it (``PR_SET_PDEATHSIG``), but a named segment in ``/dev/shm`` outlives
every process: memory lost until reboot.

So the first time a process creates a segment, it forks a *reaper*: a child
that holds the read end of a pipe and does nothing else. The creator writes
one line per segment it makes (``+name``) and one per segment it unlinks
(``-name``). When the pipe ends, which happens however the creator ends (the
kernel closes a dead process's files), the reaper unlinks every name still
listed and exits. A creator that ended cleanly left the list empty.

multiprocessing's resource tracker does the same job; minidist used it
before. It is a fresh interpreter started with ``exec`` (about 20 ms of CPU
here, plus multiprocessing's imports) at the first segment of every program;
in a 2-rank ``minidist run`` that start ran while both ranks imported NumPy
on the same two cores. A fork of the creator costs a fraction of a
millisecond, and the child needs no imports: what it calls was imported
before the fork (a forked child must not import, in case another thread of
the parent held the import lock at the fork).

The reaper ignores SIGINT, SIGTERM and SIGHUP: Ctrl-C reaches the whole
process group, and the reaper must outlive the launcher to do its job. It
ends when the pipe does. ``ps`` shows it as ``minidist-reaper`` (Linux).
"""

from __future__ import annotations

import _posixshmem
import os
import signal

from minidist.runtime.process_setup import set_process_name

_writer: int | None = None  # the pipe's write end, in the process that forked the reaper
_owner: int | None = None  # that process's pid (a fork of it needs a reaper of its own)
_pid: int | None = None  # the reaper's pid


def watch(name: str) -> None:
    """``name`` was just created by this process: unlink it if this process dies."""
    _send(f"+{name}\n")


def forget(name: str) -> None:
    """``name`` was unlinked by this process: nothing to do for it any more."""
    if _owner == os.getpid():
        _send(f"-{name}\n")


def reaper_pid() -> int | None:
    """The pid of this process's reaper, if it has one (tests look for stray children)."""
    return _pid if _owner == os.getpid() else None


def _send(line: str) -> None:
    data = line.encode()
    if len(data) > 512:  # one write of at most PIPE_BUF bytes is never interleaved
        raise ValueError(f"segment name too long for the reaper: {line[1:-1]!r}")
    if _owner != os.getpid():
        _start()
    try:
        os.write(_writer, data)
    except OSError:  # the reaper was killed: start another, tell it again
        _start()
        os.write(_writer, data)


def _start() -> None:
    global _writer, _owner, _pid
    if _owner == os.getpid():  # a dead reaper: collect it, drop its pipe
        os.close(_writer)
        try:
            os.waitpid(_pid, os.WNOHANG)
        except ChildProcessError:
            pass
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _reap(read)
        finally:
            os._exit(0)
    os.close(read)
    _writer, _owner, _pid = write, os.getpid(), pid


def _reap(read: int) -> None:
    """In the reaper: keep the list until the pipe ends, then unlink what is on it."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    set_process_name("minidist-reaper")
    # Only the pipe: a copy of the creator's other pipe ends held here would
    # keep its workers and its readers from ever seeing them end.
    for fd in _open_fds():
        if fd != read:
            try:
                os.close(fd)
            except OSError:
                pass
    names: set[str] = set()
    pending = b""
    while chunk := os.read(read, 65536):
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            name = line[1:].decode()
            if line[:1] == b"+":
                names.add(name)
            else:
                names.discard(name)
    for name in names:
        try:
            _posixshmem.shm_unlink("/" + name)
        except OSError:
            pass


def _open_fds():
    try:
        return [int(entry) for entry in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every number up to the limit
        return range(os.sysconf("SC_OPEN_MAX"))
