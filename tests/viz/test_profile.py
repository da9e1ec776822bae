"""The profile of a trace (minidist.profile) on hand-built traces whose
answers are known, and ``minidist profile`` on good and bad files.

Each synthetic trace is a few events in milliseconds; every number the
profile gives is checked against the intervals it hands back, and the
classes of a rank against its span: compute + exposed + waiting + unmarked
= span, overlapped inside compute, no two classes at the same moment.
"""

from __future__ import annotations

import json

import pytest

from minidist import trace
from minidist.cli import main
from minidist.profile import ProfileError, chrome_with_profile, profile
from minidist.profile.breakdown import waited_time
from minidist.profile.intervals import intersect, length, subtract, union

MS = 1_000_000


def event(rank, kind, start_ms, end_ms, **fields):
    found = {"rank": rank, "kind": kind, "start": round(start_ms * MS),
             "end": round(end_ms * MS), "peer": None, "bytes": 0, "tag": None, "label": "",
             "seq": None, "group": 0, "channel": 0}
    found.update(fields)
    return found


def collective(rank, start_ms, end_ms, call=0, inside_ms=None, world=2, group=0):
    label = trace.with_info("all_reduce ring", call=call, collective="all_reduce",
                            algorithm="ring", world=world, group=group)
    if inside_ms is not None:  # an async_op call: the rank spent this long in its wait()
        label += f" async=1 inside={round(inside_ms * MS)}"
    return event(rank, "collective", start_ms, end_ms, label=label, group=group)


def message(rank, kind, peer, seq, start_ms, end_ms, label="act mb=0", group=0):
    return event(rank, kind, start_ms, end_ms, peer=peer, seq=seq, bytes=64, label=label,
                 group=group)


def check_sums(found):
    """The invariants every breakdown holds, to the nanosecond."""
    for breakdown in list(found.ranks.values()) + [found.overall]:
        span = breakdown.ns("span")
        assert (breakdown.ns("compute") + breakdown.ns("exposed") + breakdown.ns("idle")
                == span)
        assert breakdown.ns("overlapped") <= breakdown.ns("communication")
        assert breakdown.ns("idle") == breakdown.ns("waiting") + breakdown.ns("unmarked")
    for breakdown in found.ranks.values():
        classes = [breakdown.compute, breakdown.exposed, breakdown.waiting, breakdown.unmarked]
        for i, first in enumerate(classes):
            for second in classes[i + 1:]:
                assert not intersect(first, second)
        assert not subtract(breakdown.overlapped, breakdown.compute)
        waits = found.waits.get(breakdown.rank, [])
        assert sum(waited_time(waits, breakdown).values()) == breakdown.ns("waiting")


def test_interval_arithmetic():
    assert union([(5, 9), (0, 3), (2, 4), (7, 8), (10, 10)]) == [(0, 4), (5, 9)]
    assert intersect([(0, 10)], [(5, 15)]) == [(5, 10)]
    assert subtract([(0, 10), (12, 20)], [(2, 3), (9, 13)]) == [(0, 2), (3, 9), (13, 20)]
    assert length([(0, 4), (5, 9)]) == 8


def test_an_all_reduce_half_under_compute_is_half_overlapped():
    """Compute 0-10 ms, an async_op all_reduce 5-15 ms waited on from 10 ms."""
    found = profile([event(0, "compute", 0, 10, label="backward"),
                     collective(0, 5, 15, inside_ms=5)])
    rank = found.ranks[0]
    assert rank.overlapped == [(5 * MS, 10 * MS)]
    assert rank.exposed == [(10 * MS, 15 * MS)]
    assert rank.ns("compute") == 10 * MS and rank.ns("communication") == 10 * MS
    assert rank.overlap_percent == pytest.approx(50.0)
    assert found.overall.overlap_percent == pytest.approx(50.0)
    check_sums(found)


def test_a_blocking_call_inside_a_compute_region_is_not_compute():
    """The same times, a blocking all_reduce: the rank sat in it from 5 ms on,
    so the region computed 5 ms, and all 10 ms of the call are exposed."""
    found = profile([event(0, "compute", 0, 10), collective(0, 5, 15)])
    rank = found.ranks[0]
    assert rank.ns("compute") == 5 * MS and rank.ns("overlapped") == 0
    assert rank.ns("exposed") == 10 * MS and rank.overlap_percent == 0
    check_sums(found)


def late_peer_trace():
    """Rank 0 computes 10 ms, then sends; rank 1 computes 7 ms and posts its
    receive at 7 ms: it waits 3 ms for the send to start, then 1 ms of bytes."""
    return [event(0, "compute", 0, 10, label="F0"), message(0, "send", 1, 0, 10, 10.5),
            event(1, "compute", 0, 7, label="F0"), message(1, "recv", 0, 0, 7, 11)]


