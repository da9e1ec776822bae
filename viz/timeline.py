"""A timeline of any trace: one row per rank, what it did when, and its messages.

Each rank's row has lanes, top to bottom:

* ``calls``: collective calls and any other kind of span (``step``, ...),
  labelled with their text where there is room;
* ``compute``: regions marked with :func:`minidist.trace.region`;
* ``send`` and ``recv``: the transport's messages (recv hatched);

and, behind them, hatched grey where the rank was idle (inside its first and
last event, covered by none of compute, send or recv). A line joins each
send's start to its recv's end (:func:`minidist.trace.iter_messages`), so a
message that waited shows as a long slanted line.

A training run of many steps is drawn as its first ``max_steps`` steps (a
step: from one occurrence of the lowest rank's first compute region, such as
"forward", to the next), with a note "steps 1-8 of 230 shown".
Big traces stay readable and fast: above ``max_events`` boxes closer than
one pixel are merged, above ``max_arrows`` only every k-th message is drawn,
above ``max_ranks`` only the first ranks are shown; the figure says which
of these it did. An elastic run's attempts (``minidist run --max-restarts``)
are drawn whole, a dashed line where each restart began (:mod:`viz.attempts`).
For an interactive view of every event, export the trace
for Perfetto instead (``minidist viz TRACE --chrome out.json``)::

    from viz.timeline import save_timeline
    save_timeline("run.jsonl", "run.png")

**Colour by mesh dimension** (``color_by="mesh"``; the default ``"auto"``
picks it when the trace's header names a device mesh, ``mesh_shape`` and
``mesh_dim_names``, as a 3D run's does): the messages, their lines and the
collective calls are coloured by the dimension of the mesh they run along
(dp, tp, pp, ...), with a legend. Which dimension: a message's two ranks
(global, row-major on the mesh as ``init_device_mesh`` lays them out)
differ in exactly one coordinate, and that is its dimension; a collective
call carries its group's id (every event does), and a group's dimension is
that of its messages. Messages between ranks that differ in more than one
coordinate (the world's own group) and calls of groups with no message are
"other". Cost: one pass over the events.
"""

from __future__ import annotations

import os
from collections import defaultdict

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minidist import trace as _trace
from minidist.atomic_file import atomic_path

# A trace header's mesh and a rank's place in it, read as the profile reads them.
from minidist.profile.dimensions import _coordinates, header_mesh
from viz.attempts import draw_attempt_lines, draws_attempts
from viz.box_labels import fit_box_labels

#: Lane of each kind inside a rank's row: (bottom, height) in row units.
LANES = {"calls": (0.78, 0.17), "compute": (0.54, 0.2), "send": (0.29, 0.2),
         "recv": (0.04, 0.2)}
COLORS = {"calls": "#CFCFCF", "compute": "#006BA4", "send": "#FF800E", "recv": "#5F9ED1"}
HATCHES = {"recv": "////", "calls": None, "compute": None, "send": None}
IDLE_COLOR = "#F2F2F2"
#: Inches of one more line of legend (the mesh's takes two).
LEGEND_LINE_INCHES = 0.22
#: Colours of the mesh dimensions, in the mesh's order (colour-blind safe,
#: none of them the compute lane's blue), and of what runs along none.
DIMENSION_COLORS = ("#C85200", "#2CA02C", "#9467BD", "#E377C2", "#8C564B", "#BCBD22")
OTHER_COLOR = "#7F7F7F"

MAX_EVENTS = 20_000
MAX_ARROWS = 2_000
MAX_RANKS = 64
#: A run of more steps than this is drawn as its first MAX_STEPS steps: the
#: steps repeat, and a thousand of them side by side are a grey smear.
MAX_STEPS = 8
HEADS_UP_TO = 200  # arrowheads cost a patch each: only on small traces
PIXELS = 2_000     # boxes closer than 1/PIXELS of the time axis merge above MAX_EVENTS


def _events_of(trace) -> tuple[dict, list[dict]]:
    if isinstance(trace, (str, os.PathLike)):
        trace = _trace.read_jsonl(trace)
    if isinstance(trace, _trace.Trace):
        return trace.header, list(trace.events)
    return {}, list(trace)


def _lane_of(kind: str) -> str:
    return kind if kind in ("compute", "send", "recv") else "calls"


def _label_text(label: str) -> str:
    """The readable part of a label (schema 2 appends " #key=value ...")."""
    return (label or "").split(" #", 1)[0]


