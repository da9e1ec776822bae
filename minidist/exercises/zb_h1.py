"""Exercise: fill 1F1B's bubble with the weight halves of the backward, as
ZB-H1 does (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024).

The student is given 1F1B's order on every rank with each backward split
into its input half I and its weight half W, kept together
(``["F0", "F1", "I0", "W0", ...]``), and writes ``place_weights(orders)``,
which returns the orders with the W's placed later: the F's and I's where
1F1B has them. The checker turns the orders into a
:class:`~minidist.parallel.pipeline.actions.Schedule`
(:func:`~minidist.parallel.pipeline.schedules.schedule_from_order` adds the
messages), and over a grid of p stages and m micro-batches, in this order:

1. the shape, and the rules: every micro-batch's F, I and W once on every
   rank, I after its F, W after its I (which rank, which micro-batch, at
   which time on the clock);
2. no deadlock on the simulator (only moving an F or an I can make one);
3. the F's and I's in 1F1B's order (else: which rank, where, what changed);
4. the time of the batch, on the virtual clock with F = I = W = 1 and with
   F = I = 2, W = 1, no longer than ZB-H1's
   (:func:`~minidist.parallel.pipeline.zero_bubble.zb_h1`), m(F+I+W) +
   (p-1)(F+I-W) when m >= p: a longer one is told by its hole, the idle
   gap on a rank that a W could fill or that a W held up the message for,
   found on the critical path and tried (:mod:`.schedule_holes`);
5. the memory: at most min(p, m) micro-batches' activations held on any
   rank, from a forward until its W (ZB-H1 holds 1F1B's peak of stage 0 on
   every stage); W's delayed longer hold more.

Both halves of ZB-H1's point are checked: its bubble is (p-1)(F+I-W) where
1F1B's with the halves together is (p-1)(F+I+W) (the I's travel back with a
W behind them), and it pays for it with memory 1F1B already has on stage 0
and no more. W's all left for the end are as slow as 1F1B (rank 0's
cool-down idles while its W's wait) and hold all m micro-batches.

Then, unless ``processes=False``, the student's orders run on real
processes (2 and 4, float64): a small MLP through
:class:`~minidist.parallel.pipeline.executor.Pipeline` with the schedule
built from them, one SGD step, every rank's weights against one process's
on the whole batch (to 1e-9). The Gantt chart of the student's schedule is
drawn above ZB-H1's.

Cost of a check: 25 shapes x 2 ratios on the simulator (a few hundred
actions each), a few more for the move that explains a hole, and two
launches.
"""

from __future__ import annotations

import re

import numpy as np

from minidist.exercises import schedule_holes
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
from minidist.parallel.pipeline.zero_bubble import zb_h1

SHAPES = [(p, m) for p in (1, 2, 3, 4, 6) for m in (1, 2, 3, 4, 8)]
#: (F, I, W): a forward, an input half, a weight half, in time units
RATIOS = ((1, 1, 1), (2, 2, 1))
#: the shape the Gantt charts are drawn at
DRAWN = (4, 8)
#: (stages, micro-batches) of the runs on real processes
REAL = ((2, 5), (4, 6))
BATCH = 13
LR = 0.1


def given_orders(stages: int, microbatches: int) -> list[list[str]]:
    """1F1B's order on every rank, each backward split into its input half
    and its weight half kept together: ``B3`` becomes ``I3, W3``."""
    schedule = ps.one_f_one_b(stages, microbatches)
    orders = []
    for rank in range(stages):
        order = []
        for item in schedule.compute_order(rank):
            order += [item] if item[0] == "F" else [f"I{item[1:]}", f"W{item[1:]}"]
        orders.append(order)
    return orders


