"""`minidist demo model-parallel`: the digits MLP trained with a column split
then a row split on real processes, the bytes of one step from the formula
next to the trace, and the last step's collective calls stepped through
(standard output is not a terminal here, so every frame is printed)."""

from __future__ import annotations

import re

import pytest
from PIL import Image

from minidist import trace
from minidist.cli import DEMO_NPROC, STRATEGY_DEMOS, main


def _printed(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.timeout(120)
def test_demo_model_parallel_trains_counts_bytes_and_steps_through(tmp_path, capsys):
    assert STRATEGY_DEMOS["model-parallel"] == "viz.demo_model_parallel"
    assert DEMO_NPROC["model-parallel"] == 2
    path, png = tmp_path / "mp.jsonl", tmp_path / "step.png"
    # No -n: the demo's default of 2 processes.
    assert main(["demo", "model-parallel", "--epochs", "1", "--trace", str(path),
                 "--timeline", str(png), "--no-color"]) == 0
    out = _printed(capsys)
    assert "split over 2 processes" in out and "epoch 1: mean loss" in out
    accuracy = float(re.search(r"test accuracy ([\d.]+)", out).group(1))
    assert 0.6 < accuracy <= 1.0, out
    assert "hidden units 0:64, 64:128" in out
    # The row layer's all_reduce of the 64 x 10 partial logits: 2,560 bytes per rank
    # on 2 ranks, the formula's count, equal to the trace; data parallel 9,610 values.
    assert "one step, formula 2,560, 2,560" in out
    assert "one step, trace of the last step 2,560, 2,560" in out
    assert "38,440, 38,440" in out
    assert "the last step's 1 collective call: all_reduce (ring, 640 x 4 bytes)" in out
    assert "step 1 of 2 · reduce-scatter" in out and "step 2 of 2 · allgather" in out
    assert f"timeline of the last step written to {png}" in out
    with Image.open(png) as image:
        assert image.size[0] > 0

    events = trace.read_jsonl(path).events
    steps = {e["label"] for e in events if e["kind"] == "step"}
    assert len(steps) == 22  # one epoch of the digits at batch 64
    collectives = {trace.label_info(e["label"]).get("collective") for e in events
                   if e["kind"] == "collective"}
    assert collectives == {"all_reduce"}


@pytest.mark.timeout(120)
def test_demo_model_parallel_on_four_ranks(tmp_path, capsys):
    assert main(["demo", "model-parallel", "-n", "4", "--epochs", "1", "--no-color",
                 "--trace", str(tmp_path / "mp4.jsonl")]) == 0
    out = _printed(capsys)
    assert "hidden units 0:32, 32:64, 64:96, 96:128" in out
    # ring all_reduce of 640 values on 4 ranks: 2 (n-1)/n x 640 = 960 values each
    assert "one step, trace of the last step 3,840, 3,840, 3,840, 3,840" in out
    assert "step 6 of 6 · allgather" in out


def test_demo_model_parallel_bad_input(capsys):
    assert main(["demo", "model-parallel", "-n", "3"]) == 2
    assert "-n must divide the hidden layer's 128 units" in _printed(capsys)
    assert main(["demo", "model-parallel", "--epochs", "0"]) == 2
    assert "--epochs must be at least 1, got 0" in _printed(capsys)
