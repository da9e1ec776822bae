"""Pipeline schedules are data: checked against hand-written orders, run to
completion on the virtual clock for every small size, and measured there.

Bubble definition (the one :func:`bubble_fraction` uses): over one batch,
from the first forward/backward region's start to the last one's end,
``1 - busy / (p * makespan)``, busy being the summed F/B/R time of all ranks.
"""

from __future__ import annotations

import numpy as np
import pytest

from minidist import nn, trace
from minidist.parallel.pipeline import (
    Action,
    DeadlockError,
    Schedule,
    balanced_partition,
    bubble_fraction,
    gpipe,
    interleaved_one_f_one_b,
    make_schedule,
    one_f_one_b,
    peak_live_microbatches,
    simulate_schedule,
    split_microbatches,
    split_model,
)
from minidist.parallel.pipeline.schedules import UNIT_NS

# --------------------------------------------------------------------------- hand-written orders

EXPECTED = {
    ("gpipe", 2, 3): [
        "F0 send_act(0)->1 F1 send_act(1)->1 F2 send_act(2)->1 "
        "recv_grad(0)<-1 B0 recv_grad(1)<-1 B1 recv_grad(2)<-1 B2 step",
        "recv_act(0)<-0 F0 recv_act(1)<-0 F1 recv_act(2)<-0 F2 "
        "B0 send_grad(0)->0 B1 send_grad(1)->0 B2 send_grad(2)->0 step",
    ],
    ("1f1b", 2, 3): [
        # warm-up of p - 0 - 1 = 1 forward, two steady rounds, one backward to drain
        "F0 send_act(0)->1 F1 send_act(1)->1 recv_grad(0)<-1 B0 "
        "F2 send_act(2)->1 recv_grad(1)<-1 B1 recv_grad(2)<-1 B2 step",
        "recv_act(0)<-0 F0 B0 send_grad(0)->0 recv_act(1)<-0 F1 B1 send_grad(1)->0 "
        "recv_act(2)<-0 F2 B2 send_grad(2)->0 step",
    ],
    ("gpipe", 3, 4): [
        "F0 send_act(0)->1 F1 send_act(1)->1 F2 send_act(2)->1 F3 send_act(3)->1 "
        "recv_grad(0)<-1 B0 recv_grad(1)<-1 B1 recv_grad(2)<-1 B2 recv_grad(3)<-1 B3 step",
        "recv_act(0)<-0 F0 send_act(0)->2 recv_act(1)<-0 F1 send_act(1)->2 "
        "recv_act(2)<-0 F2 send_act(2)->2 recv_act(3)<-0 F3 send_act(3)->2 "
        "recv_grad(0)<-2 B0 send_grad(0)->0 recv_grad(1)<-2 B1 send_grad(1)->0 "
        "recv_grad(2)<-2 B2 send_grad(2)->0 recv_grad(3)<-2 B3 send_grad(3)->0 step",
        "recv_act(0)<-1 F0 recv_act(1)<-1 F1 recv_act(2)<-1 F2 recv_act(3)<-1 F3 "
        "B0 send_grad(0)->1 B1 send_grad(1)->1 B2 send_grad(2)->1 B3 send_grad(3)->1 step",
    ],
    ("1f1b", 3, 4): [
        "F0 send_act(0)->1 F1 send_act(1)->1 "
        "F2 send_act(2)->1 recv_grad(0)<-1 B0 F3 send_act(3)->1 recv_grad(1)<-1 B1 "
        "recv_grad(2)<-1 B2 recv_grad(3)<-1 B3 step",
        "recv_act(0)<-0 F0 send_act(0)->2 "
        "recv_act(1)<-0 F1 send_act(1)->2 recv_grad(0)<-2 B0 send_grad(0)->0 "
        "recv_act(2)<-0 F2 send_act(2)->2 recv_grad(1)<-2 B1 send_grad(1)->0 "
        "recv_act(3)<-0 F3 send_act(3)->2 recv_grad(2)<-2 B2 send_grad(2)->0 "
        "recv_grad(3)<-2 B3 send_grad(3)->0 step",
        "recv_act(0)<-1 F0 B0 send_grad(0)->1 recv_act(1)<-1 F1 B1 send_grad(1)->1 "
        "recv_act(2)<-1 F2 B2 send_grad(2)->1 recv_act(3)<-1 F3 B3 send_grad(3)->1 step",
    ],
}