def place_weights(orders: list[list[str]]) -> list[list[str]]:
    """ZB-H1: every F and I where 1F1B has them, and rank r's W's r rounds
    late (round k: the k-th I). From its r-th I on, rank r runs after each
    I the W of the oldest micro-batch whose I ran; the r W's left run at
    the end, where 1F1B's rank r idles. A rank then holds at most
    min(p, m) micro-batches (1F1B's stage r holds p - r, plus r W's
    waiting), and the I's, with no W behind them, reach rank 0 sooner:
    bubble (p-1)(F+I-W) instead of (p-1)(F+I+W). O(p m)."""
    placed = []
    for rank, order in enumerate(orders):
        waiting, row = [], []
        for item in order:
            if item[0] == "W":
                continue
            row.append(item)
            if item[0] == "I":
                waiting.append(item[1:])
                if len(waiting) > rank:
                    row.append("W" + waiting.pop(0))
        placed.append(row + ["W" + microbatch for microbatch in waiting])
    return placed


_ITEM = re.compile(r"^([FIW])(\d+)$")


def _where(p: int, m: int) -> str:
    return f"place_weights(1F1B's orders for p = {p}, m = {m})"


def _position(index: int) -> str:
    number = index + 1
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(
        number % 10, "th")
    return f"{number}{suffix}"


def _words(items, most: int = 14) -> str:
    items = list(items)
    return " ".join(items[:most]) + (" ..." if len(items) > most else "")


def _shape(got, p: int, m: int) -> Failure | None:
    where = _where(p, m)
    if not isinstance(got, (list, tuple)) or len(got) != p:
        size = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
        return Failure("wrong shape", f"{where} returned {size}, expected a list of {p} "
                       "lists (one order per rank), like [['F0', 'I0', 'W0'], ...]",
                       case=(p, m))
    for rank, order in enumerate(got):
        if not isinstance(order, (list, tuple)):
            return Failure("wrong shape", f"{where}: rank {rank}'s order is a "
                           f"{type(order).__name__}, expected a list like ['F0', 'I0', 'W0']",
                           rank=rank, case=(p, m))
        for item in order:
            if isinstance(item, str) and re.match(r"^B\d+$", item):
                return Failure("wrong shape", f"{where}: rank {rank} has {item!r}, a whole "
                               f"backward; write it as its two halves 'I{item[1:]}' (input) "
                               f"and 'W{item[1:]}' (weights)", rank=rank, case=(p, m))
            if not isinstance(item, str) or not _ITEM.match(item):
                return Failure("wrong shape", f"{where}: rank {rank} has {item!r}; write each "
                               "action as 'F<micro-batch>', 'I<micro-batch>' or "
                               "'W<micro-batch>', e.g. 'W3'", rank=rank, case=(p, m))
    return None


_NAMES = {"F": "forward F", "I": "input half I", "W": "weight half W"}


def _rules(orders, p: int, m: int) -> Failure | None:
    """Every F, I and W once; I after its F; W after its I."""
    where = _where(p, m)
    for rank, order in enumerate(orders):
        for letter in "FIW":
            done = [int(item[1:]) for item in order if item[0] == letter]
            extra = sorted(set(done) - set(range(m)))
            missing = sorted(set(range(m)) - set(done))
            twice = sorted({k for k in done if done.count(k) > 1})
            if extra:
                what = (f"runs {letter}{extra[0]}, a micro-batch that does not exist "
                        f"(m = {m}: 0..{m - 1})")
            elif twice:
                first, second = [index for index, item in enumerate(order)
                                 if item == f"{letter}{twice[0]}"][:2]
                what = (f"runs {letter}{twice[0]} twice (its {_position(first)} and "
                        f"{_position(second)} actions): each micro-batch's "
                        f"{_NAMES[letter]} runs once"
                        + (", or its weights' gradient is counted twice" if letter == "W"
                           else ""))
            elif missing:
                k = missing[0]
                what = (f"never runs W{k}: micro-batch {k}'s weights' gradient is never "
                        f"computed (its I{k} is the rank's {_position(order.index(f'I{k}'))}"
                        " action); place every W after its I, before the step"
                        if letter == "W" and f"I{k}" in order
                        else f"never runs the {_NAMES[letter]} of micro-batch {k}")
            else:
                continue
            return Failure("invalid schedule", f"{where}: rank {rank} {what}", rank=rank,
                           case=(p, m))
        for index, item in enumerate(order):
            before = {"I": "F", "W": "I"}.get(item[0])
            if before and f"{before}{item[1:]}" not in order[:index]:
                return Failure("invalid schedule", _too_early(orders, p, m, rank, index,
                                                              before), rank=rank,
                               case=(p, m))
    return None


