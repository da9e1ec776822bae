"""Zero-bubble pipeline schedules: the backward split in two fills the bubble.

A stage's backward computes two things: the gradient of its input (I, which
the stage before waits for) and the gradients of its weights (W, which only
the optimizer step needs). 1F1B runs them as one backward B = I + W, so
every stage waits for the whole of it to come back. Run alone, the I's
travel back faster, and the W's, which nobody waits for, can go where a
stage would otherwise idle (Qi, Wan, Huang, Lin, "Zero Bubble Pipeline
Parallelism", ICLR 2024). In the paper's notation F, B, W are the times of a
forward, an input half and a weight half of one stage on one micro-batch
(here: I is the paper's B; ``backward_time`` of the simulator is B + W); p
stages, m micro-batches; "bubble" is a stage's idle time in one batch.

In the order they are taught:

1. :func:`zb_h1` (the paper's ZB-H1, torch.distributed.pipelining's
   ``ScheduleInterleavedZeroBubble`` with one stage a rank). 1F1B's order
   with the backward split, and stage r's W's run r rounds late: every
   stage then holds p micro-batches (1F1B's first stage's peak), the I's
   come back sooner and the late W's fill the tail. Bubble (p-1)(F+B-W)
   instead of 1F1B's (p-1)(F+B+W): a third of it when F = B = W.
2. :func:`zb_h2` (the paper's ZB-H2). Twice the warm-up and the W's 2r
   rounds late: 2p - 1 micro-batches held, and a bubble of (p-1)(F+B-2W)
   a rank, none when F = B = W: each stage is then busy without a gap
   from its first forward to its last W. Stage r starts r forwards after
   stage 0, so one batch is a parallelogram; with the optimizer step's
   synchronisation bypassed (the paper's "post-validation") the next
   batch's forwards fill the slant.
3. :func:`zb_v` (the paper's ZB-V, torch's ``ScheduleZBVZeroBubble``). The
   model in 2p chunks placed in a V (rank r holds stages r and 2p - 1 - r,
   so rank 0 holds the first and the last): a micro-batch goes down the
   ranks and back up. Each chunk's work is half a stage's, so the fill is
   half as long, and with F = B = W no rank idles between its first forward
   and its last W (m >= 2p - 1), holding 2p chunks' activations: p stages',
   1F1B's peak. Twice 1F1B's messages.
4. :func:`dualpipe_v` (DeepSeek-V3's DualPipe cut in half, "DualPipeV":
   DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, and the DualPipe
   repository, after Sea AI Lab's "cut-in-half"; torch's
   ``ScheduleDualPipeV``). The V placement again, and
   in the steady state the forward of one micro-batch *paired* with the
   backward of another, which a GPU overlaps (one's compute hides the
   other's communication). Bubble (p-1)(F&B + B - 3W) in DualPipe's
   notation (B the whole backward, F&B the pair's time), 2p + 1 chunks'
   activations held. On one CPU process a pair runs one after the other:
   here F&B = F + B, and the pair's actions carry phase "overlap".

Cost of building: O(p m) actions each; the messages around the computations
are added by :class:`~minidist.parallel.pipeline.actions._RankBuilder` as
for every schedule.
"""

from __future__ import annotations

from collections import deque

from minidist.parallel.pipeline.actions import (
    BACKWARD,
    Schedule,
    _RankBuilder,
    check_sizes,
)


def _late_weights(name: str, stages: int, microbatches: int, factor: int) -> Schedule:
    """The hand-crafted zero-bubble order of Qi et al., ``factor`` 1 (ZB-H1)
    or 2 (ZB-H2), as their own bubble script builds it: rank r warms up
    with factor (p - 1 - r) forwards, then runs rounds "F (while any is
    left), I, W of the oldest I (once round factor r is reached)", then the
    factor r W's left."""
    check_sizes(name, stages, microbatches)
    actions = []
    for rank in range(stages):
        builder = _RankBuilder(rank, stages, 1)
        warmup = min(factor * (stages - 1 - rank), microbatches)
        for microbatch in range(warmup):
            builder.forward(microbatch, 0, "warmup")
        weights = deque()  # micro-batches whose I ran and whose W has not
        for oldest in range(microbatches):
            phase = "steady" if warmup + oldest < microbatches else "cooldown"
            if warmup + oldest < microbatches:
                builder.forward(warmup + oldest, 0, phase)
            builder.backward_input(oldest, 0, phase)
            weights.append(oldest)
            # The W's wait factor r rounds: their memory stays held, and
            # they are left for the tail, where 1F1B's stage r idles.
            if oldest >= factor * rank:
                builder.backward_weight(weights.popleft(), 0, phase)
        while weights:
            builder.backward_weight(weights.popleft(), 0, "cooldown")
        actions.append(builder.step())
    return Schedule(name, stages, microbatches, 1, actions)


