"""Pipeline schedules as plain data (the virtual clock that runs them:
:mod:`minidist.parallel.pipeline.simulate`).

A pipeline cuts a model into ``p`` stages, one per rank, and a batch into
``m`` micro-batches. A *schedule* says, for every rank, the exact order of
what it does: forward micro-batch k, backward micro-batch k, send or receive
an activation or a gradient, and finally the optimizer step. Each schedule is
built by a pure function, so it can be printed, tested and drawn without any
process; the runtime (:mod:`minidist.parallel.pipeline.executor`) executes the very
same list, action by action.

The three schedules of the course, and what each costs (f, b: forward and
backward time of one stage on one micro-batch; no transfer time):

* :func:`gpipe` (all forward, then all backward). Every stage forwards all m
  micro-batches, then runs all m backwards. Time (m + p - 1)(f + b); bubble
  (p - 1) / (m + p - 1); each stage holds the activations of all m
  micro-batches at the turn.
* :func:`one_f_one_b` (PipeDream-flush). Stage s runs p - s - 1 forwards
  (warm-up), then alternates one forward and one backward (steady state),
  then runs the backwards left (cool-down). Same time and bubble as GPipe,
  but stage s never holds more than p - s micro-batches' activations.
* :func:`interleaved_one_f_one_b` (Megatron-LM). Each rank holds v
  non-consecutive *virtual stages* (chunks): with p ranks the model is cut
  into p v pieces and rank r holds pieces r, r + p, r + 2p, ... A micro-batch
  goes round the ranks v times, each pass costing f / v and b / v, so the
  fill and drain shrink v-fold: bubble (p - 1) / (v m + p - 1), for v times
  as many messages.

Splitting the backward into its input half and its weight half shrinks the
bubble further: the zero-bubble schedules (ZB-H1, ZB-H2, ZB-V, DualPipeV)
are in :mod:`~minidist.parallel.pipeline.zero_bubble`, and
:func:`make_schedule` builds every one by name (:data:`SCHEDULES`).

The data (:class:`Action`, :class:`Schedule`, the kinds of action and their
conventions) is in :mod:`~minidist.parallel.pipeline.actions`, and is
importable from here too.
"""

from __future__ import annotations

# The data a schedule is made of, here too under the names it always had.
from minidist.parallel.pipeline.actions import (  # noqa: F401
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    KINDS,
    LETTERS,
    OPTIMIZER_STEP,
    PHASES,
    PLACEMENTS,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    UNIT_NS,
    Action,
    Schedule,
    _RankBuilder,
)
from minidist.parallel.pipeline.actions import check_sizes as _check_sizes
from minidist.parallel.pipeline.zero_bubble import dualpipe_v, zb_h1, zb_h2, zb_v

# --------------------------------------------------------------------------- schedules


def gpipe(stages: int, microbatches: int) -> Schedule:
    """All forward, then all backward (GPipe).

    Every rank forwards micro-batches 0..m-1 (phase "warmup": the pipeline
    fills), then backwards 0..m-1 (phase "cooldown": it drains); there is no
    steady state. Time (m + p - 1)(f + b), bubble (p - 1) / (m + p - 1);
    activations of all m micro-batches are alive at the turn, on every stage.
    Messages: m activations and m gradients over each of the p - 1 links."""
    _check_sizes("gpipe", stages, microbatches)
    actions = []
    for rank in range(stages):
        builder = _RankBuilder(rank, stages, 1)
        for microbatch in range(microbatches):
            builder.forward(microbatch, 0, "warmup")
        for microbatch in range(microbatches):
            builder.backward(microbatch, 0, "cooldown")
        actions.append(builder.step())
    return Schedule("gpipe", stages, microbatches, 1, actions)


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """One forward, one backward (PipeDream-flush, "1F1B").

    Stage s: warm-up of min(p - s - 1, m) forwards; steady state of
    m - warm-up rounds "forward the next micro-batch, backward the oldest";
    cool-down: the backwards left. The last stage starts a backward as soon
    as its first forward is done, and a backward frees its micro-batch's
    activations, so stage s holds at most min(p - s, m) micro-batches at
    once (GPipe: m). Time and bubble as GPipe: (m + p - 1)(f + b) and
    (p - 1) / (m + p - 1); the same messages."""
    _check_sizes("one_f_one_b", stages, microbatches)
    actions = []
    for rank in range(stages):
        builder = _RankBuilder(rank, stages, 1)
        warmup = min(stages - rank - 1, microbatches)
        for microbatch in range(warmup):
            builder.forward(microbatch, 0, "warmup")
        for oldest in range(microbatches - warmup):
            builder.forward(warmup + oldest, 0, "steady")
            builder.backward(oldest, 0, "steady")
        for oldest in range(microbatches - warmup, microbatches):
            builder.backward(oldest, 0, "cooldown")
        actions.append(builder.step())
    return Schedule("1f1b", stages, microbatches, 1, actions)


