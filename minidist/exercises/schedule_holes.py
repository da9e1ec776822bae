"""Why a pipeline schedule with split backwards takes longer than it must:
the holes on its critical path and the weight halves (W) that made them.

A W sends nothing and nobody waits for it, so where a rank runs its W's
decides two things only: how early its F's and I's send what the other
ranks wait for, and whether it idles while a W could run. On the virtual
clock of :func:`~minidist.parallel.pipeline.simulate.simulate_schedule`
(messages free) every compute box starts at the later of two times: the end
of the box before it on its rank, and the end of the box on the
neighbouring rank whose message it waits for (a forward's activation from
rank r - 1, an input half's gradient from rank r + 1). The *critical path*
is read backwards from the box that ends the batch, each step to whichever
of the two decided the start. Along it two things can be moved, and each is
a *candidate*:

* a **hole**: the rank idles before a box that waits for a message, while
  a W whose I has already run waits on that rank for later. The W can run
  in the hole (it needs no message); the rank's later boxes then end
  sooner;
* a W that **holds up** a message: on a busy stretch of a rank the path
  passes a W and then the F or I whose message the next rank down the path
  waits for. Run after that F or I, the W no longer delays the message.

After the path's candidates come the holes off the path: every idle gap
of every rank with a W waiting (a rank that ends the batch with a tail of
W's may shorten it by running them earlier, in a gap the path does not
cross). Each candidate is tried in that order: the W moved, the orders run
on the clock again, and only a move that helps is told (with the time it
would take), so a hint is never a guess: the batch ends sooner, or, where
two ranks end it together and no one move can shorten it, one of them
ends sooner and none later than the batch. The first candidate
that helps is the one told; none helps, none is told.

Scope: one stage a rank, compute orders written ``"F3"``, ``"I3"``,
``"W3"``. Cost: one walk of the path, O(boxes), and one simulation per
candidate tried (at most :data:`MOST_TRIED`).
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist import trace as _trace
from minidist.parallel.pipeline.simulate import WORK

#: Candidates tried at most (each is one simulation).
MOST_TRIED = 48


@dataclass(frozen=True)
class Box:
    """One computation on the clock: ``rank``, its ``index`` in the rank's
    order, its letter ("F", "I", "W"), micro-batch, start and end (ns)."""

    rank: int
    index: int
    letter: str
    microbatch: int
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.letter}{self.microbatch}"


@dataclass(frozen=True)
class Hole:
    """Rank ``rank`` idles from ``start`` to ``end`` before ``before``,
    which waits for the message of ``sender``'s box."""

    rank: int
    start: int
    end: int
    before: Box
    sender: Box


@dataclass(frozen=True)
class Finding:
    """A move that shortens the batch. ``kind`` "hole": ``weight`` could run
    in ``hole`` (on its rank, before ``hole.before``); "held up": ``weight``
    ran before ``message``, the box whose message the path waits for, and
    belongs after it (``hole``: the idle it caused down the path, or None).
    ``span``: the batch's time with the move (ns); ``ends``: each rank's
    end before the move and after it (ns); ``orders``: the orders moved."""

    kind: str
    weight: Box
    hole: Hole | None
    message: Box | None
    span: int
    ends: tuple[tuple[int, ...], tuple[int, ...]]
    orders: list

    @property
    def sooner(self) -> int:
        """The rank whose end the move brings forward most."""
        before, after = self.ends
        return max(range(len(before)), key=lambda rank: (before[rank] - after[rank], -rank))


def boxes_of(events) -> list[list[Box]]:
    """Each rank's compute boxes (F, I, W, ...) in the order they ran."""
    by_rank: dict[int, list[Box]] = {}
    for event in events:
        if event["kind"] != "compute":
            continue
        info = _trace.label_info(event.get("label", ""))
        if info.get("pipeline") not in WORK:
            continue
        rank = event["rank"]
        row = by_rank.setdefault(rank, [])
        row.append(Box(rank, len(row), info["pipeline"], int(info["mb"]), event["start"],
                       event["end"]))
    return [by_rank.get(rank, []) for rank in range(max(by_rank, default=-1) + 1)]


def makespan(boxes: list[list[Box]]) -> int:
    """First box's start to the last one's end."""
    every = [box for row in boxes for box in row]
    return max(box.end for box in every) - min(box.start for box in every)


def ends(boxes: list[list[Box]]) -> tuple[int, ...]:
    """When each rank's last box ends."""
    return tuple(row[-1].end if row else 0 for row in boxes)


def _later_first(times) -> tuple[int, ...]:
    return tuple(sorted(times, reverse=True))