def zb_h1(stages: int, microbatches: int) -> Schedule:
    """ZB-H1: 1F1B with the backward split and stage r's W's r rounds late.

    Rank r: min(p - 1 - r, m) forwards; then m rounds k = 0, 1, ...: the
    next forward (while any is left), I of micro-batch k, and from round r
    on the W of micro-batch k - r; then the r W's left. Every stage holds
    at most min(p, m) micro-batches (from a forward to its W): 1F1B's peak,
    now on every stage. Bubble (p-1)(F+B-W) (F, B, W: a forward, an input
    half, a weight half; Qi et al.'s Table 1 and their bubble script), that
    is a makespan of m(F+B+W) + (p-1)(F+B-W), when m >= p and W <= min(F, B);
    more otherwise."""
    return _late_weights("zb_h1", stages, microbatches, 1)


def zb_h2(stages: int, microbatches: int) -> Schedule:
    """ZB-H2: twice ZB-H1's warm-up, and stage r's W's 2r rounds late.

    Rank r: min(2(p - 1 - r), m) forwards; then m rounds k: the next
    forward (while any is left), I of micro-batch k, from round 2r on the
    W of micro-batch k - 2r; then the 2r W's left. Every stage holds up to
    min(2p - 1, m) micro-batches. Bubble (p-1)(F+B-2W) (Qi et al.'s Table 1,
    their bubble script), as each rank's idle time between its first
    forward and its last action, when m >= 2p - 1 and W <= min(F, B); more
    otherwise. None when F = B = W: a parallelogram."""
    return _late_weights("zb_h2", stages, microbatches, 2)


def zb_v(stages: int, microbatches: int) -> Schedule:
    """ZB-V: two chunks a rank in a V, forwards and split backwards in the
    order of Qi et al.'s Figure (as torch's ``ScheduleZBVZeroBubble``).

    Rank r holds chunk 0 = stage r and chunk 1 = stage 2p - 1 - r. With
    n = max(m, 2p - 1) micro-batches (those past m left out, which cannot
    create a wait):

    * warm-up: 2(p - r) - 1 forwards of chunk 0; r pairs "F chunk 1, F
      chunk 0"; p - r rounds "F, I, W of chunk 1";
    * steady: rounds "F (while any is left), I, W of chunk 0; F, I, W of
      chunk 1" until every forward has run;
    * cool-down: r rounds "I chunk 0, I chunk 1", p - r rounds "I, W of
      chunk 0", then chunk 1's W's left, then chunk 0's.

    Every rank holds at most 2p chunks' activations (each half a stage's:
    p stages', 1F1B's peak) once m >= 2p - 1. With F = B = W and m >= 2p - 1
    no rank idles from its first forward to its last W (a parallelogram, as
    ZB-H2, at half the memory); twice 1F1B's messages: a micro-batch crosses
    2p - 2 links each way. Unequal times leave a bubble (Qi et al. then
    build the V greedily, from the measured times)."""
    check_sizes("zb_v", stages, microbatches)
    total = max(microbatches, 2 * stages - 1)
    actions = [_zb_v_rank(rank, stages, microbatches, total) for rank in range(stages)]
    return Schedule("zbv", stages, microbatches, 2, actions, placement="v")


def _zb_v_rank(rank: int, stages: int, microbatches: int, total: int) -> list:
    """One rank's actions of :func:`zb_v`, for ``total`` micro-batches of
    which those from ``microbatches`` on are left out."""
    builder = _RankBuilder(rank, stages, 2, microbatches, placement="v")
    forwarded, backwarded, weighed = [0, 0], [0, 0], [0, 0]  # next micro-batch, per chunk

    def forward(chunk, phase):
        builder.forward(forwarded[chunk], chunk, phase)
        forwarded[chunk] += 1

    def backward_input(chunk, phase):
        builder.backward_input(backwarded[chunk], chunk, phase)
        backwarded[chunk] += 1

    def backward_weight(chunk, phase):
        builder.backward_weight(weighed[chunk], chunk, phase)
        weighed[chunk] += 1

    for _ in range(2 * (stages - rank) - 1):
        forward(0, "warmup")
    for _ in range(rank):
        forward(1, "warmup")
        forward(0, "warmup")
    for _ in range(stages - rank):
        forward(1, "warmup")
        backward_input(1, "warmup")
        backward_weight(1, "warmup")
    while forwarded[1] < forwarded[0] or forwarded[0] < total:
        for chunk in (0, 1):
            if chunk == 1 or forwarded[0] < total:
                forward(chunk, "steady")
            backward_input(chunk, "steady")
            backward_weight(chunk, "steady")
    # In the cool-down the I's go first, since the neighbouring ranks wait
    # for them; the W's, which nobody waits for, go last.
    for _ in range(rank):
        backward_input(0, "cooldown")
        backward_input(1, "cooldown")
    for _ in range(stages - rank):
        backward_input(0, "cooldown")
        backward_weight(0, "cooldown")
    for chunk in (1, 0):
        while weighed[chunk] < total:
            backward_weight(chunk, "cooldown")
    return builder.step()