def _merge(intervals: list[tuple[int, int]], gap: float) -> list[tuple[int, int]]:
    """Intervals sorted and joined where they overlap or lie within ``gap``."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def idle_intervals(events: list[dict], gap: float = 0) -> list[tuple[int, int]]:
    """The gaps inside one rank's span where it neither computed, sent nor received
    (gaps not longer than ``gap`` ignored)."""
    if not events:
        return []
    first = min(event["start"] for event in events)
    last = max(event["end"] for event in events)
    busy = _merge([(event["start"], event["end"]) for event in events
                   if event["kind"] in ("compute", "send", "recv")], gap)
    gaps, cursor = [], first
    for start, end in busy:
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < last:
        gaps.append((cursor, last))
    return gaps


def message_dimension(rank: int, peer: int, shape, names) -> str | None:
    """The mesh dimension a message from ``rank`` to ``peer`` runs along (their
    coordinates differ in it alone), or None when they differ in several."""
    if peer is None or peer < 0 or rank >= _size(shape) or peer >= _size(shape):
        return None
    differ = [d for d, (a, b) in enumerate(zip(_coordinates(rank, shape),
                                               _coordinates(peer, shape))) if a != b]
    return names[differ[0]] if len(differ) == 1 else None


def _size(shape) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def event_dimensions(events: list[dict], shape, names) -> list[str | None]:
    """The mesh dimension of each event (module docstring), None for compute,
    for events of no group along one dimension, and for the world's."""
    group_dims: dict[int, set] = defaultdict(set)
    for event in events:
        if event["kind"] in ("send", "recv"):
            group_dims[event.get("group", 0)].add(
                message_dimension(event["rank"], event.get("peer"), shape, names))
    group_dim = {group: dims.pop() for group, dims in group_dims.items() if len(dims) == 1}
    found = []
    for event in events:
        if event["kind"] in ("send", "recv"):
            found.append(message_dimension(event["rank"], event.get("peer"), shape, names))
        elif event["kind"] == "collective":
            found.append(group_dim.get(event.get("group", 0)))
        else:
            found.append(None)
    return found


def bytes_per_dimension(trace, mesh=None) -> dict[str, int]:
    """Bytes sent along each mesh dimension (and "other") over the whole
    trace: the sum of the send events' bytes, by :func:`message_dimension`."""
    header, events = _events_of(trace)
    shape, names = mesh or header_mesh(header) or (None, None)
    if shape is None:
        raise ValueError("bytes_per_dimension: the trace's header names no device mesh "
                         "(mesh_shape, mesh_dim_names); pass mesh=(shape, names)")
    totals = dict.fromkeys(names, 0)
    for event in events:
        if event["kind"] == "send":
            dim = message_dimension(event["rank"], event.get("peer"), shape, names) or "other"
            totals[dim] = totals.get(dim, 0) + int(event.get("bytes", 0))
    return totals


