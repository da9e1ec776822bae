"""`minidist demo parameter-server`: the MLP on the digits by push and pull,
a live view in the parent fed by every process (servers and workers), a
trace with every worker's pushes and pulls, and the accuracy at the end."""

import re

import pytest

from minidist import trace
from minidist.cli import STRATEGY_DEMOS, main


@pytest.mark.timeout(120)
def test_demo_trains_reports_live_and_traces(tmp_path, capsys):
    assert "parameter-server" in STRATEGY_DEMOS
    path = tmp_path / "ps.trace.jsonl"
    assert main(["demo", "parameter-server", "-n", "3", "--servers", "1", "--mode", "ssp",
                 "--tau", "1", "--epochs", "1", "--trace", str(path)]) == 0
    out = capsys.readouterr().out
    steps = int(re.search(r"(\d+) steps per worker", out).group(1))
    # Not a terminal: plain reports, the servers' line then the workers'; the
    # last one, after every process's final report, has each worker at its
    # last step and the server at version `steps`.
    reports = re.findall(r"^ *[\d.]+ s  (server versions \[.*)\n( +worker steps .*)$", out,
                         re.MULTILINE)
    assert reports, out
    servers, workers = reports[-1]
    assert f"server versions [{steps}]" in servers, out
    assert f"worker steps [{steps}, {steps}]" in workers, out
    staleness = re.search(r"staleness \[(\d+), (\d+)\]", workers)
    assert staleness and max(map(int, staleness.groups())) <= 1, out
    accuracy = float(re.search(r"test accuracy ([\d.]+)", out).group(1))
    assert 0.1 < accuracy <= 1.0, out
    assert f"minidist viz {path} --timeline" in out

    events = trace.read_jsonl(path).events
    for kind in ("push", "pull"):
        senders = {e["rank"] for e in events if e["kind"] == "send"
                   and trace.label_info(e["label"]).get("kind") == kind}
        assert {1, 2} <= senders, (kind, senders)
    updates = [e for e in events if e["rank"] == 0 and e["kind"] == "compute"
               and trace.label_info(e["label"]).get("kind") == "update"]
    assert len(updates) == steps


@pytest.mark.parametrize("argv, message", [
    (["-n", "3", "--servers", "3"], "--servers must be from 1 to 2"),
    (["-n", "1"], "-n must be at least 2"),
    (["-n", "3", "--mode", "sync"], "unknown --mode 'sync'"),
])
def test_demo_rejects_bad_arguments(argv, message, capsys):
    assert main(["demo", "parameter-server", *argv]) == 2
    assert message in capsys.readouterr().out
