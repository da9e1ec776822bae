"""The zb_h1 exercise: place the W's of 1F1B's split backwards as ZB-H1 does.

Every wrong placement a student is likely to write gets a verdict of its
own, told apart from the others by its kind and its first words, and says
where (rank, micro-batch, time on the clock) and what to do; a hole's hint
is a move that really shortens the batch. The reference passes, on the
simulator and on real processes, and is ZB-H1's order."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from minidist.cli import main
from minidist.exercises import get, schedule_holes
from minidist.exercises.exercise import load_function
from minidist.exercises.zb_h1 import (
    RATIOS,
    SHAPES,
    given_orders,
    place_weights,
    simulate_orders,
)
from minidist.parallel.pipeline import one_f_one_b, peak_live_microbatches, simulate_schedule
from minidist.parallel.pipeline.zero_bubble import zb_h1

WRONG = Path(__file__).resolve().parent / "wrong"


def _simulated(orders, p, m, ratio):
    return simulate_orders(orders, p, m, ratio)


def _f_and_i(order):
    return [item for item in order if item[0] != "W"]


def _weights_together(orders):
    return orders  # 1F1B's own placement: each W right after its I


def _weights_at_the_end(orders):
    return [_f_and_i(order) + [item for item in order if item[0] == "W"] for order in orders]


def _delayed(orders, delay, catch_up=False):
    """Rank r's W's ``delay(r)`` rounds late; with ``catch_up``, from the
    last forward on the W's beyond r rounds run after each I."""
    placed = []
    for rank, order in enumerate(orders):
        items = _f_and_i(order)
        last_forward = max(index for index, item in enumerate(items) if item[0] == "F")
        waiting, row = [], []
        for index, item in enumerate(items):
            row.append(item)
            if item[0] != "I":
                continue
            waiting.append(item[1:])
            keep = rank if catch_up and index > last_forward else delay(rank)
            while len(waiting) > keep:
                row.append("W" + waiting.pop(0))
        placed.append(row + ["W" + k for k in waiting])
    return placed


def _twice_as_late(orders):
    return _delayed(orders, lambda rank: 2 * rank)


def _one_round_too_late_then_caught_up(orders):
    return _delayed(orders, lambda rank: rank + 1, catch_up=True)


def _weight_before_its_input(orders):
    placed = place_weights(orders)
    if len(placed) > 1:
        row = placed[1]
        row.remove("W0")
        row.insert(row.index("I0"), "W0")
    return placed


def _forgets_the_last_weight(orders):
    placed = place_weights(orders)
    last = f"W{sum(item[0] == 'F' for item in placed[-1]) - 1}"
    placed[-1] = [item for item in placed[-1] if item != last]
    return placed


def _first_weight_twice(orders):
    placed = place_weights(orders)
    placed[0].append("W0")
    return placed


def _gpipe_on_rank_0(orders):
    placed = place_weights(orders)
    placed[0] = [item for item in placed[0] if item[0] == "F"] + \
        [item for item in placed[0] if item[0] != "F"]
    return placed


def _rank_0_backward_first(orders):
    # Rank 0 runs I0 before forwarding micro-batch 1, which rank 1 waits for
    # before it can send I0's gradient: nobody can go on (p >= 3).
    placed = place_weights(orders)
    if len(placed) >= 3 and sum(item[0] == "F" for item in placed[0]) >= 2:
        placed[0].remove("I0")
        placed[0].insert(1, "I0")
    return placed


def _whole_backwards(orders):
    return [[item.replace("I", "B") for item in order if item[0] != "W"] for order in orders]


def _one_list(orders):
    return [item for order in orders for item in order]


def _raises(orders):
    return [order[10] for order in orders]