def _too_early(orders, p, m, rank, index, before) -> str:
    """Rank ``rank``'s action ``index`` runs before its ``before`` (F or I),
    with the time it would start at on the clock."""
    item = orders[rank][index]
    partner = f"{before}{item[1:]}"
    later = orders[rank].index(partner)
    when = _start_of_position(orders, p, m, rank, index)
    at = f" at t = {when:g} on the clock with F = I = W = 1" if when is not None else ""
    if item[0] == "W":
        why = (f"a W computes the weights' gradient from what its I keeps: run it after "
               f"{partner}, where the rank would otherwise wait")
    else:
        why = "an I needs its forward's activations"
    return (f"{_where(p, m)}: rank {rank} runs {item}{at} (its {_position(index)} action), "
            f"before {partner} (its {_position(later)}): {why}")


def _start_of_position(orders, p, m, rank, index) -> float | None:
    """When rank ``rank`` reaches its action ``index`` on the clock (F = I =
    W = 1), the orders run with every W that comes before its I moved to
    the end of its rank, so that they can run (the rank's own actions before
    ``index`` keep their places); None if they still cannot."""
    repaired = []
    for order in orders:
        early = [item for position, item in enumerate(order) if item[0] == "W"
                 and f"I{item[1:]}" not in order[:position]]
        repaired.append([item for item in order if item not in early] + early)
    try:
        boxes = schedule_holes.boxes_of(simulate_orders(repaired, p, m, RATIOS[0]))
    except (ValueError, simulate.DeadlockError):  # another rule broken: no time to tell
        return None
    if index == 0:
        return 0.0
    return boxes[rank][index - 1].end / ps.UNIT_NS


def _reordered(orders, p: int, m: int) -> str | None:
    """Where the F's and I's first leave 1F1B's order, in words; None if they do not."""
    given = given_orders(p, m)
    for rank, (order, want) in enumerate(zip(orders, given)):
        mine = [item for item in order if item[0] != "W"]
        theirs = [item for item in want if item[0] != "W"]
        if mine != theirs:
            index = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
            return (f"rank {rank}'s {_position(index)} F or I is {mine[index]} where 1F1B "
                    f"has {theirs[index]} (1F1B's F's and I's: {_words(theirs)}; yours: "
                    f"{_words(mine)})")
    return None


def as_schedule(orders, p: int, m: int, name: str = "yours") -> ps.Schedule:
    """The orders as a Schedule, with the messages the runtime adds."""
    return ps.schedule_from_order(name, p, m, 1, [[(item[0], int(item[1:]), 0, "")
                                                    for item in order] for order in orders])


def simulate_orders(orders, p: int, m: int, ratio=RATIOS[0], name: str = "yours"):
    forward, input_half, weight = ratio
    return simulate.simulate_schedule(as_schedule(orders, p, m, name), forward,
                                      input_half + weight, weight_time=weight)


def _reference_events(p: int, m: int, ratio):
    forward, input_half, weight = ratio
    return simulate.simulate_schedule(zb_h1(p, m), forward, input_half + weight,
                                      weight_time=weight)


def _units(ticks: int) -> str:
    return f"{ticks / ps.UNIT_NS:g}"


def _length(ticks: int) -> str:
    """"1 unit", "2 units": a length of time on the clock."""
    return f"{_units(ticks)} unit{'' if ticks == ps.UNIT_NS else 's'}"


def _ratio_words(ratio) -> str:
    forward, input_half, weight = ratio
    if forward == input_half == weight:
        return f"F = I = W = {forward:g}"
    return f"F = {forward:g}, I = {input_half:g}, W = {weight:g}"


def _most_held(order) -> int:
    """The most micro-batches the rank holds at once (from an F to its W)."""
    held = most = 0
    for item in order:
        held += {"F": 1, "W": -1}.get(item[0], 0)
        most = max(most, held)
    return most


