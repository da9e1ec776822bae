"""The parent's watchdog: wait for every worker, and stop them all on the first failure.

The parent blocks in ``multiprocessing.connection.wait`` on two things per
worker: its result pipe (a message arrives when its function returns or
raises; the log records it sends on the way are printed as they come)
and its *sentinel* (ready the instant the process exits, whatever killed
it). So a failure is seen as soon as it happens, without polling.

The sentinel is the process's own (a pidfd, see :mod:`.workers`), never a
pipe: a child the worker forked holds copies of its pipes. When a worker
ends, what it forked ends with it (:mod:`.process_groups`).

One failure makes no event at all: a rank *stopped* by a signal (SIGSTOP,
SIGTSTP) is alive and silent. Between waits the supervisor reads its ranks'
process states (:mod:`.stopped_ranks`): a rank stopped for a few seconds
while the others wait for it is named as the cause and the run ends then;
at a timeout, a rank found stopped is named as the reason the others waited.

Another ends with status 0, which for a script (``minidist run``) is a
success, but without leaving the run (``os._exit`` skips the exit work that
tells its peers): it becomes the cause as soon as a live rank waits for it
(:mod:`.early_exits`).

Stopping, in order, fast enough that every worker is gone within a few
seconds of the failure:

1. raise the abort flag in the control block and ring every doorbell: each
   rank blocked in a send, recv or probe raises ``AbortedError`` within one
   wait slice (50 ms) and reports back;
2. after ``grace`` seconds, SIGTERM whoever is still running (a rank busy in
   its own code never looks at the flag);
3. one second later, SIGKILL. A stopped rank gets SIGKILL at once: a SIGTERM
   stays pending in a stopped process until someone continues it.

Shared-memory segments are unlinked by the launcher's ``finally`` after
this, on every path; if the parent itself is SIGKILLed, the workers die with
it (``PR_SET_PDEATHSIG``) and the parent's segment reaper unlinks the
segments (see :mod:`.segment_reaper`).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import time
from multiprocessing.connection import wait

from minidist.runtime import console, early_exits, stopped_ranks
from minidist.runtime import control as ctl
from minidist.runtime.errors import WorkerError, name_ranks
from minidist.runtime.workers import ForkedWorker, ProgramWorker  # noqa: F401 - re-exported

logger = logging.getLogger("minidist")

GRACE_SECONDS = 1.0
TERM_SECONDS = 1.0
SETTLE_SECONDS = 0.1  # after a first failure, how long to look for its real cause

# Which failure explains a run best: a rank that raised or died is the cause;
# a rank whose peer vanished or that was told to stop is a consequence.
_PRIORITY = {"exception": 0, "mismatch": 0, "timeout": 0, "died": 0, "exited": 0, "frozen": 0,
             "peer_gone": 1, "aborted": 2, "stopped": 3}
# The failures a stopped rank causes in the others: when every failure is
# one of these, a rank found stopped is the cause.
_WAITED = ("timeout", "peer_gone", "aborted")


def describe_exit(exitcode) -> str:
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with code {exitcode}"


def _kind_of(type_name: str, blamed, kind: str) -> str:
    """The kind of a rank's failure from its exception's class: a
    PeerGoneError points at the peer it waited for, a CollectiveMismatchError
    that names the odd rank (``blamed``) is that rank's "mismatch"."""
    if type_name == "PeerGoneError":
        return "peer_gone"
    if type_name == "CollectiveMismatchError" and blamed is not None:
        return "mismatch"  # blamed: the rank whose call differs from the majority
    return kind


