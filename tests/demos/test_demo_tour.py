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
    assert "α 5 us, β 10 GB/s links, γ 10 GB/s adding" in flat
