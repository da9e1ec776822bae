"""A pipeline run as a Gantt chart: one row per stage, one box per forward,
backward (or its input half I and weight half W), recompute and optimizer
step, the idle time (the bubble) between.

The same model draws three pictures: the PNG (:func:`save_pipeline_gantt`),
the step-through in the terminal, one time slot per frame
(:func:`step_through_pipeline`; in the browser: :mod:`viz.pipeline_player`),
and schedules side by side (:func:`draw_schedule_comparison`). A box is
drawn in its micro-batch's colour, an I or a W in its own
(:data:`HALF_COLOURS`), each kind with its hatch; a forward and a backward
paired to overlap (DualPipeV's, phase "overlap") in one frame. It reads trace events only, so a
real run and the simulator's planned schedule are drawn by the same code::

    from viz.pipeline_chart import pipeline_chart, save_pipeline_gantt
    chart = pipeline_chart("run.jsonl")       # or a list of simulated events
    chart.bubble, chart.expected.text         # GPipe, p=2, m=2, equal costs:
                                              # 0.333..., "(p-1)/(m+p-1) = 1/3 = 0.333"
    chart.row_text(0), chart.row_text(1)      # "F0 F1 .. .. B1 B0", ".. F0 F1 B1 B0 .."
    save_pipeline_gantt("run.jsonl", "run.png")

What it reads (the format agreed with minidist/parallel/pipeline/labels.py
and ledger.py): compute events whose label carries
``pipeline=F|B|R|I|W|step``, ``mb``, ``chunk``, ``stage`` (the global
virtual stage) and ``phase``; ``memory`` events with ``activations`` and
``live_microbatches``; the header's ``schedule``, ``stages``,
``microbatches``, ``virtual_stages`` and ``placement`` (read from the
events when there is no header).

Batches. A trace of a training run holds many batches; a rank's batch ends
with its optimizer step. The chart shows one batch (the last by default: the
first one also pays the processes' start-up).

The bubble, measured: over the batch's makespan (first F/B/R/I/W start to
last one's end, all ranks), ``1 - busy / (ranks x makespan)`` where busy
sums those regions; the optimizer step is drawn but counted as neither. One
definition: the chart calls the runtime's
:func:`minidist.parallel.pipeline.simulate.bubble_fraction` on the batch's events.

The bubble, expected, with equal stage costs and no transfer time: GPipe and
1F1B idle ``(p-1)/(m+p-1)`` of the makespan (each stage waits p-1 slots to
start and p-1 to finish, in m+p-1 slots of forward and of backward). The
interleaved schedule with v model chunks per rank cuts the bubble to
``(1/v) (p-1)/m`` *of the ideal time* m(t_f+t_b) (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters", sec. 2.2.2,
which assumes m is a multiple of p); as a share of the makespan, the
quantity measured here, that is ``(p-1)/(v m + p-1)``. Both are shown. The
zero-bubble schedules', with F = B = W (a forward, an input half, a weight
half: the simulator's default costs), are their papers' idle times as a
share of the makespan: (p-1) of 3m + p - 1 units for ZB-H1 (Qi et al.'s
(p-1)(F+B-W)), ZB-H2 (none inside a rank; the slant of its parallelogram)
and DualPipeV (DeepSeek's (p-1)(F&B+B-3W), F&B = F + B on one process), of
6m + p - 1 half-stage units for ZB-V.

Time slots (the terminal's columns and ``x="slot"``). Walking the boxes in
the order they started, a box joins the current column when its row has no
box there yet and no box has ended since the column started; otherwise it
opens the next column. (A stage starts work when some work it waits for
ends, so an end is what begins a new slot.) With equal costs a column is one
unit of time; with real clocks, starts a few microseconds apart that no end
separates share a column. A box still running when a later column starts
shows there as ``--``; ``..`` is idle.
"""

from __future__ import annotations

import bisect
import os
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction

from rich.console import Console, Group
from rich.text import Text

from minidist import trace as _trace
from minidist.atomic_file import atomic_path
from minidist.model_gap import RunFacts, explain
from minidist.parallel.pipeline.labels import compute_text
from minidist.parallel.pipeline.schedules import schedule_from_order
from minidist.parallel.pipeline.simulate import DeadlockError, bubble_fraction, simulate_schedule
from minidist.units import format_bytes
from viz.box_labels import fit_box_labels
from viz.terminal import (
    LIGHT_COLOURS,
    PALETTE,
    format_seconds,
    play_frames,
    step_through_frames,
)

#: The kinds of box that count as work in the bubble: F, B, R, and a split
#: backward's input half I and weight half W (the zero-bubble schedules).
WORK = ("F", "B", "R", "I", "W")
KINDS = WORK + ("step",)
STEP_TEXT = "st"
#: The legend's symbol of a forward and a backward that overlap (DualPipe's pairs).
PAIR_TEXT = "[F B]"
IDLE_COLOR = "#F2F2F2"
#: The schedule's name when neither the header nor the caller gives one.
UNNAMED = "pipeline"
#: Inches of a Gantt figure above and below its rows (title, axis, legend).
FIGURE_MARGINS = 1.8
#: Hatch and edge of each kind in the PNG, so that no box is told apart by colour only.
HATCHES = {"F": None, "B": "///", "R": "xxx", "I": "\\\\\\", "W": "++", "step": ".."}
EDGE_STYLES = {"F": "solid", "B": "solid", "R": "dashed", "I": "solid", "W": "dashdot",
               "step": "dotted"}
KIND_NAMES = {"F": "forward", "B": "backward", "R": "recompute", "I": "input half",
              "W": "weight half", "step": "optimizer step"}
#: A split backward's halves in colours of their own (Okabe and Ito's
#: colour-blind-safe bluish green and reddish purple, never a micro-batch's):
#: the eye finds where the W's went, which is what a zero-bubble schedule is about.
HALF_COLOURS = {"I": "#009E73", "W": "#CC79A7"}
#: The colours of HALF_COLOURS on which dark text reads best.
LIGHT_HALVES = {"#CC79A7"}
#: The frame drawn round a forward and a backward that overlap (DualPipe's pairs).
PAIR_EDGE = "#000000"


@dataclass(frozen=True)
class Box:
    """One region of a stage's work in the chart's batch."""

    rank: int
    kind: str                # "F" | "B" | "R" | "I" | "W" | "step"
    microbatch: int | None   # None for the optimizer step
    chunk: int               # model chunk on this rank (interleaved), else 0
    stage: int | None        # global virtual stage (chunk x ranks + rank when interleaved)
    phase: str               # "warmup" | "steady" | "cooldown" | "overlap" | "step" | ""
    start: int               # since the batch's first F/B/R start (trace time units)
    end: int
    slot: int                # the column it starts in
    last_slot: int           # the last column it is still running in

    @property
    def text(self) -> str:
        """"F3", "B3", "R3", "I3", "W3" ("F3c1": the rank's model chunk 1) or
        "st": the schedule's own words (:func:`compute_text`)."""
        if self.kind == "step":
            return STEP_TEXT
        return compute_text(self.kind, self.microbatch, self.chunk)

    @property
    def duration(self) -> int:
        return self.end - self.start

    @property
    def face(self) -> str:
        """Its colour: white for the step, its own for an I or a W, else its
        micro-batch's (so that one micro-batch is followed down the stages)."""
        if self.kind == "step":
            return "#FFFFFF"
        if self.kind in HALF_COLOURS:
            return HALF_COLOURS[self.kind]
        return PALETTE[self.microbatch % len(PALETTE)]


def _dark_text(face: str) -> bool:
    """Whether black text reads better than white on ``face``."""
    return face in LIGHT_COLOURS or face in LIGHT_HALVES or face == "#FFFFFF"