def dualpipe_v(stages: int, microbatches: int) -> Schedule:
    """DualPipeV: the V placement, forwards paired with backwards, in the
    eight steps of DeepSeek's ``dualpipev.py``.

    Rank r holds chunk 0 = stage r and chunk 1 = stage 2p - 1 - r; each
    chunk runs its micro-batches in order; a split backward's W's run
    first-in first-out. With P = p - r - 1:

    1. 2P forwards of chunk 0;
    2. r + 1 rounds "F chunk 0, F chunk 1";
    3. P rounds "I chunk 1, its W, F chunk 1";
    4. m - 2p + r + 1 rounds "F chunk 0 with B chunk 1, F chunk 1 with B
       chunk 0", each "with" a pair (phase "overlap"; the last rank's first
       one runs unpaired, as DeepSeek's does);
    5. P rounds "B chunk 1, F chunk 1 with B chunk 0";
    6. r + 1 rounds "B chunk 1, B chunk 0", the second half of them split
       (I now, W later);
    7. P rounds "a W, I chunk 0";
    8. the r + 1 W's left.

    A pair receives both its inputs before and sends both results after
    both computations, as DeepSeek's overlapped chunk does; on one CPU
    process its forward and backward run one after the other, so the
    pair's time F&B is F + B. Bubble (p-1)(F&B + B - 3W), B the whole
    backward (DualPipe's comparison table), when a forward takes as long as
    an input half and W is no longer (more otherwise); each rank holds up
    to 2p + 1 chunks' activations (each half a stage's; the table's PP + 1
    for PP = 2p stages). Needs m >= 2p (step 4's count), as DeepSeek's does."""
    check_sizes("dualpipe_v", stages, microbatches)
    if microbatches < 2 * stages:
        raise ValueError(f"dualpipe_v: {microbatches} micro-batches for {stages} ranks: "
                         f"DualPipeV needs at least 2p = {2 * stages} (DeepSeek's asserts it: "
                         f"its main phase runs m - 2p + r + 1 rounds on rank r); pass "
                         f"microbatches >= {2 * stages}, or use zbv, which takes any m")
    actions = []
    for rank in range(stages):
        actions.append(_dualpipe_v_rank(rank, stages, microbatches))
    return Schedule("dualpipev", stages, microbatches, 2, actions, placement="v")


def _dualpipe_v_rank(rank: int, stages: int, microbatches: int) -> list:
    """One rank's actions of :func:`dualpipe_v`, step by step."""
    builder = _RankBuilder(rank, stages, 2, placement="v")
    forwarded, backwarded = [0, 0], [0, 0]
    weights = deque()  # (micro-batch, chunk) whose I ran, first in first out
    last = rank == stages - 1
    before = stages - rank - 1

    def forward(chunk, phase):
        builder.forward(forwarded[chunk], chunk, phase)
        forwarded[chunk] += 1

    def backward(chunk, phase, split=False):
        microbatch = backwarded[chunk]
        backwarded[chunk] += 1
        if split:
            builder.backward_input(microbatch, chunk, phase)
            weights.append((microbatch, chunk))
        else:
            builder.backward(microbatch, chunk, phase)

    def weight(phase):
        builder.backward_weight(*weights.popleft(), phase)

    def pair(forward_chunk, backward_chunk):
        builder.overlapped((forwarded[forward_chunk], forward_chunk),
                           (backwarded[backward_chunk], backward_chunk), BACKWARD)
        forwarded[forward_chunk] += 1
        backwarded[backward_chunk] += 1

    for _ in range(2 * before):                                       # 1
        forward(0, "warmup")
    for _ in range(rank + 1):                                         # 2
        forward(0, "warmup")
        forward(1, "warmup")
    for _ in range(before):                                           # 3
        backward(1, "steady", split=True)
        weight("steady")
        forward(1, "steady")
    for index in range(microbatches - 2 * stages + rank + 1):         # 4
        if index == 0 and last:
            # DeepSeek runs these two apart: the backward waits for no
            # message (the rank's own chunk 0 hands its output over).
            forward(0, "steady")
            backward(1, "steady")
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(before):                                           # 5
        backward(1, "steady")
        pair(1, 0)
    split = False                                                     # 6
    for index in range(rank + 1):
        # From the middle on the W's are left for later, where the
        # cool-down would idle.
        if index == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        backward(1, "cooldown", split)
        if index == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        backward(0, "cooldown", split)
    for _ in range(before):                                           # 7
        weight("cooldown")
        backward(0, "cooldown", split=True)
    while weights:                                                    # 8
        weight("cooldown")
    return builder.step()


__all__ = ["zb_h1", "zb_h2", "zb_v", "dualpipe_v"]