# Interleaved, p = 2, m = 4, v = 2. Order of (micro-batch, chunk): rounds of p = 2
# micro-batches, forward chunk 0 then 1, backward chunk 1 then 0. Warm-up
# (v - 1) p + 2 (p - r - 1): 4 forwards on rank 0, 2 on rank 1.
EXPECTED_INTERLEAVED_COMPUTE = [
    "F0 F1 F0c1 F1c1  F2 B0c1 F3 B1c1 F2c1 B0 F3c1 B1  B2c1 B3c1 B2 B3",
    "F0 F1  F0c1 B0c1 F1c1 B1c1 F2 B0 F3 B1 F2c1 B2c1 F3c1 B3c1  B2 B3",
]
# Rank 1 sends chunk 0's output to rank 0 (chunk 1 there) and gets chunk 1's gradient back.
EXPECTED_INTERLEAVED_RANK_1_START = (
    "recv_act(0)<-0 F0 send_act(0)->0 recv_act(1)<-0 F1 send_act(1)->0 "
    "recv_act(0c1)<-0 F0c1 B0c1 send_grad(0c1)->0")


@pytest.mark.parametrize("name, stages, microbatches", sorted(EXPECTED))
def test_schedule_matches_the_hand_written_order(name, stages, microbatches):
    schedule = make_schedule(name, stages, microbatches)
    assert [" ".join(map(str, actions)) for actions in schedule.actions] == \
        EXPECTED[(name, stages, microbatches)]


def test_interleaved_matches_the_hand_written_order():
    schedule = interleaved_one_f_one_b(2, 4, 2)
    assert [schedule.compute_order(rank) for rank in range(2)] == \
        [row.split() for row in EXPECTED_INTERLEAVED_COMPUTE]
    assert " ".join(map(str, schedule.actions[1])).startswith(EXPECTED_INTERLEAVED_RANK_1_START)
    # global stage = chunk * p + rank: rank 1's chunk 1 is the last of 4 stages
    assert schedule.stage_of(1, 1) == 3 and schedule.total_stages == 4


def test_phases_are_named():
    schedule = one_f_one_b(3, 4)
    phases = [(str(a), a.phase) for a in schedule.actions[0] if a.kind in ("forward", "backward")]
    assert phases == [("F0", "warmup"), ("F1", "warmup"), ("F2", "steady"), ("B0", "steady"),
                      ("F3", "steady"), ("B1", "steady"), ("B2", "cooldown"),
                      ("B3", "cooldown")]
    assert schedule.actions[0][-1] == Action("optimizer_step", None, 0, "step")
    assert {a.phase for a in gpipe(3, 4).actions[1]} == {"warmup", "cooldown", "step"}


def test_interleaved_with_m_not_a_multiple_of_p_leaves_out_the_padded_microbatches():
    # m = 3 on p = 2 runs the m = 4 schedule without micro-batch 3's actions
    padded, schedule = interleaved_one_f_one_b(2, 4, 2), interleaved_one_f_one_b(2, 3, 2)
    for rank in range(2):
        assert [str(a) for a in schedule.actions[rank]] == \
            [str(a) for a in padded.actions[rank] if a.microbatch != 3]


def test_with_one_rank_chunks_hand_over_in_memory():
    # rounds of p = 1 micro-batch; warm-up (v - 1) p = 2 forwards, then 1F1B
    schedule = interleaved_one_f_one_b(1, 2, 3)
    assert schedule.compute_order(0) == ["F0", "F0c1", "F0c2", "B0c2", "F1", "B0c1",
                                         "F1c1", "B0", "F1c2", "B1c2", "B1c1", "B1"]
    assert all(a.kind in ("forward", "backward", "optimizer_step") for a in schedule.actions[0])


# --------------------------------------------------------------------------- every size completes


def _all_schedules():
    for stages in range(1, 7):
        for microbatches in range(1, 13):
            yield gpipe(stages, microbatches)
            yield one_f_one_b(stages, microbatches)
            for virtual in range(1, 4):
                yield interleaved_one_f_one_b(stages, microbatches, virtual)


def test_every_schedule_completes_and_runs_each_microbatch_once():
    count = 0
    for schedule in _all_schedules():
        events = simulate_schedule(schedule, transfer_time=0.5)
        p, m, v = schedule.stages, schedule.microbatches, schedule.virtual_stages
        for rank in range(p):
            expected = sorted(f"{letter}{mb}" + (f"c{chunk}" if chunk else "")
                              for letter in "FB" for mb in range(m) for chunk in range(v))
            assert sorted(schedule.compute_order(rank)) == expected, (schedule.name, p, m, v)
            assert schedule.actions[rank][-1].kind == "optimizer_step"
        regions = [e for e in events if e["kind"] == "compute"]
        assert len(regions) == p * (2 * m * v + 1)
        count += 1
    assert count == 6 * 12 * 5


