"""A rank that is alive but stopped: seen by its process state, named as the cause.

A stopped process (SIGSTOP, SIGTSTP) neither runs nor dies: no
pipe ends, no exit to wait for, no exception. Its peers wait for it until
their timeout, and each of them then reports a timeout of its own. But the
kernel says what it is doing: the state letter in ``/proc/<pid>/stat`` is
``T`` (stopped by a signal) or ``t`` (stopped by a debugger or tracer at a
breakpoint, or by a profiler taking a sample).

The supervisor looks at its live ranks' states every :data:`LOOK_EVERY`
seconds (:class:`StopWatch`) and acts on what it sees:

* a rank in ``T`` for :data:`STOPPED_SECONDS` while the others wait (or have
  all finished) stalls the run: it is named as the cause and the run ends
  then, not at the timeout. Nothing in a run ever sends SIGCONT, so a
  stopped rank does not resume by itself; the few seconds leave room for a
  person who stopped it by hand to continue it (``kill -CONT``). They are
  short against the default timeout (120 s), and a process is never in ``T``
  because of load: only a stop signal puts it there.
* a rank in ``t`` is never ended early: someone is debugging it. If the
  others time out meanwhile, it is still named first, as the reason they
  waited.

Which signal stopped a process is what ``waitid(WSTOPPED | WNOWAIT)`` tells
its parent (the launcher is the parent of every rank), without consuming
the report.
"""

from __future__ import annotations

import os
import signal

#: How long a rank stays stopped (state T) while the others wait before the run ends.
STOPPED_SECONDS = 3.0
#: How often the supervisor reads its ranks' process states.
LOOK_EVERY = 0.5

STOPPED, TRACED = "T", "t"


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (R, S, D, T, t, Z, ...), or None if
    there is no such process or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            # The name, in parentheses, may itself hold ") "; the state follows the last one.
            return file.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def stop_signal(pid: int) -> str | None:
    """The name of the signal that stopped child ``pid`` ("SIGSTOP"), if it is
    this process's child and stopped by a signal; else None."""
    try:
        found = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return None
    if found is None or found.si_code != os.CLD_STOPPED:
        return None
    try:
        return signal.Signals(found.si_status).name
    except ValueError:
        return f"signal {found.si_status}"


def describe(state: str, signal_name: str | None) -> str:
    """'is stopped (SIGSTOP, process state T)', as a sentence without its subject."""
    if state == TRACED:
        return "is stopped by a debugger or tracer (process state t)"
    if signal_name:
        return f"is stopped ({signal_name}, process state T)"
    return "is stopped (process state T)"


class StopWatch:
    """Since when each watched process has been stopped, as last looked at."""

    def __init__(self):
        self.since: dict[int, float] = {}  # rank -> when it was first seen stopped
        self.state: dict[int, str] = {}  # rank -> T or t
        self._next = 0.0

    def due(self, now: float) -> bool:
        """True at most once every :data:`LOOK_EVERY` seconds."""
        if now < self._next:
            return False
        self._next = now + LOOK_EVERY
        return True

    def look(self, workers, now: float) -> None:
        """Read the state of every worker in ``workers`` (objects with rank and pid)."""
        for worker in workers:
            state = process_state(worker.pid)
            if state in (STOPPED, TRACED):
                self.since.setdefault(worker.rank, now)
                self.state[worker.rank] = state
            else:
                self.since.pop(worker.rank, None)
                self.state.pop(worker.rank, None)

    def stalled(self, now: float) -> list[int]:
        """Ranks stopped by a signal (not a debugger) for :data:`STOPPED_SECONDS` or more."""
        return [rank for rank, since in self.since.items()
                if self.state[rank] == STOPPED and now - since >= STOPPED_SECONDS]
