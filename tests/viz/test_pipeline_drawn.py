"""The pipeline runtime and simulator, drawn: minidist.parallel.pipeline.executor and
viz.pipeline_chart together.

For each schedule, the simulator's events (equal costs, backward 2x
forward) and a real traced run (one launch of 2 processes running every
schedule, the last step of each kept) go through the chart. Whatever the
clock: the chart's bubble is bubble_fraction of the same events (one
definition) and its shaded gaps add up to it, there is one row per stage,
each row's boxes are the schedule's compute actions in order, the memory
column agrees with the runtime's ledger, and the Gantt PNG and the terminal
frames render. `minidist viz TRACE --timeline` draws a real pipeline trace.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from PIL import Image
from rich.console import Console

import minidist
from minidist import nn, optim, trace
from minidist.cli import main
from minidist.parallel.pipeline import (
    Pipeline,
    annotate_trace,
    bubble_fraction,
    make_schedule,
    peak_live_microbatches,
    simulate_schedule,
)
from viz.pipeline_chart import (
    FIGURE_MARGINS,
    gantt_height,
    pipeline_chart,
    render_pipeline_frame,
    save_pipeline_gantt,
    step_through_pipeline,
)

SIMULATED = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved_1f1b", 4, 8, 2),
             ("gpipe", 3, 2, 1), ("1f1b", 3, 5, 1), ("interleaved_1f1b", 2, 3, 2)]
#: The real run: 2 processes, 4 micro-batches of a 12-example batch, 2 steps a case.
REAL = [("gpipe", 1, False), ("interleaved_1f1b", 2, False), ("1f1b", 1, True),
        ("1f1b", 1, False)]
STAGES, MICROBATCHES, BATCH, STEPS = 2, 4, 12, 2


class _Discard:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def _console(width=120):
    return Console(record=True, width=width, color_system=None, file=_Discard())


def _work_order(chart, row):
    """A row's forwards and backwards, written as the schedule writes them."""
    return [box.text for box in chart.rows[row].boxes if box.kind in ("F", "B")]


def _check_drawn(chart, schedule, events, tmp_path, name):
    """What holds for any pipeline chart, simulated or real."""
    p = schedule.stages
    assert chart.bubble == bubble_fraction(events, p)
    busy = sum(row.busy for row in chart.rows)
    # The shaded gaps are the bubble: idle = capacity - busy, to the nanosecond.
    assert chart.idle == chart.capacity - busy
    assert Fraction(chart.idle, chart.capacity) == 1 - Fraction(busy, p * chart.makespan)
    assert [row.label for row in chart.rows] == [f"stage {s}" for s in range(p)]
    for rank in range(p):
        assert _work_order(chart, rank) == schedule.compute_order(rank), (name, rank)
        assert chart.rows[rank].boxes[-1].text == "st"
    assert (chart.stages, chart.microbatches, chart.virtual_stages) == \
        (p, schedule.microbatches, schedule.virtual_stages)
    peaks = peak_live_microbatches(events)
    assert {row.rank: row.peak_live_microbatches for row in chart.rows} == peaks

    for x in ("time", "slot"):
        path = save_pipeline_gantt(chart, tmp_path / f"{name}-{x}.png", x=x)
        with Image.open(path) as image:
            assert image.size == (1200, round(100 * gantt_height(chart)))
            assert gantt_height(chart) >= FIGURE_MARGINS + 0.55 * p
    console = _console()
    assert step_through_pipeline(chart, console, color=False) == list(range(chart.slots))
    printed = console.export_text()
    clock = "simulated" if chart.simulated else "measured"
    assert printed.count("slot ") >= chart.slots and f"{clock} {chart.bubble:.3f}" in printed
    last = _console(width=10_000)  # wide enough that no slot scrolls off
    last.print(render_pipeline_frame(chart, chart.slots - 1, color=False, width=10_000))
    grid = [line for line in last.export_text().splitlines() if line.startswith("stage ")]
    assert len(grid) == p
    for rank, line in enumerate(grid):
        assert line.split("│")[1].split() == chart.row_text(rank).split()


# --------------------------------------------------------------------------- the simulator


@pytest.mark.parametrize("name, stages, microbatches, virtual", SIMULATED)
def test_simulated_schedule_drawn(name, stages, microbatches, virtual, tmp_path):
    schedule = make_schedule(name, stages, microbatches, virtual)
    events = simulate_schedule(schedule, activation_bytes=100)
    header = dict(trace.make_header(stages, transport="sim"), **schedule.header())
    for given in (events, (header, events)):
        chart = pipeline_chart(given)
        assert chart.simulated and chart.batches == 1
        _check_drawn(chart, schedule, events, tmp_path, name)
    assert chart.schedule == schedule.name
    if virtual == 1 or microbatches % stages == 0:
        # equal costs, free messages: the formula, exactly
        assert chart.bubble == chart.expected.value
    else:
        # interleaved with m not a multiple of p leaves padded slots idle
        assert chart.bubble > chart.expected.value
    p, m = stages, microbatches
    expected_peaks = {"gpipe": [m] * p, "1f1b": [min(p - s, m) for s in range(p)]}
    if name in expected_peaks:
        assert [row.peak_live_microbatches for row in chart.rows] == expected_peaks[name]
        assert [row.peak_activation_bytes for row in chart.rows] == \
            [100 * peak for peak in expected_peaks[name]]
    # the simulator's unit is a millisecond on a nanosecond clock
    assert chart.time_text(chart.makespan).endswith(" ms")


