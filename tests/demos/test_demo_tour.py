"""`minidist demo` without a name (the README's `make demo`): the tour runs
its three parts to the end."""

import pytest

from minidist.cli import main


@pytest.mark.timeout(180)
def test_the_main_demo_trains_replays_a_ring_and_simulates(capsys):
    assert main(["demo", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "test accuracy" in out
    assert "all_reduce · ring · 4 ranks" in out and "step 6 of 6" in out
    assert "256 simulated ranks" in out and "rabenseifner" in out
    # The measured ring against its model, with the ratio and this run's why.
    flat = " ".join(out.split())
    assert "whole call measured" in flat and "vs model" in flat and "x: " in flat
    assert "sim / model" in flat
