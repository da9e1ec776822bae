"""Low-communication training, measured: DDP, local SGD and DiLoCo, loss against steps and against bytes, and the bandwidth below which each one wins.

    from minidist.experiments import low_communication
    result = low_communication.run(quick=True)       # seconds: both models, 2 ranks
    print(low_communication.format_table(result))

**The question.** Data parallel (DDP) all-reduces the gradients after every
backward: per step, every rank sends ``2 (p - 1) / p * n`` bytes on the ring
(n the bytes of the parameters, p the ranks). Local SGD (Stich, "Local SGD
Converges Fast and Communicates Little", 2019; Lin, Stich, Patel & Jaggi,
"Don't Use Large Mini-Batches, Use Local SGD", 2020) lets every rank step
alone for H steps and then averages the weights: the same all_reduce, once
every H steps, so DDP's bytes divided by H. DiLoCo (Douillard et al., 2023,
"DiLoCo: Distributed Low-Communication Training of Language Models") keeps
the same schedule of messages but treats the averaged displacement as a
gradient for an outer optimizer (SGD with Nesterov momentum). Fewer bytes,
but the replicas drift apart between syncs: each step is worth less. Which
effect wins depends on the link: on a fast one, a step's compute dominates
and DDP's better steps win; on a slow one, the bytes dominate.

**What runs.** For each model (the small character-level GPT on the bundled
Shakespeare, AdamW; the digits CNN, AdamW), every method trains from the
same weights on the same batches (rank r draws its own batches, the same
for every method) inside **one** launch of real processes (shm by default),
each method in a trace region of its own. Measured:

* the held-out loss every ``eval_every`` steps, the mean over the ranks of
  each rank's model (at a sync step of local SGD or DiLoCo the ranks hold the
  same weights: that is the synced model's loss; between syncs, the mean of
  the drifting replicas');
* the bytes every rank sent, read from the trace (not from a formula), and
  set next to the formula (DDP's ring bytes per step / H);
* the wall time of a training step and the part of it spent in collectives
  (from the trace): the rest is the step's compute time.

**The model of time to a target loss.** A method m needs S_m steps to reach
the target (read from its curve, at its sync points) and makes S_m / H_m
all_reduces of the n parameter bytes. On a link of bandwidth B (latency alpha
of the transport's measured :data:`minidist.alpha_beta.PARAMS`), with the
ring's cost formula of :mod:`minidist.costmodel`
(``2 (p - 1) alpha + 2 (p - 1) / p n / B + (p - 1) / p n gamma``) and the
measured compute time c per step (the median over the methods: the same
model on the same batches; DDP's own bookkeeping, its buckets and hooks, is
left out, which the measured points show), and without overlapping communication
with compute (DDP runs with ``overlap=False`` here, so that the measured
points are what the model describes)::

    T_m(B) = S_m c + (S_m / H_m) t_allreduce(n, p, B) = a_m + b_m / B

Two methods take the same time where ``a_i + b_i / B = a_j + b_j / B``, at
``B* = (b_i - b_j) / (a_j - a_i)``: below B* the one with fewer bytes (the
smaller b) is faster. :func:`crossover` solves it; :func:`fastest_regions`
walks the bandwidths and says which method is fastest where.

Cost of the experiment: every method trains ``steps`` steps of the model on
every rank, one launch per model; the quick form (:func:`configuration`)
takes seconds per model on two cores, the full form a few minutes.

``python -m minidist.experiments.low_communication [--full] [--output DIR]``
runs it, prints the tables and writes the picture.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, costmodel, nn, no_grad, optim, trace
from minidist.alpha_beta import Params, params_for
from minidist.experiments.arguments import experiment_parser, parse_with_output
from minidist.experiments.figures import save_figure
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.diloco import DiLoCo
from minidist.parallel.data.local_sgd import LocalSGD

#: the models this experiment trains
MODELS = ("gpt", "cnn")

#: DiLoCo's outer optimizer, the paper's: SGD, lr 0.7, Nesterov momentum 0.9
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9


@dataclass(frozen=True)
class Method:
    """One way to train: ``kind`` "ddp", "local_sgd" or "diloco", syncing
    every ``sync_every`` (H) steps (DDP: every step)."""

    name: str
    kind: str
    sync_every: int = 1


def methods(sync_every: Sequence[int]) -> list[Method]:
    """DDP, then local SGD and DiLoCo at every H of ``sync_every``."""
    found = [Method("ddp", "ddp", 1)]
    for kind in ("local_sgd", "diloco"):
        found += [Method(f"{kind} every {h}", kind, int(h)) for h in sync_every]
    return found


def configuration(model: str, quick: bool) -> dict:
    """The recipe of ``model`` in its quick (tests, lessons' quick mode:
    seconds) or full (minutes) form: the model's size, the steps, the H's,
    the per-rank batch and the inner AdamW's rate."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: choose one of {', '.join(MODELS)}")
    if model == "gpt":
        if quick:
            return dict(model=dict(n_layer=1, n_head=2, n_embd=32, block_size=32),
                        batch_size=8, steps=128, eval_every=8, sync_every=(4, 16), lr=3e-3,
                        eval_windows=32)
        return dict(model=dict(n_layer=2, n_head=4, n_embd=64, block_size=64),
                    batch_size=12, steps=512, eval_every=16, sync_every=(4, 16, 64), lr=2e-3,
                    eval_windows=64)
    if quick:
        return dict(batch_size=16, steps=128, eval_every=8, sync_every=(4, 16), lr=2e-3)
    return dict(batch_size=16, steps=512, eval_every=16, sync_every=(4, 16, 64), lr=2e-3)