# --------------------------------------------------------------------------- a real run


def _model():
    nn.init.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)).to(np.float64)


def _train():
    recorder = trace.current()
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(BATCH, 8)), rng.integers(0, 3, BATCH)
    kept = []
    for name, virtual, recompute in REAL:
        pipe = Pipeline(_model(), name, MICROBATCHES, virtual_stages=virtual,
                        recompute=recompute)
        optimizer = optim.SGD(pipe.parameters(), lr=0.1)
        for _ in range(STEPS):
            first = len(recorder.events)
            pipe.step(x, y, nn.CrossEntropyLoss(), optimizer)
        kept.append([dict(zip(trace.FIELDS, event)) for event in recorder.events[first:]])
    return kept


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """(path of the launch's trace, per case: the last step's events of both ranks)."""
    path = tmp_path_factory.mktemp("pipeline_drawn") / "pipeline.jsonl"
    results = minidist.launch(_train, world_size=STAGES, trace=path, timeout=60)
    per_case = [[event for rank_events in results for event in rank_events[case]]
                for case in range(len(REAL))]
    return path, per_case


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", range(len(REAL)), ids=[
    f"{name}{'-recompute' if recompute else ''}" for name, _, recompute in REAL])
def test_real_run_drawn(real_run, case, tmp_path):
    _, per_case = real_run
    name, virtual, recompute = REAL[case]
    schedule = make_schedule(name, STAGES, MICROBATCHES, virtual)
    events = per_case[case]
    header = dict(trace.make_header(STAGES, transport="shm"), **schedule.header())
    chart = pipeline_chart((header, events))
    assert not chart.simulated and chart.batches == 1 and chart.schedule == schedule.name
    _check_drawn(chart, schedule, events, tmp_path, name)
    assert 0 < chart.bubble < 1
    recomputed = [box for row in chart.rows for box in row.boxes if box.kind == "R"]
    assert len(recomputed) == (STAGES * MICROBATCHES * virtual if recompute else 0)
    for row in chart.rows:
        for box in row.boxes:
            if box.kind == "R":  # R runs just before its B, on the same micro-batch
                following = row.boxes[row.boxes.index(box) + 1]
                assert (following.kind, following.microbatch) == ("B", box.microbatch)


@pytest.mark.timeout(120)
def test_minidist_viz_timeline_of_a_real_pipeline_trace(real_run, tmp_path, capsys):
    path, per_case = real_run
    name, virtual, _ = REAL[-1]
    schedule = make_schedule(name, STAGES, MICROBATCHES, virtual)
    annotate_trace(path, schedule)  # the last batch of the file is the last case's
    written = trace.read_jsonl(path)
    assert written.header["schedule"] == "1f1b" and written.header["transport"] == "shm"
    chart = pipeline_chart(path)
    assert chart.batches == len(REAL) * STEPS
    assert chart.bubble == bubble_fraction(per_case[-1], STAGES)
    out = tmp_path / "gantt.png"
    assert main(["viz", str(path), "--timeline", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "pipeline Gantt chart written to" in printed
    assert f"measured {chart.bubble:.3f}" in printed and "(p-1)/(m+p-1) = 1/5" in printed
    with Image.open(out) as image:
        assert image.size == (1200, round(100 * gantt_height(chart)))
    assert gantt_height(chart) >= FIGURE_MARGINS + 0.55 * STAGES
    assert main(["viz", str(path), "--no-color"]) == 0
    stepped = capsys.readouterr().out
    assert f"slot {chart.slots} of {chart.slots}" in stepped
    assert f"batch {len(REAL) * STEPS} of {len(REAL) * STEPS}" in stepped


def test_the_planned_comparison_is_the_readme_picture(tmp_path):
    from pathlib import Path

    from viz.pipeline_chart import draw_planned_comparison

    path = draw_planned_comparison(tmp_path / "schedules.png")
    committed = Path(__file__).resolve().parents[2] / "docs" / "pipeline_schedules.png"
    with Image.open(path) as drawn, Image.open(committed) as readme:
        assert drawn.mode == "P" and drawn.size == readme.size
    assert (tmp_path / "schedules.png").stat().st_size < 150_000
    assert committed.stat().st_size < 150_000
