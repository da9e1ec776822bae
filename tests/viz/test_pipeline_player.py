"""A pipeline batch in the browser's player: its steps are the chart's time
slots (step 0 before the first), each stage's row the terminal's cells in
the Gantt chart's colours (I and W their own), the boxes started in a slot
outlined, the messages sent in it listed; the page needs no network.
"""

from __future__ import annotations

import json
import re

from minidist import trace
from minidist.parallel.pipeline import make_schedule, simulate_schedule
from viz.pipeline_chart import pipeline_chart
from viz.pipeline_player import pipeline_player_panel, save_pipeline_player
from viz.terminal import PALETTE

GREEN, PURPLE = "#009E73", "#CC79A7"


def _planned(name="dualpipev", stages=3, microbatches=6):
    schedule = make_schedule(name, stages, microbatches)
    chunk = 1 / schedule.virtual_stages
    events = simulate_schedule(schedule, chunk, 2 * chunk)
    header = dict(trace.make_header(stages, transport="sim"), **schedule.header())
    return schedule, events, pipeline_chart((header, events))


def test_each_step_is_a_time_slot_of_the_chart():
    schedule, events, chart = _planned()
    panel = pipeline_player_panel(chart, events)
    assert len(panel["steps"]) == chart.slots + 1 and panel["follow"]
    assert panel["steps"][0]["header"][1] == "before the batch's first slot"
    for step, frame in enumerate(panel["steps"]):
        for row, rank in enumerate(frame["scene"]["ranks"]):
            texts = [cell[3] for cell in rank["cells"]]
            # the terminal's row up to this slot: a box's text where it starts,
            # "·" where it idles ("..")
            expected = [{".": "·", "-": ""}.get(cell[0], cell.strip())
                        for cell in chart.grid[row][:step]] + [""] * (chart.slots - step)
            assert texts == expected, (step, row)
            outlined = [cell[3] for cell in rank["cells"] if cell[5]]
            assert outlined == ([chart.grid[row][step - 1].strip()]
                                if step and not chart.grid[row][step - 1].startswith((".", "-"))
                                else [])
    last = panel["steps"][-1]["scene"]["ranks"]
    for row, rank in enumerate(last):
        for cell, box_text in zip(rank["cells"], chart.grid[row]):
            text = box_text.strip()
            if text.startswith("I"):
                assert cell[2] == GREEN
            elif text.startswith("W"):
                assert cell[2] == PURPLE
            elif text[:1] in ("F", "B"):
                microbatch = int(re.match(r"[FB](\d+)", text).group(1))
                assert cell[2] == PALETTE[microbatch % len(PALETTE)]
    # every message of the batch, once, in the slot it was sent
    sent = [message for frame in panel["steps"] for message in frame["messages"]]
    assert len(sent) == sum(event["kind"] == "send" for event in events) > 0
    assert all(src != dst for src, dst, _ in sent)
    labels = [entry["label"] for entry in panel["legend"]]
    assert "I3: input half of its backward" in labels and "W3: its weight half" in labels


def test_the_page_needs_no_network(tmp_path):
    _, events, chart = _planned("zb_h1", 4, 8)
    path = save_pipeline_player(
        (dict(trace.make_header(4, transport="sim"), **make_schedule("zb_h1", 4, 8).header()),
         events), tmp_path / "pipeline.html")
    page = open(path).read()
    assert page.startswith("<!doctype html>")
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    data = json.loads(re.search(r"const data = (\{.*?\});\n", page).group(1))
    assert len(data["panels"][0]["steps"]) == chart.slots + 1
    assert f"slot {chart.slots} of {chart.slots}" in page
