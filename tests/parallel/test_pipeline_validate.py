"""A wrong schedule is refused by name: the rank, the action's index and what
is wrong, by validate_schedule and by the simulator, which runs it first.

Each case breaks one rule of a correct schedule (built here by hand or by
the schedule functions) and checks the words; the correct ones pass.
"""

from __future__ import annotations

import pytest

from minidist.parallel.pipeline import (
    Action,
    Schedule,
    ScheduleError,
    dualpipe_v,
    gpipe,
    make_schedule,
    one_f_one_b,
    simulate_schedule,
    validate_schedule,
    zb_h1,
    zb_v,
)

F, B, I, W = "forward", "backward", "backward_input", "backward_weight"  # noqa: E741
STEP = Action("optimizer_step", None, 0, "step")


def _one_rank(*actions, microbatches=2, chunks=1, placement="loop", name="hand"):
    return Schedule(name, 1, microbatches, chunks, [list(actions) + [STEP]], placement)


def _refused(schedule, words):
    """Both refuse it with the same words."""
    with pytest.raises(ScheduleError, match=words):
        validate_schedule(schedule)
    with pytest.raises(ValueError, match=words):
        simulate_schedule(schedule)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb_h1", "zb_h2", "zbv", "dualpipev"])
@pytest.mark.parametrize("stages, microbatches", [(1, 2), (2, 4), (3, 6), (4, 8), (5, 11)])
def test_the_schedules_are_valid(name, stages, microbatches):
    assert validate_schedule(make_schedule(name, stages, microbatches)) is None


def test_a_weight_half_before_its_input_half():
    _refused(_one_rank(Action(F, 0), Action(W, 0), Action(I, 0), microbatches=1),
             r"rank 0, action 1 \(W0\): runs before its input half I0 \(a W needs what its "
             r"I kept\)")


def test_an_input_half_or_a_backward_before_its_forward():
    _refused(_one_rank(Action(I, 0), Action(F, 0), microbatches=1),
             r"rank 0, action 0 \(I0\): runs before its forward")
    _refused(_one_rank(Action(F, 1), Action(B, 0), Action(F, 0)),
             r"rank 0, action 1 \(B0\): runs before its forward")


def test_a_microbatch_backwarded_twice():
    _refused(_one_rank(Action(F, 0), Action(B, 0), Action(I, 0), microbatches=1),
             r"rank 0, action 2 \(I0\): backwards micro-batch 0 twice: action 1 ran its "
             r"whole backward B already")
    _refused(_one_rank(Action(F, 0), Action(I, 0), Action(B, 0), microbatches=1),
             r"rank 0, action 2 \(B0\): backwards micro-batch 0 twice: action 1 ran its "
             r"input half I already")
    _refused(_one_rank(Action(F, 0), Action(I, 0), Action(W, 0), Action(W, 0),
                       microbatches=1),
             r"rank 0, action 3 \(W0\): runs the weight half of micro-batch 0 twice "
             r"\(action 2\)")
    _refused(_one_rank(Action(F, 0), Action(B, 0), Action(W, 0), microbatches=1),
             r"rank 0, action 2 \(W0\): its whole backward B \(action 1\) already computed "
             r"the weights' gradients")


def test_a_weight_half_missing_at_the_step():
    _refused(_one_rank(Action(F, 0), Action(F, 1), Action(I, 0), Action(W, 0), Action(I, 1)),
             r"rank 0, action 5 \(step\): steps with micro-batches whose weight half W has "
             r"not run: I1 \(each I needs its W before the step\)")
    _refused(_one_rank(Action(F, 0), Action(F, 1), Action(B, 0)),
             r"rank 0, action 3 \(step\): steps with micro-batches still waiting for their "
             r"backward: F1")


def _replaced(schedule, rank, index, action):
    rows = [list(row) for row in schedule.actions]
    rows[rank][index] = action
    return Schedule(schedule.name, schedule.stages, schedule.microbatches,
                    schedule.virtual_stages, rows, schedule.placement)


def _inserted(schedule, rank, index, action):
    rows = [list(row) for row in schedule.actions]
    rows[rank].insert(index, action)
    return Schedule(schedule.name, schedule.stages, schedule.microbatches,
                    schedule.virtual_stages, rows, schedule.placement)