#: (the placement, the verdict's kind, how its message begins, words it holds)
MISTAKES = [
    (_weight_before_its_input, "invalid schedule",
     "place_weights(1F1B's orders for p = 2, m = 1): rank 1 runs W0 at t = 2 on the clock "
     "with F = I = W = 1 (its 2nd action), before I0 (its 3rd)",
     ["run it after I0"]),
    (_forgets_the_last_weight, "invalid schedule",
     "place_weights(1F1B's orders for p = 1, m = 1): rank 0 never runs W0",
     ["its I0 is the rank's 2nd action", "place every W after its I"]),
    (_first_weight_twice, "invalid schedule",
     "place_weights(1F1B's orders for p = 1, m = 1): rank 0 runs W0 twice (its 3rd and 4th "
     "actions)", ["counted twice"]),
    (_gpipe_on_rank_0, "reordered",
     "place_weights(1F1B's orders for p = 1, m = 2): rank 0's 2nd F or I is F1 where 1F1B "
     "has I0", ["yours: F0 F1 I0 I1", "move only the W's"]),
    (_rank_0_backward_first, "deadlock",
     "place_weights(1F1B's orders for p = 3, m = 2) deadlocks on the pipeline simulator",
     ["rank 0 waits at action 2 (recv_grad(0)<-1)", "only a moved F or I can do this",
      "rank 0's 2nd F or I is I0 where 1F1B has F1"]),
    (_weights_together, "held up",
     "place_weights(1F1B's orders for p = 2, m = 2) with F = I = W = 1: the batch takes 8 "
     "where ZB-H1's takes 7. Rank 1 runs W0 (t = 3 to 4) before I1, whose gradient",
     ["rank 0 idles 1 unit from t = 5 before I1", "Run I1 first and W0 after it",
      "would take 7"]),
    (_weights_at_the_end, "hole",
     "place_weights(1F1B's orders for p = 2, m = 2) with F = I = W = 1: the batch takes 8 "
     "where ZB-H1's takes 7. Rank 0 idles 1 unit from t = 4 (before I1, waiting for rank 1's "
     "I1) while W0 waits", ["Run W0 in that hole", "would take 7"]),
    (_twice_as_late, "hole",
     "place_weights(1F1B's orders for p = 2, m = 3) with F = I = W = 1: the batch takes 11 "
     "where ZB-H1's takes 10. Rank 1 idles 1 unit from t = 5 (before F2",
     ["Your W's also wait too long: rank 1 holds 3 micro-batches at once"]),
    (_one_round_too_late_then_caught_up, "memory",
     "place_weights(1F1B's orders for p = 1, m = 2) is as fast as ZB-H1, but rank 0 holds "
     "the activations of 2 micro-batches at once: from t = 2",
     ["W0 still waits after its I", "min(p, m) = 1", "buys no time"]),
    (_whole_backwards, "wrong shape",
     "place_weights(1F1B's orders for p = 1, m = 1): rank 0 has 'B0', a whole backward",
     ["'I0' (input) and 'W0' (weights)"]),
    (_one_list, "wrong shape",
     "place_weights(1F1B's orders for p = 1, m = 1) returned 3, expected a list of 1 lists "
     "(one order per rank)", []),
    (_raises, "raised", "place_weights(1F1B's orders for p = 1, m = 1) raised IndexError",
     []),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function,kind,begins,words", MISTAKES,
                         ids=[case[0].__name__.strip("_") for case in MISTAKES])
def test_each_wrong_placement_is_told_what_where_and_what_to_do(function, kind, begins,
                                                                 words):
    result = get("zb_h1").check(function, processes=False)
    assert result.failure is not None and result.failure.kind == kind, result.failure
    assert result.failure.message.startswith(begins), result.failure.message
    for word in words:
        assert word in result.failure.message, result.failure.message


def test_the_mistakes_are_told_apart():
    messages = {get("zb_h1").check(function, processes=False).failure.message
                for function, *_ in MISTAKES}
    assert len(messages) == len(MISTAKES)
    # the two halves of ZB-H1's point: the bubble, and the memory it pays no more than
    kinds = {kind for _, kind, *_ in MISTAKES}
    assert {"hole", "held up", "memory", "reordered", "deadlock"} <= kinds


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function", [_weights_together, _weights_at_the_end, _twice_as_late])
def test_a_hole_is_told_with_a_move_that_shortens_the_batch(function):
    # Never a guess: the move named, made, takes the time the message says,
    # at every shape and ratio where the placement is slower than ZB-H1.
    for p, m in SHAPES:
        orders = function(given_orders(p, m))
        for ratio in RATIOS:
            events = simulate_orders(orders, p, m, ratio)
            span = schedule_holes.makespan(schedule_holes.boxes_of(events))
            reference = simulate_schedule(zb_h1(p, m), ratio[0], ratio[1] + ratio[2],
                                          weight_time=ratio[2])
            if span <= schedule_holes.makespan(schedule_holes.boxes_of(reference)):
                continue
            finding = schedule_holes.first_move_that_helps(
                orders, events, partial(_simulated, p=p, m=m, ratio=ratio))
            assert finding is not None, (function.__name__, p, m, ratio)
            boxes = schedule_holes.boxes_of(simulate_orders(finding.orders, p, m, ratio))
            assert schedule_holes.makespan(boxes) == finding.span <= span
            before, after = finding.ends
            assert after == schedule_holes.ends(boxes) and max(after) <= max(before)
            assert finding.span < span or after[finding.sooner] < before[finding.sooner]
            assert sorted(map(sorted, finding.orders)) == sorted(map(sorted, orders))