# --------------------------------------------------------------------------- what the ranks run


class _Task:
    """A model, its batches (rank r's own stream, the same for every method)
    and its held-out loss."""

    def __init__(self, model: str, config: dict, seed: int):
        self.name, self.config, self.seed = model, config, seed
        rank = dist.get_rank()
        if model == "gpt":
            from minidist.data import CharTokenizer, load_shakespeare, split_tokens

            text = load_shakespeare()
            tokens = CharTokenizer(text).encode(text)
            self.train_tokens, val = split_tokens(tokens)
            block = config["model"]["block_size"]
            starts = np.random.default_rng([seed, 99]).integers(
                0, len(val) - block, size=config["eval_windows"])
            windows = val[starts[:, None] + np.arange(block + 1)]
            self.eval_x, self.eval_y = windows[:, :-1], windows[:, 1:]
        else:
            from minidist.data import load_digits

            self.x_train, self.y_train, self.eval_x, self.eval_y = load_digits(flatten=False)
        self.rank = rank

    def build(self) -> nn.Module:
        if self.name == "gpt":
            from minidist.train_gpt import build_gpt

            return build_gpt(seed=self.seed, **self.config["model"])
        from minidist.train import build_model

        return build_model("cnn", self.seed)

    def batches(self):
        """This rank's batches, a generator (the same sequence for every method)."""
        generator = np.random.default_rng([self.seed, self.rank, 7])
        size = self.config["batch_size"]
        while True:
            if self.name == "gpt":
                block = self.config["model"]["block_size"]
                starts = generator.integers(0, len(self.train_tokens) - block, size=size)
                windows = self.train_tokens[starts[:, None] + np.arange(block + 1)]
                yield windows[:, :-1], windows[:, 1:]
            else:
                pick = generator.integers(0, len(self.x_train), size=size)
                yield Tensor(self.x_train[pick]), self.y_train[pick]

    def loss(self, model, x, y):
        if self.name == "gpt":
            from minidist.train_gpt import language_model_loss

            return language_model_loss(model, x, y)
        return nn.CrossEntropyLoss()(model(x), y)

    def held_out_loss(self, model) -> float:
        was = model.training
        model.eval()
        with no_grad():
            x = self.eval_x if self.name == "gpt" else Tensor(self.eval_x)
            value = float(self.loss(model, x, self.eval_y).item())
        model.train(was)
        return value


