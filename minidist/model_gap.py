"""Why a measured number and the model's differ here, and where the model holds.

Every line of minidist that prints a measurement next to a model ("measured
4.45 ms, predicted 29.4 us"; "bubble measured 0.972, expected 0.273") prints,
beside it, the reasons *this run* gives for the gap and how to see the model
hold. The reasons are computed from the run's facts, never a canned sentence:

* more ranks than cores: the ranks take turns on the cores, and a rank that
  waits for the CPU looks to the others like a slow message;
* the measurement includes a first call (processes starting, segments being
  mapped), or ranks that entered the call at different moments (skew);
* a tiny call: fixed per-call work (Python, bookkeeping) that the model's
  alpha per message does not count;
* default parameters: the alpha / beta measured on the development machine,
  not this one (``python benchmarks/bench_p2p.py`` fits them here);
* facts only the caller knows (a pipeline's unequal stages), passed as
  ``notes``;

and ways to see the model hold (the simulator, fewer ranks, ...) passed as
``hold`` or derived from the facts::

    from minidist.model_gap import RunFacts, compare
    facts = RunFacts(ranks=4, cores=2, params="default", transport="shm",
                     hold=("`minidist simulate all_reduce -n 4 --size 128B`",))
    compare(13.4e-3, 29.4e-6, facts)
    # -> "measured ... vs model ... (...x): 4 ranks on 2 cores: ranks take turns;
    #  default shm parameters (fit them here: ...); the model holds on
    #  `minidist simulate all_reduce -n 4 --size 128B`"

Costs nothing worth counting: a few comparisons and string joins. Pure (no
clock, no processes), so every rule is tested with made-up facts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minidist.units import format_bytes

#: Measured and model within this factor of each other: the model holds.
CLOSE = 1.25
#: The same for the simulator, whose clock charges the model itself.
SIMULATED_CLOSE = 1.01
#: A model time below this (seconds) on a real transport: fixed per-call costs
#: (Python, bookkeeping) that alpha does not count are a large part of it.
SMALL_CALL_S = 100e-6
#: How to fit alpha and beta on this machine (writes benchmarks/results/p2p.json).
FIT_COMMAND = "python benchmarks/bench_p2p.py --quick"


@dataclass(frozen=True)
class RunFacts:
    """What is known about the run a measurement comes from."""

    ranks: int
    #: Cores the run had (None: not recorded, e.g. an old trace).
    cores: int | None = None
    #: The simulator: its clock *is* the model, so only the formula can differ.
    simulated: bool = False
    transport: str = ""
    #: "default" (the development machine's fit), "fitted" (this machine's)
    #: or "given" (the user's own, e.g. --alpha); None: no parameters involved.
    params: str | None = None
    #: The measurement includes a first call (process start, segment mapping).
    first_call: bool = False
    #: Seconds of the measurement spent before every rank had entered (skew).
    skew_s: float | None = None
    #: The machine's load average while the run ran (other programs count).
    load: float | None = None
    #: The longest a message took once both its ends were there (seconds).
    slowest_message_s: float | None = None
    #: Bytes the call moves per rank (None: not a message size).
    nbytes: int | None = None
    #: Reasons only the caller can compute (short phrases).
    notes: tuple[str, ...] = ()
    #: Where the model holds: commands or changes (short phrases).
    hold: tuple[str, ...] = ()
    #: The command-line option that sets the number of ranks ("--stages" for
    #: a pipeline), for the advice to run fewer.
    ranks_option: str = "-n"


def ratio_text(measured: float, model: float) -> str:
    """measured / model, as "456x", "2.1x" or "0.48x" ("-" when the model is 0)."""
    if not model or not math.isfinite(model):
        return "-"
    ratio = measured / model
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def is_close(measured: float, model: float, close: float = CLOSE) -> bool:
    """Within a factor ``close`` of each other (both zero counts as close)."""
    if model == measured:
        return True
    if model <= 0 or measured <= 0:
        return False
    return 1 / close <= measured / model <= close


def reasons(measured: float, model: float, facts: RunFacts) -> list[str]:
    """The run's reasons for the gap between ``measured`` and ``model``, most
    important first (empty when they agree and nothing is worth saying)."""
    found = []
    if facts.simulated:
        if not is_close(measured, model, SIMULATED_CLOSE):
            found.append("the simulator's clock is the model's: the closed-form formula "
                         "is what approximates here")
        return found + list(facts.notes)
    cores = facts.cores
    plural = "s" if cores != 1 else ""
    if cores is not None and facts.ranks > cores:
        found.append(f"{facts.ranks} ranks on {cores} core{plural}: ranks take turns")
    if cores is not None and facts.load is not None and facts.load > cores:
        found.append(f"machine busy (load {facts.load:.1f} on {cores} core{plural})")
    share = 0.1 * measured
    if facts.slowest_message_s and measured > 0 and facts.slowest_message_s >= share:
        found.append(f"a message waited {_seconds(facts.slowest_message_s)} for its receiver "
                     "to run")
    if facts.skew_s and measured > 0 and facts.skew_s >= share:
        found.append(f"ranks entered {_seconds(facts.skew_s)} apart")
    if facts.first_call:
        found.append("first call includes setup")
    found.extend(facts.notes)
    if facts.nbytes is not None and model < SMALL_CALL_S and measured > model:
        found.append(f"{format_bytes(facts.nbytes)}: per-call overhead (not in alpha) dominates")
    if facts.params == "default" and not is_close(measured, model):
        where = f"{facts.transport} " if facts.transport else ""
        found.append(f"default {where}alpha/beta (fit here: {FIT_COMMAND})")
    return found


def ways_to_hold(facts: RunFacts) -> list[str]:
    """Where to see the model hold: the caller's, then fewer ranks if oversubscribed."""
    ways = list(facts.hold)
    if not facts.simulated and facts.cores is not None and facts.ranks > facts.cores:
        ways.append(f"with {facts.ranks_option} {facts.cores}" if facts.cores >= 2
                    else "on a machine with a core per rank")
    return ways


def explain(measured: float, model: float, facts: RunFacts) -> str:
    """"456x: 4 ranks on 2 cores: ranks take turns; ...; the model holds on ..."
    (or "1.1x: the model holds here")."""
    ratio = ratio_text(measured, model)
    # The simulator's clock is the model's own: only an exact match holds.
    if is_close(measured, model, SIMULATED_CLOSE if facts.simulated else CLOSE):
        return f"{ratio}: the model holds here"
    words = reasons(measured, model, facts)
    if not words:
        words = ["no known cause in this run's facts"]
    ways = ways_to_hold(facts)
    tail = f"; the model holds {' or '.join(ways)}" if ways else ""
    return f"{ratio}: {'; '.join(words)}{tail}"


def compare(measured: float, model: float, facts: RunFacts, *, formatter=None,
            measured_word: str = "measured", model_word: str = "model") -> str:
    """"measured 13.40 ms vs model 29.4 us (456x: why ...)": one line for any
    measured-vs-model pair (``formatter`` turns a value into text; seconds by
    default)."""
    formatter = formatter or _seconds
    return (f"{measured_word} {formatter(measured)} vs {model_word} {formatter(model)} "
            f"({explain(measured, model, facts)})")


def _seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


__all__ = ["RunFacts", "compare", "explain", "reasons", "ways_to_hold", "ratio_text",
           "is_close", "CLOSE", "FIT_COMMAND"]
