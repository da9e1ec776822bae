"""The last line of defence for shared memory: a process that unlinks a
launcher's segments if the launcher dies without doing it.

The launcher unlinks every segment it made on every exit path it can see
(:func:`.segments.release_run`). The one it cannot see is its own sudden
death: SIGKILL, the out-of-memory killer, a crash in C. Its workers then die
with it (``PR_SET_PDEATHSIG``), but a named segment in ``/dev/shm`` outlives
every process: memory lost until reboot.

So the first time a process creates a segment, it forks a *reaper*: a child
that holds the read end of a pipe whose write end only the creator has, and
waits on it. Nothing is ever written: the read returns when the pipe ends,
which happens however the creator ends (the kernel closes a dead process's
files). The reaper then unlinks every segment named after the creator
(``minidist_<creator's pid>_...``, see :mod:`.segments`), removes its run
folders (``/tmp/minidist-run-<creator's pid>-...``: ``minidist run``'s
errors and traces) and exits. After a clean end there are none left; after a
SIGKILL, there are the run's.

The names say whose a segment is, so the reaper needs no list: an earlier
version was sent a line per segment made and unlinked, and each write woke
the reaper (too little to show in a launch's wall time, but a protocol the
names make needless).

multiprocessing's resource tracker does the same job; minidist used it
before. It is a fresh interpreter started with ``exec`` (an interpreter's
start, plus multiprocessing's imports) at the first segment of every program;
in a 2-rank ``minidist run`` that start ran while both ranks imported NumPy
on the same two cores. A fork of the creator costs a fraction of a
millisecond, and the child needs no imports: what it calls was imported
before the fork (a forked child must not import, in case another thread of
the parent held the import lock at the fork).

The reaper ignores SIGINT, SIGTERM and SIGHUP: Ctrl-C reaches the whole
process group, and the reaper must outlive the launcher to do its job.
``ps`` shows it as ``minidist-reaper`` (Linux).
"""

from __future__ import annotations

import _posixshmem
import os
import signal

SHM_DIRECTORY = "/dev/shm"

_owner: int | None = None  # the pid of the process that forked the reaper
_pid: int | None = None  # the reaper's pid


def ensure_running(prefix: str) -> None:
    """This process is about to create a segment: make sure a reaper will
    unlink the names that start with ``prefix`` (this process's) when it ends."""
    global _owner, _pid
    creator = os.getpid()
    if _owner == creator:
        return  # a fork of the creator is not the creator: it gets its own
    # Imported here, by the creator (the child must not import), not by every
    # `import minidist.distributed` (segments.py imports this module).
    import shutil
    import tempfile

    from minidist.runtime import process_setup

    folders = run_folder_prefix(creator, tempfile.gettempdir())
    read, write = os.pipe()  # not inheritable: a program started with exec never holds it
    pid = os.fork()
    if pid == 0:
        try:
            _reap(read, prefix, process_setup)
            _remove_run_folders(folders, shutil)
        finally:
            os._exit(0)
    os.close(read)
    _owner, _pid = creator, pid
    # `write` stays open, unused, for this process's whole life: its end is the signal.


def run_folder_prefix(creator: int, temporary_directory: str) -> str:
    """Where a creator's run folders (``minidist run``'s errors and traces) are
    made: ``<tmp>/minidist-run-<creator's pid>-<random>``, so that its reaper
    knows them by name, as it knows its segments."""
    return os.path.join(temporary_directory, f"minidist-run-{creator}-")


def _remove_run_folders(prefix: str, shutil) -> None:
    directory, start = os.path.split(prefix)
    try:
        names = [name for name in os.listdir(directory) if name.startswith(start)]
    except OSError:
        return
    for name in names:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def reaper_pid() -> int | None:
    """The pid of this process's reaper, if it has one (tests look for stray children)."""
    return _pid if _owner == os.getpid() else None


def _reap(read: int, prefix: str, process_setup) -> None:
    """In the reaper: wait for the pipe to end, then unlink the creator's segments."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    process_setup.set_process_name("minidist-reaper")
    # Only the pipe's read end: a copy of the creator's other pipe ends (or of
    # this pipe's write end) held here would keep them from ever ending.
    process_setup.close_fds_except({read})
    while os.read(read, 4096):
        pass  # nothing is written; a read returns at the end
    unlink_all(prefix)


def unlink_all(prefix: str) -> None:
    """Unlink every segment whose name starts with ``prefix``: the reaper's
    job, also done by whoever killed a creator together with its reaper (the
    supervised exercise check kills a whole process group)."""
    try:
        names = [name for name in os.listdir(SHM_DIRECTORY) if name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        try:
            _posixshmem.shm_unlink("/" + name)
        except OSError:
            pass
