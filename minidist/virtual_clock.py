"""The virtual clock every simulation of minidist runs on.

Three things compute time instead of measuring it: the collective simulator
(:mod:`minidist.distributed.simulator`), the sim transport under it
(:mod:`minidist.distributed.transport.sim`) and the pipeline planner
(:func:`minidist.parallel.pipeline.simulate.simulate_schedule`). They share
one model of time, and these are its pieces:

* :class:`RankClock`: how far one rank has got. Work *advances* it by its
  duration; waiting for something (a message, a request) moves it *up to*
  the moment that thing happens, never back. Times are seconds (the sim
  transport) or whole ticks (the pipeline planner): the clock only adds and
  compares.
* :func:`latest`: how long a run took, the latest clock of any rank.
* :class:`SerialPort`: a resource that does one job at a time, in the order
  the jobs come (a rank's out port: its sends leave one after another).
* :class:`BusyPort`: a resource that does one job at a time, each in the
  first free slot at or after the moment it can start (a rank's in port:
  messages that arrive at different times do not disturb each other).
* :class:`ReadyQueue`: which ranks have something new to do (the
  simulator's driver moves them on in this order).
* :func:`to_ns`: seconds of virtual time on the trace's clock.

Each piece does the arithmetic exactly as written here, in this order, so
that a simulated time is the same float on every run and after every
refactoring (``tests/test_virtual_clock.py`` holds them to that).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque


class RankClock:
    """One rank's virtual time, ``clock`` (0 at the start)."""

    __slots__ = ("clock",)

    def __init__(self, start=0):
        self.clock = start

    def advance(self, duration):
        """The rank works for ``duration``: returns (start, end) of the work."""
        start = self.clock
        self.clock = start + duration
        return start, self.clock

    def wait_until(self, time):
        """The rank waits for something that happens at ``time`` (no wait if it
        has happened already): returns (start, end) of the wait."""
        start = self.clock
        if time > start:
            self.clock = time
        return start, self.clock


def latest(clocks) -> float:
    """The latest time of any of ``clocks`` (RankClocks): how long the run took."""
    return max(clock.clock for clock in clocks)


def to_ns(seconds: float) -> int:
    """Seconds of virtual time as whole nanoseconds (a trace's times)."""
    return round(seconds * 1e9)


class SerialPort:
    """A resource that does one job at a time, in the order they are given.

    ``free``: when its last job ends. A job ready at ``ready`` starts when both
    it and the port are: ``start = max(ready, free)``."""

    __slots__ = ("free",)

    def __init__(self):
        self.free = 0.0

    def take(self, ready, duration, more=0.0):
        """Run a job of ``duration + more`` (added one after the other, as the
        cost model writes alpha + m beta); returns (start, end)."""
        free = self.free
        start = ready if ready > free else free
        self.free = end = start + duration + more
        return start, end


class BusyPort:
    """A resource that does one job at a time, each in its first free slot.

    The booked slots are kept as sorted, disjoint ``[start, end)`` intervals
    (``starts``, ``ends``); touching slots merge, so a port busy without a
    break is one interval however many jobs it ran."""

    __slots__ = ("starts", "ends")

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []

    def book(self, earliest: float, duration: float) -> float:
        """Book ``duration`` in the first free slot that starts at or after
        ``earliest``; returns the slot's start."""
        starts, ends = self.starts, self.ends
        if not ends or earliest >= ends[-1]:  # the usual case: after everything booked
            if ends and earliest == ends[-1]:
                ends[-1] = earliest + duration
            else:
                starts.append(earliest)
                ends.append(earliest + duration)
            return earliest
        start = earliest
        index = bisect_right(ends, start)
        while index < len(starts) and starts[index] < start + duration:
            start = ends[index]  # overlaps a booked slot: try right after it
            index += 1
        end = start + duration
        if index and ends[index - 1] == start:  # touches the slot before: extend it
            if index < len(starts) and starts[index] == end:
                ends[index - 1] = ends[index]
                del starts[index], ends[index]
            else:
                ends[index - 1] = end
        elif index < len(starts) and starts[index] == end:
            starts[index] = start
        else:
            starts.insert(index, start)
            ends.insert(index, end)
        return start


class ReadyQueue:
    """The ranks that have something new to do, first come first served; a
    rank is in it at most once. All ranks are in it at the start."""

    __slots__ = ("_ranks", "_queued")

    def __init__(self, ranks: int):
        self._ranks = deque(range(ranks))
        self._queued = bytearray(b"\x01") * ranks

    def __bool__(self) -> bool:
        return bool(self._ranks)

    def wake(self, rank: int) -> None:
        """``rank`` may go on (a receive of its completed)."""
        if not self._queued[rank]:
            self._queued[rank] = 1
            self._ranks.append(rank)

    def pop(self) -> int:
        rank = self._ranks.popleft()
        self._queued[rank] = 0
        return rank
