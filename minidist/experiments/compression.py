"""The communication wall, measured: train the digits with every gradient
compressor and record the test accuracy it reaches and the bytes it sends.

Every configuration (:data:`COMPRESSORS`) trains the same model from the
same weights on the same data order, data parallel on ``world_size`` ranks
(:class:`~minidist.parallel.data.ddp.DistributedDataParallel` with the
compressor as its communication hook); only the hook differs. All the
configurations run one after another inside **one** launch (one set of
processes), each in a traced region, so the bytes each rank sent per step
are read from the trace, not computed, and set next to the hook's formula.

Why per step and not per epoch: a compressor changes the bytes of every
all-reduce, not the number of steps. What it may change is the accuracy
reached after a fixed budget of epochs, which is the other column.

``python -m minidist.experiments.compression [--model cnn] [--world-size 4]
[--full]`` runs it and prints the table; lesson 13 plots it.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.atomic_file import atomic_path
from minidist.data import load_digits
from minidist.experiments.arguments import experiment_parser
from minidist.parallel.data import compression as C
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.powersgd import PowerSGDState, powersgd_hook
from minidist.train import build_model, evaluate


@dataclass(frozen=True)
class Compressor:
    """One configuration: a name, the hook and how to make its state."""

    name: str
    hook: object
    make_state: object = None          # (seed) -> state, or None for stateless hooks
    family: str = "none"               # none, bits, values, low rank (the plot's colours)
    error_feedback: bool | None = None  # None: the hook has none to switch

    def state(self, seed: int):
        return None if self.make_state is None else self.make_state(seed)


#: The configurations of lesson 13, in the order it teaches them.
COMPRESSORS = {c.name: c for c in [
    Compressor("none", C.allreduce_hook),
    Compressor("fp16", C.fp16_compress_hook, family="bits"),
    Compressor("bf16", C.bf16_compress_hook, family="bits"),
    Compressor("int8", C.int8_hook, lambda s: C.Int8State(seed=s), family="bits"),
    Compressor("sign", C.sign_hook, lambda s: C.ErrorFeedbackState(), "bits", True),
    Compressor("sign, no EF", C.sign_hook,
               lambda s: C.ErrorFeedbackState(use_error_feedback=False), "bits", False),
    Compressor("threshold", C.threshold_hook, lambda s: C.ThresholdState(1e-2, quantize=False),
               "values", True),
    Compressor("top-k 1%", C.topk_hook, lambda s: C.TopKState(0.01), "values", True),
    Compressor("top-k 1%, no EF", C.topk_hook,
               lambda s: C.TopKState(0.01, use_error_feedback=False), "values", False),
    Compressor("random-k 1%", C.randomk_hook, lambda s: C.RandomKState(0.01, seed=s),
               "values", True),
    Compressor("random-k 1%, no EF", C.randomk_hook,
               lambda s: C.RandomKState(0.01, seed=s, use_error_feedback=False), "values", False),
    Compressor("PowerSGD r2", powersgd_hook,
               lambda s: PowerSGDState(matrix_approximation_rank=2, random_seed=s,
                                       start_powerSGD_iter=2),
               "low rank", True),
    Compressor("PowerSGD r2, no EF", powersgd_hook,
               lambda s: PowerSGDState(matrix_approximation_rank=2, random_seed=s,
                                       start_powerSGD_iter=2, use_error_feedback=False),
               "low rank", False),
]}

#: The training recipe per model: epochs (full, quick), global batch, learning rate.
RECIPES = {
    "mlp": {"epochs": (30, 12), "batch_size": 64, "lr": 0.1},
    "cnn": {"epochs": (15, 4), "batch_size": 64, "lr": 0.05},
}


@dataclass
class Result:
    """One configuration's run (``seconds_per_step``: training steps only, rank 0)."""

    name: str
    family: str
    error_feedback: bool | None
    test_accuracy: float           # the mean over the seeds
    bytes_per_step: float          # sent by rank 0 per step, from the trace
    steps: int
    seconds_per_step: float
    accuracies: list = field(default_factory=list)  # one per seed
    history: list = field(default_factory=list)     # per seed: test accuracy after each epoch


# --------------------------------------------------------------------------- training


