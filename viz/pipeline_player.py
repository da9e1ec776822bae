"""A pipeline batch in the browser: the terminal's step-through, one time slot
a step, in :mod:`viz.html_player`'s page (no network, a slider, the keys, a
stage to follow).

Step 0 is the batch before its first slot; step k shows every stage's row
of slots 1..k of :func:`viz.pipeline_chart.pipeline_chart` (the later ones
blank), the boxes that start in slot k outlined, each cell in the Gantt
chart's colours: a forward, backward or recomputation in its micro-batch's,
a split backward's input half I and weight half W in their own
(:data:`viz.pipeline_chart.HALF_COLOURS`), idle time grey with a "·". With the batch's
events at hand the messages sent in the slot are listed, so that following
a rank says what it sends and receives. Built from the chart, like the
terminal's frames: what the page shows is what the terminal prints.

    from viz.pipeline_player import save_pipeline_player
    save_pipeline_player(events, "pipeline.html")     # or a trace's path

Size: one cell per stage and slot in every step, O(p s^2) numbers for p
stages and s slots (ZB-H1 on 4 stages, m = 8: 28 slots, 0.17 MB; DualPipeV:
49 slots, 0.47 MB).
"""

from __future__ import annotations

import os

from minidist import trace as _trace
from minidist.atomic_file import atomic_write
from viz.html_player import player_html
from viz.pipeline_chart import (
    HALF_COLOURS,
    IDLE_COLOR,
    IDLE_ENTRY,
    PipelineChart,
    _dark_text,
    _load,
    describe,
    legend_words,
    pipeline_chart,
)
from viz.terminal import PALETTE

#: A cell's side and the gaps, in the scene's units.
CELL, GAP, ROW = 1.0, 0.05, 1.25
#: A slot not reached yet.
BLANK = "#FFFFFF"
#: An idle cell's mark, so that it differs from a blank one by more than its grey.
IDLE_TEXT = "·"


def _cells(chart: PipelineChart, row_index: int, upto: int) -> list:
    """One stage's cells at step ``upto`` (slots 1..upto shown):
    [x, y, fill, text, ink, outlined] as the page draws them."""
    row = chart.rows[row_index]
    started = {box.slot: box for box in row.boxes}
    running = {slot: box for box in row.boxes
               for slot in range(box.slot + 1, box.last_slot + 1)}
    y = -(row_index + 1) * ROW
    cells = []
    for slot in range(chart.slots):
        box = started.get(slot) or running.get(slot)
        if slot >= upto:
            fill, text = BLANK, ""
        elif box is None:
            fill, text = IDLE_COLOR, IDLE_TEXT
        else:
            fill, text = box.face, box.text if slot in started else ""
        ink = "#000000" if _dark_text(fill) or fill == IDLE_COLOR else "#FFFFFF"
        cells.append([slot * (CELL + GAP), y, fill, text, ink,
                      slot == upto - 1 and slot in started])
    return cells


def _messages(chart: PipelineChart, events) -> list[list]:
    """Per slot, the messages sent in it: [sender, receiver, words]. Only for a
    trace of one batch, whose clock the chart's shares (times since its first
    compute)."""
    per_slot = [[] for _ in range(chart.slots)]
    if not events or chart.batches != 1:
        return per_slot
    work = [event for event in events if event.get("kind") == "compute"
            and _trace.label_info(event.get("label") or "").get("pipeline") in ("F", "B", "R",
                                                                                 "I", "W")]
    if not work:
        return per_slot
    origin = min(event["start"] for event in work)
    starts = [column.start for column in chart.columns]
    for event in events:
        if event.get("kind") != "send" or event.get("peer") is None:
            continue
        at = event["start"] - origin
        slot = max([index for index, start in enumerate(starts) if start <= at], default=0)
        per_slot[slot].append([event["rank"], event["peer"],
                               f"rank {event['rank']} -> rank {event['peer']}: "
                               f"{_trace.label_text(event.get('label') or '')}"])
    return per_slot


