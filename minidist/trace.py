"""The event record every layer of minidist writes to.

Each worker process keeps its own list of events in memory while it runs;
the runtime gathers the lists when the run ends and writes them once, as JSON
lines: one header line, then one event per line. Everything that draws a run
(the visualiser, the Chrome / Perfetto export, the bubble measurements) reads
this one format, so whatever runs can be drawn.

An event is one interval on one rank::

    {"rank": 0, "kind": "send", "peer": 1, "bytes": 4096, "tag": 7,
     "label": "ring step 2", "start": 81234567890, "end": 81234571234,
     "seq": 12, "group": 0, "channel": 0}

An elastic run (``minidist run --max-restarts``) writes every attempt into
one trace: each event has an ``attempt`` field (0, 1, ...) and the header an
``attempts`` list (number, world size, start, end, outcome); a reader that
knows neither reads it as before.

``kind`` is ``send`` / ``recv`` for messages (written by the transports),
``compute`` for regions a strategy marks with :func:`region`, and other words
(``step``, ...) for what later layers add. ``seq`` numbers the messages from
one rank to one peer, so the send ``(rank=a, peer=b, seq=s)`` and the recv
``(rank=b, peer=a, seq=s)`` are the two ends of the same message.

What a collective adds (version 2). A collective's messages carry, after the
readable text of their label, `` #`` and ``key=value`` pairs::

    "all_reduce ring: reduce-scatter step 2 chunk 3 #call=3 step=2
     phase=reduce-scatter range=256:512 op=combine"

``call`` numbers the group's collective calls; ``step`` is the algorithm's
step, numbered the same on every rank; ``range=a:b`` the elements of the
call's buffer the message reads (send) or writes (recv), absent for a
scratch array; ``op`` (recv) ``copy`` or ``combine``. Each rank also records
one ``kind="collective"`` event spanning the call, whose label holds
``collective``, ``algorithm``, ``world``, ``count``, ``itemsize``, ``root``
(-1: none), ``group`` and ``steps``; a call started with ``async_op=True``
adds ``async=1`` and ``inside=``, the nanoseconds the rank spent inside the
call's ``test()`` and ``wait()`` calls (the rest of the event the call was
in flight while the rank did other work; a blocking call holds the rank
throughout). :func:`label_info` reads the pairs back,
:func:`label_text` the text. Version 1 traces (no pairs) still read.

The clock. ``start`` and ``end`` are nanoseconds of ``CLOCK_MONOTONIC``
(:func:`time.monotonic_ns` on Linux). That clock is one system-wide counter,
so times taken in different processes on one machine are directly comparable
and an arrow from a send to its recv never points backwards. (Python's
``perf_counter`` makes no such promise across processes.)

Cost. With tracing off, :func:`region` returns a shared do-nothing context
manager and the transports skip recording with one ``is None`` test per
message; ``benchmarks/bench_p2p.py`` measures what that costs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from minidist.atomic_file import atomic_write

SCHEMA = "minidist.trace"
VERSION = 2
CLOCK = "CLOCK_MONOTONIC"

#: The order of the fields of an event tuple as recorded in memory.
FIELDS = ("rank", "kind", "peer", "bytes", "tag", "label", "start", "end", "seq", "group", "channel")

now = time.monotonic_ns
"""The shared clock: nanoseconds of CLOCK_MONOTONIC, comparable across processes."""


class Recorder:
    """The events of one process, kept in memory until the run ends.

    Events are stored as tuples in :data:`FIELDS` order (cheaper to build and to
    pickle than dicts); :meth:`as_dicts` turns them into the written form.
    """

    __slots__ = ("rank", "events")

    def __init__(self, rank: int):
        self.rank = rank
        self.events: list[tuple] = []

    def add(self, kind, start, end, peer=None, nbytes=0, tag=None, label="", seq=None,
            group=0, channel=0):
        self.events.append(
            (self.rank, kind, peer, nbytes, tag, label, start, end, seq, group, channel)
        )

    def as_dicts(self) -> list[dict]:
        return [dict(zip(FIELDS, event)) for event in self.events]


_recorder: Recorder | None = None


def start_recording(rank: int) -> Recorder:
    """Turn tracing on in this process (the runtime calls this in each worker)."""
    global _recorder
    _recorder = Recorder(rank)
    return _recorder


def stop_recording() -> list[dict]:
    """Turn tracing off in this process and hand back what was recorded."""
    global _recorder
    recorder, _recorder = _recorder, None
    return recorder.as_dicts() if recorder is not None else []


def current() -> Recorder | None:
    """The recorder of this process, or None when tracing is off."""
    return _recorder


def enabled() -> bool:
    return _recorder is not None


def record(kind: str, start: int, end: int, *, peer=None, nbytes: int = 0, tag=None,
           label: str = "", seq=None, group: int = 0, channel: int = 0) -> None:
    """Append one event (times from :func:`now`); does nothing when tracing is off."""
    if _recorder is not None:
        _recorder.add(kind, start, end, peer, nbytes, tag, label, seq, group, channel)


class _Region:
    __slots__ = ("label", "kind", "start")

    def __init__(self, label: str, kind: str):
        self.label = label
        self.kind = kind

    def __enter__(self):
        self.start = now()
        return self

    def __exit__(self, *exc_info):
        recorder = _recorder
        if recorder is not None:
            recorder.add(self.kind, self.start, now(), label=self.label)
        return False


class _NoRegion:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


_NO_REGION = _NoRegion()


def region(label: str, kind: str = "compute"):
    """Mark a region of work on this rank's timeline::

        with trace.region("forward mb=3"):
            y = model(x)

    Costs one function call and one test when tracing is off.
    """
    if _recorder is None:
        return _NO_REGION
    return _Region(label, kind)


# --------------------------------------------------------------------------- labels

INFO_MARK = " #"


def label_info(label: str) -> dict:
    """The ``key=value`` pairs after `` #`` in a label, as a dict: whole numbers
    as int, ``a:b`` ranges as ``(a, b)``, the rest as text; {} when there are none."""
    at = label.rfind(INFO_MARK) if label else -1
    if at < 0:
        return {}
    info = {}
    for pair in label[at + len(INFO_MARK):].split():
        key, _, value = pair.partition("=")
        if ":" in value:
            first, _, last = value.partition(":")
            try:
                info[key] = (int(first), int(last))
                continue
            except ValueError:
                pass
        try:
            info[key] = int(value)
        except ValueError:
            info[key] = value
    return info


def label_text(label: str) -> str:
    """The readable part of a label (without the ``key=value`` pairs)."""
    at = label.rfind(INFO_MARK) if label else -1
    return label if at < 0 else label[:at]


def with_info(text: str, **pairs) -> str:
    """``text`` followed by its ``key=value`` pairs (None values left out)."""
    tail = " ".join(f"{key}={_format_value(value)}" for key, value in pairs.items()
                    if value is not None)
    return f"{text}{INFO_MARK} {tail}" if tail else text


def _format_value(value) -> str:
    if isinstance(value, tuple):
        return f"{value[0]}:{value[1]}"
    return str(value).replace(" ", "-")


# --------------------------------------------------------------------------- files


@dataclass
class Trace:
    """A trace read back from a file: its header line and its events."""

    header: dict
    events: list[dict] = field(default_factory=list)


def make_header(world_size: int | None = None, **extra) -> dict:
    header = {
        "schema": SCHEMA,
        "version": VERSION,
        "clock": CLOCK,
        "time_unit": "ns",
        "fields": list(FIELDS),
    }
    if world_size is not None:
        header["world_size"] = world_size
    header.update(extra)
    return header


def write_jsonl(path, events: Iterable[dict], header: dict | None = None) -> int:
    """Write a header line and the events (sorted by start time) as JSON lines.

    Returns the number of events written. The file is written to a temporary
    name first and renamed, so a reader never sees half a trace.
    """
    ordered = sorted(events, key=lambda event: (event["start"], event["rank"]))
    header = dict(header) if header is not None else make_header()
    header.setdefault("schema", SCHEMA)
    header.setdefault("version", VERSION)
    header["events"] = len(ordered)
    path = os.fspath(path)
    with atomic_write(path) as file:
        file.write(json.dumps(header) + "\n")
        for event in ordered:
            file.write(json.dumps(event, separators=(",", ":")) + "\n")
    return len(ordered)


def read_jsonl(path) -> Trace:
    """Read a trace written by :func:`write_jsonl`. A file that is not one
    raises ValueError saying which line is wrong and why; an event that
    cannot be (a rank or peer outside the header's world, a negative size)
    raises :class:`WrongEvent`, a ValueError. A file cut short reads: see
    :func:`missing_events`."""
    not_a_trace = f"{path} is not a minidist trace:"  # every message about the header
    with open(path, encoding="utf-8") as file:
        lines = iter(file)
        try:
            header = json.loads(next(lines))
        except StopIteration:
            raise ValueError(f"{not_a_trace} it is empty") from None
        except UnicodeDecodeError as error:
            raise ValueError(f"{not_a_trace} it is not text (byte "
                             f"{error.object[error.start]:#04x} is not UTF-8)") from None
        except json.JSONDecodeError as error:
            raise ValueError(f"{not_a_trace} its first line is not JSON ({error.msg})") from None
        if not isinstance(header, dict) or header.get("schema") != SCHEMA:
            schema = header.get("schema") if isinstance(header, dict) else None
            raise ValueError(
                f"{not_a_trace} it does not start with a minidist trace header "
                f"(schema {schema!r}, expected {SCHEMA!r})"
            )
        version = header.get("version", 0)
        if not isinstance(version, int):
            raise ValueError(f"{path}: the header's version is {version!r}, not a number")
        if version > VERSION:
            raise ValueError(
                f"{path} is trace version {version}; this minidist reads "
                f"up to version {VERSION}. Update minidist to read it."
            )
        events = []
        for number, line in enumerate(_text_lines(lines, path), start=2):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not JSON ({error.msg})") from None
            if not isinstance(event, dict) or not _REQUIRED.issubset(event):
                raise ValueError(f"{path}, line {number}: not a trace event (an event is an "
                                 f"object with at least {sorted(_REQUIRED)})")
            wrong = _wrong_numbers(event, header.get("world_size"))
            if wrong:
                raise WrongEvent(f"{path}, line {number}: {wrong}")
            events.append(event)
    return Trace(header, events)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _wrong_numbers(event: dict, world_size) -> str | None:
    """What is wrong with an event's rank, peer or bytes (None: nothing): a
    rank or peer outside the header's world, a negative size. Every picture
    indexes its rows by rank and sums the bytes, so such an event would
    break them or draw a lie."""
    world = world_size if _whole(world_size) and world_size > 0 else None
    for key in ("rank", "peer"):
        value = event.get(key)
        if not _whole(value):
            continue  # a rank that is no number is the visualiser's to name
        if value < 0 or (world is not None and value >= world):
            ranks = f"ranks 0 to {world - 1}" if world is not None else "ranks count from 0"
            whose = f"a rank of this {world}-rank trace" if world is not None else "a rank"
            return f"{key} {value} is not {whose} ({ranks})"
    nbytes = event.get("bytes")
    if nbytes is not None and not (_whole(nbytes) and nbytes >= 0):
        return f"bytes {nbytes!r}: a message's size is a whole number of bytes, 0 or more"
    return None


def missing_events(trace: Trace) -> str | None:
    """None when ``trace`` holds the events its header counts (or the header
    counts none); else, in words, how many are missing and which collective
    calls, or which ranks' messages, lost events. A file cut short (a copy
    stopped, a full disk) keeps its header, which :func:`write_jsonl` wrote
    with the count, and loses its last lines: the events that started last."""
    counted = trace.header.get("events")
    if not _whole(counted) or counted == len(trace.events):
        return None
    held = len(trace.events)
    if held > counted:
        return f"its header counts {counted:,} events, but the file holds {held:,}"
    words = f"its header counts {counted:,} events, the file holds {held:,} ({counted - held:,} missing)"
    incomplete = _incomplete(trace.events)
    return f"{words}; {incomplete}" if incomplete else words


def _incomplete(events: list[dict]) -> str:
    """Which collective calls (or, outside any call, which ranks) lost events:
    a message with one end only, a rank without its record of the call."""
    calls: dict[tuple, dict] = {}  # (group, call) -> what the call's events say
    for event in events:
        if event.get("kind") == "collective":
            info = label_info(event.get("label") or "")
            if "call" in info:
                found = calls.setdefault((info.get("group", event.get("group", 0)), info["call"]),
                                         {"ranks": set(), "ends": set()})
                found["ranks"].add(event.get("rank"))
                found.update(name=f"{info.get('collective', '?')} {info.get('algorithm', '')}".strip(),
                             world=info.get("world"))
    ends: dict[tuple, list[dict]] = {}
    for event in events:
        if event.get("kind") in ("send", "recv") and event.get("seq") is not None:
            me, peer = (event["rank"], event.get("peer")) if event["kind"] == "send" \
                else (event.get("peer"), event["rank"])
            ends.setdefault((me, peer, event["seq"], event.get("attempt")), []).append(event)
    loose_ranks = set()
    for pair in ends.values():
        if {end["kind"] for end in pair} == {"send", "recv"}:
            continue
        event = pair[0]
        info = label_info(event.get("label") or "")
        key = (event.get("group", 0), info.get("call"))
        if "call" in info and key in calls:
            calls[key]["ends"].add(event["rank"])
        else:
            loose_ranks.add(event["rank"])
    told = []
    for (group, number), found in sorted(calls.items(), key=lambda item: item[0][1]):
        world = found.get("world")
        absent = sorted(set(range(world)) - found["ranks"]) if _whole(world) and group == 0 else []
        if not (absent or found["ends"]):
            continue
        why = []
        if found["ends"]:
            why.append(f"messages of {_ranks(found['ends'])} without their other end")
        if absent:
            why.append(f"no record of the call from {_ranks(absent)}")
        told.append(f"call {number} ({found['name']}: {'; '.join(why)})")
    if loose_ranks:
        told.append(f"messages of {_ranks(loose_ranks)} without their other end")
    return ("incomplete: " + ", ".join(told)) if told else ""


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


_REQUIRED = frozenset(("rank", "kind", "start", "end"))


class WrongEvent(ValueError):
    """A line of a trace is an event, but one that cannot be: its message says
    which line and why (a peer outside the world, a negative size)."""


def _text_lines(lines, path):
    """The lines after the header; a byte that is not UTF-8 is a ValueError naming the line."""
    number = 1
    try:
        for line in lines:
            number += 1
            yield line
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}, after line {number}: not text (byte "
                         f"{error.object[error.start]:#04x} is not UTF-8)") from None


# --------------------------------------------------------------------------- Chrome / Perfetto

#: The fixed lanes of a rank's row; any other kind gets a lane of its own after these.
LANES = ("compute", "send", "recv")
_SUBLANES = 1000  # tid = lane * _SUBLANES + sublane + 1


def _pid_of(rank: int) -> int:
    """The Chrome / Perfetto process of a rank: rank + 1, as pid 0 is the
    kernel's idle process to Perfetto, which files its slices apart."""
    return rank + 1


