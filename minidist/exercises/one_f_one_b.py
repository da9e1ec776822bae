"""Exercise: the 1F1B pipeline schedule, as data (lesson 9).

The student writes a pure function: for p stages and m micro-batches, each
rank's order of forwards and backwards, ``[["F0", "F1", "B0", ...], ...]``.
The checker turns it into a :class:`~minidist.parallel.pipeline.schedules.Schedule`
(the messages around each compute are added as the runtime adds them), runs
it on the pipeline simulator (:func:`simulate_schedule`, equal stage costs,
backward = 2 forwards), and compares with the reference 1F1B:

* every micro-batch forwarded and backwarded once on every rank, each
  backward after its forward (else: which rank, which micro-batch);
* no deadlock (the simulator names every rank's blocked action);
* the time of the batch no longer than 1F1B's, (m + p - 1)(f + b);
* the activations held: at most min(p - s, m) micro-batches on stage s,
  1F1B's point (GPipe's order is valid and as fast, but holds all m).

The Gantt chart of the student's schedule is drawn above the reference's.
Cost of a check: some 50 simulated schedules, well under a second.
"""

from __future__ import annotations

import re

from minidist.exercises.exercise import (
    CHECK_DEADLINE,
    CheckResult,
    Exercise,
    ExerciseTimeout,
    Failure,
    NotWrittenYet,
    deadline,
    describe_error,
)
from minidist.parallel.pipeline import schedules as ps
from minidist.parallel.pipeline import simulate

SHAPES = [(p, m) for p in (1, 2, 3, 4, 6) for m in (1, 2, 3, 4, 8)]
#: the shape the Gantt charts are drawn at
DRAWN = (4, 8)


def one_f_one_b(stages: int, microbatches: int) -> list[list[str]]:
    """1F1B: stage s forwards min(p - s - 1, m) micro-batches (warm-up), then
    alternates one forward and one backward (the oldest), then backwards the
    rest (cool-down). Time (m + p - 1)(f + b); at most min(p - s, m)
    micro-batches' activations alive on stage s."""
    orders = []
    for stage in range(stages):
        warmup = min(stages - stage - 1, microbatches)
        order = [f"F{k}" for k in range(warmup)]
        for oldest in range(microbatches - warmup):
            order += [f"F{warmup + oldest}", f"B{oldest}"]
        order += [f"B{k}" for k in range(microbatches - warmup, microbatches)]
        orders.append(order)
    return orders


_ITEM = re.compile(r"^([FB])(\d+)$")


def _orders(function, p: int, m: int):
    """The student's orders, checked for shape; a Failure or the orders."""
    got = function(p, m)
    where = f"one_f_one_b({p}, {m})"
    if not isinstance(got, (list, tuple)) or len(got) != p:
        size = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
        return Failure("wrong shape", f"{where} returned {size}, expected a list of "
                       f"{p} lists (one order per stage), like [['F0', 'B0'], ...]")
    for stage, order in enumerate(got):
        if not isinstance(order, (list, tuple)):
            return Failure("wrong shape", f"{where}: stage {stage}'s order is a "
                           f"{type(order).__name__}, expected a list like ['F0', 'F1', 'B0']")
        for item in order:
            if not isinstance(item, str) or not _ITEM.match(item):
                return Failure("wrong shape", f"{where}: stage {stage} has {item!r}; write "
                               "each action as 'F<micro-batch>' or 'B<micro-batch>', e.g. 'F3'")
    for stage, order in enumerate(got):
        forwards = [int(item[1:]) for item in order if item[0] == "F"]
        backwards = [int(item[1:]) for item in order if item[0] == "B"]
        for name, done in (("forward", forwards), ("backward", backwards)):
            if sorted(done) != list(range(m)):
                missing = sorted(set(range(m)) - set(done))
                twice = sorted({k for k in done if done.count(k) > 1})
                extra = sorted(set(done) - set(range(m)))
                what = (f"never does the {name} of micro-batch {missing[0]}" if missing
                        else f"does the {name} of micro-batch {twice[0]} twice" if twice
                        else f"does the {name} of micro-batch {extra[0]}, which does not "
                             f"exist (m = {m}: 0..{m - 1})")
                return Failure("invalid schedule", f"{where}: stage {stage} {what}")
        for position, item in enumerate(order):
            if item[0] == "B" and f"F{item[1:]}" not in order[:position]:
                return Failure("invalid schedule", f"{where}: stage {stage} runs {item} "
                               f"before F{item[1:]}: a backward needs its forward's "
                               "activations")
    return [list(order) for order in got]


