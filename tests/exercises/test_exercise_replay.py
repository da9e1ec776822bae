"""The side-by-side replay of a failing collective (on the frame model, not
pixels) and the `minidist exercise` command's loop: list, start, check."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rich.console import Console

from minidist.cli import main
from minidist.exercises import NAMES, get
from minidist.exercises.exercise import load_function
from viz.exercise_replay import MARK, render_pair, side_by_side

WRONG = Path(__file__).resolve().parent / "wrong"


def _model(file):
    exercise = get("ring_allreduce")
    result = exercise.check(load_function(WRONG / f"{file}.py", exercise.function,
                                          exercise.name), processes=False)
    data = result.replay
    assert data is not None, result.failure
    return data, side_by_side(data["student"], data["reference"], data["first_difference"],
                              data["difference"])


def test_the_first_differing_step_is_marked_where_the_checker_found_it():
    data, model = _model("ring_off_by_one")
    assert (data["world_size"], data["count"]) == (4, 16)
    assert model.steps == 2 * (4 - 1)  # the ring's 2 (n - 1) steps on both sides
    assert model.frames == model.steps + 1  # and step 0, before any message
    # The off-by-one sends chunks of the right size to the right peer: only the
    # values differ, so the trace alone cannot see it; the checker's step can.
    # Steps count from 1, as every replay counts (step 0 is the state before
    # any message): the checker's "step 1" is pair 1, the trace's step 0.
    assert data["first_difference"] == 1 and model.marked == 1
    assert model.pairs[model.marked].student.step + 1 == data["first_difference"]
    assert model.difference.startswith("rank 0, step 1 (reduce-scatter): you send chunk 1")


def test_a_missing_step_is_marked_where_the_messages_differ():
    data, model = _model("ring_missing_step")
    assert len(model.student.frames) == len(model.reference.frames) - 1
    first_differing = next(pair.index for pair in model.pairs if pair.differs)
    assert model.marked == first_differing == len(model.reference.frames) - 1
    assert model.pairs[model.marked].student is None
    assert not any(pair.differs for pair in model.pairs[:model.marked])


def test_the_terminal_shows_the_mark_on_the_marked_step_only():
    _, model = _model("ring_off_by_one")
    for index in range(model.frames):
        console = Console(record=True, width=160, color_system=None)
        console.print(render_pair(model, index, color=False, width=160))
        text = console.export_text()
        assert ("FIRST DIFFERENCE" in text) == (index == model.marked)
        assert "your algorithm" in text and "the reference" in text


@pytest.mark.timeout(120)
def test_the_exercise_loop_in_four_commands(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["exercise", "list"]) == 0
    listing = capsys.readouterr().out
    assert all(name[:20] in listing for name in NAMES)
    assert main(["exercise", "start", "ring_allreduce"]) == 0
    assert (tmp_path / "ring_allreduce.py").read_text() == get("ring_allreduce").skeleton.read_text()
    assert main(["exercise", "start", "ring_allreduce"]) == 2  # never overwrites a start
    assert "already exists" in capsys.readouterr().err
    assert main(["exercise", "check", "ring_allreduce", "--no-files"]) == 1
    assert "not written yet" in capsys.readouterr().out
    # "edit": a wrong solution, then a right one
    shutil.copyfile(WRONG / "ring_off_by_one.py", tmp_path / "ring_allreduce.py")
    assert main(["exercise", "check", "ring_allreduce"]) == 1
    out = capsys.readouterr().out
    assert "wrong chunk" in out and MARK in out
    assert (tmp_path / "ring_allreduce.replay.gif").stat().st_size > 0
    assert "FIRST DIFFERENCE" in (tmp_path / "ring_allreduce.replay.html").read_text()
    (tmp_path / "ring_allreduce.py").write_text(
        "from minidist.exercises.ring_allreduce import ring_allreduce  # noqa: F401\n")
    assert main(["exercise", "check", "ring_allreduce"]) == 0
    assert "passed" in capsys.readouterr().out


def test_unknown_names_and_files_get_one_line_errors(tmp_path, capsys):
    assert main(["exercise", "start", "ring"]) == 2
    assert "no exercise 'ring'; the exercises are:" in capsys.readouterr().err
    assert main(["exercise", "check", "ring_allreduce", str(tmp_path / "nope.py")]) == 2
    error = capsys.readouterr().err
    assert "no file" in error and "minidist exercise start ring_allreduce" in error
    (tmp_path / "empty.py").write_text("x = 1\n")
    assert main(["exercise", "check", "ring_allreduce", str(tmp_path / "empty.py")]) == 2
    assert "defines no function ring_allreduce()" in capsys.readouterr().err


def test_the_step_through_moves_over_the_pairs():
    _, model = _model("ring_missing_step")
    console = Console(record=True, width=160, color_system=None)
    from viz.exercise_replay import step_through_side_by_side

    shown = step_through_side_by_side(model, console, keys=["n", "n", "b", "G", "q"],
                                      color=False)
    assert shown == [0, 1, 2, 1, model.frames - 1]
    assert "FIRST DIFFERENCE" in console.export_text()  # the last pair is the marked one


def test_the_deadline_puts_an_outer_alarm_back():
    import signal

    from minidist.exercises.exercise import deadline

    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        with deadline(1.0, "nothing"):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90 < left <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