def _lane_of(kind: str, extra_lanes: dict) -> int:
    if kind in LANES:
        return LANES.index(kind)
    if kind not in extra_lanes:
        extra_lanes[kind] = len(LANES) + len(extra_lanes)
    return extra_lanes[kind]


def _event_name(event: dict) -> str:
    kind = event["kind"]
    if kind in ("send", "recv"):
        arrow = "to" if kind == "send" else "from"
        name = f"{kind} {arrow} {event['peer']} tag {event['tag']} ({event['bytes']} B)"
        return f"{event['label']}: {name}" if event.get("label") else name
    return event.get("label") or kind


def _place_on_sublanes(intervals: list[tuple[int, int, int]]) -> dict[int, int]:
    """Give each interval (start, end, index) a sublane so that slices on one
    sublane either nest or do not overlap (what trace viewers require).

    Greedy: sort by start (longest first on ties); an interval goes on the first
    sublane whose innermost open slice contains it, or that has no open slice.
    """
    stacks: list[list[int]] = []  # per sublane: ends of the open slices
    placement = {}
    for start, end, index in sorted(intervals, key=lambda item: (item[0], -item[1])):
        for sublane, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                placement[index] = sublane
                break
        else:
            stacks.append([end])
            placement[index] = len(stacks) - 1
    return placement


