"""Where a rank's time went: every moment of its span put in one class.

A rank's *span* is the time from its first event's start to its last
event's end. Three sets of time are read straight from its events:

* ``C``, compute: the union of its ``compute`` events (the regions a
  strategy or a script marks with :func:`minidist.trace.region`; a
  pipeline's F, B, I, W and step, FSDP2's forward and backward of a unit),
  less the time the rank sat inside a collective call (:func:`blocked`): a
  rank has one thread, and a blocking all_reduce in a region marked
  "backward" is not backward's computation;
* ``M``, communication: the union of its ``send``, ``recv`` and
  ``collective`` events (a collective's event spans the call, its messages
  lie inside it; an ``async_op`` call's spans until it completed);
* ``W``, waiting for a peer: the union of the intervals below, each inside
  a message or a call, so ``W`` lies inside ``M``.

A wait is time in which this rank's communication could not have moved for
want of a peer:

* a receive that was posted before its message's send started waited from
  its own start until that send's start (or its own end): no byte of the
  message existed yet. The send and the receive are the two ends of one
  message (``rank``, ``peer``, ``seq`` and ``attempt`` pair them);
* a send that could not end before its receive was posted (a rendezvous, a
  full ring of slots) waited from its start until the receive's;
* a collective call in which this rank recorded no message of its own
  waited from its start until the last member of the group entered the
  call (the same call is found on every rank by its group and number).

Each moment of the span then falls in exactly one class, tried in this order:

==============  ==========================================================
compute         in ``C``; the part of it also in ``M`` is *overlapped*
                communication (a bucket's all_reduce running under backward)
waiting         in ``W`` and not in ``C``: blocked on a peer
exposed         in ``M``, not in ``C``, not in ``W``: the rank inside its
                communication with every peer there (the bytes moving, the
                chunks being added)
unmarked        in none of them: work the trace does not name (an optimizer
                step no region marks, Python between calls) or nothing
==============  ==========================================================

So ``compute + waiting + exposed + unmarked = span``, ``idle = waiting +
unmarked``, ``communication = overlapped + exposed + waiting`` (the length
of ``M``), and the overlap is ``overlapped / communication``: the share of
the communication that ran while the rank computed. These are the columns
of the temporal breakdown and the communication/computation overlap of
Meta's Holistic Trace Analysis (HTA), whose "idle" we split in two: the
time a peer made this rank wait, and the time the trace says nothing about.

What "overlapped" means here. On a GPU, NCCL moves the bytes on its own
stream while kernels compute. A minidist rank has one thread and nothing
runs in the background: an ``async_op`` call moves on only inside its
``test()`` and ``wait()`` (DDP calls ``test()`` at each gradient). Its
overlapped time is the time it was started and not yet done while the rank
computed: what the rank did not have to sit in, the saving overlap is
for; its ``test()`` visits are counted as the rank's communication.

A trace with no compute region on any rank (the ranks only communicate, or
a script marks nothing) is read the other way round: every moment that is
not communication counts as compute, no communication can be called
overlapped, and the profile says so (``Profile.rule``).

The *overall* row adds the ranks' times (rank-seconds, as HTA's sums do); a
step (below) and a mesh dimension are the same classes cut to their window
or their communication. Every number is the length of a list of intervals
the profile holds, so a test can sum them again.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from minidist import trace as _trace
from minidist.profile.intervals import Interval, clip, intersect, length, subtract, union

COMPUTE_KINDS = frozenset({"compute"})
COMMUNICATION_KINDS = frozenset({"send", "recv", "collective"})
#: The classes of a span, in the order the table and the picture give them.
CLASSES = ("compute", "overlapped", "exposed", "waiting", "unmarked")


@dataclass
class Breakdown:
    """One rank's time (``rank``), or the ranks' summed (``rank`` None), in a
    window; each field a list of intervals in nanoseconds. ``overlapped`` is a
    part of ``compute``; the other four classes share no moment."""

    rank: int | None
    span: list[Interval]
    compute: list[Interval]
    overlapped: list[Interval]
    exposed: list[Interval]
    waiting: list[Interval]
    unmarked: list[Interval]

    def intervals(self, name: str) -> list[Interval]:
        """The intervals of one class, of ``span``, or of the two unions:
        ``communication`` (overlapped, exposed, waiting) and ``idle``
        (waiting, unmarked)."""
        if name == "communication":
            return sorted(self.overlapped + self.exposed + self.waiting)
        if name == "idle":
            return sorted(self.waiting + self.unmarked)
        return getattr(self, name)

    def ns(self, name: str) -> int:
        """The length of :meth:`intervals` ``(name)``, in ns."""
        return length(self.intervals(name))

    @property
    def overlap_percent(self) -> float | None:
        """Overlapped communication as a share of all of it; None without any."""
        total = self.ns("communication")
        return 100.0 * self.ns("overlapped") / total if total else None

    def numbers(self) -> dict:
        found = {name: self.ns(name) for name in ("span",) + CLASSES + ("communication", "idle")}
        found["overlap_percent"] = self.overlap_percent
        return found

    def cut(self, start: int, end: int) -> Breakdown:
        """The same classes inside ``[start, end)``."""
        return Breakdown(self.rank, *(clip(getattr(self, name), start, end)
                                      for name in ("span",) + CLASSES))


def summed(breakdowns) -> Breakdown:
    """The ranks' breakdowns side by side: their interval lists joined (not
    merged: two ranks computing at once is twice the rank-time)."""
    lists = {name: [] for name in ("span",) + CLASSES}
    for breakdown in breakdowns:
        for name in lists:
            lists[name].extend(getattr(breakdown, name))
    return Breakdown(None, **lists)


@dataclass
class Wait:
    """``rank`` waited for ``peer`` from ``start`` to ``end`` in ``what`` (a
    collective, "all_reduce ring", or a message's label)."""

    rank: int
    start: int
    end: int
    peer: int
    what: str
    call: int | None = None


def classify(events: list[dict], waits: list[Wait], rule: str) -> Breakdown:
    """One rank's span in the classes of the module docstring."""
    rank = events[0]["rank"]
    first = min(event["start"] for event in events)
    last = max(event["end"] for event in events)
    span = [(first, last)] if last > first else []
    communication = union((e["start"], e["end"]) for e in events
                          if e["kind"] in COMMUNICATION_KINDS)
    waited = intersect(union((w.start, w.end) for w in waits), communication)
    if rule == "regions":
        compute = subtract(union((e["start"], e["end"]) for e in events
                                 if e["kind"] in COMPUTE_KINDS), blocked(events))
    else:  # "gaps": whatever is not communication is taken as compute
        compute = subtract(span, communication)
    waiting = subtract(waited, compute)
    outside = subtract(communication, compute)
    return Breakdown(rank, span, compute, intersect(communication, compute),
                     subtract(outside, waiting), waiting,
                     subtract(span, union(compute + communication)))


def blocked(events: list[dict]) -> list[Interval]:
    """The time the rank sat inside a collective call: a blocking call's whole
    event; of an ``async_op`` call (``async=1``), the time it spent in the
    call's ``test()`` and ``wait()`` (``inside=``, ns), placed at the call's
    end. The amount is exact; the place is the last wait's, and the short
    ``test()`` visits before it are moved there (one interval, not many)."""
    found = []
    for event in events:
        if event["kind"] != "collective":
            continue
        info = _trace.label_info(event.get("label") or "")
        if info.get("async") != 1:
            found.append((event["start"], event["end"]))
        elif isinstance(info.get("inside"), int):
            found.append((max(event["start"], event["end"] - info["inside"]), event["end"]))
    return union(found)


# --------------------------------------------------------------------------- waits


def _what(event: dict) -> tuple[str, int | None]:
    """The name a wait is filed under, and its collective call's number."""
    label = event.get("label") or ""
    info = _trace.label_info(label)
    if event["kind"] == "collective":
        name = " ".join(str(info[key]) for key in ("collective", "algorithm") if key in info)
        return name or _trace.label_text(label).strip() or "collective", info.get("call")
    text = _trace.label_text(label).strip()
    if "call" in info:  # a collective's message: "all_reduce ring: reduce-scatter step 2"
        return text.split(":", 1)[0].strip(), info["call"]
    return f"point-to-point '{text}'" if text else "point-to-point", None


def find_waits(events: list[dict]) -> tuple[list[Wait], dict]:
    """Every wait of every rank (the module docstring's three rules), and
    counts of what could not be judged: ``one_end`` (messages whose other end
    is not in the trace), ``no_seq`` (messages without the ``seq`` that pairs
    them, as an older trace's)."""
    sends, receives, counts = {}, {}, {"one_end": 0, "no_seq": 0}
    with_messages = set()  # (rank, group, call, attempt): calls with a message of this rank
    for event in events:
        if event["kind"] not in ("send", "recv"):
            continue
        info = _trace.label_info(event.get("label") or "")
        if "call" in info:
            with_messages.add((event["rank"], event.get("group", 0), info["call"],
                               event.get("attempt")))
        if event.get("seq") is None or event.get("peer") is None:
            counts["no_seq"] += 1
            continue
        if event["kind"] == "send":
            sends[(event["rank"], event["peer"], event["seq"], event.get("attempt"))] = event
        else:
            receives[(event["peer"], event["rank"], event["seq"], event.get("attempt"))] = event
    waits = []
    for key, receive in receives.items():
        send = sends.get(key)
        if send is None:
            counts["one_end"] += 1
        elif send["start"] > receive["start"]:
            waits.append(Wait(receive["rank"], receive["start"], min(send["start"], receive["end"]),
                              send["rank"], *_what(receive)))
    for key, send in sends.items():
        receive = receives.get(key)
        if receive is None:
            counts["one_end"] += 1
        elif send["start"] < receive["start"] < send["end"]:
            waits.append(Wait(send["rank"], send["start"], receive["start"], receive["rank"],
                              *_what(send)))
    calls = defaultdict(list)
    for event in events:
        if event["kind"] == "collective":
            info = _trace.label_info(event.get("label") or "")
            if "call" in info:
                group = info.get("group", event.get("group", 0))
                calls[(group, info["call"], event.get("attempt"))].append(event)
    for (group, call, attempt), members in calls.items():
        latest = max(members, key=lambda event: event["start"])
        for event in members:
            if (event["rank"], group, call, attempt) in with_messages or event is latest:
                continue
            if latest["start"] > event["start"]:
                waits.append(Wait(event["rank"], event["start"], min(latest["start"], event["end"]),
                                  latest["rank"], *_what(event)))
    return waits, counts


def waited_time(waits: list[Wait], breakdown: Breakdown) -> dict[tuple[int, str], int]:
    """Nanoseconds of ``breakdown``'s waiting spent on each (peer, what), each
    moment given to one wait: the earliest begun that covers it (two receives
    waiting at once share their time, they do not count it twice). A wait's
    part under compute is no waiting. The values add up to the waiting time."""
    found: dict[tuple[int, str], int] = defaultdict(int)
    covered = None  # the waits begun so far cover time up to here
    for wait in sorted(waits, key=lambda w: (w.start, w.end)):
        start = wait.start if covered is None else max(wait.start, covered)
        if start < wait.end:
            found[(wait.peer, wait.what)] += length(intersect([(start, wait.end)],
                                                              breakdown.waiting))
        covered = wait.end if covered is None else max(covered, wait.end)
    return dict(found)


# --------------------------------------------------------------------------- steps


def step_windows(by_rank: dict[int, list[dict]]) -> tuple[str, dict[int, list[Interval]]]:
    """(how the steps were found, each rank's step windows), or ("", {}).

    * A pipeline marks its optimizer step as a compute region labelled
      ``step``: a rank's step k ends where its k-th such region ends and
      begins where the one before ended (or where the rank began).
    * Otherwise, as the timeline draws steps (:func:`viz.timeline.step_starts`):
      the lowest rank's first compute region ("forward") begins a step each
      time its label recurs; a step runs to the next one's start, the last
      to the trace's end, the same windows on every rank. What runs before
      the first (the weights' broadcast) belongs to no step.
    """
    pipelined = {}
    for rank, events in by_rank.items():
        ends = sorted(e["end"] for e in events if e["kind"] == "compute"
                      and _trace.label_text(e.get("label") or "").strip() == "step")
        if ends:
            first = min(e["start"] for e in events)
            pipelined[rank] = list(zip([first] + ends[:-1], ends))
    if pipelined:
        return "each rank's optimizer step region ('step') ends its step", pipelined
    compute = [e for events in by_rank.values() for e in events if e["kind"] == "compute"]
    if not compute:
        return "", {}
    lowest = min(e["rank"] for e in compute)
    mine = sorted((e for e in compute if e["rank"] == lowest), key=lambda e: e["start"])
    label = _trace.label_text(mine[0].get("label") or "")
    starts = [e["start"] for e in mine if _trace.label_text(e.get("label") or "") == label]
    if len(starts) < 2:
        return "", {}
    last = max(e["end"] for events in by_rank.values() for e in events)
    windows = list(zip(starts, starts[1:] + [last]))
    return (f"a step begins at each '{label}' region of rank {lowest}",
            {rank: windows for rank in by_rank})
