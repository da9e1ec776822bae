"""The suite's one shared rule: which tests are the long ones.

``make test`` runs everything. ``make test-quick`` (``pytest -m "not slow"``)
leaves out the files below, the end-to-end runs that take most of the
suite's time on a 2-core machine: every lesson as a script and as a
notebook, the MPI jobs, the accuracy runs of the compressors, the hostile
exercise solutions, the fault-injection runs and the exhaustive grids of
the rooted and all-to-all collectives, every CLI table run at 80 columns,
every replay's legend drawn. What is left still runs every
collective, strategy, layer and command once, for an edit-run loop of a
few minutes; run ``make test`` before you share a change.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: test files (relative to tests/) marked ``slow`` as a whole
SLOW_FILES = {
    "demos/test_lessons.py",
    "mpi/test_mpi.py",
    "parallel/test_compression_accuracy.py",
    "exercises/test_hostile_solutions.py",
    "exercises/test_exercises.py",
    "runtime/test_frozen_rank.py",
    "runtime/test_failures.py",
    "runtime/test_failures_detected.py",
    "runtime/test_odd_rank_named_in_calls.py",
    "collectives/test_collectives_rooted.py",
    "collectives/test_collectives_all_to_all.py",
    "viz/test_viz_title_layout.py",
    "viz/test_pipeline_drawn.py",
    "viz/test_replay_legends.py",
    "runtime/test_cli_output.py",
    "exercises/test_exercise_feedback.py",
}

TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(item.fspath).resolve().relative_to(TESTS).as_posix() in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