class Supervisor:
    """Watches ``workers`` until all succeed, or stops them all and raises WorkerError."""

    def __init__(self, workers, control: ctl.ControlBlock, wake_all, error_dir=None,
                 tolerated=frozenset()):
        self.workers = workers
        self.control = control
        self.wake_all = wake_all
        self.error_dir = error_dir
        # Ranks whose failure does not stop the run (fault-tolerant strategies):
        # their failure is recorded as their result and the others go on.
        self.tolerated = frozenset(tolerated)
        self.results = {}
        self.failures = {}  # rank -> dict(kind, type, message, traceback, exitcode, order)
        self.events = []
        self._order = 0
        self.stopped = False
        self.stop_watch = stopped_ranks.StopWatch()
        self.early_exits = early_exits.EarlyExits()

    # ---------------------------------------------------------------- messages

    def _read(self, worker, records: int | None = 64) -> bool:
        """Read what the worker has sent so far: its log records (printed here,
        see :mod:`.console`; at most ``records`` of them per call, so that a rank
        logging without pause cannot keep the supervisor from the others), then
        its one result. True if the result was read."""
        while worker.reader is not None:
            if records is not None:
                if records == 0:
                    return False  # its pipe is still ready: the next wait comes back here
                records -= 1
            try:
                if not worker.reader.poll():
                    return False
                message = pickle.loads(worker.reader.recv_bytes())
            except (EOFError, OSError):
                worker.reader = None
                return False
            if message[0] in ("log", "print"):
                console.emit_worker_message(*message)
                continue
            worker.reader = None
            if message[0] == "ok":
                _, rank, value, events = message
                self.results[rank] = value
                self.events.extend(events)
            else:
                _, rank, kind, type_name, text, tb, events, blamed, failed_at = message
                kind = _kind_of(type_name, blamed, kind)
                self._fail(rank, kind, type_name=type_name, message=text, traceback=tb,
                           peer=blamed, at=failed_at)
                self.events.extend(events)
            return True
        return False

    def _fail(self, rank, kind, **details) -> None:
        if rank in self.failures:
            return
        self._order += 1
        details.setdefault("exitcode", None)
        if details.get("at") is None:  # seen here (a death): no earlier time is known
            details["at"] = time.monotonic()
        self.failures[rank] = dict(kind=kind, order=self._order, **details)
        self.control.set_state(rank, ctl.FAILED)
        if rank in self.tolerated and not self.stopped:
            # Ranks blocked on the failed one must look again now: their
            # wait ends with PeerGoneError, which a fault-tolerant strategy handles.
            self.wake_all()
            logger.warning("rank %d %s; the run goes on without it (its failure is tolerated)",
                           rank, self._summary(rank).split("\n")[0])

    def _fatal(self) -> bool:
        """True when a failure must stop the run (one of a rank not tolerated)."""
        return any(rank not in self.tolerated for rank in self.failures)

    def _exited(self, worker) -> None:
        """The process is gone: read its message, or record how it died."""
        worker.join(0.5)
        self._read(worker, records=None)  # it is gone: read everything it sent
        rank = worker.rank
        if rank in self.results or rank in self.failures:
            return
        code = worker.exitcode()
        if code == 0 and isinstance(worker, ProgramWorker):
            self.results[rank] = None
            if not self.stopped and early_exits.left_without_finishing(self.control, rank):
                self.early_exits.note(rank, time.monotonic())
            return
        details = self._error_file(rank)
        if details:
            kind = _kind_of(details["type"], details.get("peer"),
                            {"AbortedError": "aborted",
                             "CommTimeoutError": "timeout"}.get(details["type"], "exception"))
            self._fail(rank, kind, type_name=details["type"], message=details["message"],
                       traceback=details["traceback"], exitcode=code,
                       peer=details.get("peer"), at=details.get("at"))
        elif self.stopped:
            self._fail(rank, "stopped", exitcode=code)
        else:
            self._fail(rank, "died" if code is None or code < 0 else "exited", exitcode=code)

    def _error_file(self, rank):
        if not self.error_dir:
            return None
        try:
            with open(os.path.join(self.error_dir, f"rank{rank}.txt")) as file:
                return json.load(file)
        except (OSError, ValueError):
            return None

    # ---------------------------------------------------------------- watching

    def _pending(self):
        return [w for w in self.workers if w.rank not in self.results
                and w.rank not in self.failures]

    def _wait_round(self, timeout: float) -> None:
        pending = self._pending()
        waitables = {}
        for worker in pending:
            if worker.reader is not None:
                waitables[worker.reader] = worker
            if worker.sentinel is not None:
                waitables[worker.sentinel] = worker
        ready = wait(list(waitables), timeout) if waitables else []
        if not waitables:
            time.sleep(timeout)
        seen = set()
        for item in ready:
            worker = waitables[item]
            if worker.reader is not None and item is worker.reader:
                self._read(worker)
        for item in ready:
            worker = waitables[item]
            if item is worker.sentinel and worker.rank not in seen:
                seen.add(worker.rank)
                self._exited(worker)
        for worker in pending:
            if worker.sentinel is None and worker.exitcode() is not None:
                self._exited(worker)

    # ---------------------------------------------------------------- stopped ranks

    def _watch_stopped(self) -> None:
        """End the run on a rank stopped for STOPPED_SECONDS while the others
        wait for it (or have all finished): nothing else will ever end it."""
        now = time.monotonic()
        if not self.stop_watch.due(now):
            return
        pending = self._pending()
        self.stop_watch.look(pending, now)
        for rank in self.stop_watch.stalled(now):
            others = [worker.rank for worker in pending if worker.rank != rank]
            waiting = [other for other in others if self.control.state_of(other) == ctl.WAITING]
            if waiting or not others:
                self._fail_stopped(rank, now, waiting)

    def _blame_stopped(self) -> None:
        """The run is failing with timeouts: a rank stopped meanwhile (by a
        signal or a debugger) is why the others waited."""
        kinds = {self.failures[rank]["kind"] for rank in self._fatal_failures()}
        if not kinds <= set(_WAITED):
            return  # a rank raised or died: that is the cause, not a stop
        now = time.monotonic()
        self.stop_watch.look(self._pending(), now)
        timed_out = sorted(rank for rank, failure in self.failures.items()
                           if failure["kind"] == "timeout")
        for rank in list(self.stop_watch.since):
            self._fail_stopped(rank, now, timed_out)

    def _fail_stopped(self, rank, now, waiting) -> None:
        worker = next(worker for worker in self.workers if worker.rank == rank)
        since = self.stop_watch.since[rank]
        description = stopped_ranks.describe(self.stop_watch.state[rank],
                                             stopped_ranks.stop_signal(worker.pid))
        # `at`: when it was first seen stopped, which orders it before the
        # timeouts it caused.
        self._fail(rank, "frozen", at=since, seconds=now - since, waiting=waiting,
                   description=description)
        worker.kill()  # it cannot see the abort flag; SIGKILL ends a stopped process

    # ---------------------------------------------------------------- early exits

    def _watch_early_exits(self) -> None:
        """A rank whose process ended with status 0 without leaving the run
        fails the run once a live rank waits for it: nothing else ends that wait."""
        if not self.early_exits.since:
            return
        live = [worker.rank for worker in self._pending()]
        for rank, waiting, waited_in in self.early_exits.waited_for(self.control, live):
            self._fail_early_exit(rank, waiting, waited_in)

    def _fail_early_exit(self, rank, waiting, waited_in) -> None:
        del self.results[rank]
        # `at`: when its end was seen, which orders it before what it caused.
        self._fail(rank, "exited", exitcode=0, at=self.early_exits.forget(rank),
                   waiting=waiting, waited_in=waited_in)

    def run(self):
        """Block until every worker succeeded (returns {rank: result}) or stop
        all and raise :class:`WorkerError` for the failure that caused it."""
        try:
            while self._pending() and not self._fatal():
                self._wait_round(0.25)
                self._watch_stopped()
                self._watch_early_exits()
            if self._fatal():
                settle = time.monotonic() + SETTLE_SECONDS
                while self._pending() and time.monotonic() < settle:
                    self._wait_round(max(settle - time.monotonic(), 0.001))
                self._blame_stopped()
                self.stop()
                raise self.error()
            return self.results
        except BaseException:
            self.stop()
            raise

    def reap(self, timeout: float = 5.0) -> None:
        """After success: wait for the workers to exit (they do right after
        reporting); stop any that linger (a thread of the user's that never ends)."""
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            worker.join(max(deadline - time.monotonic(), 0.01))
        for worker in self.workers:
            if worker.exitcode() is None:
                worker.terminate()
                worker.join(TERM_SECONDS)
            if worker.exitcode() is None:
                worker.kill()
                worker.join(1.0)

    def stop(self) -> None:
        """Abort the run and make sure no worker survives (idempotent)."""
        if self.stopped:
            return
        self.stopped = True
        culprit = (min(self._fatal_failures(), key=self._cause_key) if self.failures
                   else ctl.NO_CULPRIT)
        self.control.abort(culprit)
        self.wake_all()
        deadline = time.monotonic() + GRACE_SECONDS
        while self._pending() and time.monotonic() < deadline:
            self._wait_round(min(0.05, max(deadline - time.monotonic(), 0.001)))
        survivors = [w for w in self.workers if w.exitcode() is None]
        for worker in survivors:
            if stopped_ranks.process_state(worker.pid) in (stopped_ranks.STOPPED,
                                                           stopped_ranks.TRACED):
                worker.kill()  # a SIGTERM would wait for a SIGCONT that never comes
            else:
                worker.terminate()
        deadline = time.monotonic() + TERM_SECONDS
        for worker in survivors:
            worker.join(max(deadline - time.monotonic(), 0.01))
        for worker in survivors:
            if worker.exitcode() is None:
                worker.kill()
        for worker in survivors:
            worker.join(1.0)
        for worker in self._pending():
            self._exited(worker)

    # ---------------------------------------------------------------- the error

    def _fatal_failures(self):
        fatal = [rank for rank in self.failures if rank not in self.tolerated]
        return fatal or list(self.failures)

    def _cause_key(self, rank):
        failure = self.failures[rank]
        # Of two ranks that timed out waiting for each other, the first to give
        # up saw the other still waiting (its report names the deadlock); the
        # second saw it failed. Both may reach this process in one wait, so
        # the time each rank failed decides, not the order they are read in.
        return (_PRIORITY.get(failure["kind"], 0), failure["at"], failure["order"])

    def _summary(self, rank) -> str:
        """What happened to ``rank``, as a sentence without its subject."""
        failure = self.failures[rank]
        kind = failure["kind"]
        if kind == "exited" and "waiting" in failure:
            return (f"exited (status {failure['exitcode']}) while {name_ranks(failure['waiting'])} "
                    f"waited for it in {failure['waited_in']}: its process ended in the middle "
                    "of the run, without leaving it (os._exit skips the exit work that tells "
                    "the others)")
        if kind in ("died", "exited"):
            return f"{describe_exit(failure['exitcode'])} before returning a result"
        if kind == "stopped":
            return f"{describe_exit(failure['exitcode'])} by the parent, which was stopping the run"
        if kind == "aborted":
            return "stopped waiting when the run was aborted (AbortedError)"
        if kind == "frozen":
            text = f"{failure['description']}: it made no progress for {failure['seconds']:.1f} s"
            if failure["waiting"]:
                text += f" while {name_ranks(failure['waiting'])} waited for it"
            return text + "; it was killed (only SIGCONT resumes a stopped process)"
        return f"failed with {failure['type_name']}: {failure['message']}"

    def tolerated_error(self, rank) -> WorkerError:
        """What a tolerated rank's failure was, as the error it would have raised."""
        failure = self.failures[rank]
        return WorkerError(rank, failure["kind"], f"rank {rank} {self._summary(rank)}",
                           remote_type=failure.get("type_name", ""),
                           remote_message=failure.get("message", ""),
                           remote_traceback=failure.get("traceback", "") or "",
                           exitcode=failure.get("exitcode"))

    def root_cause(self) -> tuple[int, int | None]:
        """(the rank that explains the failure, the rank whose error revealed
        it or None).

        Start from the first failure of the highest priority (a rank that
        raised or died before one whose peer vanished). A PeerGoneError names
        the rank it waited for; follow those names: through ranks that
        themselves only saw a peer vanish, to a rank that raised or died (the
        cause), or to one that *returned* while others still needed it (the
        cause too: it left a collective or exchange the others were in)."""
        rank = min(self._fatal_failures(), key=self._cause_key)
        noticed_by = None
        seen = {rank}
        while True:
            failure = self.failures[rank]
            blamed = failure.get("peer")
            if failure["kind"] != "peer_gone" or blamed is None or blamed in seen:
                return rank, noticed_by
            seen.add(blamed)
            if blamed in self.results:
                return blamed, rank  # it returned; rank was waiting for it
            if blamed not in self.failures or \
                    _PRIORITY.get(self.failures[blamed]["kind"], 0) > _PRIORITY["peer_gone"]:
                return rank, noticed_by  # stopped by the abort: a consequence, not a cause
            rank, noticed_by = blamed, None

    def _witness(self, cause):
        """Of the ranks that waited for ``cause`` (a rank that left without
        finishing), the first whose failure has a traceback; else None."""
        for rank in self.failures[cause].get("waiting") or ():
            if self.failures.get(rank, {}).get("traceback"):
                return rank
        return None

    def error(self) -> WorkerError:
        cause, noticed_by = self.root_cause()
        others = [(rank, self._summary(rank).split("\n")[0])
                  for rank in sorted(self.failures) if rank != cause]
        if noticed_by is not None:
            # The cause returned normally: the error is the one of the rank that noticed.
            noticer = self.failures[noticed_by]
            waiting = sorted(rank for rank, failure in self.failures.items()
                             if failure.get("peer") == cause)
            summary = (f"rank {cause} returned from its function while "
                       f"{name_ranks(waiting)} still waited for it. "
                       f"{noticer.get('message', '').splitlines()[0]}")
            return WorkerError(cause, "returned", summary,
                               remote_type=noticer.get("type_name", ""),
                               remote_message=noticer.get("message", ""),
                               remote_traceback=noticer.get("traceback", "") or "",
                               other_failures=others, noticed_by=noticed_by)
        failure = self.failures[cause]
        if failure["kind"] == "mismatch":
            # Every rank that noticed judged the same calls: the odd rank is
            # the cause, the first to notice only the messenger.
            odd, text = failure["peer"], failure.get("message", "")
            prefix = f"rank {cause}: "
            text = text[len(prefix):] if text.startswith(prefix) else text
            return WorkerError(odd, "mismatch", text.split("\n")[0],
                               remote_type=failure.get("type_name", ""),
                               remote_message=failure.get("message", ""),
                               remote_traceback=failure.get("traceback", "") or "",
                               other_failures=[item for item in others if item[0] != odd],
                               noticed_by=cause)
        witness = self._witness(cause)
        if witness is not None:
            # It raised nothing itself: where a rank waited for it says more
            # (the line of the script that waited, the collective it was in).
            seen = self.failures[witness]
            return WorkerError(cause, failure["kind"], f"rank {cause} {self._summary(cause)}",
                               remote_type=seen.get("type_name", ""),
                               remote_message=seen.get("message", ""),
                               remote_traceback=seen["traceback"], exitcode=failure["exitcode"],
                               other_failures=others, noticed_by=witness)
        return WorkerError(cause, failure["kind"], f"rank {cause} {self._summary(cause)}",
                           remote_type=failure.get("type_name", ""),
                           remote_message=failure.get("message", ""),
                           remote_traceback=failure.get("traceback", "") or "",
                           exitcode=failure.get("exitcode"), other_failures=others)
