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


def ring_messages(ranks=4, per_rank=3000):
    """``per_rank`` sends from each rank to the next, each with its recv."""
    events = []
    for rank in range(ranks):
        for seq in range(per_rank):
            start = seq * 1000
            events.append({"rank": rank, "kind": "send", "peer": (rank + 1) % 4, "bytes": 8,
                           "tag": 1, "label": "", "start": start, "end": start + 300,
                           "seq": seq, "group": 0, "channel": 0})
            events.append({"rank": (rank + 1) % 4, "kind": "recv", "peer": rank, "bytes": 8,
                           "tag": 1, "label": "", "start": start + 400, "end": start + 700,
                           "seq": seq, "group": 0, "channel": 0})
    return events


def test_big_trace_is_merged_and_sampled_and_says_so(tmp_path):
    events = ring_messages()
    figure = timeline.draw_timeline(events)
    notes = " ".join(text.get_text() for text in figure.texts)
    assert "merged" in notes and "every 6th drawn" in notes
    figure.savefig(tmp_path / "big.png")


def test_ordinals():
    expected = {1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 10: "10th", 11: "11th", 12: "12th",
                13: "13th", 21: "21st", 22: "22nd", 23: "23rd", 101: "101st", 111: "111th",
                112: "112th", 113: "113th", 1002: "1002nd"}
    assert {number: timeline.ordinal(number) for number in expected} == expected


def test_the_sampling_note_says_every_3rd():
    figure = timeline.draw_timeline(ring_messages(), max_arrows=4000, max_events=10**6)
    notes = " ".join(text.get_text() for text in figure.texts)
    assert "every 3rd drawn" in notes and "3th" not in notes


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


def training_run(steps: int, ranks: int = 2) -> list[dict]:
    """``steps`` steps of forward, backward and a message to the next rank."""
    events = []
    for step in range(steps):
        base = step * 10_000
        for rank in range(ranks):
            for label, start, end in (("forward", 0, 3000), ("backward", 3000, 7000)):
                events.append({"rank": rank, "kind": "compute", "peer": None, "bytes": 0,
                               "tag": None, "label": label, "start": base + start,
                               "end": base + end, "seq": None, "group": 0, "channel": 0})
            peer = (rank + 1) % ranks
            events.append({"rank": rank, "kind": "send", "peer": peer, "bytes": 8, "tag": 1,
                           "label": "", "start": base + 7000, "end": base + 7500, "seq": step,
                           "group": 0, "channel": 0})
            events.append({"rank": peer, "kind": "recv", "peer": rank, "bytes": 8, "tag": 1,
                           "label": "", "start": base + 7000, "end": base + 8000, "seq": step,
                           "group": 0, "channel": 0})
    return events


def drawn_boxes(figure) -> int:
    return sum(len(collection.get_paths()) for axis in figure.axes
               for collection in axis.collections)


def test_a_run_of_many_steps_is_windowed_to_its_first_steps():
    counts = {}
    for steps in (9, 100, 1000):
        figure = timeline.draw_timeline(training_run(steps))
        notes = " ".join(text.get_text() for text in figure.texts)
        assert f"steps 1-{timeline.MAX_STEPS} of {steps} shown" in notes
        assert "'forward' of rank 0" in notes
        counts[steps] = drawn_boxes(figure)
    # As many boxes for a thousand steps as for nine: the window, not the run.
    assert counts[9] == counts[100] == counts[1000] > 0
    everything = drawn_boxes(timeline.draw_timeline(training_run(100), max_steps=None))
    assert everything > 5 * counts[100]


def test_a_short_run_is_drawn_whole():
    figure = timeline.draw_timeline(training_run(timeline.MAX_STEPS))
    assert "shown" not in " ".join(text.get_text() for text in figure.texts)
    assert timeline.step_starts(training_run(3)) == ("forward", [0, 10_000, 20_000])
    assert timeline.window_steps(ring_messages(2, 5))[1] == ""  # no compute: no steps


def _colours_without_a_name(figure) -> set[str]:
    """The fills the timeline draws that no legend swatch has."""
    from matplotlib.colors import to_hex

    axis = figure.axes[0]
    drawn = {to_hex(colour) for collection in axis.collections
             for colour in collection.get_facecolors()}
    named = {to_hex(handle.get_facecolor()) for handle in axis.get_legend().legend_handles}
    return drawn - named


def test_the_legend_names_every_colour_drawn():
    """Lane colours and, coloured by mesh dimension, each dimension's, the
    spans of no group and the lines of the messages: all in the legend, whose
    text stays clear of the rest."""
    from legends import legend_texts
    from text_layout import text_problems

    for options in ({"color_by": "lane"}, {"color_by": "mesh", "mesh": ((3,), ("dp",))}):
        figure = timeline.draw_timeline(events_with_compute(), **options)
        assert _colours_without_a_name(figure) == set(), options
        assert text_problems(figure) == [], options
        assert any(text.startswith("line: send start → recv end") for text in legend_texts(figure))
