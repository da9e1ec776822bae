"""Ctrl-C and SIGTERM in the launching process: clean exits, never half-done steps.

While a run is in progress the launcher turns SIGTERM into ``Terminated(143)``
(a ``SystemExit``) and Ctrl-C (SIGINT) into ``KeyboardInterrupt``, so that its
``finally`` blocks stop the workers and unlink the shared memory (and the
``minidist`` command says one line). But an exception raised by a
signal handler lands wherever the main thread happens to be, and some places
must not be cut in two:

* between creating a shared-memory segment and remembering it for cleanup
  (the segment would outlive the run: a leak until reboot);
* inside ``fork``: Python runs logging's and multiprocessing's at-fork hooks
  there; a ``SystemExit`` raised in logging's lock release leaves the lock
  held, and the next log call hangs the launcher for ever;
* inside the cleanup itself (a second Ctrl-C while workers are being stopped).

So those steps run inside :meth:`SignalGuard.deferred`: a signal that arrives
there is remembered, and raised as its exception the moment the step is over,
where every resource is already in the cleanup's hands.

Why not block the signals with ``pthread_sigmask``? A mask holds for one
thread only; the kernel then hands a process-directed signal to another
thread (the log-forwarding thread during a run), whose C-level handler
schedules the Python handler on the main thread anyway, in the middle of
the step. Deferring in the Python handler works whichever thread the kernel
chose.
"""

from __future__ import annotations

import _signal
import contextlib
import os
import signal
import threading

_EXIT_CODE_OF_SIGTERM = 128 + signal.SIGTERM
_SIGINT, _SIGTERM = int(signal.SIGINT), int(signal.SIGTERM)
_SIG_IGN, _SIG_DFL = int(signal.SIG_IGN), int(signal.SIG_DFL)


class Terminated(SystemExit):
    """What SIGTERM raises in a launcher: a SystemExit with status 143 (what a
    shell shows for a process SIGTERM ended), by a name of its own, which the
    ``minidist`` command tells apart from a mistake it reports."""


def _raise_for(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(_EXIT_CODE_OF_SIGTERM)


class SignalGuard:
    """Signal handlers that raise, except inside :meth:`deferred` sections."""

    def __init__(self):
        self.depth = 0
        self.pending: int | None = None

    def handle(self, signum, frame) -> None:
        if self.depth:
            if self.pending is None:
                self.pending = signum  # raised when the section ends
            return
        _raise_for(signum)

    @contextlib.contextmanager
    def deferred(self):
        """A step that a signal must not cut in two."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                signum, self.pending = self.pending, None
                _raise_for(signum)


class _Unguarded(SignalGuard):
    """Off the main thread no handler can be installed: nothing is deferred."""

    @contextlib.contextmanager
    def deferred(self):
        yield


#: The guard of the launch in progress in this process (inherited by forked workers).
_active: SignalGuard | None = None


@contextlib.contextmanager
def as_exceptions():
    """For the length of a run: SIGTERM raises Terminated(143), and SIGINT raises
    KeyboardInterrupt (if the program left Ctrl-C to Python's default), each
    held back inside the guard's deferred sections. Previous handlers come back
    at the end."""
    global _active
    if threading.current_thread() is not threading.main_thread():
        yield _Unguarded()
        return
    guard = SignalGuard()
    # _signal with plain numbers, as in reset_in_worker: signal.signal's enum
    # conversions are a measurable part of a warm launch's parent.
    previous = {_SIGTERM: _signal.signal(_SIGTERM, guard.handle)}
    if _signal.getsignal(_SIGINT) is signal.default_int_handler:
        previous[_SIGINT] = _signal.signal(_SIGINT, guard.handle)
    outer, _active = _active, guard
    try:
        yield guard
    finally:
        _active = outer
        for signum, handler in previous.items():
            _signal.signal(signum, handler)


def reset_in_worker() -> None:
    """In a worker just forked by the launcher: Ctrl-C is the parent's alone
    (a terminal sends it to the whole process group, and N tracebacks would
    bury the one that matters); SIGTERM gets its default action back, which is
    how the parent stops a worker that does not notice the abort flag. A
    SIGTERM the parent sent while this process was still inside the fork was
    only remembered by the inherited guard: deliver it now."""
    # The C module's call, with plain numbers: signal.signal converts every
    # argument and result to and from enums, and in a forked worker the enum
    # tables it reads are pages to copy (several times the faults of this
    # call; benchmarks/README.md, "Starting workers").
    _signal.signal(_SIGINT, _SIG_IGN)
    _signal.signal(_SIGTERM, _SIG_DFL)
    guard = _active
    if guard is not None and guard.pending == signal.SIGTERM:
        os.kill(os.getpid(), signal.SIGTERM)


def reset_in_program() -> None:
    """In a forked copy of the launcher that becomes a script's main program
    (:mod:`.program`): the handlers a fresh interpreter has (Ctrl-C raises
    KeyboardInterrupt, SIGTERM ends the process), and no launcher's guard. A
    SIGTERM the launcher received inside the fork was only remembered: deliver
    it now."""
    global _active
    guard, _active = _active, None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if guard is not None and guard.pending == signal.SIGTERM:
        os.kill(os.getpid(), signal.SIGTERM)
