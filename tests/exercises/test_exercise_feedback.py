"""The checker names the mistake students make, where they make it: the
first sentence of a failing collective's report says what kind of mistake
(a wrong chunk, a wrong neighbour, add instead of copy, ...), on which rank
and at which step (counted from 1, as the replay's frames are), and every
such failure comes with a side-by-side replay marked at that step.

All on the simulator (no process is launched: the checker stops at the
first simulated failure); two runs of the command write the replay files."""

from __future__ import annotations

from pathlib import Path

import pytest

from minidist.cli import main
from minidist.exercises import get
from minidist.exercises.exercise import load_function
from viz.exercise_replay import side_by_side

WRONG = Path(__file__).resolve().parent / "wrong"

#: (exercise, wrong file, the kind of mistake, how the report begins)
MISTAKES = [
    ("ring_allreduce", "ring_receive_off_by_one", "wrong chunk",
     "rank 0, step 1 (reduce-scatter): you receive into chunk 0; the reference receives "
     "into chunk 3 (from rank 3)"),
    ("ring_allreduce", "ring_allgather_off_by_one", "wrong chunk",
     "rank 0, step 4 (allgather): you send chunk 0; the reference sends chunk 1"),
    ("ring_allreduce", "ring_send_left", "wrong peer",
     "rank 0, step 1 (reduce-scatter): you send chunk 0 to rank 3; the reference sends it "
     "to rank 1"),
    ("ring_allreduce", "ring_wrong_peer", "wrong peer",
     "rank 0, step 4 (allgather): you send chunk 1 to rank 3"),
    ("ring_allreduce", "ring_allgather_adds", "add instead of copy",
     "rank 0, step 4 (allgather): you add the message into chunk 0 (irecv_reduce); the "
     "reference copies it"),
    ("ring_allreduce", "ring_deadlock", "deadlock",
     "deadlock on 4 ranks, 16 elements (simulated): rank 0 (step 1) waits for rank 3"),
    ("ring_allreduce", "ring_wasteful", "wasteful", "correct, but it sends 4.0 x the bytes"),
    ("tree_broadcast", "tree_off_by_one", "wrong peer",
     "rank 1, step 1: you send the whole buffer to rank 0; the reference sends it to rank 2"),
    ("tree_broadcast", "tree_forgets_root", "missing message",
     "rank 0, step 1: you do not receive into the whole buffer (from rank 3)"),
    ("recursive_doubling_allreduce", "doubling_off_by_one", "wrong peer",
     "rank 0, step 1: you send the whole buffer to rank 2; the reference sends it to rank 1"),
    ("recursive_doubling_allreduce", "doubling_forgets_combine", "wrong values",
     "rank 0, step 2: you send the whole buffer to rank 2 with other values"),
    ("ring_allreduce", "ring_only_empty_steps", "empty step",
     "rank 0, step 1: your generator yielded an empty step, a list of no requests (so did "
     "ranks 1, 2, 3)"),
    ("ring_allreduce", "ring_empty_step", "empty step",
     "rank 0, step 4: your generator yielded an empty step"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,file,kind,begins", MISTAKES,
                         ids=[case[1] for case in MISTAKES])
def test_the_report_begins_with_the_mistake_and_comes_with_a_replay(name, file, kind, begins):
    exercise = get(name)
    result = exercise.check(load_function(WRONG / f"{file}.py", exercise.function, name),
                            processes=False)
    assert result.failure is not None and result.failure.kind == kind, result.failure
    assert result.failure.message.startswith(begins), result.failure.message
    assert "Allocate the buffer" not in result.failure.message
    data = result.replay
    assert data is not None, f"no replay for {file}"
    model = side_by_side(data["student"], data["reference"], data["first_difference"],
                         data["difference"])
    assert model.marked is not None
    if result.failure.step is not None:  # the marked pair is the reported step
        assert data["first_difference"] == result.failure.step
        assert model.marked == result.failure.step  # pair k is step k (pair 0: before any message)
        assert f"step {result.failure.step}" in data["difference"]


def test_a_message_that_does_not_fit_is_told_as_a_wrong_chunk():
    # Uneven chunks (9 elements on 4 ranks): the receive into the wrong chunk
    # is one element too small, which the transport reports as a size.
    from minidist.exercises import collective_check, ring_allreduce

    function = load_function(WRONG / "ring_receive_off_by_one.py", "ring_allreduce",
                             "ring_allreduce")
    failure = collective_check.judge_call(ring_allreduce.SPEC, function, 4, 9, 0)
    assert failure.kind == "wrong chunk", failure
    assert failure.message.startswith("rank 0, step 1 (reduce-scatter): you receive into "
                                      "chunk 0; the reference receives into chunk 3")
    assert "did not fit its receive (rank 1 got 3 elements for a receive of 2)" \
        in failure.message
    assert "sender's shape" not in failure.message and "you send nothing" not in failure.message
    data = collective_check.replay_data(ring_allreduce.SPEC, function, failure)
    assert data is not None and data["first_difference"] == 1  # the run stopped, yet replayed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,file,kind", [
    ("ring_allreduce", "ring_receive_off_by_one", "wrong chunk"),
    ("tree_broadcast", "tree_deadlock", "deadlock"),
    ("ring_allreduce", "ring_only_empty_steps", "empty step"),  # a run with no step to draw
])
def test_the_command_says_where_the_replay_is(tmp_path, capsys, name, file, kind):
    assert main(["exercise", "check", name, str(WRONG / f"{file}.py"), "--no-processes",
                 "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if line.startswith("FAIL"))
    assert first.startswith(f"FAIL ({kind}) ") and "step 1" in out.split(".")[0]
    written = next(line for line in out.splitlines() if line.startswith("replay written:"))
    gif, page = tmp_path / f"{name}.replay.gif", tmp_path / f"{name}.replay.html"
    assert str(gif) in written and str(page) in written
    assert gif.stat().st_size > 0 and "FIRST DIFFERENCE" in page.read_text()
