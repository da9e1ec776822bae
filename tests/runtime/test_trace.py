"""The trace: what the transports record, the JSON-lines file, and the Chrome /
Perfetto export's invariants (checked in pure Python, no viewer needed)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
import minidist.distributed as dist
from minidist import trace


def check_chrome(chrome: dict) -> None:
    """The invariants trace viewers rely on."""
    events = chrome["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    named_processes = {e["pid"] for e in events
                       if e["ph"] == "M" and e["name"] == "process_name"}
    named_threads = {(e["pid"], e["tid"]) for e in events
                     if e["ph"] == "M" and e["name"] == "thread_name"}
    for item in slices:
        assert item["dur"] >= 0 and item["ts"] >= 0
        assert isinstance(item["pid"], int) and isinstance(item["tid"], int)
        assert item["pid"] in named_processes and (item["pid"], item["tid"]) in named_threads
    # Slices on one track nest or do not overlap (to within float rounding of
    # nanoseconds written as microseconds).
    tracks = defaultdict(list)
    for item in slices:
        tracks[(item["pid"], item["tid"])].append((item["ts"], item["ts"] + item["dur"]))
    for intervals in tracks.values():
        stack = []
        for start, end in sorted(intervals, key=lambda pair: (pair[0], -pair[1])):
            while stack and stack[-1] <= start + 1e-6:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, "slices on one track overlap"
            stack.append(end)
    # Each flow: exactly one start (on a send slice) and one end (on a recv slice).
    outs = defaultdict(list)
    ins = defaultdict(list)
    for item in slices:
        if item.get("flow_out"):
            outs[item["bind_id"]].append(item)
        if item.get("flow_in"):
            ins[item["bind_id"]].append(item)
    assert set(outs) == set(ins)
    for bind_id in outs:
        assert len(outs[bind_id]) == 1 and len(ins[bind_id]) == 1
        send, receive = outs[bind_id][0], ins[bind_id][0]
        assert send["cat"] == "send" and receive["cat"] == "recv"
        assert receive["ts"] + receive["dur"] >= send["ts"]  # never backwards in time


def event(rank, kind, start, end, peer=None, seq=None, nbytes=8, tag=0, label=""):
    return {"rank": rank, "kind": kind, "peer": peer, "bytes": nbytes, "tag": tag,
            "label": label, "start": start, "end": end, "seq": seq, "group": 0, "channel": 0}


def test_exporter_draws_arrows_lanes_and_names():
    events = [
        event(0, "compute", 0, 10_000, label="forward"),
        event(0, "compute", 1_000, 2_000, label="layer 1"),
        event(0, "send", 10_000, 11_000, peer=1, seq=0),
        event(0, "send", 10_500, 13_000, peer=1, seq=1),  # overlaps the first: own lane
        event(1, "recv", 9_000, 12_000, peer=0, seq=0),
        event(1, "recv", 12_000, 14_000, peer=0, seq=1),
        event(1, "send", 15_000, 16_000, peer=0, seq=0),  # never received: no arrow
        event(1, "step", 9_000, 16_000, label="ring step 1"),
    ]
    chrome = trace.to_chrome(events)
    check_chrome(chrome)
    slices = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert sum(1 for e in slices if e.get("flow_out")) == 2
    threads = {(e["pid"], e["args"]["name"]) for e in chrome["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    # Rank r is process r + 1.
    assert {(1, "compute"), (1, "send"), (1, "send 2"), (2, "recv"), (2, "step")} <= threads
    first = next(e for e in slices if e["name"] == "forward")
    assert first["ts"] == 0 and first["dur"] == 10.0  # microseconds
    json.dumps(chrome)


def test_rank_0_is_process_1_named_rank_0():
    """Perfetto takes pid 0 for the kernel's idle process, so no rank is drawn as it."""
    events = [event(0, "compute", 0, 10, label="forward"), event(0, "send", 10, 20, peer=2, seq=0),
              event(2, "recv", 12, 25, peer=0, seq=0)]
    chrome = trace.to_chrome(events)
    check_chrome(chrome)
    names = {e["pid"]: e["args"]["name"] for e in chrome["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {1: "rank 0", 3: "rank 2"}
    slices = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert {(e["name"], e["pid"]) for e in slices} >= {("forward", 1)}
    assert sorted(e["pid"] for e in slices) == [1, 1, 3]
    assert all(e["tid"] > 0 for e in chrome["traceEvents"] if e["name"] == "thread_name")


def test_chrome_file_replaces_a_link_at_its_path(tmp_path):
    """The export is renamed over its path, as every file minidist writes: a
    symbolic link there is replaced, not written through."""
    victim = tmp_path / "someone_else.txt"
    victim.write_text("theirs")
    path = tmp_path / "out.json"
    path.symlink_to(victim)
    trace.write_chrome(path, [event(0, "compute", 0, 10, label="forward")])
    assert not path.is_symlink() and victim.read_text() == "theirs"
    assert any(e.get("name") == "forward" for e in json.loads(path.read_text())["traceEvents"])


def test_a_failed_chrome_write_leaves_the_old_file_and_no_scraps(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("the old export")
    # A label JSON cannot hold: json.dump fails halfway through the file.
    broken = [event(0, "compute", 0, 10, label="forward"),
              event(0, "compute", 20, 30, label=object())]
    with pytest.raises(TypeError):
        trace.write_chrome(path, broken)
    assert path.read_text() == "the old export"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), max_size=30))