@dataclass(frozen=True)
class Row:
    """One stage (one rank) of the pipeline."""

    rank: int
    stage: int               # position in the pipeline, 0 .. p-1
    label: str               # "stage 2" ("rank 5 · stage 1" when ranks and stages differ)
    boxes: tuple[Box, ...]   # in the order they started
    idle: tuple[tuple[int, int], ...]  # gaps in [0, makespan] with no F/B/R running
    busy: int                # time spent in F/B/R
    #: Peak over the batch of the memory ledger (None: the trace has no ledger).
    peak_live_microbatches: int | None = None
    peak_activation_bytes: int | None = None


@dataclass(frozen=True)
class BubbleFormula:
    """The bubble the theory expects for a schedule's p, m and v."""

    formula: str             # "(p-1)/(m+p-1)"
    fraction: Fraction       # its value, as a share of the makespan
    text: str                # "(p-1)/(m+p-1) = 3/11 = 0.273"
    note: str = ""           # where it comes from and what it assumes

    @property
    def value(self) -> float:
        return float(self.fraction)


@dataclass(frozen=True)
class Column:
    """One time slot: the boxes that started in it."""

    index: int
    start: int               # when its first box started (trace time units)
    started: tuple[Box, ...]


@dataclass(frozen=True)
class PipelineChart:
    """One batch of a pipeline run, ready to draw."""

    schedule: str
    stages: int              # p
    microbatches: int        # m
    virtual_stages: int      # v (1 unless interleaved)
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    #: [row][column] -> a box's text, "--" (still running) or ".." (idle), all one width.
    grid: tuple[tuple[str, ...], ...]
    makespan: int            # first F/B/R start to last F/B/R end
    end: int                 # the batch's last event (an optimizer step may end after makespan)
    idle: int                # sum of every row's idle time
    expected: BubbleFormula
    batch: int               # which batch of the trace, from 0
    batches: int
    simulated: bool          # the simulator's virtual clock (in nanoseconds too: a unit of cost is 10**6 of them)
    #: The measured bubble, 1 - busy / (ranks x makespan): the runtime's own
    #: :func:`minidist.parallel.pipeline.simulate.bubble_fraction` of the batch's events.
    bubble: float
    #: Cores and load average of the machine it ran on (trace header; None: not recorded).
    cores: int | None = None
    load: float | None = None
    #: Which stages a rank holds: "loop" (chunk c of rank r is stage c p + r) or "v".
    placement: str = "loop"

    @property
    def capacity(self) -> int:
        """ranks x makespan: the time the stages had."""
        return len(self.rows) * self.makespan

    @property
    def slots(self) -> int:
        return len(self.columns)

    def row_text(self, row: int, upto: int | None = None) -> str:
        """Row ``row``'s cells of columns 0 .. ``upto`` (all by default), space separated."""
        cells = self.grid[row]
        return " ".join(cells if upto is None else cells[:upto + 1])

    def time_text(self, value: int) -> str:
        """Trace times are nanoseconds, the simulator's virtual ones too."""
        return format_seconds(value / 1e9)


# --------------------------------------------------------------------------- reading


def _load(trace) -> tuple[dict, list[dict]]:
    if isinstance(trace, (str, os.PathLike)):
        trace = _trace.read_jsonl(trace)
    if isinstance(trace, _trace.Trace):
        return dict(trace.header), list(trace.events)
    if isinstance(trace, tuple) and len(trace) == 2 and isinstance(trace[0], dict):
        return dict(trace[0]), list(trace[1])
    return {}, list(trace)


def is_pipeline_trace(header: dict) -> bool:
    """True when a trace header says it records a pipeline run (it names a schedule)."""
    return isinstance(header, dict) and "schedule" in header


def _raw_boxes(events: list[dict]) -> dict[int, list[dict]]:
    """Each rank's pipeline compute regions, in the order they started."""
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for event in events:
        if event.get("kind") != "compute":
            continue
        info = _trace.label_info(event.get("label") or "")
        kind = info.get("pipeline")
        if kind not in KINDS:
            continue
        microbatch = info.get("mb")
        if kind != "step" and not isinstance(microbatch, int):
            raise ValueError(f"rank {event['rank']}: the {kind} region {event.get('label')!r} "
                             "carries no micro-batch (mb=K): label pipeline regions with "
                             "trace.with_info(text, pipeline=..., mb=K, ...)")
        stage = info.get("stage")
        by_rank[event["rank"]].append({
            "rank": event["rank"], "kind": kind,
            "microbatch": microbatch if kind != "step" else None,
            "chunk": int(info.get("chunk", 0) or 0),
            "stage": stage if isinstance(stage, int) else None,
            "phase": str(info.get("phase", "step" if kind == "step" else "")),
            "start": int(event["start"]), "end": int(max(event["end"], event["start"])),
            "event": event})
    for boxes in by_rank.values():
        boxes.sort(key=lambda box: (box["start"], box["end"]))
    return by_rank


def _split_batches(boxes: list[dict]) -> list[list[dict]]:
    """A rank's boxes cut after each optimizer step."""
    batches: list[list[dict]] = [[]]
    for box in boxes:
        batches[-1].append(box)
        if box["kind"] == "step":
            batches.append([])
    if not batches[-1] and len(batches) > 1:
        batches.pop()
    return batches


def _merge(intervals):
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _gaps(busy, first: int, last: int) -> tuple[tuple[int, int], ...]:
    gaps, cursor = [], first
    for start, end in _merge(busy):
        if start > cursor:
            gaps.append((cursor, min(start, last)))
        cursor = max(cursor, end)
    if cursor < last:
        gaps.append((cursor, last))
    return tuple(gap for gap in gaps if gap[1] > gap[0])


def _columns(boxes: list[dict]) -> list[dict]:
    """Group the boxes into time slots (see the module's docstring) and set
    each box's ``slot`` and ``last_slot``; returns the columns as {start, rows, boxes}."""
    ends = sorted(box["end"] for box in boxes if box["end"] > box["start"])
    columns: list[dict] = []
    for box in sorted(boxes, key=lambda box: (box["start"], box["row"], box["end"])):
        current = columns[-1] if columns else None
        # A slot ends when some box ends: what starts after that waited for it.
        after = bisect.bisect_right(ends, current["start"]) if current else 0
        ended_since = current is not None and after < len(ends) and ends[after] <= box["start"]
        if current is not None and box["row"] not in current["rows"] and not ended_since:
            current["rows"].add(box["row"])
            current["boxes"].append(box)
        else:
            columns.append({"start": box["start"], "rows": {box["row"]}, "boxes": [box]})
        box["slot"] = len(columns) - 1
    starts = [column["start"] for column in columns]
    next_slot: dict[int, int] = {}
    for box in sorted(boxes, key=lambda box: -box["slot"]):
        last = box["slot"]
        stop = next_slot.get(box["row"], len(starts))
        while last + 1 < stop and starts[last + 1] < box["end"]:
            last += 1
        box["last_slot"] = last
        next_slot[box["row"]] = box["slot"]
    return columns


def _memory_peaks(events: list[dict], window: tuple[int, int]) -> dict[int, tuple[int, int]]:
    """Per rank, the peak (live micro-batches, activation bytes) inside ``window``.

    The ledger may hold one line per rank or one per model chunk (stage=S):
    a rank's total is the sum of the latest value of each of its stages."""
    latest: dict[int, dict] = defaultdict(dict)
    peaks: dict[int, list[int]] = {}
    for event in sorted((event for event in events if event.get("kind") == "memory"),
                        key=lambda event: event["start"]):
        info = _trace.label_info(event.get("label") or "")
        rank = event["rank"]
        latest[rank][info.get("stage")] = (int(info.get("live_microbatches", 0) or 0),
                                           int(info.get("activations", 0) or 0))
        if window[0] <= event["start"] <= window[1]:
            live = sum(value[0] for value in latest[rank].values())
            activations = sum(value[1] for value in latest[rank].values())
            peak = peaks.setdefault(rank, [0, 0])
            peak[0], peak[1] = max(peak[0], live), max(peak[1], activations)
    return {rank: (peak[0], peak[1]) for rank, peak in peaks.items()}


