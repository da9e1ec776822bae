"""The zero-bubble schedules as data: their orders against the orders their
authors give (Qi et al.'s bubble script, torch's ZB-V, DeepSeek's
DualPipeV, written out here by hand or rebuilt from the authors' rules),
every size completing on the virtual clock with each piece of work once,
the sizes they refuse, their names, their printout, and how the clock runs a
split backward (I and W) and counts its memory.

The bubbles and peaks against the papers' formulas are in
test_zero_bubble_formulas.py.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from minidist import trace
from minidist.parallel.pipeline import (
    DeadlockError,
    Schedule,
    bubble_fraction,
    dualpipe_v,
    make_schedule,
    one_f_one_b,
    peak_live_microbatches,
    simulate_schedule,
    zb_h1,
    zb_h2,
    zb_v,
)
from minidist.parallel.pipeline.schedules import SCHEDULES, UNIT_NS

# --------------------------------------------------------------------------- hand-written orders

# ZB-H1, p = 3, m = 4: rank r warms up with p - 1 - r forwards, then rounds
# "F, I, and from round r on the W of micro-batch k - r", then the r W's left.
ZB_H1_3_4 = [
    "F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3",
    "F0 F1 I0 F2 I1 W0 F3 I2 W1 I3 W2 W3",
    "F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3",
]
# torch's ScheduleZBVZeroBubble, p = 2, m = 4 (n = max(m, 2p - 1) = 4), followed by hand:
# rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
ZB_V_2_4 = [
    "F0 F1 F2 F0c1 I0c1 W0c1 F1c1 I1c1 W1c1 F3 I0 W0 F2c1 I2c1 W2c1 I1 W1 F3c1 I3c1 W3c1 "
    "I2 W2 I3 W3",
    "F0 F0c1 F1 F1c1 I0c1 W0c1 F2 I0 W0 F2c1 I1c1 W1c1 F3 I1 W1 F3c1 I2c1 W2c1 I2 I3c1 I3 "
    "W2 W3c1 W3",
]
# DeepSeek's dualpipev.py, p = 2, m = 4, its eight steps followed by hand; a
# bracket is a pair that overlaps (F and B of two micro-batches).
DUALPIPE_V_2_4 = [
    "F0 F1 F2 F0c1 I0c1 W0c1 F1c1 [F3 B1c1] [F2c1 B0] B2c1 [F3c1 B1] B3c1 I2 W2 I3 W3",
    # the last rank's first round of step 4 runs unpaired
    "F0 F0c1 F1 F1c1 F2 B0c1 [F2c1 B0] [F3 B1c1] [F3c1 B1] B2c1 B2 I3c1 I3 W3c1 W3",
]


def _paired_order(schedule, rank):
    """The rank's computations, a pair that overlaps in brackets."""
    words, pair = [], []
    for action in schedule.actions[rank]:
        if action.kind not in ("forward", "backward", "backward_input", "backward_weight"):
            continue
        if action.phase == "overlap":
            pair.append(str(action))
            if len(pair) == 2:
                words.append(f"[{pair[0]} {pair[1]}]")
                pair = []
        else:
            words.append(str(action))
    return " ".join(words)


def test_zb_h1_matches_the_hand_written_order():
    schedule = zb_h1(3, 4)
    assert [" ".join(schedule.compute_order(rank)) for rank in range(3)] == ZB_H1_3_4
    assert schedule.name == "zb_h1" and schedule.placement == "loop"


def test_zb_v_matches_torchs_order():
    schedule = zb_v(2, 4)
    assert [" ".join(schedule.compute_order(rank)) for rank in range(2)] == ZB_V_2_4
    assert (schedule.placement, schedule.virtual_stages) == ("v", 2)
    assert [schedule.stage_of(rank, chunk) for rank in range(2) for chunk in range(2)] == \
        [0, 3, 1, 2]


def test_dualpipe_v_matches_deepseeks_eight_steps():
    schedule = dualpipe_v(2, 4)
    assert [_paired_order(schedule, rank) for rank in range(2)] == DUALPIPE_V_2_4


def _hand_schedule_order(p, n, rank, factor):
    """Qi et al.'s get_hand_schedule (their efficiency script: factor 1 is
    ZB-H1, 2 ZB-H2), rewritten: 0, 1, 2 for F, B (the input half), W."""
    warmup = (p - rank - 1) * factor
    order = [0] * warmup
    for i in range(n):
        if warmup + i < n:
            order.append(0)
        order.append(1)
        if warmup + i >= (p - 1) * factor:
            order.append(2)
    return order + [2] * ((p - 1) * factor - warmup)