def _interleaved_order(stages: int, rounds: int, virtual_stages: int,
                       backward: bool) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in the order every rank runs them: micro-batches
    in rounds of p; within a round, chunk by chunk (forward 0..v-1, backward
    v-1..0), each chunk over the round's p micro-batches."""
    chunks = range(virtual_stages - 1, -1, -1) if backward else range(virtual_stages)
    return [(first + offset, chunk) for first in range(0, rounds * stages, stages)
            for chunk in chunks for offset in range(stages)]


def interleaved_one_f_one_b(stages: int, microbatches: int, virtual_stages: int) -> Schedule:
    """Interleaved 1F1B with ``virtual_stages`` chunks per rank (Megatron-LM).

    Rank r holds the model's pieces r, r + p, ..., r + (v - 1) p. All ranks
    run the v m (micro-batch, chunk) forwards in one order: rounds of p
    micro-batches, each round through chunk 0, then chunk 1, ...; the
    backwards in the same rounds, chunks in reverse. Rank r warms up with
    min(v m, (v - 1) p + 2 (p - r - 1)) forwards (Megatron-LM's count: the
    first backward of the last chunk needs the whole first round forwarded
    through every chunk; the extra p - r - 1 forwards keep the rank busy
    while gradients travel back, which hides transfer time), then alternates
    one forward and one backward, then drains the backwards.

    Each piece costs f / v and b / v, so fill and drain take (p - 1)(f + b) / v
    and the bubble is (p - 1) / (v m + p - 1) when m is a multiple of p;
    the price is v times as many messages, and more activations in flight
    (rank r holds up to (v - 1) p + 2 (p - r - 1) + 1 pieces' activations,
    each 1 / v of a stage's).

    m not a multiple of p (Megatron-LM refuses it): the schedule of the next
    multiple of p, with the actions of the micro-batches that do not exist
    left out. Leaving out every action of a micro-batch cannot create a
    wait cycle, so it still completes; the missing slots are idle time, so
    the bubble is larger than the formula. With v = 1 this is 1F1B with the
    longer warm-up.
    """
    _check_sizes("interleaved_one_f_one_b", stages, microbatches, virtual_stages)
    rounds = -(-microbatches // stages)
    forwards = _interleaved_order(stages, rounds, virtual_stages, backward=False)
    backwards = _interleaved_order(stages, rounds, virtual_stages, backward=True)
    total = len(forwards)
    actions = []
    for rank in range(stages):
        builder = _RankBuilder(rank, stages, virtual_stages, microbatches)
        warmup = min(total, (virtual_stages - 1) * stages + 2 * (stages - rank - 1))
        for microbatch, chunk in forwards[:warmup]:
            builder.forward(microbatch, chunk, "warmup")
        for index in range(total - warmup):
            builder.forward(*forwards[warmup + index], "steady")
            builder.backward(*backwards[index], "steady")
        for microbatch, chunk in backwards[total - warmup:]:
            builder.backward(microbatch, chunk, "cooldown")
        actions.append(builder.step())
    return Schedule("interleaved_1f1b", stages, microbatches, virtual_stages, actions)


def schedule_from_order(name: str, stages: int, microbatches: int, virtual_stages: int,
                        orders: list, placement: str = "loop") -> Schedule:
    """The schedule whose ranks compute in the given order: ``orders[rank]``
    lists that rank's compute actions as ``(letter, micro-batch, chunk,
    phase)`` with letter "F" (forward), "B" (whole backward), "I" or "W"
    (its input and weight halves), e.g. read back from a trace. The
    messages around them and the optimizer step are added as every
    schedule adds them (a forward and a backward that follow each other in
    phase "overlap" as the pair they were), so :func:`simulate_schedule` can
    replay the order on its clock: what a run did, without how long each
    piece took."""
    _check_sizes("schedule_from_order", stages, microbatches, virtual_stages)
    if len(orders) != stages:
        raise ValueError(f"schedule_from_order: {len(orders)} ranks' orders for "
                         f"{stages} stages")
    halves = {"B": BACKWARD, "I": BACKWARD_INPUT}
    actions = []
    for rank, order in enumerate(orders):
        builder = _RankBuilder(rank, stages, virtual_stages, placement=placement)
        steps = {"F": builder.forward, "B": builder.backward, "I": builder.backward_input,
                 "W": builder.backward_weight}
        order = list(order)
        index = 0
        while index < len(order):
            letter, microbatch, chunk, phase = order[index]
            if letter not in steps:
                raise ValueError(f"schedule_from_order: rank {rank}: {letter!r} is not "
                                 "F (forward), B (backward), I (its input half) or W (its "
                                 "weight half)")
            following = order[index + 1] if index + 1 < len(order) else None
            if (letter == "F" and phase == "overlap" and following is not None
                    and following[0] in halves and following[3] == "overlap"):
                builder.overlapped((microbatch, chunk), following[1:3], halves[following[0]])
                index += 2
                continue
            steps[letter](microbatch, chunk, phase)
            index += 1
        actions.append(builder.step())
    return Schedule(name, stages, microbatches, virtual_stages, actions, placement)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved_1f1b": interleaved_one_f_one_b,
             "zb_h1": zb_h1, "zb_h2": zb_h2, "zbv": zb_v, "dualpipev": dualpipe_v}
