"""Every picture the lessons and demos write keeps its text readable: no two
labels on top of each other, none cut by the figure's edge
(:func:`tests.viz.text_layout.text_problems`).

Each picture is drawn by the same function the lesson or demo calls, with
small inputs shaped like theirs (fixed seeds, no training, no processes)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from minidist import trace
from minidist.experiments import compression
from minidist.parallel.pipeline.schedules import make_schedule
from minidist.parallel.pipeline.simulate import simulate_schedule
from tests.viz.test_pipeline_order import real_pipeline_trace
from tests.viz.text_layout import text_problems
from tests.viz.viz_reference import ring_all_reduce_events
from viz import lesson_figures, pipeline_chart, timeline


def data_parallel_steps(ranks=2, steps=3, step_ns=40_000):
    """Events of a few data-parallel steps: a "step k" span, forward and
    backward regions and a ring all_reduce per step, as the lessons' DDP
    timelines hold them."""
    events = []
    for step in range(steps):
        origin = step * step_ns
        for rank in range(ranks):
            for kind, label, start, end in (
                    ("step", f"step {step + 1}", 0, step_ns - 500),
                    ("compute", "forward", 500, 8_000),
                    ("compute", "backward", 8_000, 20_000)):
                events.append({"rank": rank, "kind": kind, "peer": None, "bytes": 0,
                               "tag": None, "label": label, "start": origin + start,
                               "end": origin + end, "seq": None, "group": 0, "channel": 0})
        for event in ring_all_reduce_events(ranks, count=12, call=step, step_ns=4_000):
            event = dict(event, start=event["start"] + origin + 20_500,
                         end=event["end"] + origin + 20_500)
            if event["seq"] is not None:
                event["seq"] += 2 * step * (ranks - 1)
            events.append(event)
    return events


def compression_results(seed=0):
    """One made-up result per compressor: the formula's bytes, accuracies close
    together (the lesson's runs land within a few points of each other)."""
    rng = np.random.default_rng(seed)
    shapes = compression.parameter_shapes("mlp")
    results = []
    for name, compressor in compression.COMPRESSORS.items():
        sent = compression.formula_bytes(name, shapes, 2) or compression.dense_bytes(
            sum(int(np.prod(shape)) for shape in shapes), 2)
        accuracy = 0.95 - (0.3 if compressor.error_feedback is False else 0.0) \
            + rng.uniform(-0.01, 0.01)
        results.append(compression.Result(name, compressor.family, compressor.error_feedback,
                                          accuracy, sent, 100, 1e-3))
    return results


def _pipeline(chart_of):
    return lambda tmp_path: pipeline_chart.draw_pipeline_gantt(chart_of())


def _saved(draw):
    """A picture written by a function that saves and returns a path: drawn
    into a figure we keep (savefig is what writes it)."""
    def run(tmp_path):
        kept = []
        original = Figure.savefig

        def keep(figure, *args, **kwargs):
            kept.append(figure)
            return original(figure, *args, **kwargs)

        Figure.savefig = keep
        try:
            draw(tmp_path)
        finally:
            Figure.savefig = original
        assert len(kept) == 1
        return kept[0]
    return run


PICTURES = {
    # lesson 9 and `minidist demo pipeline --simulate`: the planned schedule
    "pipeline planned 1f1b": _pipeline(lambda: pipeline_chart.pipeline_chart(
        simulate_schedule(make_schedule("1f1b", 4, 8), 1.0, 2.0))),
    "pipeline planned interleaved": _pipeline(lambda: pipeline_chart.pipeline_chart(
        simulate_schedule(make_schedule("interleaved", 4, 8, 2), 0.5, 1.0))),
    # the zero-bubble schedules: a split backward's halves, DualPipeV's pairs
    "pipeline planned zb_h1": _pipeline(lambda: pipeline_chart.pipeline_chart(
        (dict(trace.make_header(4, transport="sim"), **make_schedule("zb_h1", 4, 8).header()),
         simulate_schedule(make_schedule("zb_h1", 4, 8), 1.0, 2.0)))),
    "pipeline planned dualpipev": _pipeline(lambda: pipeline_chart.pipeline_chart(
        (dict(trace.make_header(4, transport="sim"),
              **make_schedule("dualpipev", 4, 8).header()),
         simulate_schedule(make_schedule("dualpipev", 4, 8), 0.5, 1.0)))),
    "pipeline recompute": _pipeline(lambda: pipeline_chart.pipeline_chart(
        simulate_schedule(make_schedule("gpipe", 2, 4), 1.0, 2.0, recompute=True))),
    # `minidist demo pipeline`: a real run, its order beside its wall clock
    "pipeline real 1f1b": _pipeline(lambda: pipeline_chart.pipeline_chart(
        real_pipeline_trace())),
    "pipeline real interleaved": _pipeline(lambda: pipeline_chart.pipeline_chart(
        real_pipeline_trace("interleaved", 4, 8, 2))),
    # lesson 9's comparison of three, and the README's of all seven
    # (docs/pipeline_schedules.png)
    "pipeline lesson schedules": _saved(lambda tmp_path: pipeline_chart.draw_planned_comparison(
        tmp_path / "schedules.png", schedules=("gpipe", "1f1b", "interleaved_1f1b"))),
    "pipeline schedules": _saved(lambda tmp_path: pipeline_chart.draw_planned_comparison(
        tmp_path / "schedules.png")),
    # lessons 5 and 13, `minidist viz --timeline`, the demos' --timeline
    "timeline data parallel": lambda tmp_path: timeline.draw_timeline(
        data_parallel_steps(), title="one DDP step, 2 ranks, overlap=True"),
    "timeline ring": lambda tmp_path: timeline.draw_timeline(ring_all_reduce_events(4, 12)),
    # lesson 13
    "compression bytes vs accuracy": _saved(lambda tmp_path: compression.plot(
        compression_results(), tmp_path / "compression.png",
        title="digits MLP, 2 ranks: bytes per step against test accuracy")),
    # lesson 7
    "ps bandwidth": _saved(lambda tmp_path: lesson_figures.draw_ps_bandwidth(
        [("PS server", 2, 1, 6 * 20_000, 0, 0, 0), ("PS server", 4, 1, 6 * 40_000, 0, 0, 0),
         ("PS server", 3, 2, 6 * 15_000, 0, 0, 0), ("ring rank", 4, 0, 6 * 15_000, 0, 0, 0)],
        10_000, 6, tmp_path / "ps_bandwidth.png")),
}


@pytest.mark.parametrize("name", PICTURES)
def test_picture_text_is_readable(name, tmp_path):
    figure = PICTURES[name](tmp_path)
    assert text_problems(figure) == []


def test_the_checker_sees_overlaps_and_text_off_the_figure():
    figure = Figure(figsize=(4, 3))
    axis = figure.add_subplot()
    axis.text(0.5, 0.5, "all_reduce ring")
    axis.text(0.55, 0.5, "step 2")
    axis.text(0.5, 0.2, "")  # empty: never drawn, never counted
    figure.text(0.9, 0.9, "a title that runs off the right edge")
    problems = text_problems(figure)
    assert "'step 2' overlaps 'all_reduce ring'" in problems
    assert any("runs off the right edge' leaves the figure" in p for p in problems)
    assert len(problems) == 2


def test_the_ps_bandwidth_legend_names_every_line_and_kind_of_point(tmp_path):
    """Each line and each kind of measured point (marker and colour) of lesson
    7's picture has a legend entry."""
    figure = PICTURES["ps bandwidth"](tmp_path)
    for axis in figure.axes:
        named = {(line.get_marker(), line.get_color()) for line in axis.get_lines()
                 if not line.get_label().startswith("_")}
        drawn = {(line.get_marker(), line.get_color()) for line in axis.get_lines()}
        assert drawn <= named, drawn - named
        labels = [text.get_text() for text in axis.get_legend().get_texts()]
        assert len(labels) == len(named)
    assert "measured: 2 servers" in [text.get_text()
                                     for text in figure.axes[0].get_legend().get_texts()]