@pytest.mark.parametrize("build, factor", [(zb_h1, 1), (zb_h2, 2)])
def test_zb_h1_and_h2_are_the_orders_of_the_authors_script(build, factor):
    """Their script asks m >= 2p; micro-batches of each kind go in order."""
    for p in range(1, 7):
        for m in range(2 * p, 3 * p + 2):
            schedule = build(p, m)
            for rank in range(p):
                letters = [{"F": 0, "I": 1, "W": 2}[text[0]]
                           for text in schedule.compute_order(rank)]
                assert letters == _hand_schedule_order(p, m, rank, factor), (p, m, rank)
                for letter in "FIW":
                    assert [int(t[1:]) for t in schedule.compute_order(rank)
                            if t[0] == letter] == list(range(m))


def test_zb_h1_with_fewer_microbatches_than_stages_warms_up_with_all_it_has():
    # p = 4, m = 2: warm-ups of min(p - 1 - r, m) = 2, 2, 1, 0 forwards; W's r rounds
    # late, or at the end
    assert [" ".join(zb_h1(4, 2).compute_order(rank)) for rank in range(4)] == [
        "F0 F1 I0 W0 I1 W1", "F0 F1 I0 I1 W0 W1", "F0 F1 I0 I1 W0 W1", "F0 I0 F1 I1 W0 W1"]


# --------------------------------------------------------------------------- every size


def _zero_bubble_schedules():
    for stages in range(1, 7):
        for microbatches in range(1, 4 * stages + 2):
            yield zb_h1(stages, microbatches)
            yield zb_h2(stages, microbatches)
            yield zb_v(stages, microbatches)
            if microbatches >= 2 * stages:
                yield dualpipe_v(stages, microbatches)


def test_every_size_completes_with_each_piece_of_work_once():
    """For each (micro-batch, chunk): one forward, and one B or one I and one W."""
    count = 0
    for schedule in _zero_bubble_schedules():
        p, m, v = schedule.stages, schedule.microbatches, schedule.virtual_stages
        events = simulate_schedule(schedule, 1.0, 2.0, 0.25)
        for rank in range(p):
            order = schedule.compute_order(rank)
            for microbatch in range(m):
                for chunk in range(v):
                    piece = f"{microbatch}" + (f"c{chunk}" if chunk else "")
                    assert order.count("F" + piece) == 1, (schedule.name, p, m, rank, piece)
                    whole, halves = order.count("B" + piece), (order.count("I" + piece),
                                                               order.count("W" + piece))
                    assert (whole, halves) in ((1, (0, 0)), (0, (1, 1))), (schedule.name, piece)
                    if whole == 0:
                        assert order.index("I" + piece) < order.index("W" + piece)
            assert schedule.actions[rank][-1].kind == "optimizer_step"
        computed = [e for e in events if e["kind"] == "compute"]
        assert len(computed) == sum(len(schedule.compute_order(r)) + 1 for r in range(p))
        count += 1
    assert count == 3 * sum(4 * p + 1 for p in range(1, 7)) + sum(2 * p + 2 for p in range(1, 7))


def test_sizes_a_schedule_cannot_take_are_refused_with_what_to_pass():
    with pytest.raises(ValueError, match=r"dualpipe_v: 7 micro-batches for 4 ranks: DualPipeV "
                                         r"needs at least 2p = 8 .* pass microbatches >= 8, or "
                                         r"use zbv"):
        dualpipe_v(4, 7)
    with pytest.raises(ValueError, match="microbatches must be a whole number >= 1"):
        zb_h1(2, 0)
    with pytest.raises(ValueError, match="stages must be a whole number >= 1"):
        zb_v(0, 4)
    with pytest.raises(ValueError, match=r"'zbv' holds 2 chunks per rank in a V; "
                                         r"virtual_stages=3 cannot be given"):
        make_schedule("zbv", 2, 4, 3)
    with pytest.raises(ValueError, match=r"schedule 'zb_h1' has one stage per rank; "
                                         r"virtual_stages=2"):
        make_schedule("zb_h1", 2, 4, 2)


