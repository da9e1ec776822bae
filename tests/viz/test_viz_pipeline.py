"""The pipeline Gantt chart, its step-through and `minidist viz` on a pipeline trace.

The events are made here, by hand or by a tiny list scheduler, in the trace
format agreed with minidist/parallel/pipeline/ (see viz/pipeline_chart.py),
so these tests need neither the runtime nor the simulator.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from PIL import Image
from rich.console import Console

from minidist import trace
from minidist.cli import main
from viz.pipeline_chart import (
    FIGURE_MARGINS,
    draw_schedule_comparison,
    expected_bubble,
    gantt_height,
    pipeline_chart,
    render_pipeline_frame,
    save_pipeline_gantt,
    step_through_pipeline,
)

# --------------------------------------------------------------------------- making events


def compute(rank, kind, microbatch, start, end, *, stage=None, chunk=0, phase="steady"):
    text = "step" if kind == "step" else f"{kind}{microbatch}"
    info = ({"pipeline": "step", "stage": rank if stage is None else stage} if kind == "step"
            else {"pipeline": kind, "mb": microbatch, "chunk": chunk,
                  "stage": rank if stage is None else stage, "phase": phase})
    return {"rank": rank, "kind": "compute", "peer": None, "bytes": 0, "tag": None,
            "label": trace.with_info(text, **info), "start": start, "end": end, "seq": None,
            "group": 0, "channel": 0}


def memory(rank, time, live, activation_bytes=1000):
    label = trace.with_info("memory", params=64, grads=64, optimizer=0,
                            activations=live * activation_bytes, live_microbatches=live,
                            stage=rank)
    return {"rank": rank, "kind": "memory", "peer": None, "bytes": 0, "tag": None,
            "label": label, "start": time, "end": time, "seq": None, "group": 0, "channel": 0}


def gpipe_2x2() -> list[dict]:
    """GPipe, p=2 m=2, forward = backward = 1, written out by hand:

        rank 0: F0 F1 .. .. B1 B0
        rank 1: .. F0 F1 B1 B0 ..
    """
    return [compute(0, "F", 0, 0, 1, phase="warmup"), compute(0, "F", 1, 1, 2, phase="warmup"),
            compute(1, "F", 0, 1, 2, phase="warmup"), compute(1, "F", 1, 2, 3, phase="warmup"),
            compute(1, "B", 1, 3, 4, phase="cooldown"), compute(1, "B", 0, 4, 5, phase="cooldown"),
            compute(0, "B", 1, 4, 5, phase="cooldown"), compute(0, "B", 0, 5, 6, phase="cooldown")]


def one_f_one_b_order(stages, microbatches, stage):
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", mb) for mb in range(warmup)]
    for mb in range(microbatches - warmup):
        order += [("F", warmup + mb), ("B", mb)]
    order += [("B", mb) for mb in range(microbatches - warmup, microbatches)]
    return order


def gpipe_order(stages, microbatches, stage):
    return [("F", mb) for mb in range(microbatches)] + \
        [("B", mb) for mb in reversed(range(microbatches))]


def list_schedule(orders, forward=1, backward=1, *, transfer=0, step=True, ledger=True,
                  origin=0):
    """Times for each rank's ordered actions: an action starts when its rank is
    free and its input is there (F after the previous stage's F, B after the
    next stage's B, plus ``transfer``; the last stage's B after its own F)."""
    stages = len(orders)
    done: dict[tuple, int] = {}
    free = [origin] * stages
    position = [0] * stages
    live = [0] * stages
    events = []
    while any(position[rank] < len(orders[rank]) for rank in range(stages)):
        progressed = False
        for rank in range(stages):
            if position[rank] == len(orders[rank]):
                continue
            kind, mb = orders[rank][position[rank]]
            needs = (("F", rank - 1, mb) if kind == "F" else
                     ("B", rank + 1, mb) if rank + 1 < stages else ("F", rank, mb))
            if needs[1] >= 0 and needs not in done:
                continue
            arrives = done.get(needs, origin) + (transfer if needs[1] != rank else 0)
            start = max(free[rank], arrives)
            end = start + (forward if kind == "F" else backward)
            events.append(compute(rank, kind, mb, start, end))
            if ledger:
                live[rank] += 1 if kind == "F" else -1
                events.append(memory(rank, start if kind == "F" else end, live[rank]))
            done[(kind, rank, mb)] = free[rank] = end
            position[rank] += 1
            progressed = True
        assert progressed, "the orders deadlock"
    if step:
        events += [compute(rank, "step", None, free[rank], free[rank]) for rank in range(stages)]
    return events


def one_f_one_b(stages, microbatches, **options):
    return list_schedule([one_f_one_b_order(stages, microbatches, stage)
                          for stage in range(stages)], **options)


def gpipe(stages, microbatches, **options):
    return list_schedule([gpipe_order(stages, microbatches, stage)
                          for stage in range(stages)], **options)


def _text(renderable, width=100) -> str:
    console = Console(record=True, width=width, color_system=None, file=_Discard())
    console.print(renderable)
    return console.export_text()


class _Discard:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


# --------------------------------------------------------------------------- the model


def test_gpipe_by_hand_rows_slots_idle_and_bubble():
    chart = pipeline_chart(gpipe_2x2())
    assert [row.label for row in chart.rows] == ["stage 0", "stage 1"]
    assert [box.text for box in chart.rows[0].boxes] == ["F0", "F1", "B1", "B0"]
    assert [box.text for box in chart.rows[1].boxes] == ["F0", "F1", "B1", "B0"]
    assert chart.slots == 6
    assert chart.row_text(0) == "F0 F1 .. .. B1 B0"
    assert chart.row_text(1) == ".. F0 F1 B1 B0 .."
    assert chart.rows[0].idle == ((2, 4),) and chart.rows[1].idle == ((0, 1), (5, 6))
    assert chart.makespan == 6 and chart.idle == 4
    assert Fraction(chart.idle, chart.capacity) == Fraction(1, 3) == chart.expected.fraction
    assert chart.expected.formula == "(p-1)/(m+p-1)"
    assert (chart.stages, chart.microbatches, chart.virtual_stages) == (2, 2, 1)
    assert chart.simulated  # no header: the simulator's clock


@pytest.mark.parametrize("stages, microbatches", [(2, 2), (3, 4), (4, 8), (4, 3), (3, 1)])
@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
def test_equal_costs_bubble_is_the_formula_exactly(schedule, stages, microbatches):
    chart = pipeline_chart(schedule(stages, microbatches))
    assert Fraction(chart.idle, chart.capacity) == Fraction(stages - 1, microbatches + stages - 1)
    assert chart.expected.fraction == Fraction(stages - 1, microbatches + stages - 1)
    assert chart.bubble == pytest.approx(chart.expected.value)
    # Unit costs: one slot per unit of time, nothing still running across slots.
    assert chart.slots == 2 * (microbatches + stages - 1) + 1  # + the optimizer steps' slot
    assert all("--" not in cells for cells in chart.grid)


def test_one_f_one_b_3x4_rows_in_order():
    chart = pipeline_chart(one_f_one_b(3, 4))
    texts = [[box.text for box in row.boxes] for row in chart.rows]
    assert texts[0] == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3", "st"]
    assert texts[1] == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3", "st"]
    assert texts[2] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "st"]
    assert chart.row_text(0, upto=11) == "F0 F1 F2 .. .. B0 F3 B1 .. B2 .. B3"
    assert chart.row_text(2) == ".. .. F0 B0 F1 B1 F2 B2 F3 B3 st .. .."
    # Peak live activations from the ledger: at most p - s micro-batches at stage s.
    assert [row.peak_live_microbatches for row in chart.rows] == [3, 2, 1]
    assert [row.peak_activation_bytes for row in chart.rows] == [3000, 2000, 1000]
    gpipe_chart = pipeline_chart(gpipe(3, 4))
    assert [row.peak_live_microbatches for row in gpipe_chart.rows] == [4, 4, 4]


def test_unequal_costs_show_what_still_runs():
    chart = pipeline_chart(one_f_one_b(2, 3, forward=1, backward=2, step=False, ledger=False))
    # Stage 1's backwards take two units while stage 0 starts a forward in between.
    assert "--" in " ".join(chart.row_text(row) for row in range(2))
    for row in chart.rows:
        for box in row.boxes:
            assert chart.grid[chart.rows.index(row)][box.slot].strip() == box.text
            for slot in range(box.slot + 1, box.last_slot + 1):
                assert chart.grid[chart.rows.index(row)][slot] == "--"
    busy = sum(row.busy for row in chart.rows)
    assert chart.idle == 2 * chart.makespan - busy


def test_real_clock_transfers_do_not_split_slots():
    # Real nanoseconds: each message takes 3 µs, so a stage starts a little
    # after the work it waits for, not exactly with its neighbours.
    events = gpipe(2, 2, forward=1_000_000, backward=2_000_000, transfer=3_000, step=False,
                   ledger=False)
    for event in events:
        event["start"] += 81_000_000_000
        event["end"] += 81_000_000_000
    header = trace.make_header(2, transport="shm", schedule="gpipe", stages=2, microbatches=2,
                               virtual_stages=1)
    chart = pipeline_chart((header, events))
    assert not chart.simulated and chart.schedule == "gpipe"
    assert chart.row_text(0) == "F0 F1 .. .. B1 B0"
    assert chart.row_text(1) == ".. F0 F1 B1 B0 .."
    assert chart.makespan == 9_006_000 and "ms" in chart.time_text(chart.makespan)
    assert Fraction(chart.idle, chart.capacity) == 1 - Fraction(2 * 6_000_000,
                                                                2 * chart.makespan)
    assert chart.bubble > chart.expected.value  # the transfers add idle time


def test_batches_are_cut_at_the_optimizer_step():
    first = one_f_one_b(2, 2)
    second = one_f_one_b(2, 2, forward=2, origin=100)  # slower, to tell them apart
    chart = pipeline_chart(first + second)
    assert (chart.batch, chart.batches) == (1, 2)
    assert pipeline_chart(first + second, batch=0).makespan == pipeline_chart(first).makespan
    assert chart.makespan != pipeline_chart(first).makespan
    with pytest.raises(IndexError, match="2 batches"):
        pipeline_chart(first + second, batch=2)


def test_interleaved_formula_and_chunk_names():
    formula = expected_bubble(4, 8, 2)
    assert formula.fraction == Fraction(3, 19)
    assert formula.formula == "(p-1)/(v·m+p-1)"
    assert "(1/v)(p-1)/m" in formula.note and "0.188" in formula.note
    events = [compute(0, "F", 0, 0, 1, chunk=0, stage=0), compute(1, "F", 0, 1, 2, stage=1),
              compute(0, "F", 0, 2, 3, chunk=1, stage=2), compute(1, "F", 0, 3, 4, chunk=1,
                                                                 stage=3)]
    chart = pipeline_chart(events)
    assert chart.virtual_stages == 2 and chart.stages == 2
    assert chart.row_text(0) == "F0   .... F0c1 ...."
    assert [row.stage for row in chart.rows] == [0, 1]


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="no pipeline compute regions"):
        pipeline_chart([{"rank": 0, "kind": "compute", "label": "x", "start": 0, "end": 1}])
    broken = compute(0, "F", 0, 0, 1)
    broken["label"] = trace.with_info("F?", pipeline="F")
    with pytest.raises(ValueError, match="rank 0.*mb=K"):
        pipeline_chart([broken])
    with pytest.raises(ValueError, match="at least 1"):
        expected_bubble(0, 4)


# --------------------------------------------------------------------------- the terminal


def test_frame_k_shows_the_grid_up_to_slot_k():
    chart = pipeline_chart(gpipe_2x2())
    third = _text(render_pipeline_frame(chart, 2, color=False))
    assert "stage 0 │F0 F1 .." in third and "stage 1 │.. F0 F1" in third
    assert "B1" not in third.split("started")[1].split("F3: forward")[0]
    assert "slot 3 of 6" in third and "started: stage 1 F1 (warmup)" in third
    last = _text(render_pipeline_frame(chart, 5, color=False))
    assert "stage 0 │F0 F1 .. .. B1 B0" in last
    assert "stage 1 │.. F0 F1 B1 B0 .." in last
    assert "simulated 0.333" in last and "(p-1)/(m+p-1) = 1/3 = 0.333" in last
    coloured = _text(render_pipeline_frame(chart, 5, color=True))
    assert "stage 0 │F0 F1 .. .. B1 B0" in coloured
    with pytest.raises(IndexError, match="0..5"):
        render_pipeline_frame(chart, 6)


def test_wide_grids_scroll_and_fit_the_width():
    chart = pipeline_chart(gpipe(4, 16, ledger=False))
    text = _text(render_pipeline_frame(chart, chart.slots - 1, color=False, width=60), width=60)
    grid_lines = [line for line in text.splitlines() if line.startswith("stage ")]
    assert len(grid_lines) == 4 and all(len(line) <= 60 for line in grid_lines)
    assert all(line.startswith("stage 0 < ".replace("0", line[6])) for line in grid_lines)
    assert grid_lines[0].rstrip().endswith("B1  B0  st")
    # The frame says what it cut and how to see the whole batch.
    whole = 8 + chart.slots * (len(chart.grid[0][0]) + 1)
    assert whole > 60 and f"the whole batch needs {whole} columns" in " ".join(text.split())
    assert f"COLUMNS={whole}" in text and "--timeline OUT.png" in text
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 60
    wide = _text(render_pipeline_frame(chart, chart.slots - 1, color=False, width=whole),
                 width=whole)
    grid_lines = [line for line in wide.splitlines() if line.startswith("stage ")]
    assert all("│" in line and "<" not in line for line in grid_lines)
    assert "scrolled off" not in wide and max(map(len, grid_lines)) == whole


def test_step_through_prints_every_frame_without_a_terminal():
    chart = pipeline_chart(one_f_one_b(3, 4))
    console = Console(record=True, width=100, color_system=None, file=_Discard())
    assert step_through_pipeline(chart, console, color=False) == list(range(chart.slots))
    text = console.export_text()
    assert text.count("slot ") >= chart.slots and "peak live activations" in text
    keys = Console(record=True, width=100, color_system=None, file=_Discard())
    assert step_through_pipeline(chart, keys, keys=["n", "n", "b", "G", "q"]) == \
        [0, 1, 2, 1, chart.slots - 1]


# --------------------------------------------------------------------------- pictures


@pytest.mark.parametrize("x", ["time", "slot"])
def test_gantt_png_is_written(tmp_path, x):
    path = save_pipeline_gantt(one_f_one_b(3, 4), tmp_path / "gantt.png", x=x)
    height = gantt_height(pipeline_chart(one_f_one_b(3, 4)))
    assert height >= FIGURE_MARGINS + 0.55 * 3
    with Image.open(path) as image:
        assert image.size == (1200, round(100 * height))
    with pytest.raises(ValueError, match="'time'.*'slot'"):
        save_pipeline_gantt(one_f_one_b(3, 4), tmp_path / "bad.png", x="steps")


def test_schedule_comparison_png(tmp_path):
    interleaved = [compute(rank, kind, mb, start, end, chunk=chunk, stage=chunk * 3 + rank)
                   for rank, kind, mb, start, end, chunk in
                   [(rank, "F", mb, 3 * mb + rank, 3 * mb + rank + 1, 0) for rank in range(3)
                    for mb in range(4)]]
    path = draw_schedule_comparison({"gpipe": gpipe(3, 4), "1f1b": one_f_one_b(3, 4),
                                     "interleaved": interleaved}, tmp_path / "compare.png")
    with Image.open(path) as image:
        assert image.size[0] == 1300 and image.size[1] > 600
    with pytest.raises(ValueError, match="same stages and micro-batches"):
        draw_schedule_comparison({"gpipe": gpipe(3, 4), "1f1b": one_f_one_b(3, 5)},
                                 tmp_path / "no.png")


# --------------------------------------------------------------------------- the CLI


@pytest.fixture
def pipeline_trace(tmp_path):
    path = tmp_path / "pipeline.jsonl"
    trace.write_jsonl(path, one_f_one_b(3, 4),
                      trace.make_header(3, transport="shm", schedule="1f1b", stages=3,
                                        microbatches=4, virtual_stages=1))
    return path


def test_viz_timeline_of_a_pipeline_trace_draws_the_gantt(pipeline_trace, tmp_path, capsys):
    out = tmp_path / "gantt.png"
    assert main(["viz", str(pipeline_trace), "--timeline", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "pipeline Gantt chart written to" in printed and "bubble" in printed
    with Image.open(out) as image:
        assert image.size == (1200, round(100 * gantt_height(pipeline_chart(pipeline_trace))))


def test_viz_of_a_pipeline_trace_steps_through_its_slots(pipeline_trace, capsys):
    assert main(["viz", str(pipeline_trace), "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "slot 13 of 13" in out and "pipeline · 1f1b · 3 stages · 4 micro-batches" in out
    assert "stage 2 │.. .. F0 B0 F1 B1 F2 B2 F3 B3 st .. .." in out


def test_viz_of_a_pipeline_header_without_pipeline_events_says_so(tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    trace.write_jsonl(path, [], trace.make_header(2, schedule="gpipe", stages=2))
    assert main(["viz", str(path)]) == 2
    assert "no pipeline compute regions" in capsys.readouterr().err


def test_viz_play_and_chrome_of_a_pipeline_trace(pipeline_trace, tmp_path, capsys):
    assert main(["viz", str(pipeline_trace), "--play", "--speed", "1000", "--no-color"]) == 0
    assert "slot 13 of 13" in capsys.readouterr().out
    chrome = tmp_path / "pipeline.json"
    assert main(["viz", str(pipeline_trace), "--chrome", str(chrome)]) == 0
    out = capsys.readouterr().out
    assert chrome.stat().st_size > 0 and "slot 1 of" not in out


def test_viz_animation_of_a_pipeline_trace_says_why_it_cannot(pipeline_trace, tmp_path, capsys):
    # --gif animates collective calls: without any it writes nothing and says why.
    chrome = tmp_path / "pipe.json"
    assert main(["viz", str(pipeline_trace), "--gif", str(tmp_path / "pipe.gif"),
                 "--chrome", str(chrome)]) == 2
    captured = capsys.readouterr()
    error = captured.err.strip()
    assert error.startswith("minidist viz: --gif: ") and "\n" not in error
    assert "pipeline run with no collective calls" in error and "--timeline" in error
    assert "(in the browser: --html PAGE)" in error
    assert sorted(path.name for path in tmp_path.iterdir()) == [pipeline_trace.name]
    assert captured.out == ""


def test_viz_html_of_a_pipeline_trace_is_its_time_slots_in_the_browser(pipeline_trace, tmp_path,
                                                                       capsys):
    page, chrome = tmp_path / "pipe.html", tmp_path / "pipe.json"
    assert main(["viz", str(pipeline_trace), "--html", str(page), "--chrome", str(chrome)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"HTML player written to {page}" in out and "13 time slots" in out
    assert chrome.stat().st_size > 0
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "slot 13 of 13" in text


# --------------------------------------------------------------------------- measured vs formula


def test_the_bubble_says_why_it_differs_from_the_formula():
    from minidist.parallel.pipeline.schedules import one_f_one_b
    from minidist.parallel.pipeline.simulate import simulate_schedule
    from viz.pipeline_chart import bubble_gap, bubble_text

    schedule = one_f_one_b(4, 8)
    ideal = pipeline_chart((trace.make_header(4, transport="sim", **schedule.header()),
                            simulate_schedule(schedule)))
    assert bubble_gap(ideal) == "1x: the model holds here"
    assert bubble_text(ideal).endswith("= 0.273 (1x: the model holds here)")

    # The last stage three times slower, messages slow, on a crowded machine.
    events = simulate_schedule(schedule, lambda stage, mb: 3.0 if stage == 3 else 1.0,
                               lambda stage, mb: 6.0 if stage == 3 else 2.0, 4.0)
    header = trace.make_header(4, transport="shm", cores=2, load=5.0, **schedule.header())
    slow = pipeline_chart((header, events), simulated=False)
    gap = bubble_gap(slow)
    assert slow.bubble > 1.5 * slow.expected.value
    assert gap.startswith(f"{slow.bubble / slow.expected.value:.2g}x: ")
    assert "4 ranks on 2 cores: ranks take turns" in gap
    assert "machine busy (load 5.0 on 2 cores)" in gap
    assert "unequal stages (stage 3 busy 3.0x stage 0)" in gap
    assert "is shorter than the waits between" in gap
    assert gap.endswith("the model holds on `minidist demo pipeline --simulate --schedule 1f1b "
                        "--stages 4 --microbatches 8` or with --stages 2")


# --------------------------------------------------------------------------- the legends


@pytest.mark.parametrize("name, stages, microbatches, chunks",
                         [("gpipe", 2, 2, 1), ("interleaved_1f1b", 2, 3, 2)])
def test_legends_name_every_box_and_agree(name, stages, microbatches, chunks):
    """The PNG's legend names every text its boxes show (F0, B1, F0c1, st),
    the terminal's names every cell of its grid ("..", "--" too), and both say
    the same words for each."""
    from minidist.parallel.pipeline.schedules import make_schedule
    from minidist.parallel.pipeline.simulate import simulate_schedule
    from tests.viz.legends import legend_texts, unnamed
    from tests.viz.text_layout import text_problems
    from viz.pipeline_chart import draw_pipeline_gantt, schedule_comparison_figure

    events = simulate_schedule(make_schedule(name, stages, microbatches, chunks),
                               1.0 / chunks, 2.0 / chunks)
    chart = pipeline_chart(events)
    figure = draw_pipeline_gantt(chart)
    drawn = [text.get_text() for axis in figure.axes for text in axis.texts
             if text.get_visible() and axis.get_legend() is not None]
    png = legend_texts(figure)
    assert drawn and unnamed(drawn, png) == [], png
    assert text_problems(figure) == []
    terminal = _text(render_pipeline_frame(chart, chart.slots - 1, color=False, width=300),
                     width=300)
    legend = next(line for line in terminal.splitlines() if line.startswith("F3: forward"))
    entries = [entry.strip() for entry in legend.split("  ") if entry.strip()]
    cells = [cell.strip() for row in chart.grid for cell in row]
    assert unnamed(cells, entries) == [], entries
    for entry in png:
        if not entry.startswith("idle"):
            assert entry.rsplit(" (", 1)[0] in legend, (entry, legend)
    if chunks > 1:
        assert any(entry.startswith("F3c1, B3c1: ") for entry in png)
    # The schedules side by side: one legend under the panels, for every box.
    comparison = schedule_comparison_figure({name: events})
    drawn = [text.get_text() for axis in comparison.axes for text in axis.texts
             if text.get_visible() and "peak live" not in axis.get_title()]
    assert unnamed(drawn, legend_texts(comparison)) == []
    assert text_problems(comparison) == []
