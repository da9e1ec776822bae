"""The simulator, the sim transport and the pipeline planner give, bit for
bit, the times and schedules frozen before their clocks were merged into one
(tests/virtual_clock_frozen.json; see tests/virtual_clock_grid.py)."""

import json
from pathlib import Path

import pytest

from tests import virtual_clock_grid

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
