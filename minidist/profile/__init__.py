"""Where did my step's time go? A profile of any trace, per rank and overall.

In the spirit of Meta's Holistic Trace Analysis (HTA): its *temporal
breakdown* (how much of each rank's time was computation, communication,
idle) and its *communication/computation overlap* (how much of the
communication ran while the rank computed). Read in this order:

* :mod:`.intervals`: sets of time, and union, intersection, difference;
* :mod:`.reading`: the trace read as far as it can be trusted, with a note
  for each thing skipped (a cut last line, a missing header, events that
  cannot be placed);
* :mod:`.breakdown`: the classes (compute, overlapped, exposed, waiting,
  unmarked), which moment falls in which and why; the waits for a peer; the
  steps;
* :mod:`.dimensions`: a rank's communication by the mesh dimension (or
  the group) it ran along;
* this file: :func:`profile` puts them together, per rank, overall, per
  step, per mesh dimension, and names the slowest rank and what it waited
  on; :func:`chrome_with_profile` writes the breakdown beside the events;
* ``minidist/profile_command.py`` (above this package, as it draws with viz):
  ``minidist profile TRACE``.

::

    from minidist.profile import profile
    found = profile("ddp.jsonl")
    found.overall.overlap_percent          # overlapped / all communication
    found.ranks[0].ns("exposed")           # the length of found.ranks[0].exposed
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

from minidist import trace as _trace
from minidist.atomic_file import atomic_write
from minidist.profile.breakdown import (
    CLASSES,
    COMMUNICATION_KINDS,
    COMPUTE_KINDS,
    Breakdown,
    Wait,
    classify,
    find_waits,
    step_windows,
    summed,
    waited_time,
)
from minidist.profile.dimensions import Dimension, communication_by_dimension
from minidist.profile.intervals import Interval
from minidist.profile.reading import ProfileError, load


@dataclass
class Slowest:
    """The rank with the longest span (ties: the one that waited most), the
    peer and the collective (or message) it waited longest for, and the rank
    every rank together waited for most: often the one holding the others up."""

    rank: int
    span_ns: int
    waiting_ns: int
    peer: int | None
    peer_ns: int
    what: str | None
    what_ns: int
    most_waited_for: int | None
    most_waited_for_ns: int


@dataclass
class Step:
    number: int
    ranks: dict[int, Breakdown]
    overall: Breakdown


@dataclass
class Profile:
    """What :func:`profile` found. ``skipped`` lists, one line each, what the
    numbers leave out (a non-empty list means partial numbers); ``remarks``
    how the trace was read."""

    ranks: dict[int, Breakdown]
    overall: Breakdown
    rule: str
    slowest: Slowest | None
    waits: dict[int, list[Wait]]
    steps: list[Step] = field(default_factory=list)
    step_rule: str = ""
    dimensions: dict[str, dict[int, Dimension]] = field(default_factory=dict)
    dimension_rule: str = ""
    skipped: list[str] = field(default_factory=list)
    remarks: list[str] = field(default_factory=list)
    header: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The numbers, in ns (JSON-ready: what ``--chrome`` writes into otherData)."""
        found = {"unit": "ns", "rule": self.rule,
                 "ranks": {str(r): b.numbers() for r, b in sorted(self.ranks.items())},
                 "overall": self.overall.numbers(), "skipped": self.skipped,
                 "remarks": self.remarks}
        if self.slowest is not None:
            found["slowest"] = dict(vars(self.slowest))
        if self.steps:
            found["step_rule"] = self.step_rule
            found["steps"] = [{"step": s.number, "overall": s.overall.numbers(),
                               "ranks": {str(r): b.numbers() for r, b in sorted(s.ranks.items())}}
                              for s in self.steps]
        if self.dimensions:
            found["dimension_rule"] = self.dimension_rule
            found["dimensions"] = {
                name: {str(r): {key: d.ns(key) for key in
                                ("communication", "overlapped", "exposed", "waiting")}
                       | {"calls": d.calls} for r, d in sorted(per_rank.items())}
                for name, per_rank in self.dimensions.items()}
        return found


def profile(trace, compute: str = "auto") -> Profile:
    """The breakdown of ``trace`` (a path, a :class:`minidist.trace.Trace` or a
    list of events): the rules in :mod:`minidist.profile.breakdown`.

    ``compute``: ``"regions"`` (compute is the marked regions), ``"gaps"``
    (compute is whatever is not communication), or ``"auto"``: regions when
    any rank marked one, else gaps. Raises :class:`ProfileError` (one line)
    for a trace that cannot be profiled at all."""
    if compute not in ("auto", "regions", "gaps"):
        raise ValueError(f"compute must be 'auto', 'regions' or 'gaps', got {compute!r}")
    loaded = load(trace)
    events, header = loaded.events, loaded.header
    has_regions = any(e["kind"] in COMPUTE_KINDS for e in events)
    rule = compute if compute != "auto" else ("regions" if has_regions else "gaps")
    remarks = []
    if rule == "gaps":
        remarks.append("no compute regions in the trace: all time that is not communication "
                       "counts as compute, and no communication can be called overlapped")
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for event in events:
        by_rank[event["rank"]].append(event)
    all_waits, counts = find_waits(events)
    waits: dict[int, list[Wait]] = defaultdict(list)
    for wait in all_waits:
        waits[wait.rank].append(wait)
    ranks = {rank: classify(by_rank[rank], waits[rank], rule) for rank in sorted(by_rank)}
    skipped = list(loaded.notes) + _incomplete(header, ranks, counts)
    remarks += _unclassified_kinds(events)
    attempts = header.get("attempts")
    if isinstance(attempts, list) and len(attempts) > 1:
        remarks.append(f"an elastic run of {len(attempts)} attempts: a rank's span runs from "
                       "its first attempt to its last, the time between them unmarked")
    found = Profile(ranks, summed(ranks.values()), rule, None, dict(waits), skipped=skipped,
                    remarks=remarks, header=header)
    found.slowest = _slowest(found)
    found.step_rule, windows = step_windows(by_rank)
    found.steps = _steps(ranks, windows)
    found.dimension_rule, found.dimensions = communication_by_dimension(events, header, ranks)
    return found


