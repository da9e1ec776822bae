"""Large-batch training: test accuracy against the global batch size, and the
rules that try to keep it.

Why a single process answers a data-parallel question: n workers with b
examples each, averaging their gradients, make exactly the update that one
process makes on a batch of n * b (``tests/parallel/test_data_parallel.py`` checks it
to float rounding). So "how many workers can I use?" is "how large a global
batch can training take?".

**The sweep** (:func:`run_sweep`): the digits MLP trained for a fixed number
of *epochs* at batch sizes from small to the whole training set. A fixed
budget of epochs is the point: a batch k times larger makes k times fewer
updates, which is what data parallelism buys (the same epoch in fewer,
bigger steps, each split over workers) and what it risks. The rule that
picks the learning rate at batch ``B``, given one that works at ``B0``:

* ``constant``: keep the base rate (change nothing);
* ``linear``: the linear scaling rule ``lr = base_lr * B / B0`` from the
  first update;
* ``linear_warmup``: the same rate reached by a linear warm-up from
  ``base_lr`` over the first 2 epochs (Goyal et al., 2017, "Accurate, Large
  Minibatch SGD", who warm up over 5 of 90 epochs);
* ``lars``: LARS (You, Gitman & Ginsburg, 2017): each layer's step is a
  fixed fraction of its weights' norm, whatever its gradient's scale; the
  global rate grows as ``sqrt(B / B0)``, with the same warm-up. (You et al.
  tuned the rate per batch size; their rates grow roughly like the square
  root, and on this model the linear rule overshoots with LARS.)

**The schedule comparison** (:func:`run_batch_growth`): Smith, Kindermans,
Ying & Le (2017), "Don't Decay the Learning Rate, Increase the Batch Size".
Step decay divides the rate by ``1 / gamma`` at each milestone; the
alternative multiplies the batch by ``1 / gamma`` there and keeps the rate
(:class:`~minidist.optim.BatchSizeSchedule`). Both lower the SGD noise scale
``lr * N / B`` alike, so they should reach a similar accuracy after the
same epochs, the second with fewer updates.

Cost: every run trains ``epochs * ceil(N / B)`` steps of a 64-H-10 MLP on
N = 1442 images; the whole sweep costs the same number of examples per
batch size, and the small batches dominate its time (Python overhead per
step). The reduced form (:func:`configuration` with ``full=False``) takes
seconds, the full form a few minutes.

``python -m minidist.experiments.large_batch [--full] [--output DIR]`` runs
it, prints a table and writes the two pictures; lesson 6 walks through it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minidist import Tensor, nn, optim
from minidist.data import load_digits
from minidist.experiments.arguments import experiment_parser, parse_with_output
from minidist.experiments.figures import save_figure
from minidist.optim.lr_scheduler import LambdaLR, LinearWarmup, MultiStepLR
from minidist.runtime import blas_threads
from minidist.train import evaluate

OPTIMIZERS = ("sgd", "lars")
SCALINGS = ("none", "linear", "sqrt")


def scaled_lr(base_lr: float, base_batch: int, batch_size: int, scaling: str) -> float:
    """The learning rate at ``batch_size`` given ``base_lr`` at ``base_batch``:
    ``base_lr`` (scaling "none"), ``base_lr * B / B0`` ("linear") or
    ``base_lr * sqrt(B / B0)`` ("sqrt")."""
    if scaling == "none":
        return float(base_lr)
    if scaling == "linear":
        return optim.linear_scaling_rule(base_lr, base_batch, batch_size)
    if scaling == "sqrt":
        return float(base_lr) * math.sqrt(batch_size / base_batch)
    raise ValueError(f"unknown scaling {scaling!r}: choose one of {', '.join(SCALINGS)}")


def steps_per_epoch(dataset_size: int, batch_size: int) -> int:
    """Updates in one epoch: the last batch may be smaller, it still counts."""
    return -(-dataset_size // batch_size)


@dataclass(frozen=True)
class Rule:
    """How the learning rate follows the batch size.

    ``optimizer`` is "sgd" (momentum SGD) or "lars"; ``scaling`` turns
    ``base_lr`` at the base batch into the peak rate at batch B (see
    :func:`scaled_lr`); ``warmup_epochs`` > 0 ramps the rate linearly from
    ``base_lr`` up to the peak over that many epochs' updates, stepped per
    update (Goyal et al.: 5 of 90 epochs). ``trust_coefficient`` is LARS's eta.
    """

    name: str
    optimizer: str = "sgd"
    scaling: str = "none"
    base_lr: float = 0.01
    warmup_epochs: float = 0.0
    momentum: float = 0.9
    trust_coefficient: float = 0.001

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"rule {self.name!r}: unknown optimizer {self.optimizer!r}, "
                             f"choose one of {', '.join(OPTIMIZERS)}")
        if self.scaling not in SCALINGS:
            raise ValueError(f"rule {self.name!r}: unknown scaling {self.scaling!r}, "
                             f"choose one of {', '.join(SCALINGS)}")
        if not self.base_lr > 0 or not self.warmup_epochs >= 0:
            raise ValueError(f"rule {self.name!r}: need base_lr > 0 and warmup_epochs >= 0, "
                             f"got {self.base_lr!r} and {self.warmup_epochs!r}")

    def peak_lr(self, batch_size: int, base_batch: int) -> float:
        return scaled_lr(self.base_lr, base_batch, batch_size, self.scaling)

    def warmup_steps(self, batch_size: int, dataset_size: int) -> int:
        """Updates the warm-up lasts; at least one when there is a warm-up,
        so a full-batch run (one update per epoch) still ramps."""
        if self.warmup_epochs == 0:
            return 0
        return max(1, round(self.warmup_epochs * steps_per_epoch(dataset_size, batch_size)))

    def build(self, parameters, batch_size: int, base_batch: int, dataset_size: int):
        """``(optimizer, scheduler)`` for training at ``batch_size``; step the
        scheduler after every update. The warm-up starts at ``base_lr``: the
        rate known to work at the base batch."""
        peak = self.peak_lr(batch_size, base_batch)
        if self.optimizer == "lars":
            optimizer = optim.LARS(parameters, lr=peak, momentum=self.momentum,
                                   trust_coefficient=self.trust_coefficient,
                                   exclude_bias_and_norm=False)
        else:
            optimizer = optim.SGD(parameters, lr=peak, momentum=self.momentum)
        scheduler = LinearWarmup(optimizer, self.warmup_steps(batch_size, dataset_size),
                                 start_factor=min(1.0, self.base_lr / peak))
        return optimizer, scheduler


# Tuned once at the base batch of 16, where every base rate from 0.01 to
# 0.05 gives about 97 % (and LARS 1.0 beats 3.0), then left alone: the point
# is what each rule does at other batch sizes without retuning.
BASE_BATCH = 16
HIDDEN = 64
RULES = {
    "constant": Rule("constant", "sgd", "none", base_lr=0.01),
    "linear": Rule("linear", "sgd", "linear", base_lr=0.01),
    "linear_warmup": Rule("linear_warmup", "sgd", "linear", base_lr=0.01, warmup_epochs=2),
    "lars": Rule("lars", "lars", "sqrt", base_lr=1.0, warmup_epochs=2),
}


def digits_data():
    """``(x_train, y_train, x_test, y_test)``: the bundled digits, flattened."""
    return load_digits()


def make_model(seed: int, hidden: int = HIDDEN) -> nn.Module:
    """The MLP 64 -> hidden -> ReLU -> 10, initialised from ``seed``."""
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def epoch_order(dataset_size: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled order of one epoch, the same for every batch size and
    every rule, so that runs differ only in how the order is cut."""
    return np.random.default_rng([seed, epoch]).permutation(dataset_size)