def _legend(chart: PipelineChart) -> list[dict]:
    """The page's cell legend: the Gantt chart's words, each with its fill."""
    entries = []
    for symbol, words, _ in legend_words(chart) + [IDLE_ENTRY]:
        kind = symbol[0]
        fill = (IDLE_COLOR if symbol == IDLE_ENTRY[0] else BLANK if symbol.startswith(("st", "["))
                else HALF_COLOURS.get(kind, PALETTE[3 % len(PALETTE)]))
        entries.append({"symbol": symbol, "label": f"{symbol}: {words}", "note": "",
                        "fill": fill, "edge": "#777777", "width": 0.6, "line": False})
    entries.append({"symbol": "outlined", "label": "outlined: started in this slot",
                    "note": "", "fill": BLANK, "edge": "#000000", "width": 2.4,
                    "line": False})
    return entries


def pipeline_player_panel(chart: PipelineChart, events=None, caption: str = "") -> dict:
    """The chart's time slots as a panel of :func:`viz.html_player.player_html`:
    step 0 before the first slot, step k through slot k. ``events``: the
    batch's trace events, for the messages of each slot."""
    width = chart.slots * (CELL + GAP)
    view = [-2.2, width + 0.3, -(len(chart.rows) + 0.4) * ROW, 0.3]
    messages = _messages(chart, events)
    steps = []
    for step in range(chart.slots + 1):
        if step == 0:
            header = [describe(chart), "before the batch's first slot"]
            at, sent = 0, []
        else:
            column = chart.columns[step - 1]
            at, sent = column.start, messages[step - 1]
            header = [describe(chart),
                      f"slot {step} of {chart.slots} · time {chart.time_text(at)} of "
                      f"{chart.time_text(chart.end)}"
                      + (" (simulated)" if chart.simulated else ""),
                      "started: " + " · ".join(
                          f"{chart.rows[_row_of(chart, box.rank)].label} {box.text}"
                          + (f" ({box.phase})" if box.phase and box.kind != "step" else "")
                          for box in column.started)]
        ranks = [{"rank": row.rank, "cells": _cells(chart, index, step),
                  "title": [-0.3, -(index + 1) * ROW + CELL / 2, "right", "center"]}
                 for index, row in enumerate(chart.rows)]
        steps.append({"header": header, "messages": sent,
                      "elapsed": at / max(chart.end, 1),
                      "elapsed_text": chart.time_text(at),
                      "scene": {"view": view, "font": 0.34, "size": CELL, "ring": None,
                                "edges": [], "ranks": ranks, "messages": []}})
    return {"caption": caption, "world": max(row.rank for row in chart.rows) + 1,
            "follow": True, "palette": list(PALETTE), "legend": _legend(chart),
            "measured": 1.0, "predicted": None, "steps": steps}


def _row_of(chart: PipelineChart, rank: int) -> int:
    return next(index for index, row in enumerate(chart.rows) if row.rank == rank)


def save_pipeline_player(trace, path, *, fps: float = 2.0, **options) -> str:
    """Write the page of one batch of a pipeline run (anything
    :func:`viz.pipeline_chart.pipeline_chart` reads, with its ``options``)
    to ``path``; returns the path."""
    header, events = _load(trace) if not isinstance(trace, PipelineChart) else ({}, None)
    chart = trace if isinstance(trace, PipelineChart) else pipeline_chart((header, events),
                                                                          **options)
    page = player_html(f"pipeline: {describe(chart)}",
                       [pipeline_player_panel(chart, events)], fps=fps,
                       intro="Each step is one time slot of the batch; follow a rank to "
                             "see its stage's row and its messages.")
    path = os.fspath(path)
    with atomic_write(path) as file:
        file.write(page)
    return path


__all__ = ["pipeline_player_panel", "save_pipeline_player"]
