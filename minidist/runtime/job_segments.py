"""The shared memory an mpiexec job made, so that its launcher removes that and nothing else.

MPICH keeps its ranks' shared memory in ``/dev/shm/mpich_shm_*`` segments. A
job that ends normally unlinks them in MPI_Finalize; a job that ends by
MPI_Abort, a killed rank or a killed mpiexec leaves them behind (a few MB
each, until reboot). So whoever started the job removes them after a bad
end. Which ones? Not "every mpich_shm_* made since the job started": another
mpiexec job started meanwhile (another user's script, another test) makes
segments too, and removing those breaks that job.

A segment belongs to this job when one of this job's processes maps it. The
job's processes are mpiexec and its descendants (MPICH's process manager,
then the ranks), and ``/proc/<pid>/maps`` lists what each maps, by path. So
a :class:`JobSegments` looks, while the job runs, every :data:`LOOK_EVERY`
seconds and whenever asked (:meth:`look`), and remembers every MPICH
segment it sees mapped; after a bad end, :meth:`remove` unlinks those
(the ones still there). Linux only, and this machine only: ranks that
mpiexec started on other machines clean up (or leak) there.
"""

from __future__ import annotations

import os
import threading

PREFIX = "mpich_shm_"
SHM_DIRECTORY = "/dev/shm"
#: How often the watcher looks at the job's processes (seconds).
LOOK_EVERY = 0.2


def segments_now(directory: str = SHM_DIRECTORY) -> set[str]:
    """The names of MPICH's shared-memory segments on this machine now (tests check leaks with it)."""
    try:
        return {name for name in os.listdir(directory) if name.startswith(PREFIX)}
    except OSError:
        return set()


def _parents() -> dict[int, int]:
    """pid -> parent pid, for every process on this machine."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue  # it ended meanwhile
        # The name (field 2) is in parentheses and may hold spaces: read after it.
        parents[int(entry)] = int(stat[stat.rindex(b")") + 2:].split()[1])
    return parents


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, now."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def mapped_segments(pid: int) -> set[str]:
    """The MPICH segments process ``pid`` maps now (empty if it has ended)."""
    names = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                at = line.find(f"{SHM_DIRECTORY}/{PREFIX}")
                if at >= 0:
                    # "... /dev/shm/mpich_shm_ab12_0", perhaps with " (deleted)" after it
                    names.add(line[at + len(SHM_DIRECTORY) + 1:].split()[0])
    except OSError:
        pass
    return names


class JobSegments:
    """Remembers the MPICH segments the processes under ``root`` (mpiexec's
    pid) map, looking on a thread until :meth:`stop`."""

    def __init__(self, root: int):
        self.root = root
        self.seen: set[str] = set()
        self._before = segments_now()  # what other jobs had made already
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="minidist-mpich-segments")
        self._thread.start()

    def look(self) -> None:
        """Look at the job's processes now, and remember what they map."""
        found = set()
        for pid in descendants(self.root):
            found |= mapped_segments(pid)
        with self._lock:
            self.seen |= found

    def _watch(self) -> None:
        while not self._stopping.wait(LOOK_EVERY):
            self.look()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def remove(self) -> list[str]:
        """Stop looking; unlink the job's segments that are still there
        (after a bad end). Returns the names removed."""
        self.stop()
        removed = []
        # A job that dies within one look of starting is never seen mapping
        # its segments: also take those made since it started that no
        # process maps any more (another job's, live, are mapped by it).
        orphans = segments_now() - self._before - self.seen
        if orphans:
            mapped = set()
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    mapped |= mapped_segments(int(entry))
            orphans -= mapped
        for name in sorted(self.seen | orphans):
            try:
                os.unlink(os.path.join(SHM_DIRECTORY, name))
                removed.append(name)
            except OSError:
                pass  # MPICH removed it itself
        return removed
