"""The zero-bubble schedules drawn: the Gantt chart's I and W boxes in colours
of their own with a legend entry each (F, B, R keep their micro-batch's
colour), DualPipeV's pairs framed, the terminal's step-through showing and
colouring them, the order panel of a real run replaying them, and the
planned comparison (the README's picture) holding all seven schedules.

The schedules and their events come from the simulator; what the chart must
show is read off the schedule itself (its compute order, its pairs) and off
the simulator's ledger.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle
from PIL import Image
from rich.console import Console

from minidist import trace
from minidist.parallel.pipeline import (
    bubble_fraction,
    make_schedule,
    peak_live_microbatches,
    simulate_schedule,
)
from tests.viz.test_pipeline_order import real_pipeline_trace
from viz.pipeline_chart import (
    HALF_COLOURS,
    PAIR_EDGE,
    PLANNED,
    draw_pipeline_gantt,
    legend_words,
    paired_boxes,
    pipeline_chart,
    render_pipeline_frame,
    schedule_comparison_figure,
    schedule_order_chart,
    step_through_pipeline,
)
from viz.terminal import PALETTE

ZERO_BUBBLE = [("zb_h1", 4, 8), ("zb_h2", 4, 8), ("zbv", 4, 8), ("dualpipev", 4, 8),
               ("zb_h1", 3, 2), ("zbv", 2, 5), ("dualpipev", 3, 7)]
#: Okabe and Ito's bluish green and reddish purple, written out here.
GREEN, PURPLE = "#009e73", "#cc79a7"


class _Discard:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def _simulated(name, stages, microbatches):
    schedule = make_schedule(name, stages, microbatches)
    chunk = 1 / schedule.virtual_stages  # a chunk costs its share of a stage
    events = simulate_schedule(schedule, chunk, 2 * chunk, activation_bytes=100)
    header = dict(trace.make_header(stages, transport="sim"), **schedule.header())
    return schedule, events, pipeline_chart((header, events))


def _pairs_of(schedule, rank):
    """(forward, backward) texts of the rank's pairs that overlap, from the schedule."""
    overlapping = [str(a) for a in schedule.actions[rank]
                   if a.phase == "overlap" and a.kind in ("forward", "backward")]
    return list(zip(overlapping[0::2], overlapping[1::2]))


@pytest.mark.parametrize("name, stages, microbatches", ZERO_BUBBLE)
def test_the_chart_holds_the_schedule(name, stages, microbatches):
    schedule, events, chart = _simulated(name, stages, microbatches)
    assert chart.bubble == bubble_fraction(events, stages)
    assert (chart.schedule, chart.placement) == (name, schedule.placement)
    assert [row.label for row in chart.rows] == [f"stage {s}" for s in range(stages)]
    for rank, row in enumerate(chart.rows):
        assert [box.text for box in row.boxes if box.kind != "step"] == \
            schedule.compute_order(rank)
        assert [(first.text, second.text) for first, second in paired_boxes(row)] == \
            _pairs_of(schedule, rank)
    assert {row.rank: row.peak_live_microbatches for row in chart.rows} == \
        peak_live_microbatches(events)
    # Without a header the V is read off the stages the boxes name.
    assert pipeline_chart(events).placement == schedule.placement
    if name == "zbv" or name == "dualpipev":
        assert "2 chunks per rank in a V" in render_pipeline_frame(chart, 0, color=False) \
            .renderables[0].plain


@pytest.mark.parametrize("name, stages, microbatches", [("zb_h1", 4, 8), ("zb_h2", 4, 8),
                                                        ("zbv", 4, 8), ("dualpipev", 4, 8),
                                                        ("zb_h2", 3, 9), ("zbv", 3, 6)])
def test_the_expected_bubble_is_the_papers_with_equal_costs(name, stages, microbatches):
    """F = B = W (a forward 1, a backward 2): Qi et al.'s (p-1)(F+B-W) for
    ZB-H1, no idle inside a rank for ZB-H2 and ZB-V (their slant is what is
    left), DualPipe's (p-1)(F&B+B-3W) with F&B = F + B; as shares of the
    makespan, (p-1)/(3m+p-1), or (p-1)/(6m+p-1) in ZB-V's half-stage units."""
    p, m = stages, microbatches
    _, _, chart = _simulated(name, stages, microbatches)
    slots = 6 if name == "zbv" else 3
    assert chart.bubble == chart.expected.value == (p - 1) / (slots * m + p - 1)
    assert chart.expected.text.startswith(f"(p-1)/({slots}m+p-1) = {p - 1}/{slots * m + p - 1}")


def _drawn_boxes(figure):
    """(face colour, edge width, filled) of every rectangle on the chart's axis."""
    axis = figure.axes[0]
    return [(to_hex(patch.get_facecolor()), patch.get_linewidth(), patch.get_fill(), patch)
            for patch in axis.patches if isinstance(patch, Rectangle)]