_ALIASES = {"gpipe": "gpipe", "1f1b": "1f1b", "one_f_one_b": "1f1b",
            "interleaved": "interleaved_1f1b", "interleaved_1f1b": "interleaved_1f1b",
            "interleaved-1f1b": "interleaved_1f1b",
            # torch.distributed.pipelining's ScheduleInterleavedZeroBubble is ZB-H1 ("ZB1P")
            "zb_h1": "zb_h1", "zb-h1": "zb_h1", "zbh1": "zb_h1", "zb1p": "zb_h1",
            "zero_bubble": "zb_h1", "interleaved_zero_bubble": "zb_h1",
            "zb_h2": "zb_h2", "zb-h2": "zb_h2", "zbh2": "zb_h2", "zb2p": "zb_h2",
            "zbv": "zbv", "zb_v": "zbv", "zb-v": "zbv", "zbv_zero_bubble": "zbv",
            "dualpipev": "dualpipev", "dualpipe_v": "dualpipev", "dualpipe-v": "dualpipev"}
#: The schedules that hold two chunks a rank by their own design (the V placement).
_TWO_CHUNKS = ("zbv", "dualpipev")


def make_schedule(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """The schedule called ``name``: "gpipe", "1f1b", "interleaved_1f1b"
    (or "interleaved"), "zb_h1" (or "zero_bubble"), "zb_h2", "zbv" (or
    "zb-v"), "dualpipev". ``virtual_stages`` > 1 needs the interleaved
    schedule; "zbv" and "dualpipev" hold 2 chunks a rank (the V placement)
    and take virtual_stages 1 (the default) or 2."""
    key = _ALIASES.get(str(name).lower())
    if key is None:
        raise ValueError(f"unknown pipeline schedule {name!r}; choose one of "
                         f"{sorted(SCHEDULES)}")
    if key == "interleaved_1f1b":
        return interleaved_one_f_one_b(stages, microbatches, virtual_stages)
    if key in _TWO_CHUNKS:
        if virtual_stages not in (1, 2):
            raise ValueError(f"schedule {key!r} holds 2 chunks per rank in a V; "
                             f"virtual_stages={virtual_stages} cannot be given to it "
                             "(pass 1 or 2)")
        return SCHEDULES[key](stages, microbatches)
    if virtual_stages != 1:
        raise ValueError(f"schedule {key!r} has one stage per rank; virtual_stages="
                         f"{virtual_stages} needs schedule='interleaved_1f1b'")
    return SCHEDULES[key](stages, microbatches)


# --------------------------------------------------------------------------- labels


def message_tag(kind: str, microbatch: int, receiving_stage: int, total_stages: int) -> int:
    """The tag of the message carrying ``kind`` ("act" or "grad") of
    ``microbatch`` to ``receiving_stage``: both ends compute it, so any
    order of arrival matches the right receive."""
    return 2 * (microbatch * total_stages + receiving_stage) + (kind == "grad")