def test_any_overlapping_slices_are_placed_so_that_they_nest(spans):
    events = [event(0, "send", start, start + length, peer=1, seq=index)
              for index, (start, length) in enumerate(spans)]
    check_chrome(trace.to_chrome(events))


def test_jsonl_round_trip_and_header(tmp_path):
    path = tmp_path / "run.trace.jsonl"
    events = [event(1, "recv", 5, 9, peer=0, seq=0), event(0, "send", 3, 4, peer=1, seq=0)]
    assert trace.write_jsonl(path, events, trace.make_header(2, transport="shm")) == 2
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["schema"] == "minidist.trace" and header["version"] == trace.VERSION
    assert header["clock"] == "CLOCK_MONOTONIC" and header["world_size"] == 2
    back = trace.read_jsonl(path)
    assert [e["start"] for e in back.events] == [3, 5]  # sorted by start time
    assert list(trace.iter_messages(back.events))[0][1]["rank"] == 1


def test_reading_something_else_is_refused(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match="not start with a minidist trace header"):
        trace.read_jsonl(path)
    path.write_text(json.dumps({"schema": trace.SCHEMA, "version": trace.VERSION + 1}) + "\n")
    with pytest.raises(ValueError, match="Update minidist"):
        trace.read_jsonl(path)


def test_regions_and_records_cost_nothing_when_off():
    assert not trace.enabled()
    assert trace.region("anything") is trace.region("else")  # one shared no-op object
    with trace.region("work"):
        pass
    trace.record("compute", 0, 1)
    assert trace.stop_recording() == []


def traced_worker():
    rank, size = dist.get_rank(), dist.get_world_size()
    with trace.region(f"prepare {rank}"):
        data = np.full(1 << 16, rank, np.float32)
    right, left = (rank + 1) % size, (rank - 1) % size
    incoming = np.empty_like(data)
    request = dist.irecv(incoming, left, tag=1, label="ring")
    dist.isend(data, right, tag=1, label="ring").wait()
    request.wait()
    dist.send(np.arange(3), right, tag=2)
    dist.recv(np.empty(3, np.int64), left, tag=2)
    dist.barrier()
    return trace.enabled()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_a_traced_run_records_every_message_on_one_clock(tmp_path, transport):
    path = tmp_path / "ring.trace.jsonl"
    assert minidist.launch(traced_worker, world_size=3, transport=transport,
                           trace=str(path)) == [True] * 3
    recorded = trace.read_jsonl(path)
    assert recorded.header["world_size"] == 3 and recorded.header["transport"] == transport
    events = recorded.events
    assert {e["label"] for e in events if e["kind"] == "compute"} == \
        {"prepare 0", "prepare 1", "prepare 2"}
    pairs = list(trace.iter_messages(events))
    assert pairs and all(receive is not None for _, receive in pairs)
    for send, receive in pairs:
        assert send["bytes"] == receive["bytes"] and send["tag"] == receive["tag"]
        assert receive["end"] >= send["start"]
    ring = [send for send, _ in pairs if send["label"] == "ring"]
    assert len(ring) == 3 and all(send["bytes"] == 4 << 16 for send in ring)
    assert any(send["label"].startswith("barrier") for send, _ in pairs)
    chrome = trace.to_chrome(events, recorded.header)
    check_chrome(chrome)
    assert len({e["bind_id"] for e in chrome["traceEvents"] if e.get("flow_out")}) == len(pairs)
    trace.write_chrome(tmp_path / "ring.json", events)


@pytest.mark.timeout(60)
def test_tracing_is_off_unless_asked():
    assert minidist.launch(traced_worker, world_size=2) == [False, False]


@pytest.mark.timeout(60)
def test_a_failed_run_still_writes_what_was_recorded(tmp_path):
    path = tmp_path / "failed.trace.jsonl"

    def worker():
        if dist.get_rank() == 0:
            dist.send(np.zeros(2), 1)
            raise RuntimeError("after one message")
        dist.recv(np.zeros(2), 0)
        dist.recv(np.zeros(2), 0)

    with pytest.raises(dist.WorkerError):
        minidist.launch(worker, world_size=2, trace=str(path))
    kinds = sorted(e["kind"] for e in trace.read_jsonl(path).events)
    assert kinds == ["recv", "send"]
