"""The quorum timeline: a replica lost at step 2 of a real run, the step
redone at 3 of 4, the spare joining at step 3."""

from __future__ import annotations

import minidist
from minidist.parallel.resilience import RegressionProblem, ReplicaFault, train
from viz.quorum_timeline import draw_quorum_timeline, quorum_cells


def test_going_on_at_three_of_four_and_taking_a_replacement_back(tmp_path):
    results = minidist.launch(train, world_size=5, transport="pipe",
                              args=(RegressionProblem(steps=5), 4, ReplicaFault(1, 2, "sigkill")),
                              tolerate_failures=True, timeout=60)
    cells = quorum_cells(results[0][0].attempts, world_size=5)
    letters = ["".join(state[0].upper() if state != "dead" else "X" for state in row)
               for row in cells]
    assert letters == ["LLRLL", "LLXXX", "LLRLL", "LLRLL", "SSSJL"]
    figure = draw_quorum_timeline(cells, tmp_path / "quorums.png")
    assert (tmp_path / "quorums.png").stat().st_size > 0 and figure.axes