def expected_bubble(stages: int, microbatches: int, virtual_stages: int = 1,
                    schedule: str | None = None) -> BubbleFormula:
    """The bubble the theory gives with equal stage costs and free transfers,
    as a share of the makespan (the measured definition); see the module's
    docstring. A zero-bubble ``schedule`` ("zb_h1", "zb_h2", "zbv",
    "dualpipev") has its own, with its paper's F = B = W (a forward, a
    backward's input half, its weight half: the simulator's default costs)."""
    p, m, v = stages, microbatches, virtual_stages
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"stages, micro-batches and virtual stages must be at least 1, "
                         f"got p={p}, m={m}, v={v}")
    if schedule in _ZERO_BUBBLE:
        slots, note = _ZERO_BUBBLE[schedule]
        fraction = Fraction(p - 1, slots * m + p - 1)
        return BubbleFormula(f"(p-1)/({slots}m+p-1)", fraction,
                             f"(p-1)/({slots}m+p-1) = {p - 1}/{slots * m + p - 1} = "
                             f"{float(fraction):.3f}", note)
    if v == 1:
        fraction = Fraction(p - 1, m + p - 1)
        return BubbleFormula("(p-1)/(m+p-1)", fraction,
                             f"(p-1)/(m+p-1) = {p - 1}/{m + p - 1} = {float(fraction):.3f}",
                             "GPipe and 1F1B, equal stage costs, no transfer time")
    fraction = Fraction(p - 1, v * m + p - 1)
    of_ideal = Fraction(p - 1, v * m)
    return BubbleFormula(
        "(p-1)/(v·m+p-1)", fraction,
        f"(p-1)/(v·m+p-1) = {p - 1}/{v * m + p - 1} = {float(fraction):.3f}",
        f"interleaved: Megatron-LM's (1/v)(p-1)/m = {float(of_ideal):.3f} of the ideal time, "
        f"as a share of the makespan; assumes m a multiple of p, equal costs")


#: A zero-bubble schedule's bubble as a share of the makespan, F = B = W:
#: (p-1) units idle a rank out of m(F+B+W) + (p-1) (3m + p - 1 units; ZB-V's
#: units are a chunk's, half a stage's: 6m + p - 1), and where it comes from.
_ZERO_BUBBLE = {
    "zb_h1": (3, "ZB-H1 (Qi et al.): (p-1)(F+B-W) idle, F = B = W (B, W: a backward's "
                 "halves), m >= p"),
    "zb_h2": (3, "ZB-H2 (Qi et al.): (p-1)(F+B-2W) = 0 idle inside a rank with F = B = W; "
                 "left is its parallelogram's slant, rank r starting r F late; m >= 2p-1"),
    "zbv": (6, "ZB-V (Qi et al.), 2 chunks a rank in a V, F = B = W a chunk: no rank idles "
               "inside; left is the slant, rank r starting r F late; m >= 2p-1"),
    "dualpipev": (3, "DualPipeV (DeepSeek): (p-1)(F&B+B-3W) idle, B the whole backward, "
                     "F&B = F+B (one process runs a pair one after the other), F = B/2 = W"),
}


def _stage_boxes(events: list[dict]) -> dict[int, list[dict]]:
    """Each rank's pipeline regions (:func:`_raw_boxes`); an error when there are none,
    since a trace without them cannot be drawn as a pipeline."""
    by_rank = _raw_boxes(events)
    if not by_rank:
        raise ValueError("this trace holds no pipeline compute regions (compute events "
                         "labelled with pipeline=F|B|R|step): record a pipeline run with "
                         "trace=PATH, or simulate its schedule")
    return by_rank


def _choose_batch(by_rank: dict[int, list[dict]], batch: int):
    """The chart's one batch: ``batch`` (negative: from the end) of each rank's boxes cut
    at its optimizer steps. Returns (batch from 0, batches, {rank: boxes}, F/B/R boxes)."""
    per_rank_batches = {rank: _split_batches(boxes) for rank, boxes in by_rank.items()}
    batches = max(len(split) for split in per_rank_batches.values())
    if not -batches <= batch < batches:
        raise IndexError(f"the trace holds {batches} batches (0..{batches - 1}); "
                         f"there is no batch {batch}")
    batch %= batches
    chosen = {rank: split[batch] for rank, split in per_rank_batches.items()
              if batch < len(split) and split[batch]}
    work = [box for boxes in chosen.values() for box in boxes if box["kind"] in WORK]
    if not work:
        raise ValueError(f"batch {batch} of the trace has no forward or backward region")
    return batch, batches, chosen, work