def test_a_message_sent_or_received_twice():
    schedule = zb_h1(2, 2)
    # rank 0: F0 send_act(0)->1 F1 send_act(1)->1 recv_grad(0)<-1 I0 W0 ...
    send = schedule.actions[0][1]
    assert str(send) == "send_act(0)->1"
    _refused(_inserted(schedule, 0, 2, send),
             r"schedule 'zb_h1': rank 0, action 2 \(send_act\(0\)->1\): sends the same "
             r"message twice \(action 1\)")
    receive = schedule.actions[1][0]
    assert str(receive) == "recv_act(0)<-0"
    _refused(_inserted(schedule, 1, 1, receive),
             r"rank 1, action 1 \(recv_act\(0\)<-0\): receives the same message twice")


def test_messages_go_to_the_rank_of_the_neighbouring_stage():
    schedule = one_f_one_b(3, 2)
    wrong = Action("send_activation", 0, 0, "warmup", peer=2)
    assert str(schedule.actions[0][1]) == "send_act(0)->1"
    _refused(_replaced(schedule, 0, 1, wrong),
             r"rank 0, action 1 \(send_act\(0\)->2\): stage 1 is not on rank 2")
    # the V placement: rank 1 of 2 holds stages 1 and 2, which hand over in memory
    v = zb_v(2, 4)
    _refused(_inserted(v, 1, 2, Action("send_activation", 0, 0, "warmup", peer=1)),
             r"rank 1, action 2 \(send_act\(0\)->1\): stage 2 is on this rank: neighbouring "
             r"stages of one rank hand over in memory, without a message")


def test_a_send_nobody_receives_and_a_receive_nobody_sends():
    schedule = gpipe(2, 1)
    # rank 0: F0 send_act(0)->1 recv_grad(0)<-1 B0 step
    # rank 1: recv_act(0)<-0 F0 B0 send_grad(0)->0 step
    first, second = schedule.actions
    idle_second = Schedule("gpipe", 2, 1, 1, [first, [STEP]])
    _refused(idle_second, r"rank 0, action 1 \(send_act\(0\)->1\): sends the activation of "
                          r"micro-batch 0 to stage 1, which rank 1 never receives")
    unsent = Schedule("gpipe", 2, 1, 1, [[a for a in first if a.kind != "send_activation"],
                                         second])
    _refused(unsent, r"rank 1, action 0 \(recv_act\(0\)<-0\): waits for a message rank 0 "
                     r"never sends")
    # without its receive, the forward that needs it is named
    unreceived = Schedule("gpipe", 2, 1, 1, [first, second[1:]])
    _refused(unreceived, r"rank 1, action 0 \(F0\): runs before its activation was received")


def test_forward_and_backward_wait_for_what_the_rank_itself_hands_over():
    """One rank holding two chunks: chunk 1's forward needs chunk 0's."""
    _refused(_one_rank(Action(F, 0, 1), Action(F, 0, 0), microbatches=1, chunks=2),
             r"rank 0, action 0 \(F0c1\): runs before the forward of chunk 0 on this rank")
    _refused(_one_rank(Action(F, 0, 0), Action(F, 0, 1), Action(B, 0, 0), microbatches=1,
                       chunks=2),
             r"rank 0, action 2 \(B0\): runs before the backward of chunk 1 on this rank")
    # in the V placement, rank 0 holds stage 0 and the last stage: they are not neighbours
    v = zb_v(1, 1)
    assert validate_schedule(v) is None


def test_chunks_and_microbatches_out_of_range():
    _refused(_one_rank(Action(F, 0, 1), microbatches=1),
             r"rank 0, action 0 \(F0c1\): chunk 1: each rank holds chunks 0..0")
    _refused(_one_rank(Action(F, 2), microbatches=2),
             r"rank 0, action 0 \(F2\): micro-batch 2: the batch has micro-batches 0..1")


def test_a_pair_that_overlaps_is_checked_like_any_action():
    schedule = dualpipe_v(2, 4)
    assert validate_schedule(schedule) is None
    # drop the receive of a pair's backward: its gradient is never at hand
    rows = [list(row) for row in schedule.actions]
    index = next(i for i, a in enumerate(rows[0]) if a.phase == "overlap"
                 and a.kind == "recv_grad")
    del rows[0][index]
    broken = Schedule(schedule.name, 2, 4, 2, rows, "v")
    with pytest.raises(ScheduleError, match=r"rank 0, action \d+ \(B\d+(c1)?\): runs before its "
                                            r"gradient was received"):
        validate_schedule(broken)
