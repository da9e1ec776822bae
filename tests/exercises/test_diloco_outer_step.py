"""The diloco_outer_step exercise (DiLoCo's outer step, on real processes):
the reference passes on 2 and 3 ranks; the skeleton says it is not written;
each known mistake (tests/exercises/wrong/diloco_*.py) is caught with its
own message, which names the mistake and what to do; and no process or
shared-memory segment is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from minidist.exercises import NAMES, get
from minidist.exercises.exercise import load_function

WRONG = Path(__file__).resolve().parent / "wrong"
EXERCISE = get("diloco_outer_step")

#: file -> words its failure's message must hold
MISTAKES = {
    "diloco_sign_flipped": ["sign is flipped", "theta - theta_r", "outer step 1 of 3"],
    "diloco_from_inner_weights": ["applied to this rank's inner weights",
                                  "from the last-sync weights"],
    "diloco_plain_momentum": ["plain (heavy-ball) momentum", "update = g + mu * buf"],
    "diloco_not_averaged": ["not averaged over the ranks", "all_reduce it"],
    "diloco_summed": ["summed, not averaged", "divide"],
    "diloco_no_outer_optimizer": ["average of the ranks' weights, local SGD",
                                  "outer optimizer"],
    "diloco_momentum_not_kept": ["the weights are right but rank 0's `momentum`",
                                 "in place"],
}


def test_the_reference_passes_and_is_listed():
    assert "diloco_outer_step" in NAMES
    result = EXERCISE.check(EXERCISE.reference)
    assert result.ok, result.failure
    assert "2 and 3 ranks" in result.passed[0]
    assert EXERCISE.skeleton.is_file()


def test_the_skeleton_says_it_is_not_written():
    result = EXERCISE.check(load_function(EXERCISE.skeleton, EXERCISE.function, EXERCISE.name))
    assert result.failure.kind == "not written", result.failure


@pytest.mark.timeout(60)
@pytest.mark.parametrize("file", sorted(MISTAKES))
def test_each_mistake_gets_its_own_message(file):
    function = load_function(WRONG / f"{file}.py", EXERCISE.function, EXERCISE.name)
    result = EXERCISE.check(function)
    assert result.failure is not None, f"{file} passed the checker"
    assert result.failure.kind == "wrong result", result.failure
    for words in MISTAKES[file]:
        assert words in result.failure.message, result.failure.message
    # No other mistake's explanation in this one's message.
    for other, words in MISTAKES.items():
        if other != file:
            assert words[0] not in result.failure.message, (file, other)
