"""A trial's deadline: a worker whose trial runs past it is killed, and the
trial is marked failed as a dead worker's is.

The workers of a search exchange no message, so the runtime's timeouts
(which bound a *wait* for a message) never apply to them: a search is
launched with ``timeout=None``. A trial that never ends (an endless loop, a
process stopped by SIGSTOP, a deadlock in a library) would hold the whole
search for ever. So each trial has a deadline, ``trial_timeout`` seconds:

* the worker, as it starts a trial, writes in a small file of its own its
  pid, the trial's number and the time (:class:`TrialClock`); it marks
  itself idle when the trial ends;
* a thread of the parent (:class:`Watchdog`) reads those files a few times
  per second, and SIGKILLs a worker whose trial has run ``trial_timeout``
  seconds (SIGKILL ends a stopped process too). A pid alone could name
  another process by then (a worker that crashed mid-trial leaves its file
  saying "in a trial", and its pid is free once the runtime has collected
  it), so the file also holds the process's start time, and the signal goes
  through a pidfd opened and checked against it first.

The runtime then sees a dead worker, as if it had crashed: the search goes
on without it (``tolerate_failures``), its trial is failed with the reason
given here, the other workers take the remaining trials.

Why kill the worker rather than interrupt the trial inside it: a stopped or
stuck process runs no code of its own, so nothing inside it can keep a
deadline; only another process can.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

#: The default deadline of one trial, in seconds: far above what a trial of
#: the lessons and examples takes (seconds), short of for ever.
TRIAL_TIMEOUT = 600.0


def check_trial_timeout(trial_timeout) -> float | None:
    """``trial_timeout`` as seconds (None: no deadline), or a ValueError."""
    if trial_timeout is None:
        return None
    if isinstance(trial_timeout, bool) or not isinstance(trial_timeout, (int, float)) or \
            not 0 < trial_timeout < float("inf"):
        raise ValueError("trial_timeout must be a positive number of seconds (or None for no "
                         f"deadline), got {trial_timeout!r}")
    return float(trial_timeout)


def _clock_path(folder, worker: int) -> Path:
    return Path(folder) / f"clock-{worker}.json"


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat
    field 22): with the pid, it names one process for ever."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return int(file.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _kill(pid: int, started: int | None) -> bool:
    """SIGKILL process ``pid`` if it is still the one that started at ``started``;
    True if it was."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return False  # gone
    try:
        if _start_time(pid) != started:  # checked while the pidfd holds this process
            return False
        signal.pidfd_send_signal(handle, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False  # it ended meanwhile
    finally:
        os.close(handle)


class TrialClock:
    """In a worker: says when its current trial started (in ``folder``)."""

    def __init__(self, folder, worker: int):
        self.path = _clock_path(folder, worker)
        self.worker = worker
        self.start_time = _start_time(os.getpid())

    def _write(self, record: dict) -> None:
        # Whole or not at all: the watchdog never reads half a record.
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, self.path)

    def started(self, number: int) -> None:
        self._write({"pid": os.getpid(), "started": self.start_time, "trial": number,
                     "since": time.monotonic()})

    def finished(self) -> None:
        self._write({"pid": os.getpid(), "started": self.start_time, "trial": None,
                     "since": None})


class Watchdog:
    """In the parent, for the length of a launch: kills the worker of a trial
    that has run ``seconds``; ``overdue`` maps each killed worker to why."""

    def __init__(self, folder, seconds: float | None):
        self.folder = Path(folder)
        self.seconds = seconds
        self.overdue: dict[int, str] = {}
        self._looked_at: set[int] = set()  # workers past their deadline, killed or gone
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="minidist-trial-deadline",
                                        daemon=True)

    def __enter__(self) -> Watchdog:
        if self.seconds is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        for path in self.folder.glob("clock-*"):
            path.unlink(missing_ok=True)

    def _run(self) -> None:
        every = min(0.25, self.seconds / 4)
        while not self._done.wait(every):
            self._look(time.monotonic())

    def _look(self, now: float) -> None:
        for path in self.folder.glob("clock-*.json"):
            worker = int(path.stem.split("-")[1])
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if worker in self._looked_at or record["trial"] is None or \
                    now - record["since"] < self.seconds:
                continue
            self._looked_at.add(worker)
            if _kill(record["pid"], record["started"]):
                self.overdue[worker] = (f"it did not finish trial {record['trial']} within "
                                        f"trial_timeout={self.seconds:g} s, and was killed")
