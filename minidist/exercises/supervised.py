"""A check run in a child process that the student's code cannot take down
with it, keep waiting, or end with a false "passed".

``minidist exercise check`` runs the student's file, and a file can do
anything Python can: ``sys.exit(0)`` or ``os._exit(0)`` (the command would
end with status 0 and no output, which a grader reads as a pass), a loop
that swallows the deadline's exception, one long C call (``sum(range(10**10))``)
that no signal handler interrupts, children forked and left sleeping. So the
command forks one child that does the whole check (load the file, run the
checker, which launches its own processes) and sends back one result record
over a pipe; the parent (this module's :func:`run_check`) only reads records
and watches the clock. The child:

* starts its own session, so that it and everything it forks make one
  process group the parent can SIGKILL at once, grandchildren included, and
  a Ctrl-C at the terminal reaches the parent alone (which then kills the group);
* dies with the parent (``PR_SET_PDEATHSIG``);
* may map :data:`MEMORY_ALLOWANCE` more than the checker's own process
  (``RLIMIT_AS``, inherited by whatever it forks), and dumps no core;
* tells the parent as each of the checker's deadlines starts and ends
  (:func:`.exercise.report_deadlines`). The deadline's alarm stops ordinary
  endless loops with the checker's own message; the parent kills the group
  :data:`GRACE` seconds after an alarm that did not stop the code.

No process-count limit: ``RLIMIT_NPROC`` counts every process of the user
(their editor and shell too, so no fixed number is safe) and is not enforced
for root at all. Instead every process the solution starts is in the
group, and the group is killed when the check ends, however it ends; a
solution that leaves processes behind after a passing check fails. (A
grandchild that calls ``setsid`` itself leaves the group: that one escapes.)

Only a result record makes a verdict: a child that ends without one
(an exit, a signal) or runs past its deadline is a :class:`Stopped`, one
line, and a non-zero status. The Python API (``exercise.check(function)``)
is unchanged and runs in the caller's process.
"""

from __future__ import annotations

import os
import pickle
import resource
import select
import signal
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from minidist.exercises import exercise as _exercise_module
from minidist.exercises.exercise import CHECK_DEADLINE, CheckResult, ExerciseTimeout, load_function
from minidist.runtime import segment_reaper
from minidist.runtime.process_setup import die_with_parent
from minidist.runtime.segments import creator_prefix
from minidist.runtime.signals import reset_in_worker
from minidist.units import format_bytes

#: How much more address space than the checker's own process the check may
#: map (``RLIMIT_AS``). Address space, not memory touched: NumPy, OpenBLAS's
#: buffers and every thread's stack and malloc arena count in full, so the
#: limit must be generous; 2 GiB is far above any exercise (a check's arrays
#: are kilobytes) and stops a runaway allocation before it hurts the machine.
MEMORY_ALLOWANCE = 2 << 30

#: Seconds the parent waits past a deadline before it kills the check: the
#: deadline's own alarm gets the first chance (its message says more).
GRACE = 2.0

#: How often the parent looks whether the child is still there.
_TICK = 0.05

_HEADER = struct.Struct("!Q")  # the length of each pickled record


@dataclass
class Stopped:
    """A check that gave no verdict: ``reason`` is one line; ``status`` is the
    command's exit status (2: the file could not be loaded, 1: the solution
    broke the check)."""

    reason: str
    status: int


def run_check(exercise, path, processes: bool = True) -> CheckResult | Stopped:
    """Check the solution in ``path`` in a supervised child (see the module's
    docstring): its :class:`~.exercise.CheckResult`, or a :class:`Stopped`."""
    read, write = os.pipe()
    sys.stdout.flush()  # or what is buffered would be written by the child too
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(write, exercise, Path(path), processes)  # never returns
    os.close(write)
    try:
        return _supervise(pid, read, exercise.name)
    finally:
        os.close(read)
        _end(pid)


# --------------------------------------------------------------------------- the parent


def _supervise(pid: int, read: int, name: str) -> CheckResult | Stopped:
    """Read the child's records until its result, its end, or its deadline."""
    records = _Records()
    what, limit = f"checking {name}", CHECK_DEADLINE
    stop_at = time.monotonic() + limit + GRACE
    watched = [read]  # until the pipe ends (the solution may close it and go on)
    while True:
        left = stop_at - time.monotonic()
        if left <= 0:
            return Stopped(f"your solution did not finish within {limit:g} s ({what}); it was "
                           "stopped, with every process it started", 1)
        ready, _, _ = select.select(watched, [], [], min(left, _TICK))
        ended = _exit_code(pid)  # before the read: what it sent before its end is there
        if ready:
            chunk = os.read(read, 1 << 16)
            if not chunk:
                watched = []
            try:
                arrived = records.feed(chunk)
            except Exception as error:  # noqa: BLE001 - bytes that are no record of ours
                return Stopped(f"the check's result could not be read ({type(error).__name__}): "
                               "did your solution write to a file descriptor it did not open?",
                               1)
            for record in arrived:
                if record[0] == "result":
                    return _verdict(record, pid)
                _, started, seconds = record  # a deadline starts, or ends (None)
                what, limit = (started, seconds) if seconds is not None \
                    else (f"checking {name}", CHECK_DEADLINE)
                stop_at = time.monotonic() + limit + GRACE
            if chunk:
                continue  # read on before judging an end: more may be there
        if ended is not None:
            return Stopped(_describe_end(ended), 1)