def to_chrome(events: Iterable[dict], header: dict | None = None) -> dict:
    """Convert events to the Chrome trace / Perfetto JSON object format.

    * one process per rank, named "rank r", with ``pid`` = r + 1: Perfetto
      takes pid 0 for the kernel's idle process ("swapper") and treats it
      specially, so no rank is given it (and tids start at 1: tid 0 is that
      process's thread);
    * one thread per lane (``tid``): compute, send, recv, then one per other
      kind; overlapping slices that do not nest (two ``isend`` in flight) go
      on extra lanes "send 2", ...;
    * each event becomes an "X" (complete) slice with ``ts`` and ``dur`` in
      microseconds since the first event;
    * each message is an arrow: the send slice carries ``"bind_id": k,
      "flow_out": true`` and the matching recv slice ``"bind_id": k,
      "flow_in": true`` (Perfetto's v2 flows);
    * "M" metadata events name the processes and threads and fix their order.
    """
    events = list(events)
    if not events:
        return {"traceEvents": [], "displayTimeUnit": "ns", "otherData": dict(header or {})}
    origin = min(event["start"] for event in events)
    extra_lanes: dict[str, int] = {}

    by_track: dict[tuple[int, int], list[int]] = {}
    for index, event in enumerate(events):
        lane = _lane_of(event["kind"], extra_lanes)
        by_track.setdefault((event["rank"], lane), []).append(index)

    tid_of_event: dict[int, int] = {}
    thread_names: dict[tuple[int, int], str] = {}
    lane_names = list(LANES) + sorted(extra_lanes, key=extra_lanes.get)
    for (rank, lane), indices in by_track.items():
        intervals = [(events[i]["start"], max(events[i]["end"], events[i]["start"]), i)
                     for i in indices]
        for index, sublane in _place_on_sublanes(intervals).items():
            tid = lane * _SUBLANES + sublane + 1
            tid_of_event[index] = tid
            name = lane_names[lane] if sublane == 0 else f"{lane_names[lane]} {sublane + 1}"
            thread_names[(rank, tid)] = name

    sends = {}
    for index, event in enumerate(events):
        if event["kind"] == "send" and event.get("seq") is not None:
            sends[(event["rank"], event["peer"], event["seq"], event.get("attempt"))] = index
    flows: dict[int, tuple[int, int]] = {}  # send index -> (recv index, bind id)
    for index, event in enumerate(events):
        if event["kind"] == "recv" and event.get("seq") is not None:
            send_index = sends.get((event["peer"], event["rank"], event["seq"],
                                     event.get("attempt")))
            if send_index is not None and send_index not in flows:
                flows[send_index] = (index, len(flows) + 1)
    flow_in = {recv_index: bind for recv_index, bind in flows.values()}

    trace_events = []
    for rank in sorted({event["rank"] for event in events}):
        pid = _pid_of(rank)
        trace_events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                             "args": {"name": f"rank {rank}"}})
        trace_events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                             "args": {"sort_index": rank}})
    for (rank, tid), name in sorted(thread_names.items()):
        pid = _pid_of(rank)
        trace_events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                             "args": {"name": name}})
        trace_events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                             "args": {"sort_index": tid}})

    for index, event in enumerate(events):
        start_us = (event["start"] - origin) / 1000.0
        dur_us = max(event["end"] - event["start"], 0) / 1000.0
        args = {key: event[key] for key in ("peer", "bytes", "tag", "seq", "group", "channel",
                                            "label") if event.get(key) not in (None, "")}
        slice_ = {"ph": "X", "name": _event_name(event), "cat": event["kind"],
                  "pid": _pid_of(event["rank"]), "tid": tid_of_event[index], "ts": start_us,
                  "dur": dur_us, "args": args}
        if index in flows:
            slice_["bind_id"] = flows[index][1]
            slice_["flow_out"] = True
        if index in flow_in:
            slice_["bind_id"] = flow_in[index]
            slice_["flow_in"] = True
        trace_events.append(slice_)

    other = {"clock": CLOCK, "origin_ns": origin}
    if header:
        other.update({key: value for key, value in header.items() if key != "fields"})
    return {"traceEvents": trace_events, "displayTimeUnit": "ns", "otherData": other}


def write_chrome(path, events: Iterable[dict], header: dict | None = None) -> None:
    """Write :func:`to_chrome` to a file that chrome://tracing and ui.perfetto.dev open.

    Like every file minidist writes, it is written whole or not at all (see
    :mod:`minidist.atomic_file`): a viewer never opens half a trace, and a
    failed conversion leaves the old file, if any, as it was.
    """
    chrome = to_chrome(events, header)
    with atomic_write(os.fspath(path)) as file:
        json.dump(chrome, file)


def iter_messages(events: Iterable[dict]) -> Iterator[tuple[dict, dict | None]]:
    """Pair each send with its recv (None when the recv was not recorded).
    The attempts of an elastic run (``attempt``, absent in one attempt's
    trace) number their messages afresh: a send pairs within its attempt."""
    events = list(events)
    receives = {(e["peer"], e["rank"], e["seq"], e.get("attempt")): e for e in events
                if e["kind"] == "recv" and e.get("seq") is not None}
    for event in events:
        if event["kind"] == "send" and event.get("seq") is not None:
            yield event, receives.get((event["rank"], event["peer"], event["seq"],
                                       event.get("attempt")))
