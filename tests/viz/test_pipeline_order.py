"""A real pipeline run drawn in its schedule's order beside its wall clock:
the order panel shows the schedule's shape whatever the timing (a run of 4
stages on 2 cores included), and the words say which clock a bubble is on."""

from __future__ import annotations

import numpy as np
import pytest

from minidist import trace
from minidist.parallel.pipeline.schedules import make_schedule, schedule_from_order
from minidist.parallel.pipeline.simulate import simulate_schedule
from viz.pipeline_chart import (
    bubble_text,
    draw_pipeline_gantt,
    pipeline_chart,
    schedule_order_chart,
)


def real_pipeline_trace(name="1f1b", stages=4, microbatches=8, chunks=1, seed=0):
    """A pipeline trace shaped like a real run on fewer cores than stages:
    the planned order, but every event stretched by its rank's own factor
    and jittered (a rank that waits for a core runs slower), so the wall
    clock looks nothing like the plan."""
    schedule = make_schedule(name, stages, microbatches, chunks)
    rng = np.random.default_rng(seed)
    stretch = rng.uniform(1, 6, stages)
    events = []
    for event in simulate_schedule(schedule, 1.0 / chunks, 2.0 / chunks):
        event = dict(event)
        factor = stretch[event["rank"]]
        event["start"] = int(event["start"] * factor) + int(rng.integers(0, 1000))
        event["end"] = int(event["end"] * factor) + 1000
        events.append(event)
    header = trace.make_header(stages, transport="shm", cores=2, load=1.5, **schedule.header())
    return header, events


def planned(name, stages, microbatches, chunks=1):
    return pipeline_chart(simulate_schedule(make_schedule(name, stages, microbatches, chunks),
                                            1.0 / chunks, 2.0 / chunks))


@pytest.mark.parametrize("name, chunks", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_order_panel_of_a_real_run_is_the_planned_schedule(name, chunks, seed):
    real = pipeline_chart(real_pipeline_trace(name, 4, 8, chunks, seed=seed))
    assert not real.simulated
    # the wall clock is nothing like the plan ...
    assert real.grid != planned(name, 4, 8, chunks).grid
    order = schedule_order_chart(real)
    # ... the order is: the same action in every slot of every stage
    assert order.grid == planned(name, 4, 8, chunks).grid
    assert order.bubble == pytest.approx(planned(name, 4, 8, chunks).bubble)


def test_order_panel_follows_the_run_not_the_plan():
    """Built from what each rank ran: a rank that ran GPipe's order under a
    1F1B header is drawn as GPipe."""
    header, events = real_pipeline_trace("gpipe", 3, 4)
    header = dict(header, schedule="1f1b")
    order = schedule_order_chart(pipeline_chart((header, events)))
    assert order.grid == planned("gpipe", 3, 4).grid


def test_schedule_from_order_rebuilds_the_messages():
    schedule = make_schedule("1f1b", 3, 4)
    orders = [[(str(a)[0], a.microbatch, a.chunk, a.phase) for a in actions
               if a.kind in ("forward", "backward")] for actions in schedule.actions]
    assert schedule_from_order("1f1b", 3, 4, 1, orders).actions == schedule.actions
    with pytest.raises(ValueError, match="2 ranks' orders for 3 stages"):
        schedule_from_order("1f1b", 3, 4, 1, orders[:2])


def test_real_gantt_has_two_panels_and_says_why_they_differ():
    real = pipeline_chart(real_pipeline_trace())
    figure = draw_pipeline_gantt(real)
    titles = [axis.get_title(loc="left") for axis in figure.axes]
    assert len(figure.axes) == 2
    assert titles[0].startswith("in the schedule's order")
    assert "as it ran, on the wall clock: bubble: measured" in " ".join(titles[1].split())
    assert "4 ranks on 2 cores: ranks take turns" in " ".join(titles[1].split())
    # a simulated chart is its schedule's order already: one panel
    assert len(draw_pipeline_gantt(planned("1f1b", 4, 8)).axes) == 1


def test_simulated_bubble_is_never_called_measured():
    simulated = planned("1f1b", 4, 8)
    assert bubble_text(simulated).startswith("bubble: simulated 0.273")
    assert "measured" not in bubble_text(simulated)
    figure = draw_pipeline_gantt(simulated)
    words = " ".join(text.get_text() for text in figure.texts)
    assert "simulated" in words and "measured" not in words
    real = pipeline_chart(real_pipeline_trace())
    assert bubble_text(real).startswith("bubble: measured ")


def test_an_incomplete_order_draws_one_panel():
    header, events = real_pipeline_trace("1f1b", 2, 2)
    # rank 1 lost its last backward: the order cannot be replayed
    last = max((e for e in events if e["rank"] == 1 and "pipeline=B" in e["label"]),
               key=lambda e: e["start"])
    events = [e for e in events if e is not last]
    chart = pipeline_chart((header, events), batch=0)
    assert schedule_order_chart(chart) is None
    assert len(draw_pipeline_gantt(chart).axes) == 1
