"""Planning 3D parallelism: one GPT training step on a DP x TP x PP mesh, predicted.

A run on 1,024 GPUs cannot be made on a laptop, but its step can be
predicted from the pieces the course already has: the FLOPs of the model,
the cost model's formula of each collective (:mod:`minidist.costmodel`), the
pipeline schedule run on its virtual clock
(:func:`~minidist.parallel.pipeline.simulate.simulate_schedule`) and ZeRO's
byte counts (:mod:`minidist.parallel.data.zero`). ::

    from minidist.parallel import plan_3d
    gpt = plan_3d.GPTShape(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304,
                           seq_len=4096, global_batch=1024, micro_batch=1)
    step = plan_3d.predict_step(gpt, plan_3d.Plan(dp=8, tp=8, pp=16))
    print(step)                                    # the breakdown, and memory per rank
    plans = plan_3d.compare_plans(gpt, 1024, memory_limit=80e9)
    print(plans)                                   # every dp x tp x pp that fits, fastest first
    print(plan_3d.playbook_plan(gpt, 1024, memory_limit=80e9))  # the Playbook's order

or ``minidist plan --ranks 1024 --memory 80GB`` (``--mesh 8x8x16``: one plan's
breakdown).

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
* activations: the layers' saved tensors (Korthikanti et al., 2022, with e
  and the dropout of :data:`DROPOUT_MASK_BYTES` as parameters), bytes per
  layer per micro-batch:

  - plain TP: ``s b h (4e + 2k) + 12 e s b h / t + a s^2 b (e + k (e + 1)) / t``
  - with sequence parallelism: ``(s b h (16e + 2k) + a s^2 b (e + k (e + 1))) / t``
  - with full recomputation: the layer's input, ``e s b h`` (``/ t`` with
    sequence parallelism), plus one layer's full set while it is recomputed

  (k = 1 with dropout, 0 without; e = 2, k = 1, t = 1 gives the paper's
  34 s b h + 5 a s^2 b). Times the layers of a stage and the micro-batches
  the rank holds at its peak, counted along the schedule's actions as the
  clock's memory events count them (1F1B: p on the first stage). The attention weights are kept, as
  without flash attention; the embedding's and the logits' activations are
  left out.

**Overlap**: none is assumed, beyond what the schedule itself gives (a send
never stops its rank): TP's and DP's collectives add to the step.

Costs: one :func:`predict_step` runs the schedule's 2 m p computations and
2 m (p v - 1) messages on the clock, and a formula per collective;
:func:`compare_plans` one prediction per factorisation of the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minidist import costmodel
from minidist.alpha_beta import Params, parse_bandwidth, parse_size
from minidist.parallel.pipeline.schedules import BACKWARD, FORWARD, UNIT_NS, make_schedule
from minidist.parallel.pipeline.simulate import simulate_schedule

#: Bytes of one dropout mask entry (a byte per element, as Megatron keeps them).
DROPOUT_MASK_BYTES = 1

#: ZeRO's collectives on the dp group, per stage, as :mod:`minidist.parallel.data.zero` makes them.
ZERO_COLLECTIVES = {
    0: ("all_reduce",),
    1: ("all_reduce", "all_gather"),
    2: ("reduce_scatter", "all_gather"),
    3: ("reduce_scatter", "all_gather", "all_gather"),
}


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class GPTShape:
    """What the prediction needs of a GPT (:class:`minidist.models.gpt.GPT`'s
    shape) and of its batch: ``global_batch`` sequences of ``seq_len``
    tokens per step, ``micro_batch`` sequences per pipeline micro-batch;
    ``block_size`` rows of position embedding (default: ``seq_len``)."""

    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    seq_len: int
    global_batch: int
    micro_batch: int = 1
    bias: bool = True
    block_size: int | None = None

    def __post_init__(self):
        for name in ("n_layer", "n_embd", "n_head", "vocab_size", "seq_len", "global_batch",
                     "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTShape: {name} must be a positive int, got {value!r}")
        if self.block_size is not None and not (
                isinstance(self.block_size, int) and self.block_size >= self.seq_len):
            raise ValueError(f"GPTShape: block_size must be an int >= seq_len={self.seq_len} "
                             f"(the positions a sequence uses), got {self.block_size!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTShape: n_embd={self.n_embd} must be a multiple of "
                             f"n_head={self.n_head}")

    @classmethod
    def from_config(cls, config, global_batch: int, micro_batch: int = 1,
                    seq_len: int | None = None) -> GPTShape:
        """The shape of a :class:`~minidist.models.gpt.GPTConfig`'s model, trained
        on windows of ``seq_len`` tokens (default: its ``block_size``)."""
        return cls(config.n_layer, config.n_embd, config.n_head, config.vocab_size,
                   seq_len or config.block_size, global_batch, micro_batch, config.bias,
                   config.block_size)

    @property
    def positions(self) -> int:
        """Rows of the position embedding."""
        return self.seq_len if self.block_size is None else self.block_size

    def block_parameters(self, tp: int = 1) -> int:
        """One block's parameters on one of ``tp`` ranks: 12 h^2 / t + 7 h / t + 6 h
        with biases (c_attn's and c_fc's weights and biases, c_proj's weights
        split; the c_proj biases and the two LayerNorms whole); 12 h^2 / t + 2 h
        without."""
        h = self.n_embd
        if self.bias:
            return (12 * h * h + 7 * h) // tp + 6 * h
        return 12 * h * h // tp + 2 * h

    def parameters(self) -> int:
        """All parameters, the tied embedding once (``GPT.num_parameters()``)."""
        h = self.n_embd
        final_norm = 2 * h if self.bias else h
        return (self.n_layer * self.block_parameters() + self.vocab_size * h
                + self.positions * h + final_norm)

    def matmul_parameters(self) -> int:
        """N_mm = 12 L h^2 + V h: the weights that multiply every token."""
        return 12 * self.n_layer * self.n_embd ** 2 + self.vocab_size * self.n_embd

    def forward_flops_per_token(self) -> float:
        """2 N_mm + 4 L s h."""
        return 2 * self.matmul_parameters() + 4 * self.n_layer * self.seq_len * self.n_embd

    def step_flops(self, recompute: bool = False) -> float:
        """FLOPs of one step on the whole global batch: 3 (4 with
        recomputation) forwards' worth per token."""
        passes = 4 if recompute else 3
        return passes * self.forward_flops_per_token() * self.global_batch * self.seq_len

    def layer_activation_bytes(self, tp: int = 1, sequence_parallel: bool = False,
                               recompute: bool = False, itemsize: int = 2,
                               dropout: bool = False) -> float:
        """Bytes one layer keeps for backward on one micro-batch (the module's
        formulas); with ``recompute``, only its input."""
        s, b, h, a, e, t = (self.seq_len, self.micro_batch, self.n_embd, self.n_head,
                            itemsize, tp)
        k = DROPOUT_MASK_BYTES if dropout else 0
        sbh = s * b * h
        if recompute:
            return e * sbh / t if sequence_parallel else e * sbh
        scores = a * s * s * b * (e + k * (e + 1)) / t
        if sequence_parallel:
            return sbh * (16 * e + 2 * k) / t + scores
        return sbh * (4 * e + 2 * k) + 12 * e * sbh / t + scores