def test_a_rank_that_waits_for_a_late_peer():
    found = profile(late_peer_trace())
    late = found.ranks[1]
    assert late.waiting == [(7 * MS, 10 * MS)] and late.ns("idle") == 3 * MS
    assert late.ns("exposed") == 1 * MS and late.ns("unmarked") == 0
    assert found.ranks[0].ns("waiting") == 0
    slowest = found.slowest
    assert (slowest.rank, slowest.peer, slowest.what) == (1, 0, "point-to-point 'act mb=0'")
    assert slowest.waiting_ns == slowest.peer_ns == 3 * MS
    assert slowest.most_waited_for == 0
    check_sums(found)


def test_a_call_whose_member_entered_late_waits_for_it():
    """No messages recorded: the call's wait runs to the last member's start."""
    found = profile([collective(0, 0, 6), collective(1, 4, 6)])
    assert found.ranks[0].waiting == [(0, 4 * MS)]
    assert found.slowest.rank == 0 and found.slowest.what == "all_reduce ring"
    check_sums(found)


def test_steps_mesh_dimensions_and_the_gaps_rule():
    events = []
    for step in range(3):  # two ranks of a 2 x 2 (dp, tp) mesh's row: tp along 0-1
        at = 10 * step
        for rank in (0, 1):
            events.append(event(rank, "compute", at, at + 6, label="forward"))
            events.append(collective(rank, at + 6, at + 9, call=step, group=1))
            events.append(message(rank, "send", 1 - rank, 10 + step, at + 6, at + 8,
                                  label=f"all_reduce ring # call={step}", group=1))
        events.append(message(0, "send", 2, step, at + 9, at + 9.5, label="p2p", group=2))
    found = profile(trace.Trace({"schema": trace.SCHEMA, "mesh_shape": [2, 2],
                                 "mesh_dim_names": ["dp", "tp"]}, events))
    assert len(found.steps) == 3
    assert all(step.overall.ns("compute") == 2 * 6 * MS for step in found.steps)
    assert found.dimensions["tp"][0].ns("communication") == 3 * 3 * MS
    assert found.dimensions["dp"][0].ns("communication") == 3 * 0.5 * MS
    check_sums(found)
    gaps = profile([e for e in events if e["kind"] != "compute"])
    assert gaps.rule == "gaps" and gaps.overall.ns("overlapped") == 0
    assert gaps.ranks[1].ns("compute") == 2 * 7 * MS  # between its three calls
    check_sums(gaps)


def test_a_pipeline_step_region_ends_each_step():
    events = [event(0, "compute", 0, 2, label="F0"), event(0, "compute", 2, 3, label="step"),
              event(0, "compute", 3, 5, label="F0"), event(0, "compute", 5, 6, label="step")]
    found = profile(events)
    assert [s.ranks[0].span for s in found.steps] == [[(0, 3 * MS)], [(3 * MS, 6 * MS)]]


def test_an_older_trace_without_seq_is_profiled_and_says_what_it_could_not_pair():
    events = late_peer_trace()
    for e in events:
        del e["seq"], e["group"], e["channel"]
    found = profile(events)
    assert found.ranks[1].ns("waiting") == 0 and found.ranks[1].ns("exposed") == 4 * MS
    assert any("carry no seq" in line for line in found.skipped)
    check_sums(found)


def test_the_chrome_trace_carries_the_profile():
    chrome = chrome_with_profile(late_peer_trace())
    numbers = chrome["otherData"]["profile"]
    assert numbers["ranks"]["1"]["waiting"] == 3 * MS
    assert numbers["slowest"]["rank"] == 1
    assert any(e.get("ph") == "X" for e in chrome["traceEvents"])


# --------------------------------------------------------------------------- files and the CLI


def write(path, header, events, cut=False):
    lines = ([json.dumps(header)] if header is not None else []) + [json.dumps(e) for e in events]
    text = "\n".join(lines) + "\n"
    path.write_text(text[:-15] if cut else text)
    return str(path)


HEADER = {"schema": trace.SCHEMA, "version": 2, "world_size": 2, "events": 4}


def test_the_command_prints_the_table_the_slowest_rank_a_picture_and_chrome(tmp_path, capsys):
    path = write(tmp_path / "t.jsonl", HEADER, late_peer_trace())
    picture, chrome = tmp_path / "p.png", tmp_path / "c.json"
    assert main(["profile", path, "--steps", "--picture", str(picture),
                 "--chrome", str(chrome)]) == 0
    out = capsys.readouterr().out
    assert "rank 1" in out and "all" in out and "overlap" in out
    assert "slowest rank: 1" in out and "most for rank 0" in out
    assert picture.stat().st_size > 1000
    assert json.loads(chrome.read_text())["otherData"]["profile"]["ranks"]["1"]["idle"] == 3 * MS
    assert main(["profile", path, "--rank", "0"]) == 0
    assert "rank 1 " not in capsys.readouterr().out