def _train(task: _Task, method: Method) -> dict:
    """Train ``method`` on this rank; its evaluations and its training seconds."""
    model = task.build()
    # Built (DDP and the wrappers broadcast rank 0's weights) before the
    # region: the bytes counted inside it are the training steps' alone.
    if method.kind == "ddp":
        wrapped = DistributedDataParallel(model, algorithm="ring", overlap=False)
        inner = optim.AdamW(wrapped.parameters(), lr=task.config["lr"], betas=(0.9, 0.99),
                            weight_decay=0.0)
        context = None
    else:
        wrapped = model
        inner = optim.AdamW(model.parameters(), lr=task.config["lr"], betas=(0.9, 0.99),
                            weight_decay=0.0)
        if method.kind == "local_sgd":
            context = LocalSGD(model, inner, method.sync_every, algorithm="ring")
        else:
            outer = optim.SGD(model.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM,
                              nesterov=True)
            context = DiLoCo(model, inner, outer, method.sync_every, algorithm="ring")
    batches = task.batches()
    evaluations = [(0, task.held_out_loss(model))]
    seconds = 0.0
    steps, every = task.config["steps"], task.config["eval_every"]
    with trace.region(f"method {method.name}"):
        if context is not None:
            context.__enter__()
        try:
            for step in range(1, steps + 1):
                x, y = next(batches)
                begin = time.perf_counter()
                inner.zero_grad()
                task.loss(wrapped, x, y).backward()
                inner.step()                 # local SGD and DiLoCo sync inside, every H-th
                seconds += time.perf_counter() - begin
                if step % every == 0:
                    evaluations.append((step, task.held_out_loss(model)))
        finally:
            if context is not None:
                context.__exit__(None, None, None)
    return {"evaluations": evaluations, "seconds": seconds}


def _worker(model_name: str, config: dict, chosen: list, seed: int):
    task = _Task(model_name, config, seed)
    found = {method.name: _train(task, method) for method in chosen}
    parameters = task.build().parameters()
    found["_parameters"] = [(p.data.size, p.data.dtype.itemsize) for p in parameters]
    return found


# --------------------------------------------------------------------------- the results