def test_names_and_aliases():
    assert {"zb_h1", "zb_h2", "zbv", "dualpipev"} <= set(SCHEDULES)
    for alias, name in [("zb_h1", "zb_h1"), ("ZB-H1", "zb_h1"), ("zero_bubble", "zb_h1"),
                        ("zb1p", "zb_h1"), ("zb_h2", "zb_h2"), ("zb2p", "zb_h2"),
                        ("zbv", "zbv"), ("zb-v", "zbv"), ("ZB_V", "zbv"),
                        ("dualpipev", "dualpipev"), ("DualPipeV", "dualpipev"),
                        ("dualpipe_v", "dualpipev")]:
        schedule = make_schedule(alias, 3, 6)
        assert schedule.name == name, alias
    assert make_schedule("zbv", 2, 4, 2).actions == zb_v(2, 4).actions
    # the old schedules are as they were
    assert make_schedule("1f1b", 3, 4).actions == one_f_one_b(3, 4).actions


def test_the_printout_shows_each_ranks_row():
    printed = str(dualpipe_v(2, 4))
    lines = printed.splitlines()
    assert lines[0] == ("dualpipev: 2 stages, 4 micro-batches, 2 virtual stages per rank in a V "
                        "(rank r holds stages r and 2p-1-r)")
    assert [line.split(":")[0] for line in lines[1:]] == ["  rank 0", "  rank 1"]
    # rank 1 holds stages 1 and 2: its chunk 0 hands over to chunk 1 in memory
    assert lines[2].startswith("  rank 1: recv_act(0)<-0 F0 F0c1 send_act(0c1)->0 ")
    # a pair: its receives, both computations, its sends, in one bracket (rank 1's
    # pairs of stages 1 and 2 hand over between themselves in memory)
    assert " [F3 B1c1 send_act(3)->1 send_grad(1c1)->1] " in lines[1]
    assert " [recv_act(2c1)<-1 recv_grad(0)<-1 F2c1 B0] " in lines[1]
    assert " [recv_act(3)<-0 recv_grad(1c1)<-0 F3 B1c1] " in lines[2]
    assert str(zb_h1(2, 2)).splitlines()[1] == (
        "  rank 0: F0 send_act(0)->1 F1 send_act(1)->1 recv_grad(0)<-1 I0 W0 "
        "recv_grad(1)<-1 I1 W1 step")


# --------------------------------------------------------------------------- the clock


def _regions(events):
    regions = {}
    for event in events:
        info = trace.label_info(event["label"])
        if event["kind"] == "compute" and info.get("pipeline") in ("F", "B", "I", "W", "R"):
            regions[(info["pipeline"], info["mb"], info["stage"])] = event
    return regions


