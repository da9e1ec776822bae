"""The timing loop every side of a collective benchmark runs, nccl-tests style.

For one case (a collective, an algorithm, a size), on every rank::

    warm-up calls (untimed; the first also pays for page faults)
    rank 0 turns the warm-up time into a number of timed calls; all ranks adopt it
    barrier
    start = perf_counter(); that many calls; mean = (perf_counter() - start) / calls

The reported time of the case is the largest mean over the ranks (the
collective is finished when its slowest rank is). The number of calls is
chosen so that each case takes about ``target_seconds``: many calls for tiny
messages, where one call is microseconds and timer noise matters, few (at
least two, or one when a call alone takes over half a second) for hundreds
of MiB. Only the library under test moves the data, so the same loop
serves minidist, MPICH and gloo: each passes its own call, barrier and
"rank 0's number for everyone".
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

#: Warm-up calls move about this many bytes (1 to 5 calls).
WARMUP_BYTES = 32 << 20


@dataclass(frozen=True)
class Timing:
    """How long to time each case. ``iterations`` / ``warmup`` fix the counts
    (the test uses 1); otherwise they adapt to the size."""

    target_seconds: float = 0.1
    min_iterations: int = 2
    max_iterations: int = 1000
    #: A case whose minimum of calls would take longer gets one timed call
    #: (256 MiB on 8 oversubscribed ranks: about a second a call).
    max_case_seconds: float = 1.0
    iterations: int | None = None
    warmup: int | None = None

    def warmup_calls(self, nbytes: int) -> int:
        if self.warmup is not None:
            return max(self.warmup, 0)
        return max(1, min(5, WARMUP_BYTES // max(nbytes, 1)))

    def timed_calls(self, seconds_per_call: float) -> int:
        if self.iterations is not None:
            return max(self.iterations, 1)
        wanted = math.ceil(self.target_seconds / max(seconds_per_call, 1e-7))
        least = (self.min_iterations
                 if seconds_per_call * self.min_iterations <= self.max_case_seconds else 1)
        return max(least, min(self.max_iterations, wanted))

    def as_dict(self) -> dict:
        return asdict(self)


FULL = Timing()
QUICK = Timing(target_seconds=0.02, min_iterations=1, max_iterations=100)


def time_collective(call, nbytes: int, timing: Timing, barrier, agree) -> tuple[float, int]:
    """(mean seconds per call on this rank, number of timed calls).

    ``call()`` runs the collective once; ``barrier()`` lines the ranks up;
    ``agree(count)`` returns rank 0's ``count`` on every rank.
    """
    warmup = timing.warmup_calls(nbytes)
    start = time.perf_counter()
    for index in range(warmup):
        call()
        if index == 0 and warmup > 1:
            start = time.perf_counter()  # the first call pays for page faults: leave it out
    measured_calls = warmup - 1 if warmup > 1 else warmup
    per_call = (time.perf_counter() - start) / max(measured_calls, 1)
    calls = timing.iterations if timing.iterations is not None else agree(
        timing.timed_calls(per_call))
    barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls, calls