def _chart_shape(header: dict, chosen: dict[int, list[dict]], work: list[dict], schedule,
                 stages, microbatches, virtual_stages, simulated):
    """The schedule's name, p, m, v and whether the clock is simulated: the caller's
    options first, then the trace's header, then what the batch's boxes show."""
    schedule = schedule or str(header.get("schedule", UNNAMED))
    virtual_stages = int(virtual_stages or header.get("virtual_stages")
                         or 1 + max(box["chunk"] for box in work))
    known_stages = [box["stage"] for box in work if box["stage"] is not None]
    stages = int(stages or header.get("stages")
                 or ((1 + max(known_stages)) // virtual_stages if known_stages else len(chosen)))
    microbatches = int(microbatches or header.get("microbatches")
                       or len({box["microbatch"] for box in work if box["kind"] == "F"}))
    if simulated is None:
        simulated = not header or header.get("transport") == "sim"
    return schedule, stages, microbatches, virtual_stages, simulated, \
        _placement(header, work, stages, virtual_stages)


def _placement(header: dict, work: list[dict], stages: int, virtual_stages: int) -> str:
    """"v" when rank r's chunk 1 is stage 2p - 1 - r (ZB-V, DualPipeV), else "loop"."""
    if header.get("placement") in ("loop", "v"):
        return header["placement"]
    v_shaped = [box for box in work if box["chunk"] == 1 and box["stage"] is not None]
    if virtual_stages == 2 and v_shaped and all(
            box["stage"] == 2 * stages - 1 - box["rank"] for box in v_shaped):
        return "v"
    return "loop"


def _row_places(chosen: dict[int, list[dict]], stages: int) -> dict[int, tuple[int, str]]:
    """Each rank's (stage, row label): its lowest stage mod p (its rank when the boxes name
    none); the label names the rank too when ranks and stages differ, so no row is ambiguous."""
    ranks = sorted(chosen)
    position = {}
    for rank in ranks:
        stages_seen = [box["stage"] for box in chosen[rank] if box["stage"] is not None]
        position[rank] = min(stages_seen) % stages if stages_seen else rank
    duplicated = len(set(position.values())) < len(ranks) or \
        any(position[rank] != rank for rank in ranks)
    return {rank: (position[rank], f"rank {rank} · stage {position[rank]}" if duplicated
                   else f"stage {position[rank]}") for rank in ranks}


def _place_boxes(chosen: dict[int, list[dict]], origin: int) -> list[dict]:
    """Every rank's boxes with their row (ranks in order) and times since ``origin``,
    the batch's first F/B/R start, so that every chart's time axis starts at 0."""
    placed = []
    for row, rank in enumerate(sorted(chosen)):
        for box in chosen[rank]:
            placed.append(dict(box, row=row, start=box["start"] - origin,
                               end=box["end"] - origin))
    return placed


def _freeze_boxes(placed: list[dict]) -> dict[int, Box]:
    """The placed boxes (slots set by :func:`_columns`) as :class:`Box` es, by the id of
    their dict, so that rows and columns share the same Box."""
    return {id(box): Box(rank=box["rank"], kind=box["kind"], microbatch=box["microbatch"],
                         chunk=box["chunk"], stage=box["stage"], phase=box["phase"],
                         start=box["start"], end=box["end"], slot=box["slot"],
                         last_slot=box["last_slot"])
            for box in placed}


def _row_boxes(placed: list[dict], frozen: dict[int, Box], row: int) -> tuple[Box, ...]:
    """Row ``row``'s boxes in the order they started (ties: the one ending first), the
    order the chart draws and steps through them."""
    return tuple(sorted((frozen[id(box)] for box in placed if box["row"] == row),
                        key=lambda box: (box.start, box.end)))


def _row(rank: int, place: tuple[int, str], boxes: tuple[Box, ...], makespan: int,
         peak: tuple[int, int] | None) -> Row:
    """One stage's row: its boxes, its idle gaps over [0, makespan] (its share of the
    bubble), its busy time and its memory peak (None without a ledger)."""
    idle = _gaps([(box.start, box.end) for box in boxes if box.kind in WORK], 0, makespan)
    return Row(rank=rank, stage=place[0], label=place[1], boxes=boxes, idle=idle,
               busy=sum(box.duration for box in boxes if box.kind in WORK),
               peak_live_microbatches=peak[0] if peak else None,
               peak_activation_bytes=peak[1] if peak else None)


def _grid_cells(boxes: tuple[Box, ...], slots: int, width: int) -> tuple[str, ...]:
    """A row's cells, one per time slot, all ``width`` wide: a box's text in the slot it
    starts in, "--" while it still runs, ".." idle (what the terminal prints)."""
    cells = ["." * width] * slots
    for box in boxes:
        for slot in range(box.slot + 1, box.last_slot + 1):
            cells[slot] = "-" * width
    for box in boxes:
        cells[box.slot] = box.text.ljust(width)
    return tuple(cells)


def pipeline_chart(trace, *, batch: int = -1, schedule: str | None = None,
                   stages: int | None = None, microbatches: int | None = None,
                   virtual_stages: int | None = None,
                   simulated: bool | None = None) -> PipelineChart:
    """The chart of one batch of a pipeline run.

    ``trace``: a path, a :class:`minidist.trace.Trace`, a (header, events)
    pair or a list of events (the simulator's). ``batch``: which batch, from
    0 (negative: from the end). The keyword arguments override the header
    (or, without one, what the events say). ``simulated``: say the times are
    the simulator's virtual clock; by default when the header's transport is
    "sim" or there is no header (a list of simulated events).
    """
    header, events = _load(trace)
    batch, batches, chosen, work = _choose_batch(_stage_boxes(events), batch)
    schedule, stages, microbatches, virtual_stages, simulated, placement = _chart_shape(
        header, chosen, work, schedule, stages, microbatches, virtual_stages, simulated)
    origin = min(box["start"] for box in work)
    makespan = max(box["end"] for box in work) - origin
    places = _row_places(chosen, stages)

    placed = _place_boxes(chosen, origin)
    columns = _columns(placed)
    frozen = _freeze_boxes(placed)
    end = max(box["end"] for box in placed)
    peaks = _memory_peaks(events, (origin, origin + end))
    rows = tuple(_row(rank, places[rank], _row_boxes(placed, frozen, row), makespan,
                      peaks.get(rank))
                 for row, rank in enumerate(sorted(chosen)))
    width = max([2] + [len(box.text) for box in frozen.values()])

    return PipelineChart(
        schedule=schedule, stages=stages, microbatches=microbatches,
        virtual_stages=virtual_stages, rows=rows,
        columns=tuple(Column(index=index, start=column["start"],
                             started=tuple(frozen[id(box)] for box in column["boxes"]))
                      for index, column in enumerate(columns)),
        grid=tuple(_grid_cells(row.boxes, len(columns), width) for row in rows),
        makespan=makespan, end=end,
        idle=sum(gap_end - gap_start for row in rows for gap_start, gap_end in row.idle),
        expected=expected_bubble(stages, microbatches, virtual_stages, schedule), batch=batch,
        batches=batches, simulated=bool(simulated),
        bubble=bubble_fraction([box["event"] for box in work], len(chosen)),
        cores=header.get("cores") if isinstance(header.get("cores"), int) else None,
        load=header.get("load") if isinstance(header.get("load"), (int, float)) else None,
        placement=placement)


#: The costs of the schedule's-order view: a stage's forward 1 unit, its
#: backward 2 (a chunk of the interleaved schedule 1/v of that), messages free.
ORDER_FORWARD, ORDER_BACKWARD = 1.0, 2.0


def schedule_order_chart(chart: PipelineChart) -> PipelineChart | None:
    """The chart's batch in the schedule's order, without its clock.

    Every rank's forwards and backwards (whole, or their halves I and W, 1
    unit each), in the order the run started them, are replayed on the
    simulator's clock with equal costs (a forward 1 unit, a backward 2, a
    chunk 1/v of that; messages free). What is left is the
    schedule's shape: each action at its place in the order, whatever the
    run's timing. A real run of p processes on fewer than p cores, whose
    wall clock is mostly waiting for a core, draws here the same picture as
    the planned schedule (as long as each rank ran the plan's order, which
    the runtime does). None when the rows are not one pipeline's stages
    0..p-1 or the order cannot be replayed (an incomplete batch)."""
    rows = sorted(chart.rows, key=lambda row: row.stage)
    if [row.stage for row in rows] != list(range(chart.stages)):
        return None
    orders = [[(box.kind, box.microbatch, box.chunk, box.phase) for box in row.boxes
               if box.kind in ("F", "B", "I", "W")] for row in rows]
    recompute = any(box.kind == "R" for row in rows for box in row.boxes)
    v = chart.virtual_stages
    try:
        schedule = schedule_from_order(chart.schedule, chart.stages, chart.microbatches, v,
                                       orders, placement=chart.placement)
        events = simulate_schedule(schedule, ORDER_FORWARD / v, ORDER_BACKWARD / v,
                                   recompute=recompute)
    except (ValueError, DeadlockError):
        return None
    header = _trace.make_header(chart.stages, transport="sim", **schedule.header())
    return pipeline_chart((header, events), schedule=chart.schedule, simulated=True)


# --------------------------------------------------------------------------- words


def _count(number: int, one: str, many: str | None = None) -> str:
    """"1 stage", "4 stages"."""
    return f"{number} {one if number == 1 else many or one + 's'}"


def describe(chart: PipelineChart) -> str:
    """"1f1b · 4 stages · 8 micro-batches" (and "· v=2" when interleaved)."""
    words = (f"{chart.schedule} · {_count(chart.stages, 'stage')} · "
             f"{_count(chart.microbatches, 'micro-batch', 'micro-batches')}")
    if chart.placement == "v":
        words += " · 2 chunks per rank in a V"
    elif chart.virtual_stages > 1:
        words += f" · v={chart.virtual_stages} chunks per rank"
    return words


def clock_word(chart: PipelineChart) -> str:
    """"simulated" for the simulator's virtual clock, "measured" for a real run's:
    a planned schedule's bubble is never called measured."""
    return "simulated" if chart.simulated else "measured"


def bubble_text(chart: PipelineChart, why: bool = True) -> str:
    """"bubble: measured 0.273, expected (p-1)/(m+p-1) = 3/11 = 0.273 (1x: the model
    holds here)" ("simulated 0.273" on the simulator's clock): with ``why``, the
    reasons of this run for any gap (:func:`bubble_gap`)."""
    text = (f"bubble: {clock_word(chart)} {chart.bubble:.3f} (idle / (ranks × makespan)), "
            f"expected {chart.expected.text}")
    return f"{text} ({bubble_gap(chart)})" if why else text


def _wrapped(text: str, width: int = 160) -> str:
    """A long line of a figure's text cut into lines (9 pt on a 12-13 in figure)."""
    return "\n".join(textwrap.wrap(text, width)) or text


#: Stages whose busy times differ by more than this factor are "unequal".
UNEQUAL_STAGES = 1.5


def bubble_facts(chart: PipelineChart) -> RunFacts:
    """What the chart says about its run, for :mod:`minidist.model_gap`: the
    machine (cores, load), and two things the formula assumes away, measured
    on the batch: equal stages (busiest against idlest stage) and free
    hand-offs (a stage's mean wait between two pieces of work against the
    mean piece of work)."""
    notes = []
    busy = [row.busy for row in chart.rows]
    if len(busy) > 1 and min(busy) > 0 and max(busy) > UNEQUAL_STAGES * min(busy):
        most, least = busy.index(max(busy)), busy.index(min(busy))
        notes.append(f"unequal stages ({chart.rows[most].label} busy "
                     f"{max(busy) / min(busy):.1f}x {chart.rows[least].label})")
    work = [box.duration for row in chart.rows for box in row.boxes if box.kind in WORK]
    waits = [end - start for row in chart.rows for start, end in row.idle
             if 0 < start and end < chart.makespan]  # between work, not the ramp's
    if work and waits and sum(waits) / len(waits) > sum(work) / len(work):
        notes.append(f"a micro-batch's work ({chart.time_text(sum(work) // len(work))}) is "
                     f"shorter than the waits between ({chart.time_text(sum(waits) // len(waits))})")
    if chart.batch == 0 and chart.batches > 1:
        notes.append("first batch includes setup")
    hold = () if chart.simulated else (
        f"on `minidist demo pipeline --simulate --schedule {chart.schedule} --stages "
        f"{chart.stages} --microbatches {chart.microbatches}`",)
    return RunFacts(ranks=len(chart.rows), cores=chart.cores, load=chart.load,
                    simulated=chart.simulated, notes=tuple(notes), hold=hold,
                    ranks_option="--stages")


def bubble_gap(chart: PipelineChart) -> str:
    """"3.6x: 4 ranks on 2 cores: ranks take turns; ...; the model holds on ...":
    why the measured bubble and the formula's differ in this run."""
    return explain(chart.bubble, chart.expected.value, bubble_facts(chart))


# --------------------------------------------------------------------------- the terminal


def _cell_style(box: Box | None, color: bool) -> str:
    if not color:
        return ""
    if box is None:
        return "dim"
    if box.kind == "step":
        return "bold"
    colour = box.face
    weight = {"F": "bold ", "W": ""}.get(box.kind, "italic ")
    paired = "underline " if box.phase == "overlap" else ""
    return f"{weight}{paired}{'black' if _dark_text(colour) else 'white'} on {colour}"


def legend_words(chart: PipelineChart) -> list[tuple[str, str, str]]:
    """(symbol, words, how the PNG draws it) for each kind of box the chart
    draws: the terminal and the PNG say the same words (the PNG adds its
    hatching, the terminal its ".." and "--")."""
    kinds = {box.kind for row in chart.rows for box in row.boxes}
    split = bool(kinds & {"I", "W"})
    entries = [("F3", "forward of micro-batch 3", "its colour")]
    if "B" in kinds or not split:
        entries.append(("B3", "its backward", "///"))
    if "R" in kinds:
        entries.append(("R3", "its recompute", "xxx, dashed"))
    if "I" in kinds:
        entries.append(("I3", "input half of its backward", "green, \\\\\\"))
    if "W" in kinds:
        entries.append(("W3", "its weight half", "purple, ++, dash-dot"))
    if chart.virtual_stages > 1:
        symbols = [f"{kind}3c1" for kind in ("F", "B", "R", "I", "W")
                   if kind in kinds or (kind == "B" and not split)]
        entries.append((", ".join(symbols), "on the rank's model chunk 1", "narrower"))
    if any(box.phase == "overlap" for row in chart.rows for box in row.boxes):
        entries.append((PAIR_TEXT, "a forward and a backward paired (DualPipe overlaps them)",
                        "framed"))
    if "step" in kinds:
        entries.append((STEP_TEXT, "optimizer step", "dotted"))
    return entries


def _packed(entries: list[Text], width: int, indent: str = "", gap: str = "  ") -> Text:
    """``entries`` ``gap`` apart, in lines of at most ``width`` columns, each
    entry whole on one line (a line breaks between entries, never inside one);
    the lines after the first start with ``indent``."""
    text, used = Text(), 0
    for entry in entries:
        if used and used + len(gap) + len(entry) > width:
            text.append("\n" + indent)
            used = len(indent)
        elif used:
            text.append(gap)
            used += len(gap)
        text.append_text(entry)
        used += len(entry)
    return text


def _legend(chart: PipelineChart, color: bool, width: int = 80) -> Text:
    cell = len(chart.grid[0][0]) if chart.grid and chart.grid[0] else 2
    entries = []
    for symbol, words, _ in legend_words(chart):
        entry = Text(symbol, style="bold" if color else "")
        entry.append(f": {words}" + (" (and its colour)" if color and symbol == "F3" else ""))
        entries.append(entry)
    entries.append(Text("." * cell, style="dim" if color else "") + Text(": idle (the bubble)"))
    entries.append(Text("-" * cell + ": still running"))
    return _packed(entries, width)


#: Starts each row of a frame whose first time slots scrolled off the left.
SCROLLED = "<"


def render_pipeline_frame(chart: PipelineChart, index: int, *, color: bool = True,
                          width: int | None = None):
    """Frame ``index``: the grid of time slots 0 .. ``index``, as a Rich renderable.
    ``width``: the columns it may use (default 80); older slots scroll off the
    left, each row then starts with ``<`` and a line under the grid says how
    many columns the whole batch needs."""
    if not 0 <= index < chart.slots:
        raise IndexError(f"frame {index} out of range: the chart has time slots "
                         f"0..{chart.slots - 1}")
    width = width or 80
    column = chart.columns[index]
    bold = "bold" if color else ""
    header = Text()
    named = "" if chart.schedule == UNNAMED else "pipeline · "
    header.append(f"{named}{describe(chart)}", style=bold)
    if chart.batches > 1:
        header.append(f" · batch {chart.batch + 1} of {chart.batches}")
    header.append("\n")
    header.append(f"slot {index + 1} of {chart.slots}", style="bold reverse" if color else "")
    clock = " (simulated)" if chart.simulated else ""
    # The slot's start against the batch's end, the optimizer step included: the
    # makespan stops at the last backward, and the step's slot starts after it.
    header.append(f" · time {chart.time_text(column.start)} of "
                  f"{chart.time_text(chart.end)}{clock}\n")
    header.append("started: ")
    header.append(" · ".join(
        f"{chart.rows[_row_of(chart, box.rank)].label} {box.text}"
        + (f" ({box.phase})" if box.phase and box.kind != "step" else "")
        for box in column.started))

    label_width = max(len(row.label) for row in chart.rows)
    cell_width = len(chart.grid[0][0]) + 1
    # "stage 0 │F0 F1": the label, a space, the bar, the cells a space apart.
    if label_width + 1 + (index + 1) * cell_width <= width:
        first = 0
    else:  # "stage 0 < F5 F6": the cut slots' place said by "< "
        first = index + 1 - max(1, (width - label_width - 3) // cell_width)
    lines = Text()
    for row_index, row in enumerate(chart.rows):
        line = Text(f"{row.label:<{label_width}} ", style=bold)
        line.append(f"{SCROLLED} " if first else "│")
        boxes = {box.slot: box for box in row.boxes}
        running = {slot: box for box in row.boxes
                   for slot in range(box.slot + 1, box.last_slot + 1)}
        for slot in range(first, index + 1):
            box = boxes.get(slot) or running.get(slot)
            line.append(chart.grid[row_index][slot], style=_cell_style(box, color))
            if slot < index:
                line.append(" ")
        lines.append_text(line)
        if row_index + 1 < len(chart.rows):
            lines.append("\n")
    if first:
        whole = label_width + 1 + chart.slots * cell_width
        lines.append(f"\n{SCROLLED}: slot{'s 1-' if first > 1 else ' '}{first} scrolled off the "
                     f"left at this width; the whole batch needs {whole} columns (a wider "
                     f"terminal, or COLUMNS={whole}), or --timeline OUT.png draws it",
                     style="dim" if color else "")

    footer = Text()
    footer.append(bubble_text(chart))
    if chart.expected.note:
        footer.append(f"\n  ({chart.expected.note})", style="dim" if color else "")
    peaks = [row for row in chart.rows if row.peak_live_microbatches is not None]
    if peaks:
        footer.append("\n")
        # a stage's "stage 0: 4 (40 KiB)" whole on one line
        footer.append_text(_packed([Text("peak live activations (micro-batches):")] + [
            Text(f"{row.label}: {row.peak_live_microbatches}"
                 + (f" ({format_bytes(row.peak_activation_bytes)})"
                    if row.peak_activation_bytes else "")
                 + ("," if number + 1 < len(peaks) else ""))
            for number, row in enumerate(peaks)], width, indent="  ", gap=" "))
    return Group(header, Text(), lines, Text(), _legend(chart, color, width), footer)


def _row_of(chart: PipelineChart, rank: int) -> int:
    return next(index for index, row in enumerate(chart.rows) if row.rank == rank)


def step_through_pipeline(chart: PipelineChart, console: Console | None = None,
                          keys=None, *, color: bool = True) -> list[int]:
    """Step through the chart one time slot at a time (the keys of
    :func:`viz.terminal.step_through`; every frame printed without a terminal)."""
    console = console or Console()
    # All of the terminal: a frame too narrow for the batch says COLUMNS shows it whole.
    width = console.width
    return step_through_frames(
        lambda index: render_pipeline_frame(chart, index, color=color, width=width),
        chart.slots, console, keys, color=color)


def play_pipeline(chart: PipelineChart, console: Console | None = None, speed: float = 2.0,
                  *, color: bool = True, **options) -> None:
    """Show every time slot in turn, ``speed`` frames a second (rich.live)."""
    console = console or Console()
    width = console.width
    play_frames(lambda index: render_pipeline_frame(chart, index, color=color, width=width),
                chart.slots, console, speed, **options)


# --------------------------------------------------------------------------- the PNG


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _time_unit(span: float) -> tuple[str, float]:
    for unit, scale, below in (("ns", 1.0, 2e3), ("µs", 1e3, 2e6), ("ms", 1e6, 2e9)):
        if span < below:
            return unit, scale
    return "s", 1e9


def _extent(chart: PipelineChart, box: Box, x: str, scale: float) -> tuple[float, float]:
    if x == "slot":
        return box.slot, box.last_slot + 1 - box.slot
    return box.start / scale, box.duration / scale


def _draw_chart(axis, chart: PipelineChart, *, x: str = "time", xmax: float | None = None,
                title: str | None = None, legend: bool = True, peaks: bool = True,
                xlabel: bool | str = True) -> None:
    """Draw ``chart`` on a matplotlib axis (rows top to bottom); ``xlabel``: the
    axis's own label (True), none (False) or this text."""
    from matplotlib.patches import Rectangle

    if x not in ("time", "slot"):
        raise ValueError(f"x={x!r}: draw against 'time' (the clock) or 'slot' (time slots)")
    unit, scale = _time_unit(max(chart.end, 1))
    span = chart.slots if x == "slot" else max(chart.end, 1) / scale
    limit = xmax if xmax is not None else span
    labels = []
    for row_index, row in enumerate(chart.rows):
        if x == "slot":
            gaps = [(slot, 1) for slot, cell in enumerate(chart.grid[row_index])
                    if cell.startswith(".")]
        else:
            gaps = [(start / scale, (end - start) / scale) for start, end in row.idle]
        axis.broken_barh(gaps, (row_index + 0.06, 0.88), facecolor=IDLE_COLOR,
                         edgecolor="#BBBBBB", hatch="..", linewidth=0, zorder=0)
        for box in row.boxes:
            left, width = _extent(chart, box, x, scale)
            face = box.face
            # Interleaved chunks after the first are drawn a little narrower.
            inset = 0.1 + 0.08 * min(box.chunk, 3)
            axis.add_patch(Rectangle((left, row_index + inset), max(width, span / 2000),
                                     1 - 2 * inset, facecolor=face, edgecolor="#222222",
                                     linewidth=0.9, linestyle=EDGE_STYLES[box.kind],
                                     hatch=HATCHES[box.kind], zorder=2))
            if width >= span / 60:
                labels.append((axis.text(left + width / 2, row_index + 0.5, box.text, ha="center",
                          va="center", fontsize=8 if width >= span / 30 else 6, zorder=3,
                          color="black" if _dark_text(face) else "white",
                          bbox={"boxstyle": "round,pad=0.12", "facecolor": face,
                                "edgecolor": "none"}, clip_on=True), left, left + width))
        # One frame round a pair that overlaps, as DualPipe draws them.
        for first, second in paired_boxes(row):
            left = _extent(chart, first, x, scale)[0]
            right = sum(_extent(chart, second, x, scale))
            axis.add_patch(Rectangle((left, row_index + 0.05), right - left, 0.9, fill=False,
                                     edgecolor=PAIR_EDGE, linewidth=2.0, zorder=2.5))
    axis.set_xlim(0, limit * 1.01)
    axis.set_ylim(len(chart.rows), 0)
    # Short boxes (an interleaved chunk's, a busy rank's) lose their label
    # rather than print it over their neighbours'.
    fit_box_labels(axis, labels)
    axis.set_yticks([row + 0.5 for row in range(len(chart.rows))])
    labels = []
    for row in chart.rows:
        live = "pieces" if chart.virtual_stages > 1 else "micro-batches"
        peak = (f"\npeak {row.peak_live_microbatches} live\n{live}"
                if peaks and row.peak_live_microbatches is not None else "")
        labels.append(row.label + peak)
    axis.set_yticklabels(labels, fontsize=8)
    if isinstance(xlabel, str):
        axis.set_xlabel(xlabel)
    elif xlabel:
        axis.set_xlabel("time slot" if x == "slot" else f"time ({unit}) since the batch's "
                        "first compute")
    axis.grid(axis="x", alpha=0.3)
    axis.set_title(title if title is not None else
                   f"{describe(chart)}\n{_wrapped(bubble_text(chart))}", fontsize=9, loc="left")
    if legend:
        handles = legend_handles(chart)
        axis.legend(handles=handles, loc="upper center", ncol=_legend_columns(len(handles)),
                    fontsize=7, frameon=False,
                    bbox_to_anchor=(0.5, -0.55 / (0.55 * len(chart.rows))))


#: A legend of more entries than this (a DualPipeV chart's, a comparison with
#: the zero-bubble schedules) takes lines of LEGEND_COLUMNS entries.
LEGEND_ONE_LINE = 6
LEGEND_COLUMNS = 4
#: Inches of each line of a legend after its first.
LEGEND_LINE = 0.2


def _legend_columns(entries: int) -> int:
    return entries if entries <= LEGEND_ONE_LINE else LEGEND_COLUMNS


def _legend_extra(entries: int) -> float:
    """Inches a legend of ``entries`` needs past one line."""
    lines = -(-entries // _legend_columns(entries)) if entries else 1
    return LEGEND_LINE * (lines - 1)


def paired_boxes(row: Row) -> list[tuple[Box, Box]]:
    """The row's forwards paired with a backward to overlap (phase
    "overlap", DualPipe's pairs): each (forward, backward) that follow each
    other."""
    boxes = [box for box in row.boxes if box.kind in ("F", "B", "I", "W")]  # R rides along
    return [(first, second) for first, second in zip(boxes, boxes[1:])
            if first.phase == second.phase == "overlap" and first.kind == "F"
            and second.kind in ("B", "I")]


def legend_handles(chart: PipelineChart) -> list:
    """The PNG's legend: :func:`legend_words`' entries as swatches drawn like
    the boxes, and the idle time."""
    return _handles(legend_words(chart) + [IDLE_ENTRY])


#: The legend's entry of the idle time (the PNG's only: the terminal has its "..").
IDLE_ENTRY = ("idle", "the bubble", "grey dots")


def _handles(entries) -> list:
    """Swatches of (symbol, words, drawn) legend entries, drawn like their boxes."""
    from matplotlib.patches import Patch

    handles = []
    for symbol, words, drawn in entries:
        label = f"{symbol}: {words} ({drawn})"
        if (symbol, words, drawn) == IDLE_ENTRY:
            handles.append(Patch(facecolor=IDLE_COLOR, edgecolor="#BBBBBB", hatch="..",
                                 label=label))
            continue
        if symbol == PAIR_TEXT:
            handles.append(Patch(facecolor="#FFFFFF", edgecolor=PAIR_EDGE, linewidth=2.0,
                                 label=label))
            continue
        kind = "step" if symbol == STEP_TEXT else symbol[0]
        face = {"step": "#FFFFFF"}.get(kind, HALF_COLOURS.get(kind, "#BBBBBB"))
        handles.append(Patch(facecolor=face, edgecolor="#222222", hatch=HATCHES[kind],
                             linestyle=EDGE_STYLES[kind], label=label))
    return handles


def _gantt_heading(chart: PipelineChart, panels: bool = False) -> str:
    """The figure's heading: what ran and, on one panel, its bubble; with two
    ``panels`` each panel's title carries its own bubble."""
    simulated = " (simulated)" if chart.simulated else ""
    batch = f" · batch {chart.batch + 1} of {chart.batches}" if chart.batches > 1 else ""
    named = "" if chart.schedule == UNNAMED else "pipeline: "
    bubble = "" if panels else f"\n{_wrapped(bubble_text(chart))}"
    return (f"{named}{describe(chart)}{batch}{simulated}{bubble}"
            + (f"\n({chart.expected.note})" if chart.expected.note else ""))


def _heading_extra(heading: str) -> float:
    """Inches for the heading's lines past the three FIGURE_MARGINS leaves room for."""
    return 0.16 * max(0, heading.count("\n") + 1 - 3)


#: Inches of a second panel's title and gap, above its rows.
PANEL_MARGIN = 0.75
#: Characters of a panel's title line (9 pt across a panel of 10 in).
PANEL_WIDTH = 140


def _order_title(order: PipelineChart) -> str:
    return _wrapped(
        f"in the schedule's order: each rank's actions in the order it ran them, a forward "
        f"1 unit, a backward {ORDER_BACKWARD:g}, messages free (the shape on any machine; "
        f"bubble {order.bubble:.3f}, expected {order.expected.text})", PANEL_WIDTH)


def _clock_title(chart: PipelineChart) -> str:
    return _wrapped(f"as it ran, on the wall clock: {bubble_text(chart)}", PANEL_WIDTH)


def _panels(chart: PipelineChart) -> PipelineChart | None:
    """The schedule's-order chart drawn beside a real run's (None: one panel).
    A simulated chart's clock already is the schedule's order."""
    return None if chart.simulated else schedule_order_chart(chart)


def gantt_height(chart: PipelineChart) -> float:
    """The Gantt PNG's height in inches: the margins, the heading's extra lines
    (the bubble's why may take two or three), 0.55 a stage; a real run's second
    panel (its schedule's order, :func:`schedule_order_chart`) adds as much again."""
    order = _panels(chart)
    rows = 0.55 * len(chart.rows) + _legend_extra(len(legend_handles(chart)))
    if order is None:
        return FIGURE_MARGINS + _heading_extra(_gantt_heading(chart)) + rows
    titles = _order_title(order).count("\n") + _clock_title(chart).count("\n")
    return (FIGURE_MARGINS + _heading_extra(_gantt_heading(chart, panels=True)) + 2 * rows
            + PANEL_MARGIN + 0.16 * titles + 0.55 * len(order.rows) - rows)


def draw_pipeline_gantt(trace, figure=None, *, x: str = "time", **options):
    """The Gantt chart of a pipeline run (a :class:`PipelineChart` or anything
    :func:`pipeline_chart` reads, with its keyword ``options``), on a new
    figure (or ``figure``); returns the figure. ``x``: "time" (the clock) or
    "slot" (the time slots of the step-through).

    A real run gets two panels: above, its actions in the schedule's order
    (:func:`schedule_order_chart`: the schedule's shape, the same on any
    machine); below, the wall clock, titled with why its bubble differs from
    the formula (:func:`bubble_gap`: e.g. more ranks than cores take turns,
    so most of a rank's wall-clock time is spent waiting for a core)."""
    chart = trace if isinstance(trace, PipelineChart) else pipeline_chart(trace, **options)
    order = _panels(chart)
    heading = _gantt_heading(chart, panels=order is not None)
    extra = _heading_extra(heading)
    if figure is None:
        figure = _figure(12.0, gantt_height(chart))
    height = figure.get_figheight()
    bottom = 0.85 + _legend_extra(len(legend_handles(chart)))  # the x axis and the legend
    if order is None:
        axis = figure.add_axes((0.12, bottom / height, 0.85,
                                1 - (1.65 + extra + bottom - 0.85) / height))
        _draw_chart(axis, chart, x=x, title="")
    else:
        order_title, clock_title = _order_title(order), _clock_title(chart)
        lines = 0.16 * order_title.count("\n"), 0.16 * clock_title.count("\n")
        top_rows, bottom_rows = 0.55 * len(order.rows), 0.55 * len(chart.rows)
        top = 1 - (1.65 - 0.85 + extra + lines[0]) / height
        upper = figure.add_axes((0.12, top - top_rows / height, 0.85, top_rows / height))
        _draw_chart(upper, order, x=x, title=order_title, legend=False,
                    xlabel=f"units of work (a forward 1, a backward {ORDER_BACKWARD:g})"
                    if x == "time" else True)
        lower = figure.add_axes((0.12, bottom / height, 0.85, bottom_rows / height))
        _draw_chart(lower, chart, x=x, title=clock_title)
    figure.text(0.01, 1 - 0.1 / height, heading, fontsize=9, va="top")
    return figure


def save_pipeline_gantt(trace, path, dpi: int = 100, **options) -> str:
    """Draw :func:`draw_pipeline_gantt` and write it as a PNG; returns the path."""
    path = os.fspath(path)
    with atomic_path(path) as name:
        draw_pipeline_gantt(trace, **options).savefig(name, dpi=dpi)
    return path


def draw_schedule_comparison(events_by_schedule: dict, path, *, x: str = "time",
                             dpi: int = 100) -> str:
    """Schedules side by side with one time axis: a Gantt panel each (e.g.
    {"gpipe": ..., "1f1b": ..., "interleaved": ...}, each value anything
    :func:`pipeline_chart` reads, simulated events included) and, where the
    events carry the memory ledger, each stage's peak live activations
    (micro-batches), one legend under them. They must share p and m. Writes
    a PNG (:func:`schedule_comparison_figure`); returns the path."""
    figure = schedule_comparison_figure(events_by_schedule, x=x)
    path = os.fspath(path)
    with atomic_path(path) as name:
        figure.savefig(name, dpi=dpi)
    return path


def schedule_comparison_figure(events_by_schedule: dict, *, x: str = "time"):
    """The figure :func:`draw_schedule_comparison` writes."""
    from matplotlib.ticker import MaxNLocator

    if not events_by_schedule:
        raise ValueError("no schedules to compare: pass {name: events, ...}")
    charts = []
    for name, trace in events_by_schedule.items():
        if isinstance(trace, PipelineChart):
            charts.append(trace)
            continue
        header, events = _load(trace)
        charts.append(pipeline_chart((header, events),
                                     schedule=None if header.get("schedule") else name))
    shapes = {(chart.stages, chart.microbatches) for chart in charts}
    if len(shapes) > 1:
        listing = ", ".join(f"{chart.schedule}: p={chart.stages} m={chart.microbatches}"
                            for chart in charts)
        raise ValueError(f"compare schedules with the same stages and micro-batches; "
                         f"got {listing}")
    memory = any(row.peak_live_microbatches is not None for chart in charts
                 for row in chart.rows)
    rows = max(len(chart.rows) for chart in charts)
    # One legend for the panels: the entries of every chart drawn.
    handles = _handles(_merged_words(charts))
    legend_extra = _legend_extra(len(handles))
    # Beside the memory column a panel is 5/6 as wide.
    titles = [_wrapped(f"{chart.schedule}: bubble {clock_word(chart)} {chart.bubble:.3f}, "
                       f"expected {chart.expected.text} ({bubble_gap(chart)})",
                       120 if memory else 160) for chart in charts]
    # The first panel's title lines past two push the panels down, under
    # the figure's own title (0.15 in a line of 9 points).
    above = 0.15 * max(titles[0].count("\n") - 1, 0)
    height = 1.6 + above + len(charts) * (0.75 + 0.45 * rows) + legend_extra
    figure = _figure(13.0, height)
    grid = figure.add_gridspec(len(charts), 2 if memory else 1,
                               width_ratios=(5, 1) if memory else None,
                               hspace=0.95 / (0.45 * rows), wspace=0.08, left=0.09,
                               right=0.98, top=1 - (0.7 + above) / height,
                               bottom=(0.95 + legend_extra) / height)
    if x == "slot":
        xmax = max(chart.slots for chart in charts)
    else:
        xmax = max(chart.end / _time_unit(max(chart.end, 1))[1]
                   for chart in charts)
    for index, chart in enumerate(charts):
        axis = figure.add_subplot(grid[index, 0])
        _draw_chart(axis, chart, x=x, xmax=xmax, legend=False, peaks=not memory,
                    xlabel=index + 1 == len(charts),
                    title=titles[index])
        if memory:
            bars = figure.add_subplot(grid[index, 1], sharey=axis)
            peaks = [row.peak_live_microbatches or 0 for row in chart.rows]
            bars.barh([row + 0.5 for row in range(len(chart.rows))], peaks, height=0.6,
                      color="#595959")
            for row, peak in enumerate(peaks):
                bars.text(peak, row + 0.5, f" {peak}", va="center", fontsize=8)
            bars.set_xlim(0, max(chart.microbatches, max(peaks, default=0)) * 1.25)
            bars.tick_params(labelleft=False)
            bars.xaxis.set_major_locator(MaxNLocator(integer=True))
            held = ("pieces, each\n1/v of a stage" if chart.virtual_stages > 1
                    else "micro-batches")
            bars.set_title(f"peak live activations\n({held})", fontsize=8)
    p, m = next(iter(shapes))
    # Never further from the top than 0.2 in, however tall the figure.
    figure.suptitle(f"{' vs '.join(chart.schedule for chart in charts)}: {p} stages, "
                    f"{m} micro-batches", fontsize=10, x=0.01, ha="left",
                    y=1 - min(0.02 * height, 0.2) / height)
    figure.legend(handles=handles, loc="lower center", ncol=_legend_columns(len(handles)),
                  fontsize=7, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return figure


def _merged_words(charts) -> list[tuple[str, str, str]]:
    """Every chart's :func:`legend_words` once: entries of the same words (the
    chunk-1 symbols of different schedules) under the union of their symbols."""
    merged: dict[str, list] = {}
    for chart in charts:
        for symbol, words, drawn in legend_words(chart) + [IDLE_ENTRY]:
            if words not in merged:
                merged[words] = [symbol.split(", "), drawn]
            else:
                merged[words][0] += [part for part in symbol.split(", ")
                                     if part not in merged[words][0]]
    order = {kind: index for index, kind in enumerate(("F", "B", "R", "I", "W"))}
    return [(", ".join(sorted(symbols, key=lambda part: order.get(part[0], 9)))
             if len(symbols) > 1 else symbols[0], words, drawn)
            for words, (symbols, drawn) in merged.items()]


#: The schedules of the planned comparison (the README's picture), in the
#: order they are taught: lesson 9's three, then the zero-bubble ones.
PLANNED = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zbv", "dualpipev")


def draw_planned_comparison(path, stages: int = 4, microbatches: int = 8,
                            virtual_stages: int = 2, *, forward_time: float = 1.0,
                            backward_time: float = 2.0, dpi: int = 80,
                            colors: int | None = 64, schedules=PLANNED) -> str:
    """The ``schedules`` (:data:`PLANNED`: GPipe, 1F1B, interleaved 1F1B,
    ZB-H1, ZB-H2, ZB-V, DualPipeV) as planned: each of ``stages`` ranks and
    ``microbatches`` micro-batches run by the simulator
    (:func:`minidist.parallel.pipeline.simulate_schedule`; a stage's forward
    ``forward_time``, backward ``backward_time``, its halves half of it each,
    a chunk of the interleaved schedule 1/v of that, of ZB-V and DualPipeV
    1/2; messages free), drawn by :func:`draw_schedule_comparison` on one
    time axis with each stage's peak live activations. ``colors``: write the
    PNG with a palette of that many colours (a third of the bytes, the same
    picture: it has few colours), None for full colour. Returns the PNG's path."""
    from minidist.parallel.pipeline.schedules import make_schedule
    from minidist.parallel.pipeline.simulate import simulate_schedule

    planned = {}
    for name in schedules:
        chunks = virtual_stages if name == "interleaved_1f1b" else 1
        schedule = make_schedule(name, stages, microbatches, chunks)
        per_rank = schedule.virtual_stages
        planned[name] = simulate_schedule(schedule, forward_time / per_rank,
                                          backward_time / per_rank)
    path = draw_schedule_comparison(planned, path, dpi=dpi)
    if colors:
        from PIL import Image  # matplotlib's own dependency

        with Image.open(path) as image:
            reduced = image.convert("RGB").quantize(colors=colors)
        with atomic_path(path) as name:
            reduced.save(name, optimize=True)
    return path


__all__ = ["Box", "Row", "Column", "BubbleFormula", "PipelineChart", "pipeline_chart",
           "expected_bubble", "is_pipeline_trace", "describe", "clock_word", "bubble_text",
           "bubble_gap", "schedule_order_chart",
           "gantt_height",
           "render_pipeline_frame", "step_through_pipeline", "play_pipeline",
           "draw_pipeline_gantt", "save_pipeline_gantt", "draw_schedule_comparison",
           "schedule_comparison_figure", "legend_words", "legend_handles", "paired_boxes",
           "draw_planned_comparison"]