def test_a_split_backward_shares_the_whole_ones_time():
    # weight_time defaults to half the backward: I and W of 1 unit each
    events = simulate_schedule(zb_h1(2, 2), 1.0, 2.0)
    for (letter, _, _), event in _regions(events).items():
        assert event["end"] - event["start"] == UNIT_NS, letter
    events = simulate_schedule(zb_h1(2, 2), 1.0, 2.0, weight_time=0.5)
    durations = {letter: event["end"] - event["start"]
                 for (letter, _, _), event in _regions(events).items()}
    assert durations == {"F": UNIT_NS, "I": 3 * UNIT_NS // 2, "W": UNIT_NS // 2}
    # per (stage, micro-batch), as the other costs
    events = simulate_schedule(zb_h1(2, 2), 1.0, lambda stage, mb: 2.0 + stage,
                               weight_time=lambda stage, mb: 0.5 * (1 + mb))
    for (letter, mb, stage), event in _regions(events).items():
        expected = {"F": 1.0, "I": 2.0 + stage - 0.5 * (1 + mb), "W": 0.5 * (1 + mb)}[letter]
        assert event["end"] - event["start"] == round(expected * UNIT_NS)
    with pytest.raises(ValueError, match=r"at stage 1, micro-batch 0 the weight half costs 3, "
                                         r"more than the whole backward's 2: weight_time is a "
                                         r"part of backward_time"):
        simulate_schedule(zb_h1(2, 2), 1.0, 2.0, weight_time=3.0)


def test_dependencies_of_the_halves():
    """I waits for the next stage's I (or B); W for its own I only: it sends nothing."""
    events = simulate_schedule(dualpipe_v(3, 6), 1.0, 2.0, 0.5)
    regions = _regions(events)
    schedule = dualpipe_v(3, 6)
    last = schedule.total_stages - 1
    for (letter, mb, stage), event in regions.items():
        if letter in "BI" and stage < last:
            after = regions.get(("I", mb, stage + 1)) or regions[("B", mb, stage + 1)]
            rank_here = schedule.rank_of(stage)[0]
            same_rank = schedule.rank_of(stage + 1)[0] == rank_here
            assert event["start"] >= after["end"] + (0 if same_rank else UNIT_NS // 2)
        if letter == "W":
            assert event["start"] >= regions[("I", mb, stage)]["end"]
        if letter == "F" and stage > 0:
            same_rank = schedule.rank_of(stage - 1)[0] == schedule.rank_of(stage)[0]
            assert event["start"] >= regions[("F", mb, stage - 1)]["end"] + \
                (0 if same_rank else UNIT_NS // 2)


def test_the_v_placement_sends_between_ranks_and_hands_over_on_one():
    schedule = zb_v(3, 6)
    events = simulate_schedule(schedule, 1.0, 2.0, message_bytes=8)
    pairs = list(trace.iter_messages(events))
    # 2p - 1 = 5 links between stages, one of them inside rank 2 (stages 2 and 3)
    assert len(pairs) == 2 * 6 * (2 * 3 - 2)
    for send, received in pairs:
        assert received is not None and send["peer"] == received["rank"]
        assert abs(send["rank"] - received["rank"]) == 1
    assert not [e for e in events if e["kind"] in ("send", "recv") and e["rank"] == e["peer"]]


def test_memory_counts_a_piece_from_its_forward_to_its_weight_half():
    events = simulate_schedule(zb_h1(2, 2), activation_bytes=100, weight_kept_bytes=40)
    rank0 = [trace.label_info(e["label"]) for e in events
             if e["kind"] == "memory" and e["rank"] == 0]
    # rank 0: F0 F1 I0 W0 I1 W1
    assert [(m["live_microbatches"], m["weights_pending"], m["activations"],
             m["weights_pending_bytes"]) for m in rank0] == [
        (1, 0, 100, 0), (2, 0, 200, 0), (2, 1, 140, 40), (1, 0, 100, 0), (1, 1, 40, 40),
        (0, 0, 0, 0)]
    # without a split the memory events are as they always were
    plain = [trace.label_info(e["label"]) for e in simulate_schedule(one_f_one_b(2, 2))
             if e["kind"] == "memory"]
    assert all("weights_pending" not in m for m in plain)


def test_bubble_fraction_counts_the_halves_as_work():
    events = simulate_schedule(zb_h1(4, 8), 1.0, 2.0)
    busy = sum(e["end"] - e["start"] for e in events if e["kind"] == "compute"
               and trace.label_info(e["label"]).get("pipeline") in ("F", "I", "W"))
    makespan = max(e["end"] for e in events) - min(e["start"] for e in events)
    assert bubble_fraction(events, 4) == float(1 - Fraction(busy, 4 * makespan))
    # ZB-H1, F = B = W: its bubble (p-1)(F+B-W) is 3 units of a makespan of 3m + 3 = 27
    assert bubble_fraction(events, 4) == float(Fraction(3, 27))


def test_recomputation_runs_before_the_input_half():
    events = simulate_schedule(zb_h1(3, 4), 1.0, 2.0, recompute=True)
    for rank in range(3):
        texts = [trace.label_text(e["label"]) for e in events
                 if e["rank"] == rank and e["kind"] == "compute"]
        for index, text in enumerate(texts):
            if text.startswith("I"):
                assert texts[index - 1] == "R" + text[1:]
        assert not any(text.startswith("R") and texts[i + 1][0] != "I"
                       for i, text in enumerate(texts))


def test_a_deadlocked_split_schedule_names_the_waiting_actions():
    schedule = zb_h1(2, 1)
    rows = [list(row) for row in schedule.actions]
    # rank 0: F0 send_act(0)->1 recv_grad(0)<-1 I0 W0 step: wait for the gradient first
    rows[0] = [rows[0][2], rows[0][0], rows[0][1]] + rows[0][3:]
    broken = Schedule("zb_h1", 2, 1, 1, rows)
    with pytest.raises(DeadlockError, match=r"rank 0 waits at action 0 \(recv_grad\(0\)<-1\); "
                                            r"rank 1 waits at action 0 \(recv_act\(0\)<-0\)"):
        simulate_schedule(broken)


def test_peaks_of_the_memory_ledger():
    assert peak_live_microbatches(simulate_schedule(zb_h1(4, 8))) == {r: 4 for r in range(4)}
    assert peak_live_microbatches(simulate_schedule(zb_h2(4, 8))) == {r: 7 for r in range(4)}
    assert peak_live_microbatches(simulate_schedule(zb_v(4, 8))) == {r: 8 for r in range(4)}
    assert peak_live_microbatches(simulate_schedule(dualpipe_v(4, 8))) == \
        {r: 9 for r in range(4)}