@dataclass
class MethodRun:
    """One method on one model. Bytes are per rank (the mean over the
    ranks), read from the trace; seconds are rank 0's."""

    name: str
    kind: str
    sync_every: int
    steps: list[int]                 # the evaluation steps, 0 first
    loss: list[float]                # held-out loss there, the mean over the ranks
    bytes_per_step: float            # every byte sent, per rank per training step
    ring_bytes_per_step: float       # those of the ring all_reduces (weights or gradients)
    formula_bytes_per_step: float    # 2 (p - 1) / p n / H
    seconds_per_step: float          # wall time of a training step
    comm_seconds_per_step: float     # of which inside collectives (the trace)
    steps_to_target: int | None = None   # first sync step at or below the target loss
    bytes_to_target: float | None = None

    @property
    def compute_seconds_per_step(self) -> float:
        return self.seconds_per_step - self.comm_seconds_per_step

    def synced(self, step: int) -> bool:
        """At ``step`` every rank holds the same weights (a sync just ran)."""
        return step % self.sync_every == 0

    def bytes_at(self, step: int) -> float:
        """Bytes per rank sent after ``step`` steps: one all_reduce every H."""
        return self.bytes_per_step * self.sync_every * (step // self.sync_every)


@dataclass(frozen=True)
class Crossover:
    """Below ``bandwidth`` (bytes per second) ``below`` reaches the target
    sooner than ``above``; above it, the other way round."""

    below: str
    above: str
    bandwidth: float


@dataclass
class ModelResult:
    """One model's runs, the target, the modeled times and the crossovers."""

    model: str
    world_size: int
    transport: str
    parameters: int                  # values
    parameter_bytes: int             # n of the formulas
    target_loss: float
    link: Params                     # alpha (and gamma) of the model of time; beta = 1 / B
    runs: dict[str, MethodRun] = field(default_factory=dict)
    #: c of the model: the median over the methods of their compute seconds
    #: per step (the same model and batch; what differs is the communication)
    compute_seconds_per_step: float = 0.0
    #: measured on this machine's link: 1 / beta of the transport's PARAMS
    measured_bandwidth: float = 0.0
    #: method -> measured seconds to the target (steps to target x seconds per step)
    measured_seconds_to_target: dict = field(default_factory=dict)
    #: method -> the bandwidth below which it reaches the target before DDP (None: never)
    beats_ddp_below: dict = field(default_factory=dict)
    #: every pairwise crossover (below: the method that sends fewer bytes)
    crossovers: list[Crossover] = field(default_factory=list)
    #: (lowest bandwidth, highest bandwidth, method): the fastest, band by band
    fastest: list = field(default_factory=list)

    def seconds_to_target(self, name: str, bandwidth: float) -> float:
        """The modeled T_m(B); inf if the method never reached the target."""
        a, b = self.time_terms(name)
        return a + b / bandwidth

    def time_terms(self, name: str) -> tuple[float, float]:
        """(a, b) of T(B) = a + b / B for ``name``: a the compute and the
        latency (and reduction) terms, b the bytes on the critical path."""
        run = self.runs[name]
        if run.steps_to_target is None:
            return math.inf, 0.0
        syncs = run.steps_to_target / run.sync_every
        fixed, per_byte = allreduce_terms(self.parameter_bytes, self.world_size, self.link)
        return (run.steps_to_target * self.compute_seconds_per_step + syncs * fixed,
                syncs * per_byte)

    @property
    def bytes_ratio_to_ddp(self) -> dict:
        ddp = self.runs["ddp"].bytes_per_step
        return {name: run.bytes_per_step / ddp for name, run in self.runs.items()}


@dataclass
class Result:
    """What :func:`run` measured, per model (``models["gpt"]``, ``models["cnn"]``)."""

    quick: bool
    models: dict[str, ModelResult] = field(default_factory=dict)
    picture: Path | None = None


def allreduce_terms(nbytes: float, world_size: int, link: Params) -> tuple[float, float]:
    """The ring all_reduce of the cost model as ``fixed + per_byte / B``: its
    time at bandwidth B is linear in beta = 1 / B, so two calls of
    :func:`minidist.costmodel.predict` give both terms (``fixed``: 2 (p - 1)
    alpha + (p - 1) / p n gamma; ``per_byte``: 2 (p - 1) / p n)."""
    fixed = costmodel.predict("all_reduce", "ring", world_size, nbytes,
                              params=Params(alpha=link.alpha, beta=0.0, gamma=link.gamma))
    one = costmodel.predict("all_reduce", "ring", world_size, nbytes,
                            params=Params(alpha=link.alpha, beta=1.0, gamma=link.gamma))
    return fixed, one - fixed


def crossover(first: tuple[float, float], second: tuple[float, float]) -> float | None:
    """The bandwidth where ``a1 + b1 / B = a2 + b2 / B``, for (a, b) pairs:
    ``(b1 - b2) / (a2 - a1)``; None when the lines do not cross at a
    positive finite bandwidth (one method is faster everywhere)."""
    (a1, b1), (a2, b2) = first, second
    if not (math.isfinite(a1) and math.isfinite(a2)) or a1 == a2:
        return None
    bandwidth = (b1 - b2) / (a2 - a1)
    return bandwidth if bandwidth > 0 else None


def fastest_regions(result: ModelResult, low: float = 1e3, high: float = 1e13) -> list:
    """``(from B, to B, method)``: the fastest method to the target in each
    band of bandwidths between ``low`` and ``high``, split at the crossovers."""
    names = [n for n, r in result.runs.items() if r.steps_to_target is not None]
    cuts = sorted({c.bandwidth for c in result.crossovers if low < c.bandwidth < high})
    edges = [low, *cuts, high]
    bands = []
    for left, right in zip(edges, edges[1:]):
        middle = math.sqrt(left * right)
        best = min(names, key=lambda n: result.seconds_to_target(n, middle))
        if bands and bands[-1][2] == best:
            bands[-1] = (bands[-1][0], right, best)
        else:
            bands.append((left, right, best))
    return bands


def _sent(events, region: str, world_size: int) -> tuple[float, float, float]:
    """Inside each rank's region ``region``: (all bytes sent, those of ring
    all_reduces, both per rank: the sums over the ranks / p) and rank 0's
    seconds inside collectives."""
    bounds = {e["rank"]: (e["start"], e["end"]) for e in events
              if e["kind"] == "compute" and e["label"] == region}
    total = ring = collective = 0.0
    for e in events:
        begin, end = bounds.get(e["rank"], (1, 0))
        if not begin <= e["start"] <= end:
            continue
        if e["kind"] == "send":
            total += e["bytes"]
            if (e.get("label") or "").startswith("all_reduce ring"):
                ring += e["bytes"]
        elif e["kind"] == "collective" and e["rank"] == 0:
            collective += (e["end"] - e["start"]) * 1e-9
    return total / world_size, ring / world_size, collective


def _analyse(model: str, chosen, per_rank, events, config, world_size, transport,
             target) -> ModelResult:
    shapes = per_rank[0]["_parameters"]
    values = sum(size for size, _ in shapes)
    nbytes = sum(size * itemsize for size, itemsize in shapes)
    link = params_for(transport)
    result = ModelResult(model, world_size, transport, values, nbytes, 0.0,
                         Params(alpha=link.alpha, beta=link.beta, gamma=link.gamma),
                         measured_bandwidth=link.bandwidth)
    steps = config["steps"]
    for method in chosen:
        found = [rank_result[method.name] for rank_result in per_rank]
        evaluation_steps = [step for step, _ in found[0]["evaluations"]]
        loss = np.mean([[value for _, value in f["evaluations"]] for f in found], axis=0)
        total, ring, comm = _sent(events, f"method {method.name}", world_size)
        formula = 2 * (world_size - 1) / world_size * nbytes / method.sync_every
        result.runs[method.name] = MethodRun(
            method.name, method.kind, method.sync_every, evaluation_steps,
            [float(v) for v in loss], total / steps, ring / steps, formula,
            found[0]["seconds"] / steps, comm / steps)
    result.compute_seconds_per_step = float(np.median(
        [run.compute_seconds_per_step for run in result.runs.values()]))
    return apply_target(result, target)


def apply_target(result: ModelResult, target: float | None = None) -> ModelResult:
    """Set ``result``'s target loss and what follows from it: the steps and
    bytes of each method to reach it, the measured and modeled times, the
    crossovers and the fastest bands. ``target`` None: the loosest of the
    methods' best synced losses, so that every method reaches it."""
    result.target_loss = float(target) if target is not None else max(
        min(v for s, v in zip(r.steps, r.loss) if s and r.synced(s)) for r in result.runs.values())
    result.measured_seconds_to_target, result.beats_ddp_below = {}, {}
    result.crossovers = []
    for run in result.runs.values():
        run.steps_to_target = run.bytes_to_target = None
        reached = [s for s, v in zip(run.steps, run.loss)
                   if s and run.synced(s) and v <= result.target_loss]
        if reached:
            run.steps_to_target = reached[0]
            run.bytes_to_target = run.bytes_at(reached[0])
            result.measured_seconds_to_target[run.name] = reached[0] * run.seconds_per_step
    names = list(result.runs)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            bandwidth = crossover(result.time_terms(first), result.time_terms(second))
            if bandwidth is None:
                continue
            b1, b2 = result.time_terms(first)[1], result.time_terms(second)[1]
            below, above = (first, second) if b1 < b2 else (second, first)
            result.crossovers.append(Crossover(below, above, bandwidth))
    for name in names[1:]:
        if result.runs[name].steps_to_target is None or result.runs["ddp"].steps_to_target is None:
            result.beats_ddp_below[name] = None
            continue
        a, b = result.time_terms(name)
        a0, b0 = result.time_terms("ddp")
        if b >= b0:          # no fewer bytes: faster below no bandwidth
            result.beats_ddp_below[name] = None
        elif a <= a0:        # fewer bytes and no more compute: faster everywhere
            result.beats_ddp_below[name] = math.inf
        else:
            result.beats_ddp_below[name] = crossover((a, b), (a0, b0))
    result.fastest = fastest_regions(result)
    return result


def measure(model: str, config: dict | None = None, quick: bool = True, world_size: int = 2,
            transport: str = "shm", seed: int = 0, target: float | None = None,
            order: Sequence[str] | None = None, trace_dir=None) -> ModelResult:
    """Every method on ``model`` in one launch of ``world_size`` ranks:
    :func:`configuration`'s recipe (or ``config``), the methods trained in
    ``order`` (names; default DDP first), the bytes read from the launch's
    trace (kept in ``trace_dir`` when given); a :class:`ModelResult`."""
    config = configuration(model, quick) if config is None else config
    chosen = methods(config["sync_every"])
    by_name = {method.name: method for method in chosen}
    trained = chosen if order is None else [by_name[name] for name in order]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(trace_dir or folder) / f"low_communication_{model}.jsonl"
        per_rank = minidist.launch(_worker, world_size=world_size, transport=transport,
                                   trace=str(path), args=(model, config, trained, seed),
                                   timeout=900)
        events = trace.read_jsonl(path).events
    return _analyse(model, chosen, per_rank, events, config, world_size, transport, target)


def run(models: Sequence[str] = MODELS, quick: bool = True, world_size: int = 2,
        transport: str = "shm", seed: int = 0, target: dict | None = None, output=None,
        progress: Callable[[str], None] | None = None, trace_dir=None) -> Result:
    """Train every method on each of ``models`` (:func:`measure`: one launch
    per model), and return a :class:`Result`. ``target``: model -> target
    loss (default: the loosest best loss of the methods); ``output``: a
    folder for the picture (None: none drawn); ``progress(line)`` after each
    model."""
    result = Result(quick=quick)
    for model in models:
        result.models[model] = measure(model, quick=quick, world_size=world_size,
                                       transport=transport, seed=seed,
                                       target=(target or {}).get(model), trace_dir=trace_dir)
        if progress is not None:
            runs = result.models[model].runs
            progress(f"{model}: {len(runs)} methods trained, target loss "
                     f"{result.models[model].target_loss:.3f}")
    if output is not None:
        result.picture = plot(result, Path(output) / "low_communication.png")
    return result


# --------------------------------------------------------------------------- reporting


def format_bandwidth(value) -> str:
    """Bytes per second in words ("144 MB/s"); None: "never", inf: "always"."""
    if value is None:
        return "never"
    if math.isinf(value):
        return "always"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} B/s"