def as_schedule(orders, name: str = "yours") -> ps.Schedule:
    """The orders as a Schedule, with the messages the runtime would add."""
    stages = len(orders)
    microbatches = sum(1 for item in orders[0] if item[0] == "F") if orders else 0
    actions = []
    for rank, order in enumerate(orders):
        builder = ps._RankBuilder(rank, stages, 1)
        for item in order:
            (builder.forward if item[0] == "F" else builder.backward)(int(item[1:]), 0, "")
        actions.append(builder.step())
    return ps.Schedule(name, stages, microbatches, 1, actions)


def simulate_orders(orders, name: str = "yours") -> list[dict]:
    return simulate.simulate_schedule(as_schedule(orders, name), 1.0, 2.0)


def _makespan(events) -> int:
    regions = list(simulate._pipeline_regions(events))
    return max(e["end"] for e in regions) - min(e["start"] for e in regions)


def check(function, **options) -> CheckResult:
    report = CheckResult("one_f_one_b")
    try:
        with deadline(CHECK_DEADLINE, "checking one_f_one_b"):
            report.failure = _check(function, report)
    except ExerciseTimeout as error:
        report.failure = Failure("hang", f"{error}: an endless loop?")
    if report.failure is None or report.failure.kind in ("slower", "memory"):
        try:
            orders = _orders(function, *DRAWN)
            if not isinstance(orders, Failure):
                report.schedules = {"yours": simulate_orders(orders, "yours"),
                                    "1F1B (reference)": simulate_orders(
                                        one_f_one_b(*DRAWN), "1f1b")}
        except Exception:  # noqa: BLE001 - the drawing is a bonus; the verdict stands
            pass
    return report


def _check(function, report) -> Failure | None:
    for p, m in SHAPES:
        try:
            orders = _orders(function, p, m)
        except NotWrittenYet as error:
            return Failure("not written", f"one_f_one_b is not written yet: {error}")
        except ExerciseTimeout:
            raise
        except Exception as error:  # noqa: BLE001 - the student's error, told plainly
            return Failure("raised", f"one_f_one_b({p}, {m}) raised {describe_error(error)}")
        if isinstance(orders, Failure):
            return orders
        try:
            events = simulate_orders(orders)
        except simulate.DeadlockError as error:
            return Failure("deadlock", f"one_f_one_b({p}, {m}) deadlocks on the pipeline "
                           f"simulator: {error}")
        reference = simulate_orders(one_f_one_b(p, m), "1f1b")
        mine, theirs = _makespan(events), _makespan(reference)
        if mine > theirs:
            return Failure("slower", (
                f"one_f_one_b({p}, {m}) is valid but takes {mine / ps.UNIT_NS:g} time units "
                f"where 1F1B takes {theirs / ps.UNIT_NS:g} ((m + p - 1)(f + b) with f = 1, "
                "b = 2): some stage waits longer than it must. Compare the Gantt charts."))
        peaks, limits = simulate.peak_live_microbatches(events), simulate.peak_live_microbatches(reference)
        for stage in range(p):
            if peaks.get(stage, 0) > limits.get(stage, 0):
                return Failure("memory", (
                    f"one_f_one_b({p}, {m}) is valid and as fast, but stage {stage} holds the "
                    f"activations of {peaks[stage]} micro-batches at once, where 1F1B holds "
                    f"min(p - s, m) = {limits[stage]}: start the backward of the oldest "
                    "micro-batch as soon as the warm-up is done (this order is GPipe's?)"))
    report.passed.append(f"valid on {len(SHAPES)} shapes (p = 1..6 stages, m = 1..8 "
                         "micro-batches, m < p too): every F and B once, B after F, no deadlock")
    report.passed.append("as fast as 1F1B, (m + p - 1)(f + b), and at most min(p - s, m) "
                         "micro-batches alive on stage s")
    return None


EXERCISE = Exercise(
    name="one_f_one_b", function="one_f_one_b",
    summary="the 1F1B pipeline schedule, as data, on the pipeline simulator",
    lesson="lessons/09_pipeline.py", reference=one_f_one_b, check=check)
