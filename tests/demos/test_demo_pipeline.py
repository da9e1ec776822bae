"""`minidist demo pipeline`: trains on real processes and draws the trace;
`--simulate` draws the planned schedule. Standard output is not a terminal
here, so the step-through prints every frame."""

from __future__ import annotations

import re

import pytest
from PIL import Image

from minidist import trace
from minidist.cli import STRATEGY_DEMOS, main
from viz.pipeline_chart import pipeline_chart


def _printed(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())


_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_TIME_OF = re.compile(r"time ([\d.]+) (ns|us|µs|ms|s) of ([\d.]+) (ns|us|µs|ms|s)")


def assert_no_part_exceeds_its_whole(out: str) -> None:
    """Every frame's "time T of E": the slot starts within the batch, the
    optimizer step's slot too (it starts after the last backward, the end of
    the makespan, so the whole is the batch's end)."""
    found = _TIME_OF.findall(out)
    assert found, "no frame said its time"
    for part, part_unit, whole, whole_unit in found:
        assert float(part) * _UNIT[part_unit] <= float(whole) * _UNIT[whole_unit], \
            f"time {part} {part_unit} of {whole} {whole_unit}"


@pytest.mark.timeout(120)
def test_demo_pipeline_trains_writes_the_trace_and_draws_it(tmp_path, capsys):
    assert STRATEGY_DEMOS["pipeline"] == "viz.demo_pipeline"
    path, png = tmp_path / "pipeline.jsonl", tmp_path / "gantt.png"
    assert main(["demo", "pipeline", "--schedule", "1f1b", "--stages", "2",
                 "--microbatches", "2", "--epochs", "1", "--trace", str(path),
                 "--timeline", str(png), "--no-color"]) == 0
    out = _printed(capsys)
    assert "1f1b on 2 processes" in out and "epoch 1: mean loss" in out
    assert "test accuracy" in out and f"trace written to {path}" in out
    written = trace.read_jsonl(path)
    assert written.header["schedule"] == "1f1b" and written.header["stages"] == 2
    assert written.header["microbatches"] == 2
    chart = pipeline_chart(written)
    # one epoch over the digits: every batch of the run is in the trace
    assert chart.batches > 10 and f"batch {chart.batches} of {chart.batches}" in out
    assert f"slot {chart.slots} of {chart.slots}" in out  # every frame printed
    assert_no_part_exceeds_its_whole(out)
    # the last slot is the optimizer step's, after the makespan's end
    assert chart.columns[-1].start > chart.makespan
    assert chart.columns[-1].start <= chart.end
    assert f"bubble: measured {chart.bubble:.3f}" in out
    assert "expected (p-1)/(m+p-1) = 1/3 = 0.333" in out
    assert 0 < chart.bubble < 1
    assert f"Gantt chart written to {png}" in out
    with Image.open(png) as image:
        assert image.size[0] == 1200


def test_demo_pipeline_simulate_draws_the_planned_schedule(tmp_path, capsys):
    png, path = tmp_path / "planned.png", tmp_path / "planned.jsonl"
    assert main(["demo", "pipeline", "--simulate", "--schedule", "gpipe", "--stages", "2",
                 "--microbatches", "2", "--timeline", str(png), "--trace", str(path),
                 "--no-color"]) == 0
    out = _printed(capsys)
    assert "no processes" in out and "(simulated)" in out
    assert "slot 1 of" in out and "simulated 0.333" in out and "1/3 = 0.333" in out
    assert_no_part_exceeds_its_whole(out)
    assert "gpipe · 2 stages · 2 micro-batches" in out
    assert pipeline_chart(path).row_text(0).startswith("F0 F1")
    with Image.open(png) as image:
        assert image.size[0] == 1200
    assert main(["demo", "pipeline", "--simulate", "--schedule", "interleaved", "--stages",
                 "2", "--microbatches", "4", "--no-color"]) == 0
    # two chunks per rank, each half a stage's cost: (p-1)/(v m+p-1) = 1/9
    assert "simulated 0.111" in _printed(capsys)
    assert main(["demo", "pipeline", "--simulate", "--schedule", "gpipe", "--stages", "1",
                 "--microbatches", "1", "--no-color"]) == 0
    out = _printed(capsys)
    assert "gpipe · 1 stage · 1 micro-batch " in out and "gpipe, 1 stage, 1 micro-batch;" in out
    assert "1 micro-batches" not in out and "1 stages" not in out


