"""`minidist demo data-parallel`: DDP on the digits, with a live view in the
parent fed by the workers, a trace of every rank's all_reduce, and a
sensible accuracy at the end."""

import re

import pytest

from minidist import trace
from minidist.cli import STRATEGY_DEMOS, main


@pytest.mark.timeout(120)
def test_demo_trains_traces_and_reports(tmp_path, capsys):
    assert "data-parallel" in STRATEGY_DEMOS
    path = tmp_path / "dp.trace.jsonl"
    picture = tmp_path / "dp.png"
    assert main(["demo", "data-parallel", "-n", "2", "--epochs", "1", "--trace", str(path),
                 "--timeline", str(picture)]) == 0
    out = capsys.readouterr().out
    # Not a terminal: one plain progress line per rank and epoch, from the workers' queue.
    for rank in (0, 1):
        assert re.search(rf"rank {rank}  epoch 1/1  step (\d+)/\1  loss [\d.]+  "
                         r"sent [\d.]+ (?:KiB|MiB)", out), out
    accuracy = float(re.search(r"test accuracy ([\d.]+)", out).group(1))
    assert 0.7 < accuracy <= 1.0, out
    assert f"minidist viz {path} --timeline" in out
    assert picture.exists()

    events = trace.read_jsonl(path).events
    all_reduce_ranks = {e["rank"] for e in events if e["kind"] == "collective"
                        and trace.label_info(e["label"]).get("collective") == "all_reduce"}
    assert all_reduce_ranks == {0, 1}
    assert {e["label"] for e in events if e["kind"] == "compute"} >= {"forward", "backward",
                                                                        "update"}
    # The bytes per step against the ring's formula, split by the call that sent them.
    flat = " ".join(out.split())
    assert re.search(r"rank 0's, by call: all_reduce ring [\d,]+ \+ all_reduce one_shot 8;", flat)
    assert "vs the formula's 38,440: equal" in flat


def test_ring_bytes_against_the_formula():
    from viz.demo_data_parallel import bytes_per_step_by_call, ring_gap

    assert ring_gap(38_440, 38_440.0, 2, 9_610) == "equal"
    assert ring_gap(51_256, 51_253.3, 3, 9_610) == (
        "+3 B: 9,610 elements in 3 chunks are unequal, and the formula is the ranks' mean")
    events = [{"rank": 0, "kind": "send", "label": "broadcast linear: to 1", "bytes": 64,
               "start": 0},
              {"rank": 0, "kind": "compute", "label": "forward", "bytes": 0, "start": 10},
              {"rank": 0, "kind": "send", "label": "all_reduce ring: step 0", "bytes": 100,
               "start": 20},
              {"rank": 0, "kind": "send", "label": "all_reduce one_shot: to 1", "bytes": 8,
               "start": 21},
              {"rank": 1, "kind": "send", "label": "all_reduce ring: step 0", "bytes": 7,
               "start": 22}]
    assert bytes_per_step_by_call(events, 0, 2) == {"all_reduce ring": 50.0,
                                                    "all_reduce one_shot": 4.0}


def test_demo_rejects_a_bad_process_count(capsys):
    assert main(["demo", "data-parallel", "-n", "0"]) == 2
    assert "-n must be at least 1" in capsys.readouterr().out