def _verdict(record, pid: int) -> CheckResult | Stopped:
    _, outcome, reaper = record
    if isinstance(outcome, Stopped) or not outcome.ok:
        return outcome
    left = [member for member in _group_members(pid) if member not in (pid, reaper)]
    if left:
        return Stopped(f"your solution left {len(left)} process(es) running after the check "
                       f"(pids {', '.join(map(str, left[:5]))}{', ...' if len(left) > 5 else ''}"
                       "); they were killed: a solution must not start processes of its own", 1)
    return outcome


def _exit_code(pid: int) -> int | None:
    """The child's exit code if it has ended, without reaping it: its pid stays
    its own, so the kill of its group can never hit a stranger's."""
    try:
        found = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if found is None:
        return None
    return -found.si_status if found.si_code in (os.CLD_KILLED, os.CLD_DUMPED) \
        else found.si_status


def _describe_end(code: int) -> str:
    if code == 0:
        return "your solution exited the process (status 0) before the check finished"
    if code > 0:
        return f"your solution exited the process with status {code} before the check finished"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = " (out of memory?)" if -code == signal.SIGKILL else ""
    return f"the check's process was killed by {name}{hint} while running your solution"


def _group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return sorted(members)


def _end(pid: int) -> None:
    """Kill the child's group (the child, what it launched, what the solution
    forked), reap the child, and unlink the shared memory its runs made (its
    segment reaper died in the same kill)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    segment_reaper.unlink_all(creator_prefix(pid))


class _Records:
    """Whole records out of the bytes of the pipe, as they arrive."""

    def __init__(self):
        self.buffer = b""

    def feed(self, chunk: bytes) -> list:
        self.buffer += chunk
        records = []
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + size:
                break
            records.append(pickle.loads(self.buffer[_HEADER.size:_HEADER.size + size]))
            self.buffer = self.buffer[_HEADER.size + size:]
        return records


# --------------------------------------------------------------------------- the child


def _send(fd: int, record) -> None:
    data = pickle.dumps(record)
    data = _HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _limit_memory() -> None:
    with open("/proc/self/statm") as file:
        mapped = int(file.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + MEMORY_ALLOWANCE
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child(write: int, exercise, path: Path, processes: bool) -> None:
    """In the child: set up (module docstring), check, send the result; never returns."""
    me = os.getpid()

    def report(what, seconds):
        if os.getpid() == me:  # not from a process the check forked
            _send(write, ("deadline", what, seconds))

    try:
        os.setsid()
        die_with_parent()
        reset_in_worker()
        _limit_memory()
        _exercise_module.report_deadlines(report)
        outcome = _check(exercise, path, processes)
    except SystemExit as stop:
        outcome = Stopped(f"your solution called sys.exit({stop.code!r}) while being checked", 1)
    except MemoryError:
        outcome = Stopped("your solution ran out of memory: the check may map "
                          f"{format_bytes(MEMORY_ALLOWANCE)} more than the checker itself", 1)
    except BaseException as error:  # noqa: BLE001 - whatever it was, the parent says it
        outcome = Stopped(_first_line(f"the check failed with {type(error).__name__}: "
                                      f"{error}"), 1)
    try:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # the solution's prints, before the parent reports
    except BaseException:  # noqa: BLE001, S110 - a closed stream: nothing to flush
        pass
    try:
        _send(write, ("result", outcome, segment_reaper.reaper_pid()))
    finally:
        os._exit(0)


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


def _check(exercise, path: Path, processes: bool) -> CheckResult | Stopped:
    try:
        function = load_function(path, exercise.function, exercise.name)
    except ExerciseTimeout:
        return Stopped(f"your solution did not finish within {CHECK_DEADLINE:g} s (importing "
                       f"{path})", 1)
    except (OSError, ImportError, AttributeError, SyntaxError) as error:
        return Stopped(_first_line(str(error)), 2)
    options = {} if processes else {"processes": False}
    return exercise.check(function, **options)