def ordinal(number: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st, 22nd, 101st, 111th."""
    if number % 100 in (11, 12, 13):
        return f"{number}th"
    return f"{number}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(number % 10, 'th')}"


def _time_unit(span_ns: float) -> tuple[str, float]:
    if span_ns < 2e3:
        return "ns", 1.0
    if span_ns < 2e6:
        return "µs", 1e3
    if span_ns < 2e9:
        return "ms", 1e6
    return "s", 1e9


def step_starts(events: list[dict]) -> tuple[str, list[int]]:
    """(label, start times) of the steps of a training run: the first compute
    region of the lowest rank ("forward") begins a step each time it recurs.
    No compute regions: ("", [])."""
    compute = [event for event in events if event["kind"] == "compute"]
    if not compute:
        return "", []
    lowest = min(event["rank"] for event in compute)
    mine = sorted((event for event in compute if event["rank"] == lowest),
                  key=lambda event: event["start"])
    label = _label_text(mine[0].get("label", ""))
    return label, [event["start"] for event in mine if _label_text(event.get("label", "")) == label]


def window_steps(events: list[dict], max_steps: int = MAX_STEPS) -> tuple[list[dict], str]:
    """The events of the run's first ``max_steps`` steps (and what came before
    the first: start-up, the weights' broadcast), and a note saying so; all
    events and "" when the run has no more steps than that. An event belongs
    to the window when it starts before step ``max_steps + 1`` does."""
    label, starts = step_starts(events)
    if len(starts) <= max_steps:
        return events, ""
    cut = starts[max_steps]
    kept = [event for event in events if event["start"] < cut]
    return kept, (f"steps 1-{max_steps} of {len(starts)} shown (a step: from one "
                  f"'{label}' of rank {min(e['rank'] for e in events if e['kind'] == 'compute')}"
                  " to the next; all of them: --chrome, for Perfetto)")


def draw_timeline(trace, figure: Figure | None = None, *, max_events: int = MAX_EVENTS,
                  max_arrows: int = MAX_ARROWS, max_ranks: int = MAX_RANKS,
                  max_steps: int | None = MAX_STEPS, title: str | None = None,
                  color_by: str = "auto", mesh=None) -> Figure:
    """Draw the timeline of ``trace`` (a path, a :class:`~minidist.trace.Trace` or
    a list of events) on a new figure (or ``figure``), and return it. A run of
    more than ``max_steps`` training steps is drawn as its first ``max_steps``
    (None: all of them). ``color_by``: "lane" (what kind of event), "mesh"
    (messages and calls by mesh dimension; ``mesh=(shape, names)`` or the
    header's), or "auto" (mesh when the header names one)."""
    header, events = _events_of(trace)
    if color_by not in ("auto", "lane", "mesh"):
        raise ValueError(f"color_by={color_by!r}: choose 'lane', 'mesh' or 'auto'")
    mesh = mesh or header_mesh(header)
    if color_by == "mesh" and mesh is None:
        raise ValueError("color_by='mesh': the trace's header names no device mesh (mesh_shape, "
                         "mesh_dim_names); pass mesh=((2, 2), ('dp', 'tp'))")
    if color_by == "lane":
        mesh = None
    ranks = sorted({event["rank"] for event in events})
    notes = []
    restarted = draws_attempts(header, events)  # every attempt shown, each after a dashed line
    if max_steps is not None and not restarted:
        events, windowed = window_steps(events, max_steps)
        if windowed:
            notes.append(windowed)
    if len(ranks) > max_ranks:
        notes.append(f"showing ranks {ranks[0]} to {ranks[max_ranks - 1]} of {len(ranks)}")
        ranks = ranks[:max_ranks]
    row_of = {rank: index for index, rank in enumerate(ranks)}
    # The mesh's legend takes two lines above the ranks: room for the second.
    extra = LEGEND_LINE_INCHES if mesh is not None else 0.0
    height = min(2.0 + 0.55 * max(len(ranks), 1), 30.0) + extra
    figure, axis = _figure_and_axis(figure, height, extra)
    if not events:
        axis.text(0.5, 0.5, "this trace has no events", ha="center", va="center",
                  transform=axis.transAxes)
        axis.set_axis_off()
        return figure

    origin = min(event["start"] for event in events)
    span = max(max(event["end"] for event in events) - origin, 1)
    unit, scale = _time_unit(span)
    shown = [event for event in events if event["rank"] in row_of]
    many = len(shown) > max_events
    colors = None
    if mesh is not None:
        shape, names = mesh
        palette = dict(zip(names, DIMENSION_COLORS * (len(names) // len(DIMENSION_COLORS) + 1)))
        colors = {id(event): palette.get(dim, OTHER_COLOR) if dim or event["kind"] in (
                      "send", "recv", "collective") else None
                  for event, dim in zip(shown, event_dimensions(shown, shape, names))}
    by_rank_lane, labelled = _lanes(shown, origin, span, many, notes, colors)
    _draw_idle(axis, shown, row_of, origin, span, scale, many)
    _draw_boxes(axis, by_rank_lane, row_of, span, scale)
    labels = _draw_labels(axis, labelled, row_of, span, scale)
    messages = _draw_messages(axis, shown, row_of, origin, scale, max_arrows, notes, colors)
    _draw_axes(axis, ranks, span, scale, unit)
    if restarted:
        draw_attempt_lines(axis, header, events, origin, span, scale)
    fit_box_labels(axis, labels)
    if mesh is not None:
        _draw_mesh_legend(axis, mesh, palette)
    else:
        _draw_legend(axis)
    transport = header.get("transport")
    heading = title or (f"timeline: {len(ranks)} ranks, {len(shown):,} events, "
                        f"{len(messages):,} messages" + (f" ({transport})" if transport else ""))
    figure.text(0.08, 1 - 0.25 / height, heading, fontsize=11, weight="bold", va="top")
    if notes:
        figure.text(0.98, 1 - 0.25 / height, "; ".join(notes), fontsize=8, va="top",
                    ha="right", color="#C85200")
    return figure


def _figure_and_axis(figure: Figure | None, height: float, extra: float = 0.0):
    """A figure ``height`` inches tall (or the one given) and the timeline's
    axis on it, ``extra`` inches more above it (for the legend)."""
    if figure is None:
        figure = Figure(figsize=(13.0, height), dpi=100)
    if not isinstance(figure.canvas, FigureCanvasAgg):
        FigureCanvasAgg(figure)
    axis = figure.add_axes((0.08, 0.9 / height + 0.04,
                            0.9, 1 - ((1.6 + extra) / height) - 0.04))
    return figure, axis


def _lanes(shown, origin, span, many: bool, notes: list, colors=None):
    """The boxes of each (rank, lane, colour), merged when there are ``many``
    (colour None: the lane's), and the labelled call and compute boxes:
    (rank, lane, start, end, text)."""
    by_rank_lane: dict[tuple[int, str, str | None], list[tuple[int, int]]] = defaultdict(list)
    labelled: list[tuple[int, str, int, int, str]] = []
    for event in shown:
        lane = _lane_of(event["kind"])
        start, end = event["start"] - origin, max(event["end"], event["start"]) - origin
        color = colors.get(id(event)) if colors else None
        by_rank_lane[event["rank"], lane, color].append((start, end))
        text = _label_text(event.get("label", ""))
        if lane in ("calls", "compute") and text:
            labelled.append((event["rank"], lane, start, end, text))
    if many:
        gap = span / PIXELS
        by_rank_lane = {key: _merge(value, gap) for key, value in by_rank_lane.items()}
        notes.append(f"{len(shown):,} events: boxes closer than 1/{PIXELS} of the time axis "
                     "merged")
    return by_rank_lane, labelled


def _draw_idle(axis, shown, row_of, origin, span, scale, many: bool) -> None:
    """Each rank's idle time, dotted, behind everything."""
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for event in shown:
        by_rank[event["rank"]].append(event)
    for rank, rank_events in by_rank.items():
        gaps = [((start - origin) / scale, (end - start) / scale)
                for start, end in idle_intervals(rank_events, span / PIXELS if many else 0)]
        # Hatching thousands of boxes takes minutes: only a few gaps get dots.
        axis.broken_barh(gaps, (row_of[rank] + 0.02, 0.96), facecolor=IDLE_COLOR,
                         edgecolor="#DDDDDD", hatch=".." if len(gaps) < 500 else None,
                         linewidth=0, zorder=0)


def _draw_boxes(axis, by_rank_lane, row_of, span, scale) -> None:
    for (rank, lane, color), intervals in by_rank_lane.items():
        bottom, lane_height = LANES[lane]
        boxes = [(start / scale, max(end - start, span / PIXELS / 4) / scale)
                 for start, end in intervals]
        # A thin white edge, so that two regions end to end (a forward, then
        # the straggler's wait) read as two boxes, not one bar.
        axis.broken_barh(boxes, (row_of[rank] + 1 - bottom - lane_height, lane_height),
                         facecolor=color or COLORS[lane],
                         edgecolor="white" if lane == "compute" and len(boxes) < 500 else "none",
                         linewidth=0.6,
                         hatch=HATCHES[lane] if len(boxes) < 500 else None, zorder=2)


def _draw_labels(axis, labelled, row_of, span, scale) -> list:
    """The labels of the widest boxes (at most 200, none on a box narrower
    than 5 % of the axis), widest first, as (text, left, right) for
    :func:`~viz.box_labels.fit_box_labels` once the axis is laid out (a
    step's span and the all_reduce inside it share the calls lane: only the
    label with room shows)."""
    minimum_width = span * 0.05
    texts = 0
    drawn = []
    for rank, lane, start, end, text in sorted(labelled, key=lambda item: item[2] - item[3]):
        if end - start < minimum_width or texts >= 200:
            continue
        bottom, lane_height = LANES[lane]
        drawn.append((axis.text((start + end) / 2 / scale,
                                row_of[rank] + 1 - bottom - lane_height / 2, text,
                                ha="center", va="center", fontsize=7, clip_on=True, zorder=4,
                                color="white" if lane == "compute" else "black"),
                      start / scale, end / scale))
        texts += 1
    return drawn


def _draw_messages(axis, shown, row_of, origin, scale, max_arrows: int, notes: list,
                   colors=None) -> list:
    """A line from each send's start to its receive's end (at most ``max_arrows``,
    with heads when few; in the send's colour when ``colors`` maps events to
    theirs); returns the messages between the shown ranks."""
    messages = [(send, recv) for send, recv in _trace.iter_messages(shown)
                if recv is not None and recv["rank"] in row_of]
    every = max(1, -(-len(messages) // max_arrows))
    if every > 1:
        notes.append(f"{len(messages):,} messages: every {ordinal(every)} drawn")
    drawn = messages[::every]
    segments = []
    for send, recv in drawn:
        send_bottom, send_height = LANES["send"]
        recv_bottom, recv_height = LANES["recv"]
        segments.append((((send["start"] - origin) / scale,
                          row_of[send["rank"]] + 1 - send_bottom - send_height / 2),
                         ((recv["end"] - origin) / scale,
                          row_of[recv["rank"]] + 1 - recv_bottom - recv_height / 2)))
    line_colors = [(colors or {}).get(id(send)) or "#333333" for send, _ in drawn]
    if len(drawn) <= HEADS_UP_TO:
        for (start, end), color in zip(segments, line_colors):
            axis.annotate("", xy=end, xytext=start, zorder=3,
                          arrowprops={"arrowstyle": "-|>", "color": color, "lw": 0.8,
                                      "shrinkA": 0, "shrinkB": 0, "alpha": 0.7})
    else:
        axis.add_collection(LineCollection(segments, colors=line_colors, linewidths=0.5,
                                           alpha=0.35, zorder=3))
    return messages


def _draw_axes(axis, ranks, span, scale, unit) -> None:
    axis.set_xlim(0, span / scale * 1.01)
    axis.set_ylim(len(ranks), 0)
    axis.set_yticks([row + 0.5 for row in range(len(ranks))])
    axis.set_yticklabels([f"rank {rank}" for rank in ranks],
                         fontsize=9 if len(ranks) <= 32 else 6)
    axis.set_xlabel(f"time ({unit}) since the first event")
    axis.grid(axis="x", alpha=0.3)
    for row in range(1, len(ranks)):
        axis.axhline(row, color="#BBBBBB", linewidth=0.6)


def _draw_legend(axis) -> None:
    handles = [Patch(facecolor=COLORS[lane], hatch=HATCHES[lane], label=name)
               for lane, name in (("calls", "collective call / other span"),
                                  ("compute", "compute"), ("send", "send"),
                                  ("recv", "recv (hatched)"))]
    handles.append(Patch(facecolor=IDLE_COLOR, hatch="..", edgecolor="#BBBBBB", label="idle"))
    handles.append(Patch(facecolor="white", edgecolor="#333333",
                         label="line: send start → recv end"))
    axis.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=6,
                fontsize=8, frameon=False)


def _draw_mesh_legend(axis, mesh, palette) -> None:
    """The legend of the colour-by-mesh mode: one swatch per dimension (its
    size), "other", the spans of no group, compute, recv hatched, idle, the
    messages' lines."""
    shape, names = mesh
    handles = [Patch(facecolor=palette[name],
                     label=f"{name} ({size} {'rank' if size == 1 else 'ranks'}): messages, calls")
               for name, size in zip(names, shape)]
    handles += [Patch(facecolor=OTHER_COLOR, label="other group / world"),
                Patch(facecolor=COLORS["calls"], label="step / other span"),
                Patch(facecolor=COLORS["compute"], label="compute"),
                Patch(facecolor="white", edgecolor="#333333", hatch=HATCHES["recv"],
                      label="recv (hatched)"),
                Patch(facecolor=IDLE_COLOR, hatch="..", edgecolor="#BBBBBB", label="idle"),
                Patch(facecolor="white", edgecolor="#333333",
                      label="line: send start → recv end (its dimension's colour)")]
    axis.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0),
                ncol=min(len(handles), 5), fontsize=8, frameon=False)


def save_timeline(trace, path, dpi: int = 100, **options) -> str:
    """Draw the timeline of ``trace`` and write it as a PNG; returns the path."""
    path = os.fspath(path)
    figure = draw_timeline(trace, **options)
    with atomic_path(path) as name:
        figure.savefig(name, dpi=dpi)
    return path


def message_count(trace) -> int:
    """Messages the timeline joins (sends with a recorded recv)."""
    _, events = _events_of(trace)
    return sum(1 for _, recv in _trace.iter_messages(events) if recv is not None)


__all__ = ["draw_timeline", "save_timeline", "idle_intervals", "message_count", "ordinal",
           "step_starts", "window_steps", "header_mesh", "message_dimension", "event_dimensions",
           "bytes_per_dimension", "DIMENSION_COLORS", "OTHER_COLOR"]
