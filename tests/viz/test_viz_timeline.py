"""The timeline PNG and the Chrome / Perfetto export, for any trace."""

import json

from PIL import Image
from viz_reference import ring_all_reduce_events

from minidist import trace
from viz import timeline


def events_with_compute(n=3):
    events = ring_all_reduce_events(n, count=12)
    for rank in range(n):
        events.append({"rank": rank, "kind": "compute", "peer": None, "bytes": 0, "tag": None,
                       "label": f"forward mb={rank}", "start": -4000, "end": -1000 - rank * 500,
                       "seq": None, "group": 0, "channel": 0})
    return events


def test_timeline_png(tmp_path):
    path = timeline.save_timeline(events_with_compute(), tmp_path / "timeline.png")
    with Image.open(path) as image:
        width, height = image.size
    assert 800 <= width <= 2000 and 200 <= height <= 3000


def test_idle_gaps_are_where_a_rank_does_nothing():
    events = [{"rank": 0, "kind": "compute", "start": 0, "end": 10},
              {"rank": 0, "kind": "send", "start": 30, "end": 40},
              {"rank": 0, "kind": "collective", "start": 0, "end": 60}]
    assert timeline.idle_intervals(events) == [(10, 30), (40, 60)]


def test_big_trace_is_merged_and_sampled_and_says_so(tmp_path):
    events = []
    for rank in range(4):
        for seq in range(3000):
            start = seq * 1000
            events.append({"rank": rank, "kind": "send", "peer": (rank + 1) % 4, "bytes": 8,
                           "tag": 1, "label": "", "start": start, "end": start + 300,
                           "seq": seq, "group": 0, "channel": 0})
            events.append({"rank": (rank + 1) % 4, "kind": "recv", "peer": rank, "bytes": 8,
                           "tag": 1, "label": "", "start": start + 400, "end": start + 700,
                           "seq": seq, "group": 0, "channel": 0})
    figure = timeline.draw_timeline(events)
    notes = " ".join(text.get_text() for text in figure.texts)
    assert "merged" in notes and "every 6th drawn" in notes
    figure.savefig(tmp_path / "big.png")


def test_chrome_export_has_one_flow_arrow_per_message(tmp_path):
    events = events_with_compute()
    path = tmp_path / "trace.json"
    trace.write_chrome(path, events, trace.make_header(3))
    data = json.loads(path.read_text())
    slices = [event for event in data["traceEvents"] if event["ph"] == "X"]
    outs = [event["bind_id"] for event in slices if event.get("flow_out")]
    ins = [event["bind_id"] for event in slices if event.get("flow_in")]
    messages = timeline.message_count(events)
    assert messages == 2 * (3 - 1) * 3
    assert sorted(outs) == sorted(ins) == list(range(1, messages + 1))