def format_table(result: Result) -> str:
    """Per model: bytes per step (trace and formula), time per step, steps
    and bytes to the target, and the bandwidth below which each beats DDP."""
    lines = []
    for model in result.models.values():
        ddp = model.runs["ddp"]
        lines.append(f"{model.model}: {model.parameters:,} parameters ({model.parameter_bytes:,} "
                     f"bytes), {model.world_size} ranks ({model.transport}), target loss "
                     f"{model.target_loss:.3f}")
        lines.append(f"  {'method':<18} {'bytes/step':>11} {'formula':>11} {'vs DDP':>7} "
                     f"{'ms/step':>8} {'vs DDP':>7} {'steps':>6} {'bytes to target':>16} "
                     f"{'beats DDP below':>16}")
        for run in model.runs.values():
            steps = "-" if run.steps_to_target is None else str(run.steps_to_target)
            sent = "-" if run.bytes_to_target is None else f"{run.bytes_to_target:,.0f}"
            below = "" if run.name == "ddp" else format_bandwidth(model.beats_ddp_below.get(run.name))
            lines.append(
                f"  {run.name:<18} {run.bytes_per_step:11,.0f} {run.formula_bytes_per_step:11,.0f} "
                f"{run.bytes_per_step / ddp.bytes_per_step:7.3f} {1e3 * run.seconds_per_step:8.2f} "
                f"{run.seconds_per_step / ddp.seconds_per_step:7.2f} {steps:>6} {sent:>16} "
                f"{below:>16}")
        bands = ", ".join(f"{name} from {format_bandwidth(low)} to {format_bandwidth(high)}"
                          for low, high, name in model.fastest)
        lines.append(f"  fastest to the target: {bands}")
    return "\n".join(lines)