def _train_one(compressor: Compressor, model_name: str, epochs: int, batch_size: int,
               lr: float, seed: int, bucket_mb: float):
    """Train on this rank's share of every global batch; return (accuracy, steps, history)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x_train, y_train, x_test, y_test = load_digits(flatten=(model_name == "mlp"))
    model = build_model(model_name, seed)
    # The ring for every all-reduce, the hooks' included: bandwidth-optimal,
    # and the algorithm the byte formulas assume ("auto" may pick another
    # for small buckets, whose bytes differ).
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb, algorithm="ring")
    state = compressor.state(seed)
    ddp.register_comm_hook(state, compressor.hook)
    # PowerSGD all-reduces plainly for its first start_powerSGD_iter steps
    # (torch's rule); those steps are trained but not counted in the bytes.
    warm_up = getattr(state, "start_powerSGD_iter", 0)
    optimizer = optim.SGD(ddp.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    loss_fn = nn.CrossEntropyLoss()
    steps, seconds, history = 0, 0.0, []
    # The region holds the counted training steps only (not DDP's first
    # broadcast of the weights, a warm-up, nor the evaluation): the bytes
    # counted in it are per step.
    with contextlib.ExitStack() as region:
        for epoch in range(epochs):
            order = np.random.default_rng([seed, epoch]).permutation(len(x_train))
            begin = time.perf_counter()
            for start in range(0, len(order), batch_size):
                if steps == warm_up:
                    region.enter_context(trace.region(f"compressor {compressor.name}|{seed}"))
                batch = order[start:start + batch_size]
                mine = np.array_split(batch, world)[rank]    # uneven shards are fine
                optimizer.zero_grad(set_to_none=False)
                loss_fn(ddp(Tensor(x_train[mine])), y_train[mine]).backward()
                optimizer.step()
                steps += 1
            seconds += time.perf_counter() - begin
            scheduler.step()
            history.append(evaluate(model, x_test, y_test))
    return history[-1], steps - warm_up, seconds / steps, history


def _worker(names, model_name, epochs, batch_size, lr, seeds, bucket_mb):
    return [(name, seed, *_train_one(COMPRESSORS[name], model_name, epochs, batch_size, lr,
                                     seed, bucket_mb))
            for name in names for seed in seeds]


def bytes_per_step(events, rank: int = 0) -> dict:
    """Bytes ``rank`` sent per step inside each run's region (its training
    steps), by (compressor name, seed)."""
    regions = {tuple(e["label"].split(" ", 1)[1].rsplit("|", 1)): (e["start"], e["end"])
               for e in events if e["rank"] == rank and e["kind"] == "compute"
               and e["label"].startswith("compressor ")}
    sends = [e for e in events if e["rank"] == rank and e["kind"] == "send"]
    return {(name, int(seed)): sum(e["bytes"] for e in sends if begin <= e["start"] <= end)
            for (name, seed), (begin, end) in regions.items()}


def run(names=None, model: str = "mlp", world_size: int = 2, epochs: int | None = None,
        full: bool = False, seeds=(0,), transport: str = "shm", trace_path=None,
        bucket_mb: float = 25.0) -> list[Result]:
    """Train with each compressor in ``names`` (default: all of
    :data:`COMPRESSORS`) and each seed (the model's initial weights, the
    data order, the compressors' draws) in one launch of ``world_size``
    ranks; return a :class:`Result` per compressor, the accuracy the mean
    over the seeds, the bytes from the trace at ``trace_path`` (a temporary
    file when None)."""
    import tempfile
    from pathlib import Path

    names = list(COMPRESSORS) if names is None else list(names)
    unknown = [n for n in names if n not in COMPRESSORS]
    if unknown:
        raise ValueError(f"unknown compressor(s) {unknown}: choose from {list(COMPRESSORS)}")
    if model not in RECIPES:
        raise ValueError(f"unknown model {model!r}: choose 'mlp' or 'cnn'")
    recipe = RECIPES[model]
    epochs = recipe["epochs"][0 if full else 1] if epochs is None else int(epochs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(trace_path) if trace_path is not None else Path(tmp) / "compression.jsonl"
        per_rank = minidist.launch(
            _worker, world_size=world_size, transport=transport, trace=str(path),
            args=(names, model, epochs, recipe["batch_size"], recipe["lr"], tuple(seeds),
                  bucket_mb),
            timeout=300)
        events = trace.read_jsonl(path).events
    sent = bytes_per_step(events)
    results = []
    for name in names:
        rows = [row for row in per_rank[0] if row[0] == name]   # (name, seed, acc, steps, s, hist)
        steps = sum(row[3] for row in rows)
        results.append(Result(
            name, COMPRESSORS[name].family, COMPRESSORS[name].error_feedback,
            test_accuracy=float(np.mean([row[2] for row in rows])),
            bytes_per_step=sum(sent[(name, row[1])] for row in rows) / steps,
            steps=rows[0][3],
            seconds_per_step=float(np.mean([row[4] for row in rows])),
            accuracies=[row[2] for row in rows],
            history=[row[5] for row in rows]))
    return results


# --------------------------------------------------------------------------- formulas


def dense_bytes(n: int, world_size: int, s: int = 4) -> float:
    """A ring all-reduce of n values of s bytes: 2 (N - 1) / N n s per rank."""
    return 2 * (world_size - 1) / world_size * n * s


def formula_bytes(name: str, parameter_shapes, world_size: int) -> float | None:
    """Bytes one rank sends per step for a one-bucket model of these
    parameter shapes, from the hooks' docstrings, plus the 8-byte example
    count DDP all-reduces each step (one_shot, what "auto" picks for it). None where the bytes depend on the data
    (threshold). Algorithms as DDP's "auto" picks them are assumed to be the
    ring's bandwidth (the lesson's models fit in one bucket)."""
    n = sum(int(np.prod(s)) for s in parameter_shapes)
    others = world_size - 1
    count = others * 8      # the example count: 8 bytes to every other rank ("auto": one_shot)
    base = name.split(",")[0]
    if base in ("none",):
        body = dense_bytes(n, world_size)
    elif base == "fp16":
        body = dense_bytes(n, world_size, 2)
    elif base == "bf16":
        body = others * n * 2
    elif base == "int8":
        body = others * (n + 8)
    elif base == "sign":
        body = others * (math.ceil(n / 8) + 8)
    elif base in ("top-k 1%", "random-k 1%"):
        body = others * (8 + C.TopKState(0.01).k(n) * (4 + 4))
    elif base == "PowerSGD r2":
        layout = PowerSGDState(matrix_approximation_rank=2).layout(parameter_shapes)
        values = sum(r * (nn_ + m) if r else size for (_, size, nn_, m, r) in layout)
        body = dense_bytes(values, world_size)
    else:
        return None
    return count + body


def parameter_shapes(model: str) -> list[tuple]:
    """The shapes of ``model``'s parameters in DDP's bucket order (reversed)."""
    return [p.data.shape for p in build_model(model).parameters()][::-1]


# --------------------------------------------------------------------------- reporting


def format_table(results, model: str, world_size: int) -> str:
    shapes = parameter_shapes(model)
    dense = next((r.bytes_per_step for r in results if r.name == "none"), None)
    lines = [f"{'compressor':<20} {'test acc':>8} {'bytes/step':>11} {'formula':>11} "
             f"{'vs none':>8} {'ms/step':>8}"]
    for r in results:
        formula = formula_bytes(r.name, shapes, world_size)
        ratio = f"{dense / r.bytes_per_step:7.1f}x" if dense and r.bytes_per_step else "      -"
        lines.append(f"{r.name:<20} {100 * r.test_accuracy:7.2f}% {r.bytes_per_step:11,.0f} "
                     f"{'-' if formula is None else f'{formula:,.0f}':>11} {ratio:>8} "
                     f"{1e3 * r.seconds_per_step:8.2f}")
    return "\n".join(lines)


def plot(results, path, title: str | None = None):
    """Bytes per step (log scale) against test accuracy, one point per
    compressor, filled with error feedback, hollow without: all runs on the
    left, the top of the accuracy range enlarged on the right."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    colors = {"none": "black", "bits": "#006BA4", "values": "#FF800E", "low rank": "#2CA02C"}
    figure = Figure(figsize=(13, 5.5))
    FigureCanvasAgg(figure)
    best = max(r.test_accuracy for r in results)
    top = [r for r in results if r.test_accuracy >= best - 0.06]
    labels = []
    markers = []   # (axis, x, y) of every point, which a label must not cover either
    for position, (shown, zoom) in enumerate(((results, False), (top, True))):
        axis = figure.add_subplot(1, 2, position + 1)
        # Runs at the same point share one label; labels of runs with the same
        # bytes are stacked downwards so that they do not overlap.
        points: dict[tuple, list] = {}
        for r in shown:
            points.setdefault((r.bytes_per_step, round(100 * r.test_accuracy, 2)), []).append(r)
        # Neighbours along the bytes axis alternate above and below; on the
        # left, only the runs the right panel does not show are labelled.
        xs = sorted({sent for sent, _ in points})
        columns: dict[float, int] = {}
        for (sent, accuracy), runs in sorted(points.items(), key=lambda kv: -kv[0][1]):
            for r in runs:
                hollow = r.error_feedback is False
                markers.append((axis, sent, accuracy))
                axis.scatter(sent, accuracy, s=60, zorder=3, linewidths=1.5,
                             facecolors="none" if hollow else colors[r.family],
                             edgecolors=colors[r.family])
            if not zoom and all(r in top for r in runs):
                continue
            row = columns.get(sent, 0)
            columns[sent] = row + 1
            below = xs.index(sent) % 2 == 1
            labels.append(axis.annotate(", ".join(r.name for r in runs), (sent, accuracy),
                                        textcoords="offset points", fontsize=8,
                                        xytext=(6, (-12 if below else 4) - 11 * row)))
        axis.set_xscale("log")
        axis.set_xlabel("bytes sent per rank per step (from the trace, log scale)")
        axis.set_ylabel("test accuracy (%)")
        axis.grid(True, which="both", alpha=0.3)
        axis.set_xlim(min(r.bytes_per_step for r in results) / 1.5,
                      max(r.bytes_per_step for r in results) * 4)
        if zoom:
            axis.set_title("enlarged: the runs within 6 points of the best", fontsize=10)
        else:
            for family, color in colors.items():
                axis.scatter([], [], color=color, label=family)
            axis.scatter([], [], facecolors="none", edgecolors="grey", label="no error feedback")
            axis.legend(loc="lower right", fontsize=8)
            axis.set_title("every run (the ones on the right labelled there)", fontsize=10)
    figure.suptitle(title or "the communication wall: bytes against accuracy")
    figure.tight_layout()
    _unstack(figure, labels, markers)
    with atomic_path(path) as name:
        figure.savefig(name, dpi=100)
    return path


