"""The quorum_allreduce exercise (fault-tolerant data parallel's all_reduce
over the live replicas): the reference passes with a replica SIGKILLed
inside the all_reduce and before it, and each known mistake is caught in
about a second with the message that names it: the world size for the live
count, the dead replica counted with a zero or its last gradient, a sum not
averaged, a failed step applied, a step never applied, PeerGoneError not
caught, the world group for the quorum's; nothing is left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from minidist.exercises import get
from minidist.exercises.exercise import load_function


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"minidist_{os.getpid()}_")}


def _children() -> list[int]:
    """Live children of this process (the checker's workers, if left), but
    for the segment reaper, which lives as long as this interpreter."""
    from minidist.runtime.segment_reaper import reaper_pid

    me, found = os.getpid(), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and int(entry) != reaper_pid():
            found.append(int(entry))
    return found

WRONG = Path(__file__).resolve().parent / "wrong"
EXERCISE = get("quorum_allreduce")

#: (file, the failure kind, words the message must hold)
MISTAKES = [
    ("quorum_world_size", "wrong result", ["step 0", "divided by 5, the world size",
                                           "len(members) = 4"]),
    ("quorum_dead_as_zero", "wrong result", ["ranks [0, 2, 3]", "divided by 4",
                                             "replica 1 died and counts as if it had sent a "
                                             "zero gradient"]),
    ("quorum_stale_gradient", "wrong result", ["replica 1's gradient of step",
                                               "must not count"]),
    ("quorum_sum", "wrong result", ["the sum of the 4 members' gradients, not their mean"]),
    ("quorum_commits_anyway", "applied a failed step", ["step 2", "the all_reduce failed",
                                                        "yet you returned True",
                                                        "next quorum redoes it"]),
    ("quorum_never_applies", "step not applied", ["step 0", "yet you returned False"]),
    ("quorum_uncaught", "raised", ["the survivors stopped with PeerGoneError",
                                   "except dist.PeerGoneError"]),
    # a deadlock when the runtime sees who waits for whom, a hang when the check's
    # deadline rings first (a loaded machine)
    ("quorum_world_group", ("deadlock", "hang"), ["pass group=group"]),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("file,kind,words", MISTAKES, ids=[case[0] for case in MISTAKES])
def test_each_mistake_is_named(file, kind, words):
    before = _segments()
    started = time.monotonic()
    result = EXERCISE.check(load_function(WRONG / f"{file}.py", EXERCISE.function,
                                          EXERCISE.name))
    assert time.monotonic() - started < 10
    assert result.failure is not None, f"{file} passed the checker"
    assert result.failure.kind in ((kind,) if isinstance(kind, str) else kind), result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message
    assert not _children() and _segments() == before


@pytest.mark.timeout(60)
def test_a_verdict_that_is_not_a_bool_is_told():
    def forgets_to_return(gradients, group, members, failed_ranks):
        EXERCISE.reference(gradients, group, members, failed_ranks)

    result = EXERCISE.check(forgets_to_return)
    assert result.failure.kind == "raised", result.failure
    assert "returned None; return True when the step may be applied" in result.failure.message
