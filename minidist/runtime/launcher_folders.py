"""A launcher's temporary folder, named after it, so that a later run can tell it is orphaned.

``minidist run --transport mpi`` keeps a folder in the temporary directory
while its job runs (the socket its ranks report to). It removes the folder
on every end it sees: the job's, an error, Ctrl-C, SIGTERM. Its own SIGKILL
it cannot see, and it has no reaper (:mod:`.segment_reaper` is forked by a
process that makes shared memory, which this launcher never does). So the
folder is named after its launcher, ``minidist-mpi-<launcher's pid>-<random>``
(as ``minidist run``'s own folders are, for its reaper), and every such
launcher removes, as it starts, the folders whose launcher no longer exists.

A pid is reused in time: a folder whose pid now belongs to another process
stays (a few bytes) until that process is gone too. A live launcher's folder
is never removed.
"""

from __future__ import annotations

import os
import shutil


def prefix(kind: str, launcher: int) -> str:
    """The start of the folder names of launcher ``launcher``: ``minidist-<kind>-<pid>-``."""
    return f"minidist-{kind}-{launcher}-"


def _launcher_of(name: str, kind: str) -> int | None:
    start = f"minidist-{kind}-"
    if not name.startswith(start):
        return None
    pid, dash, _ = name[len(start):].partition("-")
    return int(pid) if dash and pid.isdigit() else None


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def remove_orphans(kind: str, directory: str) -> list[str]:
    """Remove the folders of ``kind`` in ``directory`` whose launcher is gone;
    the names of those removed."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        launcher = _launcher_of(name, kind)
        if launcher is None or launcher == os.getpid() or _exists(launcher):
            continue
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
        removed.append(name)
    return removed
