"""The simulator at scale: one rank standing for all in symmetric
algorithms gives the full simulation's numbers exactly, memory does not grow
with the square of the ranks, and long runs report their progress."""

from __future__ import annotations

import tracemalloc

import pytest

from minidist.cli import main
from minidist.distributed import simulator
from minidist.distributed.simulator import SYMMETRIC, WHOLE_ARRAYS, simulate
from minidist.distributed.transport.sim import SimulationStallError

# Sizes that are simulated whole (0, 96 B, 1 KB: pieces of unequal size
# for most n, so no symmetry) and scaled up from a few elements (100 MB).
SIZES = (0, 96, 1000, 100_000_000)


def _numbers(result):
    return result.time, result.clocks, result.messages, result.bytes


def test_one_rank_standing_for_all_gives_the_full_simulation_exactly():
    used = set()
    for collective, algorithm in sorted(SYMMETRIC):
        for n in (1, 2, 3, 5, 6, 8, 9):
            for nbytes in SIZES:
                full = simulate(collective, algorithm, n, nbytes, symmetry=False)
                reduced = simulate(collective, algorithm, n, nbytes)
                assert not full.symmetric
                # the same floats to the last bit: time, every clock, messages, bytes
                assert _numbers(reduced) == _numbers(full), (collective, algorithm, n, nbytes)
                if reduced.symmetric:
                    used.add((collective, algorithm))
                    assert reduced.buffers is None
    assert used == set(SYMMETRIC)  # every claim was exercised


def test_the_symmetric_ring_at_scale_still_equals_the_closed_form():
    for n in (1000, 4096):
        result = simulate("all_reduce", "ring", n, 100_000_000)
        assert result.symmetric and result.messages == 2 * n * (n - 1)
        assert result.time == pytest.approx(result.predicted, rel=1e-12)


def test_an_algorithm_wrongly_called_symmetric_stops_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(simulator, "SYMMETRIC", SYMMETRIC | {("all_reduce", "reduce_broadcast")})
    with pytest.raises(SimulationStallError, match="not symmetric as SYMMETRIC claims"):
        simulate("all_reduce", "reduce_broadcast", 8, 100_000_000)
    # and without symmetry it runs as always
    assert simulate("all_reduce", "reduce_broadcast", 8, 100_000_000,
                    symmetry=False).time > 0


def test_whole_array_algorithms_at_scale_run_on_one_element_and_equal_the_formula():
    for collective, algorithm in sorted(WHOLE_ARRAYS):
        result = simulate(collective, algorithm, 3000, 100_000_000)
        assert result.buffers[0].size == 1  # the default grain did not fit the budget
        assert result.time == pytest.approx(result.predicted, rel=1e-12), algorithm


def _peak(function) -> int:
    tracemalloc.start()
    try:
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.timeout(300)
def test_memory_does_not_grow_with_the_square_of_the_ranks():
    # 4x the ranks: n^2 memory would be 16x. The ring (symmetric) on a
    # scaled 100 MB; recursive doubling (every rank runs) on one float, so
    # that what is measured is what the simulator keeps per rank.
    for algorithm, nbytes in (("ring", 100_000_000), ("recursive_doubling", 4)):
        small = _peak(lambda a=algorithm, b=nbytes: simulate("all_reduce", a, 256, b))
        big = _peak(lambda a=algorithm, b=nbytes: simulate("all_reduce", a, 1024, b))
        assert big < 8 * small, (algorithm, small, big)


def test_progress_is_reported_with_growing_counts_up_to_the_total(monkeypatch):
    monkeypatch.setattr(simulator, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(simulator, "PROGRESS_EVERY", 16)
    calls = []
    result = simulate("all_reduce", "ring", 64, 1_000_000, symmetry=False,
                      progress=lambda messages, total: calls.append((messages, total)))
    assert len(calls) > 2
    counts = [messages for messages, _ in calls]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    assert calls[-1] == (result.messages, 2 * 64 * 63)  # the traffic formula's total


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("FORCE_COLOR", "1")  # Rich draws the bar as on a terminal


def test_cli_draws_a_progress_bar_on_stderr_and_the_table_on_stdout(capsys, terminal):
    assert main(["simulate", "all_reduce", "-n", "32", "--size", "10MB"]) == 0
    captured = capsys.readouterr()
    assert "simulating double_binary_tree" in captured.err and "messages" in captured.err
    assert "simulating" not in captured.out and "double_binary_tree" in captured.out


def test_cli_quiet_draws_no_bar(capsys, terminal):
    assert main(["simulate", "all_reduce", "-n", "16", "--size", "1MB", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "simulating" not in captured.err and "ring" in captured.out
