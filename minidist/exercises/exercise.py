"""What every exercise is made of, and what a check hands back.

An exercise is a function a student fills in. Its skeleton (in
``minidist/exercises/skeletons/``) holds the function with a docstring that
states the contract and the cost to reach, and a body that raises
:class:`NotWrittenYet`; its module here holds the reference solution and
says how to check a student's version against it.

A check is a list of findings that either all pass or stop at the first
failure, which is told in one short paragraph: what was wrong, where (rank,
element, step) and what to try. The failure of a collective also carries
the traces of the student's run and the reference's, for the side-by-side
replay (:mod:`viz.exercise_replay`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import signal
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SKELETONS = Path(__file__).resolve().parent / "skeletons"

#: Seconds a whole check may run before it is stopped and told it hangs.
CHECK_DEADLINE = 6.0


class NotWrittenYet(NotImplementedError):
    """Raised by a skeleton's body until the student writes it."""


class ExerciseTimeout(Exception):
    """The student's code ran past the check's deadline (an endless loop?)."""


@dataclass
class Failure:
    """Why a check failed: ``kind`` is one word tests can match ("wrong result",
    "deadlock", "raised", "wasteful", "wrong shape", "hang", "not written",
    "not a generator", "empty step", "invalid schedule", ...), ``message`` the paragraph a
    student reads."""

    kind: str
    message: str
    #: where, when known: the first wrong rank, element and step
    rank: int | None = None
    element: int | None = None
    step: int | None = None
    #: the case that failed: (world size, elements, root)
    case: tuple | None = None


@dataclass
class CheckResult:
    """What ``minidist exercise check`` found."""

    exercise: str
    passed: list[str] = field(default_factory=list)   # one line per check that passed
    failure: Failure | None = None
    #: for the side-by-side replay of a failing collective: world size, the
    #: student's and the reference's events (trace dicts) and the first
    #: differing step (an index into the student's steps), or None
    replay: dict | None = None
    #: for a pipeline schedule: the student's and the reference's events
    schedules: dict | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class Exercise:
    """One exercise: its name, the function the student writes, the lesson
    that teaches it, a one-line summary, and the checker."""

    name: str
    function: str          # the name of the function in the skeleton
    summary: str
    lesson: str            # "lessons/04_ring_allreduce.py"
    reference: object      # the reference solution (a function)
    check: object          # check(student_function) -> CheckResult

    @property
    def skeleton(self) -> Path:
        return SKELETONS / f"{self.name}.py"


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """Reads the solution as Python source whatever its name ends in
    (``solution.txt`` too), and never a cached ``.pyc``: the cache is named
    after the file's stem, so ``solution.txt`` would share ``solution.py``'s."""

    def get_code(self, fullname):
        return self.source_to_code(self.get_data(self.path), self.path)


def load_function(path, name: str, exercise: str):
    """The function ``name`` from the student's file ``path``; a one-line
    error saying what to do when the file or the function is missing, the
    file cannot be read or does not compile, or its import raises."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no file {path}: run `minidist exercise start {exercise}` to copy the skeleton "
            f"here, or pass the path of your solution")
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise OSError(f"cannot read {path}: {error.strerror}") from error
    module_name = f"minidist_exercise_{exercise}_{abs(hash(os.fspath(path.resolve())))}"
    loader = _SourceLoader(module_name, os.fspath(path))
    spec = importlib.util.spec_from_file_location(module_name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up
    try:
        with deadline(CHECK_DEADLINE, f"importing {path}"):
            loader.exec_module(module)
    except SyntaxError as error:
        raise SyntaxError(f"{path} is not valid Python: {error.msg} at line {error.lineno}: "
                          f"{(error.text or '').strip()}") from None
    except (ExerciseTimeout, MemoryError):
        raise  # the caller says it, in its words
    except Exception as error:
        raise ImportError(f"{path} raised while being imported: "
                          f"{type(error).__name__}: {error}") from error
    function = getattr(module, name, None)
    if not isinstance(function, types.FunctionType):
        raise AttributeError(f"{path} defines no function {name}(): keep the skeleton's "
                             f"function name (`minidist exercise start {exercise}` shows it)")
    return function


#: Called with (what, seconds) as each deadline starts and with (what, None)
#: as it ends, when set by :func:`report_deadlines`.
_deadline_reporter = None


def report_deadlines(reporter) -> None:
    """Have ``reporter(what, seconds)`` called as each :func:`deadline` starts,
    and ``reporter(what, None)`` as it ends. The supervised check
    (:mod:`.supervised`) tells its parent, which stops the whole process if
    the code inside defeats the alarm (swallows the exception, or sits in
    one long C call that no signal handler interrupts)."""
    global _deadline_reporter
    _deadline_reporter = reporter


@contextmanager
def deadline(seconds: float, what: str):
    """Stop the code inside after ``seconds`` of wall time with
    :class:`ExerciseTimeout` (SIGALRM; main thread only, else no limit).
    An endless loop in pure Python is interrupted between two bytecodes.
    An alarm already set outside (pytest-timeout's, say) is put back with
    the time it has left, or left alone if it rings sooner than ours.
    The start and the end are told to the reporter, if one is set
    (:func:`report_deadlines`)."""
    reporter = _deadline_reporter
    if reporter is not None:
        reporter(what, seconds)
    try:
        with _alarm(seconds, what):
            yield
    finally:
        if reporter is not None:
            reporter(what, None)


@contextmanager
def _alarm(seconds: float, what: str):
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    if 0 < outer_delay <= seconds:
        yield  # the outer alarm rings first: it is the limit
        return

    def ring(signum, frame):
        raise ExerciseTimeout(f"{what} did not finish in {seconds:g} s")

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay > 0:
            left = max(outer_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)


def describe_error(error: BaseException) -> str:
    """'ValueError: ...' and where in the student's file it was raised."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    where = ""
    for frame in reversed(frames):
        if "minidist/" not in frame.filename.replace(os.sep, "/") or "skeletons" in frame.filename:
            where = f" (at {frame.filename}:{frame.lineno}: {frame.line})"
            break
    return f"{type(error).__name__}: {error}{where}"