def test_halves_together_and_weights_at_the_end_pay_what_zb_h1_saves():
    # ZB-H1's point, on the clock: (p-1)W less than either, and p micro-batches
    # held where the W's at the end hold all m.
    p, m = 4, 8
    for ratio in RATIOS:
        forward, input_half, weight = ratio

        def span(orders, ratio=ratio):
            return schedule_holes.makespan(schedule_holes.boxes_of(
                simulate_orders(orders, p, m, ratio)))
        zb = m * (forward + input_half + weight) + (p - 1) * (forward + input_half - weight)
        assert span(place_weights(given_orders(p, m))) == zb * 1_000_000
        for wrong in (_weights_together, _weights_at_the_end):
            assert span(wrong(given_orders(p, m))) == (zb + (p - 1) * weight) * 1_000_000
    peaks = peak_live_microbatches(simulate_orders(_weights_at_the_end(given_orders(p, m)),
                                                   p, m))
    assert set(peaks.values()) == {m}
    peaks = peak_live_microbatches(simulate_orders(place_weights(given_orders(p, m)), p, m))
    assert set(peaks.values()) == {p}


def test_the_reference_is_zb_h1_and_the_given_orders_are_1f1b_split():
    for p in range(1, 7):
        for m in range(1, 10):
            given = given_orders(p, m)
            for rank in range(p):
                whole = [item.replace("I", "B") for item in given[rank] if item[0] != "W"]
                assert whole == one_f_one_b(p, m).compute_order(rank)
            assert place_weights(given) == [zb_h1(p, m).compute_order(rank)
                                            for rank in range(p)]
    # the skeleton's example is what the student is given
    skeleton = get("zb_h1").skeleton.read_text()
    for order in given_orders(3, 4):
        assert ", ".join(f'"{item}"' for item in order[:11]) in skeleton


@pytest.mark.timeout(120)
def test_the_reference_passes_on_the_simulator_and_real_processes():
    result = get("zb_h1").check(place_weights)
    assert result.ok, result.failure
    assert any("real processes" in line and "1e-9" in line for line in result.passed)
    assert not any("real processes" in line
                   for line in get("zb_h1").check(place_weights, processes=False).passed)


def test_a_slow_placement_comes_with_both_gantt_charts():
    result = get("zb_h1").check(_weights_at_the_end, processes=False)
    assert set(result.schedules) == {"yours", "ZB-H1 (reference)"}
    assert all(events for events in result.schedules.values())
    assert get("zb_h1").check(_first_weight_twice, processes=False).schedules is None


@pytest.mark.timeout(120)
def test_the_command_shows_checks_and_draws_the_exercise(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["exercise", "show", "zb_h1"]) == 0
    shown = capsys.readouterr().out
    assert "def place_weights(orders" in shown and "minidist exercise check zb_h1" in shown
    assert max(len(line) for line in shown.splitlines()) <= 80
    assert main(["exercise", "check", "zb_h1", str(WRONG / "zb_h1_weights_at_the_end.py"),
                 "--no-processes", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL (hole)" in out and "Run W0 in that hole" in " ".join(out.split())
    assert (tmp_path / "zb_h1.gantt.png").stat().st_size > 0
    solution = tmp_path / "zb_h1.py"
    solution.write_text("from minidist.exercises.zb_h1 import place_weights  # noqa: F401\n")
    assert main(["exercise", "check", "zb_h1", str(solution)]) == 0
    assert "zb_h1: passed" in capsys.readouterr().out
    assert load_function(get("zb_h1").skeleton, "place_weights", "zb_h1")