def test_demo_pipeline_bad_input(capsys):
    assert main(["demo", "pipeline", "--stages", "0"]) == 2
    assert "--stages and --microbatches must be at least 1, got 0" in _printed(capsys)
    assert main(["demo", "pipeline", "--schedule", "zigzag", "--simulate"]) == 2
    assert "unknown pipeline schedule 'zigzag'" in _printed(capsys)


def test_demo_pipeline_simulates_the_zero_bubble_schedules(capsys):
    for name in ("zb_h1", "zb_h2", "zbv", "dualpipev"):
        assert main(["demo", "pipeline", "--simulate", "--schedule", name, "--stages", "2",
                     "--microbatches", "4", "--no-color"]) == 0
        printed = _printed(capsys)
        assert "I0" in printed and "W0" in printed and "input half" in printed, name
    assert main(["demo", "pipeline", "--simulate", "--schedule", "dualpipev", "--stages", "3",
                 "--microbatches", "4"]) == 2
    assert "DualPipeV needs at least 2p = 6" in _printed(capsys)


def test_demo_pipeline_runs_for_real_only_what_the_runtime_runs(capsys):
    from minidist.parallel.pipeline import make_schedule
    from viz.demo_pipeline import _runtime_runs

    for name in ("gpipe", "1f1b", "interleaved", "zb_h1", "zb_h2", "zbv", "dualpipev"):
        assert _runtime_runs(make_schedule(name, 2, 4, 2 if name == "interleaved" else 1))
    assert main(["demo", "pipeline", "--microbatches", "65", "--simulate"]) == 2
    assert "use --microbatches <= 64" in _printed(capsys)


#: (schedule, Linear layers a process holds, the formula's words)
ZERO_BUBBLE_RUNS = [("zb_h1", 1, "(p-1)/(3m+p-1) = 1/13"), ("zb_h2", 1, "(p-1)/(3m+p-1)"),
                    ("zbv", 2, "(p-1)/(6m+p-1) = 1/25"), ("dualpipev", 2, "(p-1)/(3m+p-1)")]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name,layers,formula", ZERO_BUBBLE_RUNS,
                         ids=[case[0] for case in ZERO_BUBBLE_RUNS])
def test_demo_pipeline_trains_the_zero_bubble_schedules_on_processes(
        name, layers, formula, tmp_path, capsys, monkeypatch):
    # One epoch on 2 processes, at 80 columns: the split backward's I and W
    # are in the trace and drawn, and the rank holding the last stage (rank 0
    # on the V placement) tells the loss. (A command to copy is printed
    # whole, so the trace's path is short.)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)
    path = "zero_bubble.jsonl"
    assert main(["demo", "pipeline", "--schedule", name, "--stages", "2", "--microbatches",
                 "4", "--epochs", "1", "--trace", path, "--no-color"]) == 0
    raw = capsys.readouterr().out
    assert max(len(line) for line in raw.splitlines()) <= 80
    out = " ".join(raw.split())
    assert f"{name} on 2 processes" in out and f"({layers} per process)" in out
    assert "epoch 1: mean loss" in out and "test accuracy" in out
    assert formula in out and "input half" in out and "weight half" in out
    written = trace.read_jsonl(path)
    assert written.header["schedule"] == name
    # the last batch drawn is the schedule's, split halves and all, rank by rank
    from minidist.parallel.pipeline import make_schedule

    chart, schedule = pipeline_chart(written), make_schedule(name, 2, 4)
    for row in chart.rows:
        ran = [box.text for box in sorted(row.boxes, key=lambda box: box.start)
               if box.kind != "step"]
        assert ran == schedule.compute_order(row.rank)
    assert any(box.kind == "W" for row in chart.rows for box in row.boxes)
    assert_no_part_exceeds_its_whole(out)