def _incomplete(header: dict, ranks: dict, counts: dict) -> list[str]:
    """What makes the numbers partial, in words: ranks of the world with no
    events, messages with one end, messages no wait can be measured for."""
    lines = []
    world = header.get("world_size")
    if isinstance(world, int) and world > 0:
        absent = sorted(set(range(world)) - set(ranks))
        if absent:
            lines.append(f"{_rank_words(absent)} of the {world} recorded no events (the run "
                         "failed before their events were gathered?): "
                         f"{'they are' if len(absent) > 1 else 'it is'} left out")
    if counts["one_end"]:
        lines.append(f"{counts['one_end']:,} messages have one end only (a rank stopped in "
                     "the middle of a call: the run failed, or the trace was cut): their "
                     "waits cannot be measured and count as exposed")
    if counts["no_seq"]:
        lines.append(f"{counts['no_seq']:,} messages carry no seq or peer (an older trace): "
                     "they cannot be paired, so their waits count as exposed")
    return lines


def _unclassified_kinds(events: list[dict]) -> list[str]:
    other = defaultdict(int)
    for event in events:
        if event["kind"] not in COMPUTE_KINDS | COMMUNICATION_KINDS and event["end"] > event["start"]:
            other[event["kind"]] += event["end"] - event["start"]
    if not other:
        return []
    kinds = ", ".join(f"{kind} ({ns / 1e6:.3g} ms)" for kind, ns in sorted(other.items()))
    return [f"spans of other kinds are neither compute nor communication (their messages "
            f"are): {kinds}; outside those, their time counts as unmarked"]


def _rank_words(ranks) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _slowest(found: Profile) -> Slowest | None:
    if not found.ranks:
        return None
    rank = max(found.ranks, key=lambda r: (found.ranks[r].ns("span"),
                                           found.ranks[r].ns("waiting"), -r))
    mine = waited_time(found.waits.get(rank, []), found.ranks[rank])
    by_peer, by_what = defaultdict(int), defaultdict(int)
    for (peer, what), ns in mine.items():
        by_peer[peer] += ns
        by_what[what] += ns
    peer = max(by_peer, key=by_peer.get) if any(by_peer.values()) else None
    what = max(by_what, key=by_what.get) if any(by_what.values()) else None
    waited_for = defaultdict(int)
    for other, waits in found.waits.items():
        for (peer_, _), ns in waited_time(waits, found.ranks[other]).items():
            waited_for[peer_] += ns
    most = max(waited_for, key=waited_for.get) if any(waited_for.values()) else None
    return Slowest(rank, found.ranks[rank].ns("span"), found.ranks[rank].ns("waiting"),
                   peer, by_peer.get(peer, 0), what, by_what.get(what, 0),
                   most, waited_for.get(most, 0))


def _steps(ranks: dict[int, Breakdown], windows: dict[int, list[Interval]]) -> list[Step]:
    count = max((len(w) for w in windows.values()), default=0)
    steps = []
    for number in range(count):
        cut = {rank: ranks[rank].cut(*windows[rank][number]) for rank in ranks
               if number < len(windows.get(rank, []))}
        steps.append(Step(number, cut, summed(cut.values())))
    return steps


def chrome_with_profile(trace, found: Profile | None = None) -> dict:
    """The trace as :func:`minidist.trace.to_chrome` writes it, its breakdown
    under ``otherData["profile"]`` (the numbers of :meth:`Profile.as_dict`):
    Perfetto and chrome://tracing show otherData as the trace's metadata."""
    loaded = load(trace)
    found = found if found is not None else profile(trace)
    chrome = _trace.to_chrome(loaded.events, loaded.header)
    chrome.setdefault("otherData", {})["profile"] = found.as_dict()
    return chrome


def write_chrome_with_profile(trace, path, found: Profile | None = None) -> None:
    """:func:`chrome_with_profile` written whole or not at all."""
    import json

    chrome = chrome_with_profile(trace, found)
    with atomic_write(os.fspath(path)) as file:
        json.dump(chrome, file)


__all__ = ["profile", "Profile", "Breakdown", "Step", "Dimension", "Slowest", "Wait",
           "ProfileError", "chrome_with_profile", "write_chrome_with_profile", "CLASSES"]
