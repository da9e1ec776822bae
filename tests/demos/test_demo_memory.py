"""`minidist demo memory`: DDP and ZeRO stages 1-3 on the digits MLP, the
ledger of each rank shown per strategy, model-state bytes equal to
zero_model_state_bytes, the trace's memory events drawn with --plot."""

import re

import pytest

from minidist import trace
from minidist.cli import DEMO_NPROC, STRATEGY_DEMOS, main
from minidist.memory import memory_timeline
from minidist.parallel.data.costs import zero_model_state_bytes
from minidist.train import build_model


@pytest.mark.timeout(120)
def test_demo_measures_each_stage_and_plots(tmp_path, capsys):
    assert STRATEGY_DEMOS["memory"] == "viz.demo_memory" and DEMO_NPROC["memory"] == 2
    path, picture = tmp_path / "memory.trace.jsonl", tmp_path / "memory.png"
    assert main(["demo", "memory", "--trace", str(path), "--plot", str(picture)]) == 0
    out = capsys.readouterr().out
    psi = build_model("mlp").num_parameters()
    for stage, name in enumerate(("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")):
        for rank in (0, 1):   # not a terminal: one plain line per rank and strategy
            assert re.search(rf"rank {rank}  {name}  step 3/3  params [\d.]+ KiB", out), out
        line = re.search(rf"  {name} +measured rank 0 ([\d,]+), rank 1 ([\d,]+)  formula ([\d,]+)",
                         out)
        assert line, out
        measured = {int(line.group(i).replace(",", "")) for i in (1, 2)}
        assert measured == {round(zero_model_state_bytes(psi, 2, stage))}
        assert int(line.group(3).replace(",", "")) == round(zero_model_state_bytes(psi, 2, stage))
    assert picture.exists() and picture.stat().st_size > 0
    timeline = memory_timeline(trace.read_jsonl(path).events)
    assert set(timeline) == {0, 1}
    assert all(len(samples) == 4 * 3 * 4 for samples in timeline.values())  # 4 samples x 3 steps x 4


def test_demo_rejects_a_bad_process_count(capsys):
    assert main(["demo", "memory", "-n", "0"]) == 2
    assert "-n must be at least 1" in capsys.readouterr().out


def test_the_formula_gap_names_the_uneven_shards():
    from viz.demo_memory import shard_gap

    assert shard_gap(153_760, 153_760.0, [8192, 128, 1280, 10], 2) == ""
    assert shard_gap(102_520, 102_506.7, [8192, 128, 1280, 10], 3) == (
        "+13 B: 4 of 4 tensors do not split evenly in 3: shards rounded up, the formula is "
        "psi / N")
    assert shard_gap(1_010, 1_000.0, [8, 4], 2).endswith("no known cause (every tensor "
                                                         "splits evenly)")
