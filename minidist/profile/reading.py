"""Reading a trace for a profile: as much of it as can be trusted, and in
words what could not be.

:func:`minidist.trace.read_jsonl` refuses a file with one wrong line, which
is right for a replay that must show every message. A profile is a sum of
times, and a sum of most of a run still answers "where did the time go",
so long as it says what it left out. So this reader

* refuses, with one line saying what is wrong, what is no trace at all: a
  missing or empty file, a first line that is not JSON, a header of another
  schema, a version newer than this minidist reads, a file with no events;
* reads a file whose header is missing (its first line is already an event)
  as events alone, noting it;
* reads a file whose last line was cut (a copy stopped, a full disk) without
  that line, noting it, and notes the events the header counts and the file
  lacks (:func:`minidist.trace.missing_events`);
* skips the events that cannot be placed in time (no rank, no kind, a start
  or end that is not a number, an end before the start), counting them;
* reads an older trace's events, whose optional fields (``seq``, ``group``,
  ``label``, ...) may be absent: the profile then says which of its numbers
  it could not separate (without ``seq`` a receive cannot be paired with its
  send, so no wait for a peer can be measured).

Every note is one line; :class:`Loaded` keeps them for the command to print.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from minidist import trace as _trace


class ProfileError(ValueError):
    """A trace that cannot be profiled at all; the message is one line saying
    what is wrong with it and what to do."""


@dataclass
class Loaded:
    """What was read: the header ({} when the file had none), the events that
    can be placed in time, and one line for each thing that was skipped."""

    header: dict
    events: list[dict]
    notes: list[str] = field(default_factory=list)


def load(trace) -> Loaded:
    """``trace``: a path, a :class:`minidist.trace.Trace`, or a list of event dicts."""
    if isinstance(trace, (str, os.PathLike)):
        loaded = _read_file(os.fspath(trace))
    elif isinstance(trace, _trace.Trace):
        loaded = Loaded(dict(trace.header), list(trace.events))
    else:
        loaded = Loaded({}, list(trace))
    loaded.events = _placeable(loaded.events, loaded.notes)
    if not loaded.events:
        raise ProfileError("the trace holds no events to profile: trace a run that does "
                           "some work (minidist.launch(..., trace=PATH), minidist run --trace)")
    return loaded


def _read_file(path: str) -> Loaded:
    if not os.path.exists(path):
        raise ProfileError(f"no trace at {path}: give the file a traced run wrote "
                           "(minidist.launch(..., trace=PATH) or minidist run --trace PATH)")
    try:
        read = _trace.read_jsonl(path)
    except _trace.WrongEvent as error:
        raise ProfileError(str(error)) from None
    except ValueError as error:
        return _read_leniently(path, str(error))
    except OSError as error:
        raise ProfileError(f"cannot read {path}: {error.strerror}") from None
    loaded = Loaded(read.header, read.events)
    missing = _trace.missing_events(read)
    if missing:
        loaded.notes.append(f"the trace is incomplete: {missing}")
    return loaded


def _read_leniently(path: str, refusal: str) -> Loaded:
    """The cases :func:`~minidist.trace.read_jsonl` refuses that still leave a
    profile: a cut last line, a missing header. Anything else: its refusal."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = [line for line in file.read().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError):
        raise ProfileError(refusal) from None
    if not lines:
        raise ProfileError(f"{path} is empty: it holds no header and no events")
    notes: list[str] = []
    parsed = []
    for number, line in enumerate(lines, start=1):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) and number > 1:  # only the last line may be cut short
                notes.append(f"the last line ({number}) is cut short: skipped")
                break
            raise ProfileError(refusal) from None
    first = parsed[0] if parsed else None
    if isinstance(first, dict) and first.get("schema") == _trace.SCHEMA:
        header, events = first, parsed[1:]
        if _whole(header.get("events")) and header["events"] > len(events):
            notes.append(f"its header counts {header['events']:,} events, the file holds "
                         f"{len(events):,}: the profile covers those")
    elif isinstance(first, dict) and {"rank", "kind", "start", "end"} <= set(first):
        header, events = {}, parsed
        notes.append("the trace has no header line: read as events alone (no world size, "
                     "no mesh)")
    else:
        raise ProfileError(refusal) from None
    kept = [event for event in events if isinstance(event, dict)]
    if len(kept) < len(events):
        notes.append(f"{len(events) - len(kept):,} lines are not events: skipped")
    return Loaded(header, kept, notes)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _placeable(events: list[dict], notes: list[str]) -> list[dict]:
    """The events with a whole rank, a kind and whole start and end, the end
    not before the start; the rest counted in one note."""
    kept, skipped = [], 0
    for event in events:
        start, end = event.get("start"), event.get("end")
        if (_whole(event.get("rank")) and isinstance(event.get("kind"), str)
                and _whole(start) and _whole(end) and end >= start):
            kept.append(event)
        else:
            skipped += 1
    if skipped:
        notes.append(f"{skipped:,} events without a rank, a kind, or a start and end in "
                     "order: skipped")
    return kept