# --------------------------------------------------------------------------- the machine


@dataclass(frozen=True)
class Machine:
    """``flops``: FLOP/s one rank sustains on the model's matrix products;
    ``intra``: the link between ranks of one node; ``inter``: between nodes;
    ``node_size`` ranks per node."""

    flops: float
    intra: Params
    inter: Params
    node_size: int = 8

    def link(self, span: int) -> Params:
        """The link of a group whose ranks lie within ``span`` consecutive ranks."""
        return self.intra if span <= self.node_size else self.inter

    def link_name(self, span: int) -> str:
        return "intra-node" if span <= self.node_size else "inter-node"


#: A GPU cluster of today, its constants chosen, not measured (they are the
#: arguments below): a rank sustains an H100's bf16 at about 40 % of its
#: peak; NVLink joins the 8 ranks of a node, one InfiniBand port per GPU the
#: nodes; links full duplex; reductions free (gamma 0: a GPU adds faster than
#: a link brings the bytes).
CLUSTER = Machine(flops=400e12,
                  intra=Params(alpha=5e-6, beta=1 / 200e9),
                  inter=Params(alpha=10e-6, beta=1 / 25e9),
                  node_size=8)


# --------------------------------------------------------------------------- a plan


@dataclass(frozen=True)
class Plan:
    """A mesh ``dp x tp x pp`` and how it runs: the pipeline ``schedule``
    ("1f1b", "gpipe", "interleaved_1f1b") with ``virtual_stages`` chunks,
    Megatron's ``sequence_parallel``, ZeRO's ``zero_stage`` on dp, full
    activation ``recompute``."""

    dp: int
    tp: int
    pp: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    recompute: bool = False

    @property
    def ranks(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        extras = [name for name, on in (("sp", self.sequence_parallel),
                                         (f"zero{self.zero_stage}", self.zero_stage),
                                         ("recompute", self.recompute),
                                         (f"v{self.virtual_stages}", self.virtual_stages > 1))
                  if on]
        return f"dp{self.dp} tp{self.tp} pp{self.pp}" + "".join(f" {x}" for x in extras)


def why_not(model: GPTShape, plan: Plan) -> str | None:
    """Why ``plan`` cannot split ``model`` (None when it can)."""
    for name in ("dp", "tp", "pp", "virtual_stages"):
        value = getattr(plan, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name} must be a positive int, got {value!r}"
    if plan.zero_stage not in ZERO_COLLECTIVES:
        return f"zero_stage must be 0, 1, 2 or 3, got {plan.zero_stage!r}"
    if model.n_head % plan.tp:
        return f"tp={plan.tp} does not divide the {model.n_head} heads"
    if plan.sequence_parallel and model.seq_len % plan.tp:
        return f"sequence parallelism: tp={plan.tp} does not divide seq_len={model.seq_len}"
    pieces = plan.pp * plan.virtual_stages
    if model.n_layer % pieces:
        return f"pp x virtual_stages = {pieces} does not divide the {model.n_layer} layers"
    if model.global_batch % (plan.dp * model.micro_batch):
        return (f"dp x micro_batch = {plan.dp} x {model.micro_batch} does not divide the "
                f"global batch of {model.global_batch} sequences")
    return None


# --------------------------------------------------------------------------- the prediction


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
            lines.append(f"  {name:<10} {_ms(value):>12}  {share:6.1%}")
        lines.append("  memory per rank: " + ", ".join(
            f"{name} {_gb(value)}" for name, value in self.memory.items())
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
                 algorithm: str = "ring", itemsize: int = 2,
                 dropout: bool = False) -> StepPrediction:
    """Predict one training step of ``model`` under ``plan`` on ``machine``
    (the module's formulas). ``algorithm``: the collectives' algorithm
    ("ring", NCCL's, or "auto": the cost model's fastest for each call);
    ``itemsize``: bytes of an activation, a gradient, a value sent
    (2: bf16); ``dropout``: the layers keep dropout masks."""
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
    layer = model.layer_activation_bytes(tp, plan.sequence_parallel, plan.recompute, e, dropout)
    working = (model.layer_activation_bytes(tp, plan.sequence_parallel, False, e, dropout)
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


# --------------------------------------------------------------------------- comparing plans


def factorisations(ranks: int, node_size: int = 8) -> list[tuple[int, int, int]]:
    """Every (dp, tp, pp) with dp tp pp = ``ranks`` and tp within a node
    (tp divides ``node_size``), tp then pp ascending."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"factorisations: ranks must be a positive int, got {ranks!r}")
    found = []
    for tp in range(1, node_size + 1):
        if node_size % tp or ranks % tp:
            continue
        for pp in range(1, ranks // tp + 1):
            if (ranks // tp) % pp == 0:
                found.append((ranks // (tp * pp), tp, pp))
    return found


@dataclass(frozen=True)
class PlanComparison:
    """What :func:`compare_plans` found: ``ranked`` (the plans that fit, fastest
    first), ``too_big`` (those over the memory limit, smallest first),
    ``impossible`` ((plan, why) for factorisations the model cannot take)."""

    ranks: int
    memory_limit: float | None
    ranked: list
    too_big: list
    impossible: list

    @property
    def best(self) -> StepPrediction | None:
        return self.ranked[0] if self.ranked else None

    def __str__(self) -> str:
        limit = "no limit" if self.memory_limit is None else f"{_gb(self.memory_limit)} a rank"
        lines = [f"{self.ranks} ranks, {limit}: {len(self.ranked)} plans fit, "
                 f"{len(self.too_big)} do not, {len(self.impossible)} cannot split the model"]
        if self.ranked:
            lines.append(format_table(self.ranked))
        if self.too_big:
            lines.append("over the memory limit: " + ", ".join(
                f"{p.plan} ({_gb(p.memory_total)})" for p in self.too_big))
        return "\n".join(lines)


def format_table(predictions) -> str:
    """A table of predictions: the plan, the step and its parts (ms), the memory."""
    columns = ("plan", "step ms", "compute", "tp comm", "pp bubble", "dp comm", "GB a rank")
    rows = [(str(p.plan), *(f"{getattr(p, name) * 1e3:,.1f}"
                            for name in ("total", "compute", "tp_comm", "pp_bubble", "dp_comm")),
             f"{p.memory_total / 1e9:,.1f}") for p in predictions]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]

    def render(cells):
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths)))

    return "\n".join([render(columns), render(["-" * w for w in widths])]
                     + [render(r) for r in rows])


def compare_plans(model: GPTShape, ranks: int, machine: Machine = CLUSTER,
                  memory_limit: float | None = None, **options) -> PlanComparison:
    """Predict every (dp, tp, pp) of :func:`factorisations` on ``machine``,
    keep those whose fullest rank fits in ``memory_limit`` bytes, and rank
    them by step time. ``options``: the rest of :class:`Plan`
    (``schedule``, ``sequence_parallel``, ``zero_stage``, ...) for every plan,
    and ``algorithm``, ``itemsize``, ``dropout`` of :func:`predict_step`."""
    predict_options = {key: options.pop(key) for key in ("algorithm", "itemsize", "dropout")
                       if key in options}
    fitting, too_big, impossible = [], [], []
    for dp, tp, pp in factorisations(ranks, machine.node_size):
        plan = Plan(dp, tp, pp, **options)
        why = why_not(model, plan)
        if why is not None:
            impossible.append((plan, why))
            continue
        step = predict_step(model, plan, machine, **predict_options)
        (fitting if step.fits(memory_limit) else too_big).append(step)
    fitting.sort(key=lambda p: p.total)
    too_big.sort(key=lambda p: p.memory_total)
    return PlanComparison(ranks, memory_limit, fitting, too_big, impossible)


@dataclass(frozen=True)
class PlaybookChoice:
    """The plan :func:`playbook_plan` reached, and the decisions on the way."""

    step: StepPrediction | None
    decisions: list

    def __str__(self) -> str:
        return "\n".join(["the Playbook's order:"] + [f"  {d}" for d in self.decisions]
                         + ([str(self.step)] if self.step else []))


def playbook_plan(model: GPTShape, ranks: int, machine: Machine = CLUSTER,
                  memory_limit: float | None = None, **options) -> PlaybookChoice:
    """The Ultra-Scale Playbook's decision tree, in its order: first make a
    step fit, with tensor parallelism within a node (tp doubled up to
    ``node_size``), then with pipeline stages across nodes (pp doubled);
    every rank left over goes to data parallelism, which grows the batch a
    step processes at once. ``options`` as :func:`compare_plans`'s."""
    predict_options = {key: options.pop(key) for key in ("algorithm", "itemsize", "dropout")
                       if key in options}
    decisions = []

    def attempt(tp, pp):
        if ranks % (tp * pp):
            return None, f"tp{tp} pp{pp} does not divide {ranks} ranks"
        plan = Plan(ranks // (tp * pp), tp, pp, **options)
        why = why_not(model, plan)
        if why is not None:
            return None, f"{plan}: {why}"
        step = predict_step(model, plan, machine, **predict_options)
        if not step.fits(memory_limit):
            return None, f"{plan}: {_gb(step.memory_total)} a rank, over the limit"
        return step, f"{plan}: fits in {_gb(step.memory_total)} a rank"

    tp, pp = 1, 1
    while True:
        step, said = attempt(tp, pp)
        decisions.append(said)
        if step is not None:
            decisions.append(f"the remaining factor goes to data parallelism: dp{step.plan.dp}")
            return PlaybookChoice(step, decisions)
        if tp * 2 <= machine.node_size and ranks % (tp * 2 * pp) == 0 \
                and model.n_head % (tp * 2) == 0:
            tp *= 2
            decisions.append(f"grow tensor parallelism within the node: tp{tp}")
        elif ranks % (tp * pp * 2) == 0 and model.n_layer % (pp * 2) == 0:
            pp *= 2
            decisions.append(f"grow pipeline stages across nodes (tp is at the node's "
                             f"size): pp{pp}")
        else:
            decisions.append("no more tp or pp to add: nothing fits")
            return PlaybookChoice(None, decisions)


# --------------------------------------------------------------------------- minidist plan


def plan_command(args) -> int:
    """``minidist plan``: with ``--mesh DPxTPxPP`` the breakdown of that plan;
    otherwise every plan of ``--ranks`` compared, and the Playbook's choice
    beside the best (the arguments: :mod:`minidist.cli`)."""
    model = GPTShape(args.n_layer, args.n_embd, args.n_head, args.vocab, args.seq_len,
                     args.global_batch, args.micro_batch)
    machine = Machine(flops=args.tflops * 1e12,
                      intra=Params(CLUSTER.intra.alpha, 1 / parse_bandwidth(args.intra)),
                      inter=Params(CLUSTER.inter.alpha, 1 / parse_bandwidth(args.inter)),
                      node_size=args.node_size)
    options = {"schedule": args.schedule, "virtual_stages": args.virtual_stages,
               "sequence_parallel": args.sequence_parallel, "recompute": args.recompute,
               "zero_stage": args.zero_stage}
    print(f"GPT of {model.parameters() / 1e9:.2f} B parameters: {model.n_layer} layers, "
          f"h {model.n_embd}, {model.n_head} heads, vocabulary {model.vocab_size}, "
          f"{model.global_batch} sequences of {model.seq_len} tokens a step, "
          f"{model.micro_batch} a micro-batch")
    print(f"machine: {args.tflops:g} TFLOP/s a rank, {machine.node_size} ranks a node, "
          f"{args.intra} within a node, {args.inter} between nodes")
    if args.mesh:
        try:
            dp, tp, pp = (int(part) for part in args.mesh.lower().split("x"))
        except ValueError:
            raise SystemExit(f"minidist plan: --mesh {args.mesh!r} is not DPxTPxPP, "
                             "e.g. 8x8x16") from None
        plan = Plan(dp, tp, pp, **options)
        why = why_not(model, plan)
        if why is not None:
            raise SystemExit(f"minidist plan: {plan} cannot split this model: {why}")
        print(predict_step(model, plan, machine))
        return 0
    limit = parse_size(args.memory)
    print(compare_plans(model, args.ranks, machine, memory_limit=limit, **options))
    print(playbook_plan(model, args.ranks, machine, memory_limit=limit, **options))
    return 0