def _check_batch_size(batch_size: int, dataset_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or not (
        1 <= batch_size <= dataset_size
    ):
        raise ValueError(f"batch size {batch_size!r} must be an integer from 1 to the "
                         f"training set's {dataset_size} examples")


def train(model: nn.Module, optimizer, data, epochs: int, batch_size_at: Callable[[int], int],
          seed: int = 0, step_scheduler=None, epoch_scheduler=None) -> list[dict]:
    """Train ``model`` for ``epochs`` epochs, at ``batch_size_at(epoch)``
    examples per update; step ``step_scheduler`` after every update and
    ``epoch_scheduler`` after every epoch.

    Returns one dict per epoch: ``epoch`` (from 1), ``batch_size``, ``lr``
    (the rate of the epoch's last update), ``updates`` (so far),
    ``train_loss`` (mean over the epoch), ``test_accuracy``, ``diverged``.
    Training stops at the first update whose loss is not finite: that run
    has diverged, and its last entry says so.
    """
    x, y, x_test, y_test = data
    loss_fn = nn.CrossEntropyLoss()
    history, updates = [], 0
    # Diverging runs overflow on their way to inf; they are detected below, not warned about.
    # One BLAS thread: this MLP's products are too small to gain from a second
    # one, and on a busy machine every product waits for its slowest thread to
    # get a core (the reduced sweep took three times as long on two threads).
    with np.errstate(over="ignore", invalid="ignore"), blas_threads.limit(1):
        for epoch in range(epochs):
            batch_size = batch_size_at(epoch)
            _check_batch_size(batch_size, len(x))
            order = epoch_order(len(x), seed, epoch)
            loss_sum, diverged = 0.0, False
            for start in range(0, len(x), batch_size):
                indices = order[start:start + batch_size]
                lr = optimizer.param_groups[0]["lr"]
                optimizer.zero_grad()
                loss = loss_fn(model(Tensor(x[indices])), y[indices])
                loss.backward()
                optimizer.step()
                updates += 1
                if step_scheduler is not None:
                    step_scheduler.step()
                loss_sum += loss.item() * len(indices)
                if not math.isfinite(loss.item()):
                    diverged = True
                    break
            history.append({
                "epoch": epoch + 1, "batch_size": batch_size, "lr": lr, "updates": updates,
                "train_loss": loss_sum / len(x), "test_accuracy": evaluate(model, x_test, y_test),
                "diverged": diverged,
            })
            if diverged:
                break
            if epoch_scheduler is not None:
                epoch_scheduler.step()
    return history


def run_point(rule: Rule, batch_size: int, epochs: int, seed: int = 0, data=None,
              base_batch: int = BASE_BATCH, hidden: int = HIDDEN) -> dict:
    """One training run of the sweep; returns its record (see :func:`run_sweep`)."""
    data = digits_data() if data is None else data
    dataset_size = len(data[0])
    _check_batch_size(batch_size, dataset_size)
    model = make_model(seed, hidden)
    optimizer, scheduler = rule.build(model.parameters(), batch_size, base_batch, dataset_size)
    history = train(model, optimizer, data, epochs, lambda epoch: batch_size, seed,
                    step_scheduler=scheduler)
    last = history[-1]
    return {
        "rule": rule.name, "batch_size": int(batch_size), "seed": seed, "epochs": epochs,
        "peak_lr": rule.peak_lr(batch_size, base_batch),
        "warmup_steps": rule.warmup_steps(batch_size, dataset_size),
        "updates": last["updates"], "train_loss": last["train_loss"],
        "test_accuracy": last["test_accuracy"], "diverged": last["diverged"],
        "model": model,
    }


def _resolve_rules(rules) -> list[Rule]:
    resolved = []
    for rule in rules:
        if isinstance(rule, Rule):
            resolved.append(rule)
        elif rule in RULES:
            resolved.append(RULES[rule])
        else:
            raise ValueError(f"unknown rule {rule!r}: pass a Rule, or one of {', '.join(RULES)}")
    return resolved


def run_sweep(batch_sizes: Sequence[int], rules: Sequence = tuple(RULES), epochs: int = 20,
              seeds: Sequence[int] = (0,), data=None, base_batch: int = BASE_BATCH,
              hidden: int = HIDDEN, progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Train at every batch size with every rule (names of :data:`RULES` or
    :class:`Rule` objects) and seed, each run ``epochs`` epochs.

    Returns one record per run: ``rule``, ``batch_size``, ``seed``,
    ``epochs``, ``peak_lr``, ``warmup_steps``, ``updates`` (made),
    ``train_loss`` and ``test_accuracy`` at the end, ``diverged``, and the
    trained ``model``. ``progress(record)`` is called after each run.
    """
    data = digits_data() if data is None else data
    for batch_size in batch_sizes:
        _check_batch_size(batch_size, len(data[0]))
    if epochs < 1 or not seeds:
        raise ValueError(f"need epochs >= 1 and at least one seed, got {epochs} and {seeds!r}")
    records = []
    for rule in _resolve_rules(rules):
        for batch_size in batch_sizes:
            for seed in seeds:
                record = run_point(rule, batch_size, epochs, seed, data, base_batch, hidden)
                records.append(record)
                if progress is not None:
                    progress(record)
    return records


def summarise(records: Sequence[dict]) -> dict[str, list[dict]]:
    """Per rule, one row per batch size (ascending): ``batch_size``,
    ``updates``, ``peak_lr``, ``mean`` and ``std`` of the test accuracy over
    seeds, ``seeds``, the mean final ``train_loss`` and ``diverged`` (how
    many runs diverged)."""
    table: dict[str, dict[int, list[dict]]] = {}
    for record in records:
        table.setdefault(record["rule"], {}).setdefault(record["batch_size"], []).append(record)
    summary = {}
    for rule, by_batch in table.items():
        rows = []
        for batch_size in sorted(by_batch):
            runs = by_batch[batch_size]
            accuracies = np.array([run["test_accuracy"] for run in runs])
            rows.append({
                "batch_size": batch_size, "updates": runs[0]["updates"],
                "peak_lr": runs[0]["peak_lr"], "mean": float(accuracies.mean()),
                "std": float(accuracies.std()), "seeds": len(runs),
                "train_loss": float(np.mean([run["train_loss"] for run in runs])),
                "diverged": sum(run["diverged"] for run in runs),
            })
        summary[rule] = rows
    return summary


# --------------------------------------------------------------------------- batch growth


def schedule_updates(batch_size_at: Callable[[int], int], dataset_size: int, epochs: int) -> int:
    """Updates that ``epochs`` epochs make at ``batch_size_at(epoch)``."""
    return sum(steps_per_epoch(dataset_size, batch_size_at(epoch)) for epoch in range(epochs))


def run_batch_growth(epochs: int = 30, milestones: Sequence[int] = (10, 20), gamma: float = 0.2,
                     initial_batch: int = 16, base_lr: float = 0.15,
                     max_batch_size: int | None = None, seeds: Sequence[int] = (0,), data=None,
                     hidden: int = HIDDEN, momentum: float = 0.9) -> dict[str, list[list[dict]]]:
    """Step decay of the rate against growth of the batch (Smith et al.),
    with momentum SGD from ``base_lr`` at ``initial_batch``:

    * ``no_decay``: neither; rate and batch stay (is the decay needed at all?);
    * ``decay_lr``: the rate is multiplied by ``gamma`` at each milestone
      (:class:`MultiStepLR`, stepped per epoch);
    * ``grow_batch``: the batch is divided by ``gamma`` at each milestone
      and the rate stays (:class:`~minidist.optim.BatchSizeSchedule`);
    * ``hybrid`` (only with ``max_batch_size``): the batch grows up to
      ``max_batch_size``, the decays it cannot absorb go to the rate.

    Returns ``{schedule: [history per seed]}``, each history as
    :func:`train` returns it.
    """
    data = digits_data() if data is None else data
    dataset_size = len(data[0])
    milestones = list(milestones)
    _check_batch_size(initial_batch, dataset_size)
    fixed_batch = lambda epoch: initial_batch
    growth = optim.BatchSizeSchedule(initial_batch, milestones, gamma)
    plans = {
        "no_decay": (fixed_batch, None),
        "decay_lr": (fixed_batch, lambda optimizer: MultiStepLR(optimizer, milestones, gamma)),
        "grow_batch": (growth.batch_size_at,
                       lambda optimizer: LambdaLR(optimizer, growth.lr_factor_at)),
    }
    if max_batch_size is not None:
        capped = optim.BatchSizeSchedule(initial_batch, milestones, gamma, max_batch_size)
        plans["hybrid"] = (capped.batch_size_at,
                           lambda optimizer: LambdaLR(optimizer, capped.lr_factor_at))
    for name, (batch_size_at, _) in plans.items():
        largest = batch_size_at(epochs - 1)
        if largest > dataset_size:
            raise ValueError(
                f"{name}: the batch would grow to {largest}, more than the {dataset_size} "
                "training examples; use fewer milestones, a larger gamma, a smaller "
                "initial_batch or a max_batch_size")
    results = {}
    for name, (batch_size_at, make_scheduler) in plans.items():
        runs = []
        for seed in seeds:
            model = make_model(seed, hidden)
            optimizer = optim.SGD(model.parameters(), lr=base_lr, momentum=momentum)
            scheduler = make_scheduler(optimizer) if make_scheduler is not None else None
            runs.append(train(model, optimizer, data, epochs, batch_size_at, seed,
                              epoch_scheduler=scheduler))
        results[name] = runs
    return results


def mean_curve(runs: Sequence[Sequence[dict]], key: str = "test_accuracy") -> np.ndarray:
    """``key`` per epoch averaged over the runs (seeds) of one schedule."""
    return np.mean([[entry[key] for entry in run] for run in runs], axis=0)


# --------------------------------------------------------------------------- configuration


def configuration(full: bool, dataset_size: int) -> dict:
    """The reduced (CI, seconds) or full (minutes) form of both experiments:
    keyword arguments for :func:`run_sweep` and :func:`run_batch_growth`."""
    batch_sizes = [b for b in (16, 32, 64, 128, 256, 512, 1024) if b < dataset_size]
    batch_sizes.append(dataset_size)
    if full:
        return {
            "sweep": {"batch_sizes": batch_sizes, "epochs": 20, "seeds": (0, 1, 2, 3, 4)},
            "growth": {"epochs": 30, "milestones": (10, 20), "gamma": 0.2, "initial_batch": 16,
                       "base_lr": 0.15, "max_batch_size": 80, "seeds": (0, 1, 2, 3, 4)},
        }
    return {
        "sweep": {"batch_sizes": batch_sizes[::2] + [dataset_size] * (len(batch_sizes) % 2 == 0),
                  "epochs": 20, "seeds": (0,)},
        "growth": {"epochs": 15, "milestones": (5, 10), "gamma": 0.2, "initial_batch": 16,
                   "base_lr": 0.15, "max_batch_size": 80, "seeds": (0,)},
    }


# --------------------------------------------------------------------------- pictures


def plot_sweep(records: Sequence[dict], path, title: str | None = None) -> Path:
    """Test accuracy against batch size, one line per rule (mean over seeds,
    bars one standard deviation), log-x; saved to ``path``."""
    import matplotlib.pyplot as plt

    summary = summarise(records)
    figure, axis = plt.subplots(figsize=(7.5, 4.5))
    for rule, rows in summary.items():
        sizes = [row["batch_size"] for row in rows]
        axis.errorbar(sizes, [100 * row["mean"] for row in rows],
                      yerr=[100 * row["std"] for row in rows], marker="o", capsize=3, label=rule)
    axis.set_xscale("log", base=2)
    sizes = sorted({record["batch_size"] for record in records})
    axis.set_xticks(sizes)
    axis.set_xticklabels([str(size) for size in sizes])
    axis.set_xlabel("global batch size (log scale; the last one is the whole training set)")
    axis.set_ylabel("test accuracy (%)")
    axis.set_ylim(0, 100)
    epochs = records[0]["epochs"] if records else 0
    seeds = len({record["seed"] for record in records})
    axis.set_title(title or f"digits MLP, {epochs} epochs at every batch size, "
                            f"mean of {seeds} seed{'s' if seeds > 1 else ''}")
    axis.grid(alpha=0.3)
    axis.legend(title="learning-rate rule")
    return save_figure(figure, path)


def plot_batch_growth(results: dict[str, list[list[dict]]], path) -> Path:
    """Four panels: batch size and learning rate per epoch (the schedules),
    test accuracy against epochs and against parameter updates (means over
    seeds); saved to ``path``."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (batch_axis, rate_axis), (epoch_axis, update_axis) = axes
    # Schedules that coincide (decay_lr and no_decay share a batch) stay
    # visible: wide solid lines under narrow dashed ones.
    styles = [dict(linewidth=4, alpha=0.5), dict(linewidth=3, alpha=0.7),
              dict(linewidth=2, linestyle="--"), dict(linewidth=1.5, linestyle=":")]
    for index, (name, runs) in enumerate(results.items()):
        style = dict(color=f"C{index}", **styles[index % len(styles)])
        epochs = [entry["epoch"] for entry in runs[0]]
        updates = mean_curve(runs, "updates")
        accuracy = 100 * mean_curve(runs)
        batch_axis.step(epochs, [entry["batch_size"] for entry in runs[0]], where="mid",
                        label=name, **style)
        rate_axis.step(epochs, [entry["lr"] for entry in runs[0]], where="mid", label=name,
                       **style)
        epoch_axis.plot(epochs, accuracy, label=name, **style)
        update_axis.plot(updates, accuracy, label=f"{name}: {int(updates[-1])} updates", **style)
    for axis, label, title in ((batch_axis, "batch size", "batch size per epoch"),
                               (rate_axis, "learning rate", "learning rate per epoch")):
        axis.set_yscale("log")
        axis.set_xlabel("epoch")
        axis.set_ylabel(label)
        axis.set_title(title)
    sizes = sorted({entry["batch_size"] for runs in results.values() for entry in runs[0]})
    batch_axis.set_yticks(sizes)
    batch_axis.set_yticklabels([str(size) for size in sizes])
    batch_axis.minorticks_off()
    low = min(100 * mean_curve(runs).min() for runs in results.values())
    for axis, label in ((epoch_axis, "epoch"), (update_axis, "parameter updates")):
        axis.set_xlabel(label)
        axis.set_ylabel("test accuracy (%)")
        axis.set_ylim(max(0, low - 2), 100)
    epoch_axis.set_title("test accuracy: same epochs...")
    update_axis.set_title("...and fewer updates")
    seeds = len(next(iter(results.values())))
    figure.suptitle(f"decay the rate or grow the batch (digits MLP, mean of {seeds} "
                    f"seed{'s' if seeds > 1 else ''})")
    for axis in axes.flat:
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    return save_figure(figure, path)


# --------------------------------------------------------------------------- command line


def format_summary(summary: dict[str, list[dict]]) -> str:
    """The sweep as a text table: accuracy (and updates) per batch size and rule."""
    sizes = sorted({row["batch_size"] for rows in summary.values() for row in rows})
    lines = [f"{'batch':>6} {'updates':>8}  " + "  ".join(f"{rule:>17}" for rule in summary)]
    for size in sizes:
        cells, updates = [], ""
        for rows in summary.values():
            row = next((r for r in rows if r["batch_size"] == size), None)
            if row is None:
                cells.append(f"{'':>17}")
                continue
            updates = str(row["updates"])
            mark = f" ({row['diverged']} div)" if row["diverged"] else ""
            cells.append(f"{100 * row['mean']:6.1f} +-{100 * row['std']:4.1f}{mark:>6}")
        lines.append(f"{size:>6} {updates:>8}  " + "  ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = experiment_parser(
        "large_batch",
        "Test accuracy against the global batch size (constant rate, linear "
        "scaling + warm-up, LARS) and batch growth against rate decay, on the "
        "digits. Without --full, the reduced form (seconds).",
        "every batch size, 5 seeds, longer schedules (a few minutes)")
    args, output = parse_with_output(parser, argv, "large_batch_output", "the two PNG pictures")
    if output is None:
        return 2
    data = digits_data()
    config = configuration(args.full, len(data[0]))
    records = run_sweep(data=data, **config["sweep"])
    print(format_summary(summarise(records)))
    print("saved", plot_sweep(records, output / "large_batch_accuracy.png"))
    growth = run_batch_growth(data=data, **config["growth"])
    for name, runs in growth.items():
        print(f"{name:>10}: test accuracy {100 * mean_curve(runs)[-1]:.1f} % after "
              f"{int(mean_curve(runs, 'updates')[-1])} updates")
    print("saved", plot_batch_growth(growth, output / "batch_growth.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
