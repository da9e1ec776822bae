"""The timing loop every side of a collective benchmark runs, nccl-tests style.

For one case (a collective, an algorithm, a size), on every rank::

    warm-up calls (untimed; the first also pays for page faults)
    rank 0 turns the warm-up time into a number of timed calls; all ranks adopt it
    for each of ``blocks`` blocks (3):
        barrier
        start = perf_counter(); that many calls; mean = (perf_counter() - start) / calls

The time of a block is the largest mean over the ranks (the collective is
finished when its slowest rank is); the reported time of the case is that of
the fastest block (:func:`fastest_block`). Taking the fastest of a few blocks,
as ``timeit`` does, keeps out the stalls a shared machine adds now and then
(another tenant, a daemon waking up), which hit one block and not the next:
the mean of a single block varies from run to run far more than the fastest
of three does. Every library in a run is
timed by this same loop, so the ratios stay fair. The number of calls is
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
    #: timed blocks per case; the fastest is reported
    blocks: int = 3
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
        per_block = self.target_seconds / max(self.blocks, 1)
        wanted = math.ceil(per_block / max(seconds_per_call, 1e-7))
        least = (self.min_iterations
                 if seconds_per_call * self.min_iterations <= self.max_case_seconds else 1)
        return max(least, min(self.max_iterations, wanted))

    def as_dict(self) -> dict:
        return asdict(self)


FULL = Timing()
#: --quick: short, but still the fastest of 3 blocks, as the targets are judged
#: on it (with one block, a single stall of a shared machine can make a 4 KiB
#: all_reduce look many times slower than it is, and slower than its target).
QUICK = Timing(target_seconds=0.02, blocks=3, min_iterations=1, max_iterations=100)


def time_collective(call, nbytes: int, timing: Timing, barrier,
                    agree) -> tuple[list[float], int]:
    """([mean seconds per call on this rank, per block], timed calls per block).

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
    means = []
    for _ in range(max(timing.blocks, 1)):
        barrier()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        means.append((time.perf_counter() - start) / calls)
    return means, calls


def fastest_block(per_rank) -> float:
    """The time of a case from every rank's block means (a list per rank):
    each block takes as long as its slowest rank; the fastest block counts."""
    return min(max(block) for block in zip(*per_rank))