def test_the_command_prints_steps_and_mesh_dimensions(tmp_path, capsys):
    header = {"schema": trace.SCHEMA, "version": 2, "world_size": 4, "mesh_shape": [2, 2],
              "mesh_dim_names": ["dp", "tp"]}
    events = []
    for step in range(2):
        for rank in (0, 1):
            events += [event(rank, "compute", 10 * step, 10 * step + 6, label="forward"),
                       collective(rank, 10 * step + 6, 10 * step + 9, call=step, group=1)]
            events.append(message(rank, "send", 1 - rank, step, 10 * step + 6, 10 * step + 8,
                                  label=f"all_reduce ring # call={step}", group=1))
            events.append(message(1 - rank, "recv", rank, step, 10 * step + 6, 10 * step + 8,
                                  label=f"all_reduce ring # call={step}", group=1))
    path = write(tmp_path / "mesh.jsonl", dict(header, events=len(events)), events)
    assert main(["profile", path, "--steps"]) == 1  # ranks 2 and 3 recorded nothing
    out = capsys.readouterr().out
    assert "step 1" in out and "step 2" in out
    assert "by mesh dimension (dp x tp = 2 x 2)" in out and " tp " in out
    assert "ranks 2, 3 of the 4 recorded no events" in out


def test_the_command_fits_in_80_columns(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    events = []
    for rank in range(12):  # rank 11's numbers are the widest
        events += [event(rank, "compute", 0, 12_000), collective(rank, 500, 13_000, inside_ms=2)]
    path = write(tmp_path / "wide.jsonl", {"schema": trace.SCHEMA, "world_size": 12}, events)
    assert main(["profile", path, "--steps", "--rank", "11"]) == 0
    assert main(["profile", path]) == 0
    for line in capsys.readouterr().out.splitlines():
        assert len(line) <= 80 and "…" not in line, line


def test_an_older_trace_says_what_it_could_not_measure(tmp_path, capsys):
    events = late_peer_trace()
    for e in events:
        del e["seq"]
    path = write(tmp_path / "v1.jsonl", {"schema": trace.SCHEMA, "version": 1}, events)
    assert main(["profile", path]) == 1
    assert "carry no seq" in capsys.readouterr().err


@pytest.mark.parametrize("case, status, words", [
    ("missing", 2, "no trace at"),
    ("empty", 2, "is empty"),
    ("not a trace", 2, "not a minidist trace"),
    ("header only", 2, "no events to profile"),
    ("cut last line", 1, "partial numbers: the last line (5) is cut short"),
    ("no header", 1, "partial numbers"),
    ("failed run", 1, "one end only"),
    ("no such rank", 2, "rank 7 is not in"),
])
def test_bad_traces_are_one_line_and_a_status(tmp_path, capsys, case, status, words):
    path = str(tmp_path / "t.jsonl")
    events = late_peer_trace()
    argv = ["profile", path]
    if case == "empty":
        (tmp_path / "t.jsonl").write_text("")
    elif case == "not a trace":
        (tmp_path / "t.jsonl").write_text('{"hello": 1}\n')
    elif case == "header only":
        write(tmp_path / "t.jsonl", HEADER, [])
    elif case == "cut last line":
        write(tmp_path / "t.jsonl", HEADER, events, cut=True)
    elif case == "no header":
        write(tmp_path / "t.jsonl", None, events)
    elif case == "failed run":  # rank 1 died before its receive was recorded
        write(tmp_path / "t.jsonl", dict(HEADER, events=3), events[:3])
    elif case == "no such rank":
        write(tmp_path / "t.jsonl", HEADER, events)
        argv += ["--rank", "7"]
    assert main(argv) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert "Traceback" not in err[0]


def test_profile_refuses_what_is_no_trace_in_one_line(tmp_path):
    with pytest.raises(ProfileError, match="no events"):
        profile([])


def test_an_elastic_runs_attempts_pair_their_messages_apart():
    """Each attempt numbers its messages afresh: seq 0 twice, told apart by attempt."""
    events = []
    for attempt, at in ((0, 0), (1, 100)):
        for e in late_peer_trace():
            e.update(attempt=attempt, start=e["start"] + at * MS, end=e["end"] + at * MS)
            events.append(e)
    found = profile(trace.Trace({"schema": trace.SCHEMA, "attempts": [{}, {}]}, events))
    assert found.ranks[1].ns("waiting") == 2 * 3 * MS
    assert any("elastic run of 2 attempts" in line for line in found.remarks)
    check_sums(found)


@pytest.mark.parametrize("ranks", [1, 2, 9])
def test_the_pictures_legend_covers_nothing(ranks):
    """The legend's box meets neither the axis (its bars, labels and
    percentages) nor the figure's edge, whatever the number of rows."""
    from viz.profile_bars import draw_profile_bars, segment_lengths

    events = []
    for rank in range(ranks):
        events += [event(rank, "compute", 0, 10 + rank), collective(rank, 5, 15 + rank,
                                                                    inside_ms=3)]
    found = profile(events)
    for breakdown in found.ranks.values():
        assert sum(segment_lengths(breakdown).values()) == breakdown.ns("span")
    figure = draw_profile_bars(found)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    legend = figure.legends[0].get_window_extent(renderer)
    axis = figure.axes[0].get_tightbbox(renderer)
    assert not legend.overlaps(axis)
    assert legend.y0 >= 0 and legend.x0 >= 0 and legend.x1 <= figure.bbox.x1
    assert axis.y1 <= figure.bbox.y1