def _peak(order, limit: int):
    """(index of the first action after which the rank holds more than
    ``limit`` micro-batches, how many it holds then); None if it never does."""
    held = 0
    for index, item in enumerate(order):
        held += {"F": 1, "W": -1}.get(item[0], 0)
        if held > limit:
            return index, held
    return None


def _memory(orders, p: int, m: int) -> Failure | None:
    limit = min(p, m)
    for rank, order in enumerate(orders):
        found = _peak(order, limit)
        if found is None:
            continue
        index, held = found
        done = order[:index + 1]
        waiting = [f"W{item[1:]}" for item in done
                   if item[0] == "I" and f"W{item[1:]}" not in done]
        boxes = schedule_holes.boxes_of(simulate_orders(orders, p, m))
        return Failure("memory", (
            f"{_where(p, m)} is as fast as ZB-H1, but rank {rank} holds the activations of "
            f"{held} micro-batches at once: from t = {_units(boxes[rank][index].start)} with "
            f"F = I = W = 1 (its {_position(index)} action, {order[index]}), while "
            f"{_words(waiting, 8)} still "
            f"{'waits after its I' if len(waiting) == 1 else 'wait after their I' + chr(39) + 's'}"
            f". ZB-H1 holds at most "
            f"min(p, m) = {limit} on every rank, 1F1B's peak on stage 0: a W kept waiting "
            "past the hole it could fill buys no time and holds its micro-batch's "
            "activations (ZB-H1 runs rank r's W's r rounds after their I's)"), rank=rank,
            case=(p, m))
    return None


def _slower(orders, p, m, ratio, events, reference) -> Failure:
    """The batch takes longer than ZB-H1's: the hole and the W that explain it."""
    mine_boxes, theirs_boxes = schedule_holes.boxes_of(events), schedule_holes.boxes_of(reference)
    mine, theirs = schedule_holes.makespan(mine_boxes), schedule_holes.makespan(theirs_boxes)
    head = (f"{_where(p, m)} with {_ratio_words(ratio)}: the batch takes {_units(mine)} where "
            f"ZB-H1's takes {_units(theirs)}")
    limit = min(p, m)
    over = [(rank, _peak(order, limit)[1]) for rank, order in enumerate(orders)
            if _peak(order, limit) is not None]
    # A move told must not trade the hole for memory: no rank may hold more
    # than ZB-H1 does, or than it did.
    finding = schedule_holes.first_move_that_helps(
        orders, events, lambda moved: simulate_orders(moved, p, m, ratio),
        allowed=lambda moved: all(_most_held(new) <= max(limit, _most_held(old))
                                  for new, old in zip(moved, orders)))
    if finding is None:
        return Failure("slower", head + ": some rank waits longer than it must. Compare the "
                       "Gantt charts.", case=(p, m))

    def idle(rank):
        return (f"rank {rank} idles {_length(schedule_holes.idle_between(mine_boxes[rank]))} "
                f"between its first and its last action, ZB-H1's "
                f"{_units(schedule_holes.idle_between(theirs_boxes[rank]))}")

    weight, hole = finding.weight, finding.hole
    gain = _gain(finding, mine)
    if finding.kind == "hole":
        memory = ""
        if over:
            worst, held = max(over, key=lambda found: found[1])
            memory = (f". Your W's also wait too long: rank {worst} holds {held} "
                      f"micro-batches at once, ZB-H1 at most min(p, m) = {limit}")
        message = (
            f"{head}. Rank {hole.rank} idles {_length(hole.end - hole.start)} from t = "
            f"{_units(hole.start)} (before {hole.before}, waiting for rank "
            f"{hole.sender.rank}'s {hole.sender}) while {weight} waits: its I ended at t = "
            f"{_units(_box(mine_boxes, weight.rank, 'I', weight.microbatch).end)}. Run "
            f"{weight} in that hole, a W needs no message ({gain}; {idle(hole.rank)})"
            + memory)
        return Failure("hole", message, rank=hole.rank, case=(p, m))
    sent = finding.message
    waits = (f"rank {hole.rank} idles {_length(hole.end - hole.start)} from t = "
             f"{_units(hole.start)} before {hole.before}" if hole is not None
             else "the batch's end waits for it")
    kind = "activation" if sent.letter == "F" else "gradient"
    message = (
        f"{head}. Rank {weight.rank} runs {weight} (t = {_units(weight.start)} to "
        f"{_units(weight.end)}) before {sent}, whose {kind} the rest of the batch waits for "
        f"({waits}): a W nobody waits for held up a message somebody does. Run {sent} "
        f"first and {weight} after it, in a hole ({gain}; "
        f"{idle(hole.rank if hole is not None else weight.rank)})")
    return Failure("held up", message, rank=weight.rank, case=(p, m))