def _unstack(figure, labels, markers=(), step_points: float = 11, tries: int = 12) -> None:
    """Move each label a line at a time, down or up, whichever is nearer its
    own point, until it covers no label placed before it: runs a few bytes
    apart with close accuracies ("top-k 1%, no EF" and "sign, no EF") would
    otherwise print over each other, and a label pushed only downwards can end
    nearer a neighbour's point than its own."""
    from matplotlib.text import Text

    renderer = figure.canvas.get_renderer()

    def text_box(label):
        """The label's text alone (an Annotation's extent includes its line)."""
        label.update_positions(renderer)
        return Text.get_window_extent(label, renderer)

    from matplotlib.transforms import Bbox

    placed = []
    for axis, x, y in markers:   # a point's marker, about 9 px across at s=60
        px, py = axis.transData.transform((x, y))
        placed.append(Bbox.from_extents(px - 5, py - 5, px + 5, py + 5))
    for label in labels:
        x, y = label.xyann
        for shift in [0] + [sign * step * step_points for step in range(1, tries + 1)
                            for sign in (-1, 1)]:
            label.xyann = (x, y + shift)
            box = text_box(label)
            if not any(box.overlaps(other) for other in placed):
                break
        placed.append(text_box(label))


def main(argv=None) -> int:
    parser = experiment_parser("compression", __doc__.split("\n\n")[0],
                               "the full number of epochs")
    parser.add_argument("--model", choices=sorted(RECIPES), default="mlp")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0 .. S-1 (accuracy: the mean)")
    parser.add_argument("--only", nargs="*", default=None, help="compressor names")
    parser.add_argument("--plot", default=None, help="write the picture here")
    args = parser.parse_args(argv)
    results = run(args.only, args.model, args.world_size, args.epochs, args.full,
                  seeds=range(args.seeds))
    print(format_table(results, args.model, args.world_size))
    if args.plot:
        print("saved", plot(results, args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
