"""The simulator, the sim transport and the pipeline planner give, bit for
bit, the times and schedules frozen before their clocks were merged into one
(tests/collectives/virtual_clock_frozen.json; see tests/collectives/virtual_clock_grid.py)."""

import json
from pathlib import Path

import pytest

from tests.collectives import virtual_clock_grid

FROZEN = json.loads((Path(__file__).parent / "virtual_clock_frozen.json").read_text())


def _differences(now: dict, frozen: dict) -> list[str]:
    missing = sorted(set(frozen) ^ set(now))
    changed = sorted(key for key in set(frozen) & set(now) if now[key] != frozen[key])
    return ([f"{key}: only in one of the grids" for key in missing]
            + [f"{key}: {now[key]} != frozen {frozen[key]}" for key in changed])


@pytest.mark.parametrize("grid, compute", [("simulate", virtual_clock_grid.simulate_grid),
                                           ("schedules", virtual_clock_grid.schedule_grid)])
def test_results_are_the_frozen_ones(grid, compute):
    now = json.loads(json.dumps(compute()))
    differences = _differences(now, FROZEN[grid])
    assert not differences, f"{len(differences)} of {len(FROZEN[grid])} changed:\n" + \
        "\n".join(differences[:20])


def test_the_clock_pieces():
    from minidist.virtual_clock import BusyPort, RankClock, ReadyQueue, SerialPort, latest

    clock = RankClock()
    assert clock.advance(3) == (0, 3) and clock.wait_until(2) == (3, 3)
    assert clock.wait_until(5) == (3, 5) and latest([clock, RankClock(7)]) == 7
    port = SerialPort()
    assert port.take(1.0, 2.0) == (1.0, 3.0) and port.take(0.0, 1.0, 0.5) == (3.0, 4.5)
    busy = BusyPort()
    assert [busy.book(t, 1.0) for t in (5.0, 0.0, 6.0, 0.5)] == [5.0, 0.0, 6.0, 1.0]
    assert (busy.starts, busy.ends) == ([0.0, 5.0], [2.0, 7.0])  # touching slots merge
    ready = ReadyQueue(3)
    assert [ready.pop(), ready.pop()] == [0, 1]
    ready.wake(0)
    ready.wake(2)  # already queued: once only
    assert [ready.pop(), ready.pop()] == [2, 0] and not ready