def _gain(finding, span: int) -> str:
    """What the move told would win, in words."""
    if finding.span < span:
        return f"with that W moved the batch would take {_units(finding.span)}"
    before, after = finding.ends
    rank = finding.sooner
    also = [other for other, end in enumerate(after) if end == span]
    return (f"with that W moved rank {rank} would end at t = {_units(after[rank])}, not "
            f"{_units(before[rank])}; rank{'s' if len(also) > 1 else ''} "
            f"{', '.join(map(str, also))} end{'s' if len(also) == 1 else ''} the batch at "
            f"t = {_units(span)} too, so move {'its' if len(also) == 1 else 'their'} W's "
            "as well")


def _box(boxes, rank, letter, microbatch):
    return next(box for box in boxes[rank] if box.letter == letter
                and box.microbatch == microbatch)


# --------------------------------------------------------------------------- the check


def check(function, processes: bool = True, **options) -> CheckResult:
    report = CheckResult("zb_h1")
    try:
        with deadline(CHECK_DEADLINE, "checking zb_h1 on the simulator"):
            report.failure = _check(function, report)
    except ExerciseTimeout as error:
        report.failure = Failure("hang", f"{error}: an endless loop?")
    if report.failure is None or report.failure.kind in ("hole", "held up", "slower",
                                                          "memory"):
        report.schedules = _charts(function)
    if report.failure is None and processes:
        report.failure = _on_processes(function, report)
    return report


def _charts(function):
    """Both schedules' simulated (header, events) at :data:`DRAWN`, or None."""
    try:
        p, m = DRAWN
        orders = function(given_orders(p, m))
        if _shape(orders, p, m) is None and _rules(orders, p, m) is None:
            # The header names ZB-H1 for both: the student's bubble is read
            # against ZB-H1's formula, not 1F1B's.
            header = {"schedule": "zb_h1", "stages": p, "microbatches": m,
                      "virtual_stages": 1, "transport": "sim"}
            return {"yours": (header, simulate_orders(orders, p, m, name="yours")),
                    "ZB-H1 (reference)": (header, _reference_events(p, m, RATIOS[0]))}
    except Exception:  # noqa: BLE001 - the drawing is a bonus; the verdict stands
        pass
    return None


def _check(function, report) -> Failure | None:
    placed = {}
    for p, m in SHAPES:
        try:
            got = function(given_orders(p, m))
        except NotWrittenYet as error:
            return Failure("not written", f"place_weights is not written yet: {error}")
        except ExerciseTimeout:
            raise
        except Exception as error:  # noqa: BLE001 - the student's error, told plainly
            return Failure("raised", f"{_where(p, m)} raised {describe_error(error)}",
                           case=(p, m))
        failure = _shape(got, p, m)
        if failure is None:
            got = [list(order) for order in got]
            failure = _rules(got, p, m)
        if failure is not None:
            return failure
        placed[(p, m)] = got
    for (p, m), orders in placed.items():
        try:
            simulate_orders(orders, p, m)
        except simulate.DeadlockError as error:
            changed = _reordered(orders, p, m)
            return Failure("deadlock", (
                f"{_where(p, m)} deadlocks on the pipeline simulator: {error}. A W sends and "
                f"waits for nothing, so only a moved F or I can do this: {changed}"
                if changed else f"{_where(p, m)} deadlocks on the pipeline simulator: {error}"),
                case=(p, m))
    for (p, m), orders in placed.items():
        changed = _reordered(orders, p, m)
        if changed:
            return Failure("reordered", (
                f"{_where(p, m)}: {changed}. Keep every F and I where 1F1B has them and move "
                "only the W's: ZB-H1 is 1F1B's order with the weight halves placed later"),
                case=(p, m))
    for (p, m), orders in placed.items():
        for ratio in RATIOS:
            events, reference = simulate_orders(orders, p, m, ratio), \
                _reference_events(p, m, ratio)
            if _span(events) > _span(reference):
                return _slower(orders, p, m, ratio, events, reference)
    for (p, m), orders in placed.items():
        failure = _memory(orders, p, m)
        if failure is not None:
            return failure
    report.passed.append(f"valid on {len(SHAPES)} shapes (p = 1..6 stages, m = 1..8 "
                         "micro-batches, m < p too): every F, I and W once, W after its I, "
                         "no deadlock, F's and I's in 1F1B's order")
    report.passed.append("as fast as ZB-H1 with F = I = W = 1 and with F = I = 2, W = 1 "
                         "(m(F+I+W) + (p-1)(F+I-W) when m >= p), holding at most min(p, m) "
                         "micro-batches on every rank")
    return None