def idle_between(row: list[Box]) -> int:
    """A rank's idle time between its first box's start and its last's end."""
    if not row:
        return 0
    return row[-1].end - row[0].start - sum(box.end - box.start for box in row)


def producer(boxes: list[list[Box]], box: Box, where: dict) -> Box | None:
    """The box on the neighbouring rank whose message ``box`` waits for: a
    forward's activation from rank r - 1, an input half's (or a whole
    backward's) gradient from rank r + 1; None for what waits for no message."""
    ranks = len(boxes)
    if box.letter == "F" and box.rank > 0:
        return where.get((box.rank - 1, "F", box.microbatch))
    if box.letter in ("I", "B") and box.rank < ranks - 1:
        return where.get((box.rank + 1, box.letter, box.microbatch))
    return None


def _waiting_weights(row: list[Box], hole: Hole, where: dict) -> list[Box]:
    """The W's of ``row`` that run after ``hole`` although their I ended before it."""
    return [weight for weight in row[hole.before.index + 1:] if weight.letter == "W"
            and where[(weight.rank, "I", weight.microbatch)].end <= hole.start]


def candidates(boxes: list[list[Box]]) -> list[tuple]:
    """The moves to try, as (kind, W box, hole or None, the box the W goes
    before ("hole") or after ("held up")): first those on the critical
    path (see the module), earliest first, the W nearest to the message it
    holds up first; then every other hole of every rank with a W waiting."""
    where = {(box.rank, box.letter, box.microbatch): box for row in boxes for box in row}
    last = max((box for row in boxes for box in row), key=lambda box: (box.end, -box.rank))
    path, current, top, hole = [], last, None, None
    while True:
        row = boxes[current.rank]
        previous = row[current.index - 1] if current.index > 0 else None
        sender = producer(boxes, current, where)
        ready = previous.end if previous is not None else row[0].start
        if sender is not None and current.start == sender.end and sender.end >= ready:
            if previous is not None and current.start > previous.end:
                hole = Hole(current.rank, previous.end, current.start, current, sender)
                path += [("hole", weight, hole, current)
                         for weight in _waiting_weights(row, hole, where)]
            elif previous is not None and previous.letter == "W" and top is not None:
                # busy until the message came: the W alone may not be what delays it
                path.append(("held up", previous, hole, top))
            current, top = sender, sender
            continue
        if previous is None:
            break
        if previous.letter == "W" and top is not None:
            path.append(("held up", previous, hole, top))
        current = previous
    path.sort(key=lambda move: move[2].start if move[0] == "hole" else move[3].start)
    others = []
    for row in boxes:
        for previous, box in zip(row, row[1:]):
            sender = producer(boxes, box, where)
            if box.start > previous.end and sender is not None:
                gap = Hole(box.rank, previous.end, box.start, box, sender)
                others += [("hole", weight, gap, box)
                           for weight in _waiting_weights(row, gap, where)]
    others.sort(key=lambda move: (move[2].start, move[1].rank))
    return path + others


def _moved(orders: list, kind: str, weight: Box, target: Box) -> list:
    row = list(orders[weight.rank])
    item = row.pop(weight.index)
    at = row.index(str(target))
    row.insert(at if kind == "hole" else at + 1, item)
    return [row if rank == weight.rank else list(order) for rank, order in enumerate(orders)]


def first_move_that_helps(orders: list, events, simulate, allowed=None) -> Finding | None:
    """The first candidate (see :func:`candidates`) that helps, tried by
    ``simulate(orders) -> events``: the batch ends sooner, or as late but
    with fewer ranks ending then (when two ranks end the batch together, no
    single move can shorten it; one that brings one of them forward
    helps). ``allowed(orders)`` (optional) refuses a move, e.g. one that
    holds more memory. None if no candidate helps."""
    boxes = boxes_of(events)
    span, before = makespan(boxes), ends(boxes)
    tried = set()
    for kind, weight, hole, target in candidates(boxes):
        key = (kind, weight.rank, weight.index, str(target))
        if key in tried:
            continue
        tried.add(key)
        if len(tried) > MOST_TRIED:
            break
        moved = _moved(orders, kind, weight, target)
        if allowed is not None and not allowed(moved):
            continue
        after_boxes = boxes_of(simulate(moved))
        faster, after = makespan(after_boxes), ends(after_boxes)
        if faster <= span and _later_first(after) < _later_first(before):
            return Finding(kind, weight, hole, target if kind == "held up" else None, faster,
                           (before, after), moved)
    return None


__all__ = ["Box", "Hole", "Finding", "boxes_of", "makespan", "ends", "idle_between",
           "candidates", "first_move_that_helps"]