def test_trace_events_have_the_real_trace_shape():
    events = simulate_schedule(interleaved_one_f_one_b(3, 6, 2), 1.0, 2.0, 0.25,
                               message_bytes=64)
    for event in events:
        assert set(event) == set(trace.FIELDS)
        assert isinstance(event["start"], int) and isinstance(event["end"], int)
        assert event["end"] >= event["start"]
    pairs = list(trace.iter_messages(events))
    assert len(pairs) == sum(e["kind"] == "send" for e in events) == 2 * 6 * (3 * 2 - 1)
    for send, recv in pairs:
        assert recv is not None and recv["end"] >= send["end"] == send["start"] + UNIT_NS // 4
        assert trace.label_info(send["label"])["pipeline"] in ("act", "grad")
        assert send["tag"] == recv["tag"] and send["bytes"] == 64
    for event in events:
        if event["kind"] == "compute" and trace.label_text(event["label"]) != "step":
            info = trace.label_info(event["label"])
            assert info["stage"] == info["chunk"] * 3 + event["rank"]
            assert trace.label_text(event["label"]) == f"{info['pipeline']}{info['mb']}"
            assert info["phase"] in ("warmup", "steady", "cooldown")


def test_forward_waits_for_the_previous_stage_and_backward_for_the_next():
    events = simulate_schedule(one_f_one_b(4, 6), 1.0, 2.0, 0.5)
    region = {}
    for event in events:
        info = trace.label_info(event["label"])
        if event["kind"] == "compute" and info["pipeline"] in "FB":
            region[(info["pipeline"], info["mb"], info["stage"])] = event
    for (letter, mb, stage), event in region.items():
        if letter == "F" and stage > 0:
            assert event["start"] >= region[("F", mb, stage - 1)]["end"] + UNIT_NS // 2
        if letter == "B" and stage < 3:
            assert event["start"] >= region[("B", mb, stage + 1)]["end"] + UNIT_NS // 2
        if letter == "B":
            assert event["start"] >= region[("F", mb, stage)]["end"]


# --------------------------------------------------------------------------- wrong schedules


def _with_actions(schedule, rank, actions):
    rows = [list(row) for row in schedule.actions]
    rows[rank] = actions
    return Schedule(schedule.name, schedule.stages, schedule.microbatches,
                    schedule.virtual_stages, rows)


def test_a_deadlock_is_reported_with_the_stuck_actions():
    schedule = one_f_one_b(2, 2)
    # rank 0 waits for a gradient before sending the activation it depends on
    broken = _with_actions(schedule, 0, [
        Action("forward", 0), Action("recv_grad", 0, peer=1), Action("send_activation", 0, peer=1),
        Action("backward", 0), Action("forward", 1), Action("send_activation", 1, peer=1),
        Action("recv_grad", 1, peer=1), Action("backward", 1), Action("optimizer_step", None)])
    with pytest.raises(DeadlockError) as error:
        simulate_schedule(broken)
    message = str(error.value)
    assert "rank 0 waits at action 1 (recv_grad(0)<-1)" in message
    assert "rank 1 waits at action 0 (recv_act(0)<-0)" in message


def test_a_wrong_schedule_is_a_clear_error():
    schedule = gpipe(1, 2)
    backward_first = _with_actions(schedule, 0, [Action("backward", 0), Action("forward", 0)])
    with pytest.raises(ValueError, match=r"rank 0, action 0 \(B0\): runs before its forward"):
        simulate_schedule(backward_first)
    twice = _with_actions(gpipe(2, 1), 0, [Action("forward", 0),
                                           Action("send_activation", 0, peer=1),
                                           Action("send_activation", 0, peer=1)])
    with pytest.raises(ValueError, match=r"action 2 \(send_act\(0\)->1\): sends the same"):
        simulate_schedule(twice)
    with pytest.raises(ValueError, match="microbatches must be a whole number >= 1"):
        one_f_one_b(2, 0)
    with pytest.raises(ValueError, match="virtual_stages=2 needs schedule='interleaved_1f1b'"):
        make_schedule("1f1b", 2, 4, 2)
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        make_schedule("zigzag", 2, 4)


# --------------------------------------------------------------------------- bubble and memory


