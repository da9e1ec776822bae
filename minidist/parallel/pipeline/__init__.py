"""Pipeline parallelism: the model cut into stages, a batch into
micro-batches that flow through them.

Read in this order:

1. :mod:`.actions`: what a rank does, as data: the kinds of action, a
   schedule of them, where each chunk sits, the messages around each
   computation;
2. :mod:`.schedules`: the schedules as data (GPipe, 1F1B, interleaved 1F1B),
   built by pure functions, and every schedule by name;
3. :mod:`.zero_bubble`: the backward split in two to fill the bubble
   (ZB-H1, ZB-H2, ZB-V, DualPipeV);
4. :mod:`.validate`: the rules a schedule keeps, checked without running it;
5. :mod:`.simulate`: a schedule on a virtual clock: time, bubble, peak memory;
6. :mod:`.labels`: the words each action writes into the trace;
7. :mod:`.split`: the model cut into stages of balanced cost, a batch into
   micro-batches;
8. :mod:`.grid`: where a rank sits among p stages x d replicas, and its
   two groups;
9. :mod:`.held_activations`: what a stage keeps from a micro-batch's forward
   to its backward, with or without recomputation, and from a split
   backward's input half I to its weight half W;
10. :mod:`.ledger`: one batch of one rank in the trace: its regions and its
    memory events (what waits for W among them);
11. :mod:`.steps`: one batch on one rank, a schedule's actions in order, one
    short step per kind of action (F, B, I, W, send, receive, the step);
12. :mod:`.executor`: ``Pipeline``, the runtime that runs a schedule on real
    ranks, p stages x d replicas, and its rules for a training step
    (``step(max_norm=)`` clips over the stages with torchtitan's
    ``clip_grad_norm_(..., pp_mesh=)``, a name of this face, from
    :mod:`minidist.distributed.tensor.grad_norm`);
13. :mod:`.pipeline_stage`, :mod:`.pipelining`, :mod:`.split_points`:
    torch.distributed.pipelining's names on that same runtime: a
    ``PipelineStage`` (a piece and where it sits); the schedule classes
    (``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
    ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``,
    ``ScheduleDualPipeV``) and their ``step``; ``pipeline`` and
    ``SplitPoint``, a module cut between its children. A torch script's
    ``from torch.distributed.pipelining import ...`` reads
    ``from minidist.parallel.pipeline.pipelining import ...``; all but
    ``pipeline`` (the name of this family) are also names of this face and
    of :mod:`minidist.parallel`.

This face is what the mesh family uses (``Pipeline``, the schedules and the
simulator).
"""

from __future__ import annotations

from minidist.parallel.pipeline.executor import (  # noqa: F401
    Pipeline,
    annotate_trace,
    clip_grad_norm_,
)
from minidist.parallel.pipeline.labels import (  # noqa: F401
    compute_label,
    compute_text,
    memory_label,
    message_label,
    step_label,
)
from minidist.parallel.pipeline.pipelining import (  # noqa: F401
    Pipe,
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
    SplitPoint,
    build_stage,
    pipe_split,
)
from minidist.parallel.pipeline.schedules import (  # noqa: F401
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
    SCHEDULES,
    SEND_ACTIVATION,
    SEND_GRAD,
    UNIT_NS,
    Action,
    Schedule,
    gpipe,
    interleaved_one_f_one_b,
    make_schedule,
    message_tag,
    one_f_one_b,
    schedule_from_order,
)
from minidist.parallel.pipeline.simulate import (  # noqa: F401
    DeadlockError,
    bubble_fraction,
    peak_live_microbatches,
    simulate_schedule,
)
from minidist.parallel.pipeline.split import (  # noqa: F401
    balanced_partition,
    layer_costs,
    split_microbatches,
    split_model,
)
from minidist.parallel.pipeline.validate import ScheduleError, validate_schedule  # noqa: F401
from minidist.parallel.pipeline.zero_bubble import (  # noqa: F401
    dualpipe_v,
    zb_h1,
    zb_h2,
    zb_v,
)

__all__ = ["FORWARD", "BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "LETTERS", "PLACEMENTS", "SEND_ACTIVATION", "RECV_ACTIVATION", "SEND_GRAD", "RECV_GRAD",
           "OPTIMIZER_STEP", "KINDS", "PHASES", "UNIT_NS", "Action", "Schedule", "gpipe",
           "one_f_one_b", "interleaved_one_f_one_b", "zb_h1", "zb_h2", "zb_v", "dualpipe_v",
           "schedule_from_order", "SCHEDULES", "validate_schedule", "ScheduleError",
           "make_schedule", "message_tag", "DeadlockError", "simulate_schedule", "bubble_fraction",
           "peak_live_microbatches", "compute_text", "compute_label", "step_label",
           "message_label", "memory_label", "balanced_partition", "layer_costs", "split_model",
           "split_microbatches", "Pipeline", "annotate_trace", "PipelineStage",
           "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
           "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV",
           "SplitPoint", "Pipe", "build_stage", "pipe_split", "clip_grad_norm_"]
