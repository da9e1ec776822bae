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
        assert re.search(rf"rank {rank}  epoch 1/1  step (\d+)/\1  loss [\d.]+  sent [\d.]+ MB",
                         out), out
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


def test_demo_rejects_a_bad_process_count(capsys):
    assert main(["demo", "data-parallel", "-n", "0"]) == 2
    assert "-n must be at least 1" in capsys.readouterr().out