@pytest.mark.parametrize("name", ["zb_h1", "dualpipev"])
def test_the_gantt_chart_colours_the_halves_and_frames_the_pairs(name):
    schedule, _, chart = _simulated(name, 4, 8)
    figure = draw_pipeline_gantt(chart)
    drawn = _drawn_boxes(figure)
    boxes = [box for row in chart.rows for box in row.boxes]
    filled = [entry for entry in drawn if entry[2]]
    assert len(filled) == len(boxes)
    kinds = {"I": GREEN, "W": PURPLE}
    for box, (face, _, _, _) in zip(boxes, filled):
        if box.kind in kinds:
            assert face == kinds[box.kind], box.text
        elif box.kind == "step":
            assert face == "#ffffff"
        else:  # F, B and R keep their micro-batch's colour
            assert face == PALETTE[box.microbatch % len(PALETTE)].lower(), box.text
    assert {to_hex(colour) for colour in HALF_COLOURS.values()} == {GREEN, PURPLE}
    assert GREEN not in {c.lower() for c in PALETTE} and PURPLE not in {c.lower() for c in PALETTE}
    frames = [entry for entry in drawn if not entry[2]]
    pairs = sum(len(_pairs_of(schedule, rank)) for rank in range(4))
    assert len(frames) == pairs == (0 if name == "zb_h1" else sum(
        2 * (8 - 2 * 4 + rank + 1) + (4 - rank - 1) - (rank == 3) for rank in range(4)))
    assert all(to_hex(patch.get_edgecolor()) == PAIR_EDGE.lower() and width == 2.0
               for _, width, _, patch in frames)
    legend = {text.get_text(): to_hex(handle.get_facecolor()) for text, handle in
              zip(figure.axes[0].get_legend().get_texts(),
                  figure.axes[0].get_legend().legend_handles)}
    assert legend["I3: input half of its backward (green, \\\\\\)"] == GREEN
    assert legend["W3: its weight half (purple, ++, dash-dot)"] == PURPLE
    assert ("[F B]: a forward and a backward paired (DualPipe overlaps them) (framed)"
            in legend) == (name == "dualpipev")
    # a chart without halves keeps the legend it had
    plain = pipeline_chart(simulate_schedule(make_schedule("1f1b", 4, 8), 1.0, 2.0))
    assert [symbol for symbol, _, _ in legend_words(plain)] == ["F3", "B3", "st"]


def test_the_terminal_shows_and_colours_the_halves():
    _, _, chart = _simulated("dualpipev", 3, 6)
    console = Console(record=True, width=10_000, color_system=None, file=_Discard())
    console.print(render_pipeline_frame(chart, chart.slots - 1, color=False, width=10_000))
    text = console.export_text()
    grid = [line for line in text.splitlines() if line.startswith("stage ")]
    for rank, line in enumerate(grid):
        assert line.split("│")[1].split() == chart.row_text(rank).split()
    assert "I3: input half of its backward" in text and "W3: its weight half" in text
    assert "[F B]: a forward and a backward paired" in text
    coloured = render_pipeline_frame(chart, chart.slots - 1, color=True, width=10_000)
    styles = {str(span.style) for span in coloured.renderables[2].spans}
    assert any("on #009E73" in style for style in styles)
    assert any("on #CC79A7" in style for style in styles)
    assert any("underline" in style for style in styles)  # a pair
    stepped = Console(record=True, width=200, color_system=None, file=_Discard())
    assert step_through_pipeline(chart, stepped, color=False) == list(range(chart.slots))
    assert "(overlap)" in stepped.export_text()  # a pair's boxes say so as they start


@pytest.mark.parametrize("name, chunks", [("zb_h1", 1), ("zb_h2", 1), ("zbv", 2),
                                          ("dualpipev", 2)])
def test_a_real_runs_order_panel_replays_the_halves_and_the_v(name, chunks):
    real = pipeline_chart(real_pipeline_trace(name, 4, 8, chunks))
    assert not real.simulated and real.placement == ("v" if chunks == 2 else "loop")
    order = schedule_order_chart(real)
    planned = _simulated(name, 4, 8)[2]
    assert order.grid == planned.grid


def test_the_comparison_holds_every_schedule(tmp_path):
    assert PLANNED == ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zbv",
                       "dualpipev")
    planned = {}
    for name in PLANNED:
        schedule = make_schedule(name, 4, 8, 2 if name == "interleaved_1f1b" else 1)
        chunk = 1 / schedule.virtual_stages
        planned[name] = simulate_schedule(schedule, chunk, 2 * chunk, activation_bytes=1)
    figure = schedule_comparison_figure(planned)
    titles = [axis.get_title(loc="left") for axis in figure.axes]
    for name in PLANNED:
        assert any(title.startswith(f"{name}: bubble simulated") for title in titles), name
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "I3: input half of its backward (green, \\\\\\)" in labels
    assert "F3c1, B3c1, I3c1, W3c1: on the rank's model chunk 1 (narrower)" in labels
    committed = Path(__file__).resolve().parents[2] / "docs" / "pipeline_schedules.png"
    with Image.open(committed) as readme:
        assert readme.size == (1040, round(80 * figure.get_figheight()))