def plot(result: Result, path) -> Path:
    """One row per model: loss against steps, loss against bytes sent (log),
    and the modeled time to the target against the link's bandwidth (log-log)
    with the measured points at this machine's link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(result.models)
    figure, axes = plt.subplots(rows, 3, figsize=(16, 4.6 * rows), squeeze=False)
    for row, model in zip(axes, result.models.values()):
        steps_axis, bytes_axis, time_axis = row
        bandwidths = np.logspace(4, 12, 200)
        for index, run in enumerate(model.runs.values()):
            style = dict(color=f"C{index}", linestyle="-" if run.kind != "diloco" else "--",
                         linewidth=2.2 if run.kind == "ddp" else 1.5)
            steps_axis.plot(run.steps, run.loss, label=run.name, **style)
            # At the sync points only (the bytes move there), from the first one.
            synced = [(run.bytes_at(s), v) for s, v in zip(run.steps, run.loss)
                      if s and run.synced(s)]
            bytes_axis.plot(*zip(*synced), marker=".", label=run.name, **style)
            if run.steps_to_target is not None:
                time_axis.plot(bandwidths, [model.seconds_to_target(run.name, b)
                                            for b in bandwidths], label=run.name, **style)
                time_axis.scatter([model.measured_bandwidth],
                                  [model.measured_seconds_to_target[run.name]],
                                  color=style["color"], zorder=3, s=30)
        for axis in (steps_axis, bytes_axis):
            axis.axhline(model.target_loss, color="grey", linewidth=0.8, linestyle=":")
            axis.set_ylabel("held-out loss (mean over ranks)")
            axis.grid(alpha=0.3)
        steps_axis.set_xlabel("training steps")
        steps_axis.set_title(f"{model.model}: loss against steps")
        steps_axis.legend(fontsize="small")
        bytes_axis.set_xscale("log")
        bytes_axis.set_xlabel("bytes sent per rank (from the trace, log scale), at each sync")
        bytes_axis.set_title(f"{model.model}: loss against bytes")
        for c in model.crossovers:
            if c.above == "ddp":
                time_axis.axvline(c.bandwidth, color="grey", linewidth=0.6, linestyle=":")
        time_axis.set_xscale("log")
        time_axis.set_yscale("log")
        time_axis.set_xlabel("link bandwidth 1/β (bytes/s); dots: measured here (shm)")
        time_axis.set_ylabel(f"seconds to loss {model.target_loss:.2f}")
        time_axis.set_title(f"{model.model}: time to target, alpha-beta model")
        time_axis.grid(alpha=0.3, which="both")
        time_axis.legend(fontsize="small")
    figure.suptitle("DDP, local SGD and DiLoCo: loss, bytes, and the bandwidth each needs")
    return save_figure(figure, path)


def main(argv=None) -> int:
    parser = experiment_parser(
        "low_communication",
        "DDP, local SGD and DiLoCo on the small GPT and the digits CNN: loss against steps "
        "and bytes, and the link bandwidth below which each wins. Without --full, the "
        "quick form (seconds).",
        "longer runs, a larger GPT and H up to 64 (minutes)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--transport", default="shm", choices=["shm", "pipe"])
    parser.add_argument("--model", choices=MODELS, default=None, help="one model only")
    args, output = parse_with_output(parser, argv, "low_communication_output", "the PNG picture")
    if output is None:
        return 2
    result = run(models=(args.model,) if args.model else MODELS, quick=not args.full,
                 world_size=args.world_size, transport=args.transport, output=output,
                 progress=lambda line: print(line, file=sys.stderr))
    print(format_table(result))
    print("saved", result.picture)
    return 0


if __name__ == "__main__":
    sys.exit(main())