@pytest.mark.parametrize("forward_time, backward_time", [(1.0, 1.0), (1.0, 2.0), (1.5, 2.5)])
def test_bubble_of_gpipe_and_1f1b_is_the_formula_exactly(forward_time, backward_time):
    for stages in range(1, 7):
        for microbatches in range(1, 13):
            expected = (stages - 1) / (microbatches + stages - 1)
            for schedule in (gpipe(stages, microbatches), one_f_one_b(stages, microbatches)):
                events = simulate_schedule(schedule, forward_time, backward_time)
                assert bubble_fraction(events, stages) == expected, (schedule.name, stages,
                                                                     microbatches)


@pytest.mark.parametrize("forward_time, backward_time", [(1.0, 1.0), (1.0, 2.0)])
def test_interleaving_divides_the_bubble_by_v(forward_time, backward_time):
    """Each of the v m pieces of work per rank costs f and b (a chunk is 1 / v
    of a stage), the fill and drain p - 1 chunk-steps: with m a multiple of p
    the simulator gives exactly (p - 1) / (v m + p - 1). Otherwise the
    padded rounds leave extra idle slots, but never more than 1F1B's."""
    for stages in range(2, 7):
        for virtual in range(1, 4):
            for microbatches in range(1, 13):
                events = simulate_schedule(
                    interleaved_one_f_one_b(stages, microbatches, virtual),
                    forward_time, backward_time)
                bubble = bubble_fraction(events, stages)
                if microbatches % stages == 0:
                    assert bubble == (stages - 1) / (virtual * microbatches + stages - 1)
                else:
                    assert bubble <= (stages - 1) / (microbatches + stages - 1) + 1e-12


def test_peak_live_activations_gpipe_m_and_1f1b_p_minus_s():
    for stages in range(1, 7):
        for microbatches in range(1, 13):
            peaks = peak_live_microbatches(simulate_schedule(gpipe(stages, microbatches)))
            assert peaks == {s: microbatches for s in range(stages)}
            peaks = peak_live_microbatches(simulate_schedule(one_f_one_b(stages, microbatches)))
            assert peaks == {s: min(stages - s, microbatches) for s in range(stages)}


def test_recomputation_adds_a_forward_before_each_backward():
    events = simulate_schedule(one_f_one_b(3, 4), 1.0, 2.0, recompute=True)
    for rank in range(3):
        letters = [trace.label_text(e["label"]) for e in events
                   if e["rank"] == rank and e["kind"] == "compute"]
        for index, letter in enumerate(letters):
            if letter.startswith("B"):
                assert letters[index - 1] == "R" + letter[1:]
    # R + B acts as one longer backward: the bubble keeps its formula
    assert bubble_fraction(events, 3) == (3 - 1) / (4 + 3 - 1)


def test_bubble_needs_pipeline_regions():
    with pytest.raises(ValueError, match="no pipeline compute regions"):
        bubble_fraction([{"rank": 0, "kind": "send", "start": 0, "end": 1, "label": ""}], 1)


# --------------------------------------------------------------------------- splitting


def test_balanced_partition_minimizes_the_largest_stage():
    assert balanced_partition([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert balanced_partition([5, 1, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 6)]
    # layers with no cost (activations) stay with the layer before them
    assert balanced_partition([4, 0, 4, 0, 4], 3) == [range(0, 2), range(2, 4), range(4, 5)]
    # every stage gets a layer even when the costs would rather not split
    assert balanced_partition([0, 0, 9], 3) == [range(0, 1), range(1, 2), range(2, 3)]
    with pytest.raises(ValueError, match="cannot cut 2 layers into 3 stages"):
        balanced_partition([1, 1], 3)


def _model():
    nn.init.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 2))


def test_split_model_by_parameters_and_by_time():
    model = _model()
    stages = split_model(model, 2, by="parameters")
    # 160 | 0 | 1056 | 0 | 66: the big middle layer alone would leave 1056 on one side anyway
    assert [len(stage) for stage in stages] == [2, 3]
    assert stages[0][0] is model[0] and stages[1][2] is model[4]
    timed = split_model(model, 3, by="time", sample=np.ones((8, 4), np.float32))
    assert [layer for stage in timed for layer in stage] == list(model)
    assert all(len(stage) >= 1 for stage in timed)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="pass sample="):
        split_model(model, 2, by="time")
    with pytest.raises(ValueError, match="choose 'parameters' or 'time'"):
        split_model(model, 2, by="flops")


def test_split_microbatches_uneven():
    pieces = split_microbatches(np.arange(10), 4)
    assert [len(p) for p in pieces] == [3, 3, 2, 2]
    assert np.concatenate(pieces).tolist() == list(range(10))
    with pytest.raises(ValueError, match="a batch of 3 examples cannot be cut into 4"):
        split_microbatches(np.arange(3), 4)