def _span(events) -> int:
    return schedule_holes.makespan(schedule_holes.boxes_of(events))


# --------------------------------------------------------------------------- real processes


def _model():
    from minidist import nn

    nn.init.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).to(np.float64)


def _batch():
    generator = np.random.default_rng(7)
    return generator.standard_normal((BATCH, 5)), generator.integers(0, 3, BATCH)


def _one_process() -> dict:
    """The weights after one SGD step of one process on the whole batch."""
    from minidist import nn, optim
    from minidist.tensor import Tensor

    model, (x, y) = _model(), _batch()
    optimizer = optim.SGD(model.parameters(), lr=LR)
    nn.CrossEntropyLoss()(model(Tensor(x)), y).backward()
    optimizer.step()
    return {name: np.array(parameter.data) for name, parameter in model.named_parameters()}


def _worker(orders, microbatches):
    import minidist.distributed as dist
    from minidist import nn, optim
    from minidist.parallel.pipeline import Pipeline

    stages = dist.get_world_size()
    model = _model()
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    pipe = Pipeline(model, schedule=as_schedule(orders, stages, microbatches))
    optimizer = optim.SGD(pipe.parameters(), lr=LR)
    x, y = _batch()
    pipe.step(x if pipe.is_first else None, y if pipe.is_last else None,
              nn.CrossEntropyLoss(), optimizer)
    return {names[id(parameter)]: np.array(parameter.data) for parameter in pipe.parameters()}


def _on_processes(function, report) -> Failure | None:
    from minidist.exercises.process_check import launch_checked

    want = _one_process()
    for stages, microbatches in REAL:
        orders = [list(order) for order in function(given_orders(stages, microbatches))]
        results, failure = launch_checked(_worker, stages, (orders, microbatches),
                                          "your placement through Pipeline")
        if failure is not None:
            return failure
        for rank, weights in enumerate(results):
            for name, got in weights.items():
                wrong = np.flatnonzero(~np.isclose(got, want[name], rtol=1e-9, atol=1e-12))
                if wrong.size:
                    element = int(wrong[0])
                    return Failure("wrong result", (
                        f"on {stages} processes, {microbatches} micro-batches: after one step "
                        f"rank {rank}'s {name}, element {element}, is "
                        f"{got.flat[element]:.12g}, one process on the whole batch has "
                        f"{want[name].flat[element]:.12g}"), rank=rank, element=element,
                        case=(stages, microbatches))
    worlds = " and ".join(f"{p} ({m} micro-batches)" for p, m in REAL)
    report.passed.append(f"real processes, float64, {worlds}: your orders through Pipeline, "
                         "one SGD step, every rank's weights equal one process's to 1e-9")
    return None


EXERCISE = Exercise(
    name="zb_h1", function="place_weights",
    summary="ZB-H1: fill 1F1B's bubble with the backward's weight halves W",
    lesson="lessons/20_zero_bubble.py", reference=place_weights, check=check)
