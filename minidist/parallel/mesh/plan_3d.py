"""Planning 3D parallelism: one GPT training step on a DP x TP x PP mesh, predicted.

A run on 1,024 GPUs cannot be made on a laptop, but its step can be
predicted from the pieces the course already has: the FLOPs of the model,
the cost model's formula of each collective (:mod:`minidist.costmodel`), the
pipeline schedule run on its virtual clock
(:func:`~minidist.parallel.pipeline.simulate.simulate_schedule`) and ZeRO's
byte counts (:mod:`minidist.parallel.data.zero`). The model, the machine
and the plan it is given are :mod:`.plan_inputs`'s shapes; choosing among
plans is :mod:`.choose_plan`'s. ::

    from minidist.parallel.mesh import GPTShape, Plan, predict_step
    gpt = GPTShape(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304,
                   seq_len=4096, global_batch=1024, micro_batch=1)
    step = predict_step(gpt, Plan(dp=8, tp=8, pp=16))
    print(step)                                    # the breakdown, and memory per rank

or ``minidist plan --mesh 8x8x16`` (``--ranks 1024 --memory 80GB``: every
plan compared).

The mesh is laid out as torch's ``init_device_mesh(..., (pp, dp, tp))``
(row-major, tp the fastest index, as Megatron-LM and torchtitan place it),
on nodes of ``node_size`` ranks. A dimension's group spans ``tp`` ranks
(tp), ``tp dp`` ranks (dp) and ``tp dp pp`` ranks (pp): when that span fits
in a node its collectives use the machine's intra-node link (``intra``,
NVLink-like), otherwise the inter-node one (``inter``): a ring that leaves
the node runs at the speed of its slowest hop.

Notation: L layers, h = n_embd, a = n_head, V = vocab, s = seq_len,
b = micro_batch (sequences), B = global_batch, e = itemsize (bytes of an
activation, gradient or communicated value), t = tp, p = pp, d = dp,
v = virtual stages, m = B / (d b) micro-batches per pipeline.

**Compute.** Forward FLOPs per token: 2 N_mm + 4 L s h, where
N_mm = 12 L h^2 + V h are the parameters of the matrix products (the four
Linears of each block and the tied output layer) and 4 s h per layer the
attention's scores and weighted sum (causal, but minidist computes every score);
backward twice the forward (the standard "6 N" per token), one forward more
with recomputation. A pipeline stage's forward of one micro-batch takes
``F = 2 b s (N_mm + 2 L s h) / (t p) / flops`` seconds, its backward 2F.
The stages are taken balanced (the logits' V h shared by all, not put on
the last stage).

**TP.** Megatron's split: per block, per micro-batch, 2 all_reduces of the
activation (b s h e bytes) in forward and 2 in backward on the tp group;
with sequence parallelism each becomes an all_gather plus a reduce_scatter
of the same b s h e bytes (the cost model's N: the whole gathered array,
the whole input). ``L / p`` blocks per stage. These sit on the critical
path (no overlap) and are added to F and to the backward; a recomputed
forward repeats its collectives. The embedding's and the vocab-parallel
loss's collectives (one b s h and three b s all_reduces per micro-batch)
are left out.

**PP.** The schedule (1F1B by default) runs on the virtual clock with those
forward and backward times and a transfer of ``alpha + n beta`` per
activation or gradient (b s h e bytes; / t with sequence parallelism, which
sends the sequence shard) on the pp link (the inter-node one as soon as the
pipeline leaves a node: its slowest hop). The pipeline's makespan less the
work each rank does, m (F + B), is ``pp_bubble``: the fill, the drain and
any wait on a message. With no transfer time, 1F1B's makespan is
(m + p - 1)(F + B). The clock counts whole nanoseconds: each action's time
is rounded to one.

**DP.** After the pipeline drains, the gradients of the rank's parameters
P_r (e bytes each) are synchronised on the dp group, with ZeRO's
collectives as :mod:`minidist.parallel.data.zero` makes them: stage 0 an
all_reduce, 1 an all_reduce and an all_gather (beside DDP, as torch's
ZeroRedundancyOptimizer), 2 a reduce_scatter and an all_gather, 3 a
reduce_scatter and two all_gathers; each one call of the whole P_r e
bytes (per-layer calls pay more alphas; stage 3's gathers are counted once
a step, not again for every micro-batch of a pipeline). No overlap with the backward: the
step is ``makespan + dp_comm`` (the optimizer's update left out).

**Memory per rank** (the rank that holds the most):

* model states: ``zero_model_state_bytes(P_r, d, stage)``: 16 bytes per
  parameter (weights, gradients, Adam's two moments, fp32; mixed precision's
  2 + 2 + 4 + 4 + 4 is 16 too), sharded over dp by ZeRO's stage.
  P_r per block: 12 h^2 / t + 7 h / t + 6 h (the column-split Linears'
  weights and biases split; the row-split biases and the LayerNorms
  replicated); the first stage adds the token embedding V h / t
  (vocab-parallel) and the position embedding (block_size h); the last
  stage the final LayerNorm and, when it is not the first, a copy of the
  tied embedding.
* activations: the course's one count of what a layer (one block) keeps
  for backward, :func:`minidist.memory.transformer_block_activation_bytes`
  (its docstring gives it term by term), in e-byte values, per layer per
  micro-batch:

  - plain TP: ``e (s b h (12 + 17/t) + 2 s b + a s^2 b / t)`` (t >= 2;
    ``e (25 s b h + 2 s b + a s^2 b)`` unsplit)
  - with sequence parallelism: ``e (s b h (4 + 27/t) + 2 s b / t + a s^2 b / t)``
  - with full recomputation: the layer's output, the next one's input,
    ``e s b h`` (``/ t`` with sequence parallelism), plus one layer's full
    set while it is recomputed

  (17/t and 27/t become 16/t and 26/t when a rank holds one head). What
  minidist's ops keep, measured by its ledger; Megatron's fused kernels keep
  less (Korthikanti et al., 2022: 34 s b h + 5 a s^2 b bytes with e = 2 and
  dropout). Times the layers of a stage and the micro-batches
  the rank holds at its peak, counted along the schedule's actions as the
  clock's memory events count them (1F1B: p on the first stage). The attention weights are kept, as
  without flash attention; the embedding's and the logits' activations are
  left out.

**Overlap**: none is assumed, beyond what the schedule itself gives (a send
never stops its rank): TP's and DP's collectives add to the step.

Costs: one :func:`predict_step` runs the schedule's 2 m p computations and
2 m (p v - 1) messages on the clock, and a formula per collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minidist import costmodel
from minidist.parallel.mesh.plan_inputs import (
    CLUSTER,
    ZERO_COLLECTIVES,
    GPTShape,
    Machine,
    Plan,
    why_not,
)
from minidist.parallel.pipeline import (
    BACKWARD,
    FORWARD,
    UNIT_NS,
    make_schedule,
    simulate_schedule,
)


@dataclass(frozen=True)
class CollectiveCost:
    """One kind of call of a step: ``calls`` of ``collective`` on ``ranks``
    ranks of dimension ``dimension``, ``nbytes`` each (the cost model's N),
    ``seconds`` each (``costmodel.predict``), over ``link``."""

    dimension: str
    collective: str
    algorithm: str
    ranks: int
    nbytes: float
    calls: int
    seconds: float
    link: str

    @property
    def total(self) -> float:
        return self.calls * self.seconds


@dataclass(frozen=True)
class StepPrediction:
    """One step of ``plan``, predicted. Seconds: ``compute`` (a rank's
    forwards, backwards and recomputations), ``tp_comm`` (its TP collectives,
    on the critical path), ``pp_bubble`` (idle in the pipeline: fill, drain,
    waits for messages), ``dp_comm`` (the gradients' synchronisation);
    ``total`` their sum, the step. ``memory``: bytes of the fullest rank by
    category (``parameters``, ``gradients``, ``optimizer_state``,
    ``activations``)."""

    plan: Plan
    microbatches: int
    compute: float
    tp_comm: float
    pp_bubble: float
    dp_comm: float
    total: float
    memory: dict
    collectives: tuple = field(repr=False)
    forward_time: float = 0.0       # one stage, one micro-batch, with its TP collectives
    backward_time: float = 0.0
    transfer_time: float = 0.0      # one activation or gradient between stages
    live_microbatches: int = 0      # pieces held at the fullest rank's peak
    links: dict = field(default_factory=dict)

    @property
    def memory_total(self) -> float:
        return sum(self.memory.values())

    def fits(self, memory_limit: float | None) -> bool:
        return memory_limit is None or self.memory_total <= memory_limit

    def __str__(self) -> str:
        lines = [f"{self.plan}: {self.microbatches} micro-batches, step {_ms(self.total)}"]
        for name in ("compute", "tp_comm", "pp_bubble", "dp_comm"):
            value = getattr(self, name)
            share = value / self.total if self.total else 0.0
            lines.append(f"  {name.replace('_', ' '):<10} {_ms(value):>12}  {share:6.1%}")
        lines.append("  memory per rank: " + ", ".join(
            f"{name.replace('_', ' ')} {_gb(value)}" for name, value in self.memory.items())
            + f"; total {_gb(self.memory_total)}")
        for cost in self.collectives:
            lines.append(f"  {cost.dimension}: {cost.calls} x {cost.collective} "
                         f"({cost.algorithm}) of {_gb(cost.nbytes)} on {cost.ranks} ranks, "
                         f"{cost.link}: {_ms(cost.seconds)} each")
        return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.3f} GB" if nbytes >= 1e7 else f"{nbytes / 1e6:,.3f} MB"


def parameters_per_rank(model: GPTShape, tp: int, pp: int, virtual_stages: int = 1) -> list[int]:
    """Parameters held by each pipeline rank (one of ``tp``): its blocks, the
    embeddings on the rank of the first stage, the final LayerNorm and the
    tied embedding's copy on the rank of the last (see the module)."""
    h, pieces = model.n_embd, pp * virtual_stages
    blocks = model.n_layer // pieces * virtual_stages * model.block_parameters(tp)
    counts = [blocks] * pp
    counts[0] += model.vocab_size * h // tp + model.positions * h
    counts[pp - 1] += (2 * h if model.bias else h)
    if pp > 1:
        counts[pp - 1] += model.vocab_size * h // tp   # the tied matrix, again
    return counts


def predict_step(model: GPTShape, plan: Plan, machine: Machine = CLUSTER, *,
                 algorithm: str = "ring", itemsize: int = 2) -> StepPrediction:
    """Predict one training step of ``model`` under ``plan`` on ``machine``
    (the module's formulas). ``algorithm``: the collectives' algorithm
    ("ring", NCCL's, or "auto": the cost model's fastest for each call);
    ``itemsize``: bytes of an activation, a gradient, a value sent
    (2: bf16)."""
    why = why_not(model, plan)
    if why is not None:
        raise ValueError(f"predict_step: {plan} cannot run this model: {why}")
    s, b, h, e = model.seq_len, model.micro_batch, model.n_embd, itemsize
    tp, pp, dp = plan.tp, plan.pp, plan.dp
    m = model.global_batch // (dp * b)
    links = {"tp": machine.link_name(tp), "dp": machine.link_name(tp * dp),
             "pp": machine.link_name(tp * dp * pp)}

    def call(dimension, collective, ranks, nbytes, calls, span):
        params = machine.link(span)
        name = (costmodel.best(collective, ranks, nbytes, params=params)
                if algorithm == "auto" else algorithm)
        return CollectiveCost(dimension, collective, name, ranks, nbytes, calls,
                              costmodel.predict(collective, name, ranks, nbytes, params),
                              machine.link_name(span))

    # TP: per block, per pass, two all_reduces (or all_gather + reduce_scatter).
    blocks = model.n_layer // pp
    activation = s * b * h * e
    forwards_per_microbatch = 2 if plan.recompute else 1
    tp_calls = []
    if tp > 1:
        kinds = (("all_gather", "reduce_scatter") if plan.sequence_parallel
                 else ("all_reduce",))
        passes = forwards_per_microbatch + 1   # the forwards and the backward
        tp_calls = [call("tp", kind, tp, activation, 2 * blocks * passes * m, tp)
                    for kind in kinds]
    tp_pass = sum(2 * blocks * cost.seconds for cost in tp_calls)  # one pass, one micro-batch

    forward_compute = 2 * b * s * (model.matmul_parameters()
                                   + 2 * model.n_layer * s * h) / (tp * pp) / machine.flops
    forward_time = forward_compute + tp_pass
    backward_time = 2 * forward_compute + tp_pass
    message = activation / tp if plan.sequence_parallel else activation
    transfer = machine.link(tp * dp * pp).message(message) if pp > 1 else 0.0

    schedule = make_schedule(plan.schedule, pp, m, plan.virtual_stages)
    v = plan.virtual_stages
    # The clock counts in units of UNIT_NS ns: seconds * 1e9 / UNIT_NS units.
    unit = 1e9 / UNIT_NS
    events = simulate_schedule(schedule, forward_time / v * unit, backward_time / v * unit,
                               transfer * unit, recompute=plan.recompute)
    regions = [event for event in events if event["kind"] == "compute"]
    makespan = (max(event["end"] for event in regions)
                - min(event["start"] for event in regions)) * 1e-9
    busy = m * (forward_time * forwards_per_microbatch + backward_time)
    compute = m * forward_compute * (forwards_per_microbatch + 2)
    tp_comm = busy - compute

    # DP: the gradients of the fullest rank's parameters, ZeRO's collectives.
    per_rank = parameters_per_rank(model, tp, pp, v)
    dp_calls = []
    if dp > 1:
        gradient_bytes = max(per_rank) * e
        counts: dict[str, int] = {}
        for kind in ZERO_COLLECTIVES[plan.zero_stage]:
            counts[kind] = counts.get(kind, 0) + 1
        dp_calls = [call("dp", kind, dp, gradient_bytes, calls, tp * dp)
                    for kind, calls in counts.items()]
    dp_comm = sum(cost.total for cost in dp_calls)

    # Memory: the rank with the most model states and activations.
    live = peak_live(schedule)
    layer = model.layer_activation_bytes(tp, plan.sequence_parallel, plan.recompute, e)
    working = (model.layer_activation_bytes(tp, plan.sequence_parallel, False, e)
               if plan.recompute else 0.0)
    layers_per_piece = model.n_layer // (pp * v)
    fullest = None
    for rank in range(pp):
        states = _model_states(per_rank[rank], dp, plan.zero_stage)
        activations = live.get(rank, 0) * layers_per_piece * layer + working
        memory = {**states, "activations": activations}
        if fullest is None or sum(memory.values()) > sum(fullest[1].values()):
            fullest = (live.get(rank, 0), memory)
    pp_costs = ([CollectiveCost("pp", "send/recv", "p2p", 2, message,
                                2 * m * (pp * v - 1), transfer, links["pp"])]
                if pp > 1 else [])
    return StepPrediction(
        plan=plan, microbatches=m, compute=compute, tp_comm=tp_comm,
        pp_bubble=max(makespan - busy, 0.0), dp_comm=dp_comm, total=makespan + dp_comm,
        memory=fullest[1], collectives=tuple(tp_calls + pp_costs + dp_calls),
        forward_time=forward_time, backward_time=backward_time, transfer_time=transfer,
        live_microbatches=fullest[0], links=links)


def peak_live(schedule) -> dict[int, int]:
    """The most (micro-batch, chunk) activations each rank holds at once: a
    forward adds one, a backward frees one (the count the simulator's memory
    events carry, :func:`~minidist.parallel.pipeline.simulate.peak_live_microbatches`,
    read off the actions without formatting the events)."""
    peaks = {}
    for rank, actions in enumerate(schedule.actions):
        live = peak = 0
        for action in actions:
            live += (action.kind == FORWARD) - (action.kind == BACKWARD)
            peak = max(peak, live)
        peaks[rank] = peak
    return peaks


def _model_states(parameters: int, dp: int, zero_stage: int) -> dict:
    """16 bytes a parameter, split by category and by ZeRO's stage:
    weights 4 (sharded at stage 3), gradients 4 (2, 3), Adam 8 (1, 2, 3);
    their sum is :func:`~minidist.parallel.data.costs.zero_model_state_bytes`."""
    shard = {category: (dp if zero_stage >= first else 1)
             for category, first in (("parameters", 3), ("gradients", 2),
                                     ("optimizer_state", 1))}
    return {"parameters": 4 * parameters / shard["parameters"],
            "gradients": 4 * parameters / shard["gradients"],
            "optimizer_state": 8 * parameters / shard["optimizer_state"]}
