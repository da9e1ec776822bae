"""`minidist demo` without a name (the README's `make demo`): the tour runs
its three parts to the end."""

import re

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
    # The table says where the ring's time goes: its three terms add up to it,
    # and it is not the 2 N beta of the bytes alone.
    terms = re.search(r"Where the ring's ([\d.]+) ms goes .*?= ([\d.]+) ms of latency; "
                      r"2\(n-1\)/n Nβ = ([\d.]+) ms .*?\(n-1\)/n Nγ = ([\d.]+) ms .*?"
                      r"2Nβ = ([\d.]+) ms", flat)
    assert terms, flat[-1500:]
    ring, latency, sending, adding, bytes_alone = map(float, terms.groups())
    assert abs(latency + sending + adding - ring) <= 0.15
    assert ring > 1.5 * bytes_alone
    # beta and gamma are seconds per byte (lessons/NOTATION.md), written as lessons write them
    assert "α = 5 us, β = 1 / 10 GB/s (links), γ = 1 / 10 GB/s (adding)" in flat
    assert "β 10 GB/s" not in flat
    # the replay says it shows its last frame, and how to see every step
    assert "Shown: the replay's last frame" in flat
    assert "To step through the frames with the keys: `minidist demo ring-allreduce -n 4`" in flat
    # the progress line's accuracy is the training batches', next to the test accuracy
    assert "train acc" in flat
