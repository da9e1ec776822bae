"""Timings a student can trust on a busy laptop.

A lesson that compares a measurement with its theory ("time per example
falls as the batch grows") must not print the opposite because a browser,
a test-suite or another student's job ran beside it. Three habits make a
comparison robust, and this module is them, in one place:

* **interleave**: the variants being compared take turns, repeat after
  repeat (:func:`timed`), so a burst of load hits all of them, not only the
  one that happened to run during it;
* **take the minimum** of short repeats: a repeat that the operating system
  interrupted is slower, never faster, so the fastest one is the closest to
  the undisturbed time (the median is kept as well);
* **one BLAS thread**: NumPy's matrix products would otherwise start a
  thread per core, and on a busy machine a product waits for its slowest
  thread to get a core (small products are no faster on two threads anyway).

And one habit makes the result honest: the machine's load is read before
and after (:class:`Load`). When more programs wanted a core than there were
cores, :meth:`Load.note` says so in one line, next to the number, and
points to the modelled or simulated value the lesson has instead.

Example::

    from minidist.lesson_timing import timed
    result = timed({"batch 1": small_step, "batch 256": large_step}, repeats=30)
    result.best["batch 256"]          # seconds per call, the fastest repeat
    print(result.load.note("the simulated value is the model's"))   # "" when idle
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from minidist.runtime.blas_threads import limit as blas_limit
from minidist.runtime.oversubscription import cores


def machine_load() -> float:
    """The machine's load average over the last minute: how many programs,
    on average, were running or waiting for a core (this one included)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every system
        return 0.0


@dataclass(frozen=True)
class Load:
    """The load read before and after a measurement, and the cores it had."""

    before: float
    after: float
    cores: int

    @classmethod
    def start(cls) -> Load:
        """The load now; :meth:`finish` reads it again."""
        return cls(machine_load(), float("nan"), cores())

    def finish(self) -> Load:
        return Load(self.before, machine_load(), self.cores)

    @property
    def busy(self) -> bool:
        """More programs wanted a core than there were cores, before or after
        (the measurement's own processes count: a lesson that runs 4 ranks
        on 2 cores is busy by itself)."""
        highest = max(self.before, self.after if self.after == self.after else self.before)
        return highest > self.cores

    def describe(self) -> str:
        """"load 6.2 -> 6.8 on 2 cores"."""
        after = f" -> {self.after:.1f}" if self.after == self.after else ""
        plural = "s" if self.cores != 1 else ""
        return f"load {self.before:.1f}{after} on {self.cores} core{plural}"

    def note(self, instead: str = "") -> str:
        """One line for a busy machine ("" when it was not): the numbers above
        include waiting for a core, and where to look ``instead``."""
        if not self.busy:
            return ""
        text = f"machine busy ({self.describe()}): these times include waiting for a core"
        return f"{text}; {instead}" if instead else text


@dataclass(frozen=True)
class Timing:
    """What :func:`timed` measured: seconds per call of each variant."""

    best: dict[Hashable, float]
    median: dict[Hashable, float]
    load: Load
    repeats: int
    samples: dict[Hashable, list[float]] = field(repr=False, default_factory=dict)


def timed(functions: Mapping[Hashable, Callable[[], object]] | Callable[[], object],
          repeats: int = 5, number: int = 1, warmup: int = 1, blas_threads: int | None = 1) -> Timing:
    """Time each function of ``functions`` (name -> function, any names; or
    one function, named "") ``repeats`` times, interleaved: every repeat runs
    every function once, in a rotating order, each ``number`` calls in a row
    (choose it so one repeat lasts well under a millisecond or a few: short
    repeats are the ones the scheduler leaves alone). ``warmup`` uncounted
    rounds come first (fresh memory, caches, lazy imports). BLAS runs
    ``blas_threads`` threads meanwhile (None: as it is). The load is read
    before and after."""
    named = dict(functions) if isinstance(functions, Mapping) else {"": functions}
    if not named or repeats < 1 or number < 1:
        raise ValueError("timed() needs at least one function, repeats >= 1 and number >= 1")
    names = list(named)
    samples: dict[Hashable, list[float]] = {name: [] for name in names}
    load = Load.start()
    with blas_limit(blas_threads) if blas_threads else contextlib.nullcontext():
        for round_ in range(warmup + repeats):
            # Rotate who goes first: a variant that always ran right after
            # another would inherit its cache state (or its bad luck).
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                function = named[name]
                start = time.perf_counter()
                for _ in range(number):
                    function()
                seconds = (time.perf_counter() - start) / number
                if round_ >= warmup:
                    samples[name].append(seconds)
    return Timing(best={name: min(values) for name, values in samples.items()},
                  median={name: statistics.median(values) for name, values in samples.items()},
                  load=load.finish(), repeats=repeats, samples=samples)


__all__ = ["Load", "Timing", "machine_load", "timed"]
