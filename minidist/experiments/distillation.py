"""Teacher-student compression on the digits: hard labels vs Hinton's distillation vs FitNets.

    from minidist.experiments import distillation
    results = distillation.run(seeds=(0, 1, 2))                  # quick form, seconds
    print(distillation.format_table(results))

**The question.** A small student network, many times smaller than a good
teacher, is trained three ways on the same examples with the same seeds
(same initial weights, same batch order), and scored on the same held-out
digits:

* ``hard``: cross-entropy on the labels alone, the baseline;
* ``hinton``: :class:`minidist.nn.DistillationLoss` (Hinton et al. 2015),
  the teacher's softened outputs (temperature T) as targets with weight
  alpha, the labels with weight 1 - alpha;
* ``fitnets``: a *thinner and deeper* student (Romero et al. 2014): stage 1
  trains its lower layers and a :class:`~minidist.nn.HintRegressor` to
  predict the teacher's first hidden layer (the hint), stage 2 trains the
  whole student with the same distillation loss. Compared with the same
  thin, deep student trained on hard labels (``fitnets_hard``) and with
  it distilled without the hint stage (``deep_hinton``), which tells what
  the hints themselves add.

**Learning rates, said plainly.** Every student trains with SGD (momentum
0.9, cosine schedule, 60 epochs, batch 32) at ``lr`` = 0.05, except the
*distilled* thin, deep students (``deep_hinton``, ``fitnets``) at
``deep_distill_lr`` = 0.02: at 0.05 the soft targets' gradient (with the
T^2 factor, about (s - t) / C per logit, and the teacher's logits are
large) killed most ReLUs of the 16-wide layers, and accuracy fell to
40-60 %. The hard-label thin student keeps 0.05, its better rate (at 0.02
it underfits in 60 epochs: 78 % against 88 % at a 200-example budget).

**The setting, and why.** The teacher (the digits MLP widened to
64-256-256-10, about 85 k parameters) trains on the whole training set. The
students see only a *limited budget* of labelled examples (``budget``, a
class-balanced subset): this is where Hinton et al. found soft targets
matter most (their speech model trained on 3 % of the data kept nearly all
of the accuracy with soft targets and overfitted badly without them). With
1,442 examples the digits are nearly solved by any model, and the gain of
distillation shrinks to noise; with a few hundred, each soft target carries
what the label cannot (this "3" is a bit like an "8"), and the student
learns from the teacher's similarity structure.

The teacher is trained once per run (its own seed); each student seed
fixes the student's initial weights and its batch order, identical for the
three methods. Accuracies are reported per seed and as the mean.

**Measured** (``--full``, 10 seeds, mean test accuracy %, teacher 97.5 %):

    budget   hard  hinton  fitnets_hard  deep_hinton  fitnets
       100   89.7    92.4          75.3         75.3     73.1
       200   93.5    95.4          88.0         91.4     90.4
       400   95.6    96.3          92.6         95.2     94.6
      1442   96.7    96.9          96.9         96.9     97.0

Hinton's distillation beats hard labels at every budget, most where data
is scarce (+2.7 points at 100 examples, +0.2 on the whole set). The thin,
deep student gains from distillation from 200 examples on (+2.4 to +3.4),
but the hint stage adds nothing over plain distillation here (fitnets is
within a point of deep_hinton, below it at 100-400): on 8x8 digits a
3-hidden-layer, 16-wide MLP is not deep enough to need FitNets' help to
train, and at 100 examples the hints (fitted on the same 100 inputs) hurt.

``python -m minidist.experiments.distillation [--full] [--output DIR]``
prints the table and writes one plot; the quick form (3 seeds, budget 200)
takes about 2 s, the full one about 35 s.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from minidist import Tensor, nn, no_grad, optim
from minidist.data import load_digits
from minidist.experiments.arguments import experiment_parser, parse_with_output
from minidist.experiments.figures import save_figure
from minidist.nn.distillation import DistillationLoss, HintRegressor, train_hint_stage
from minidist.train import evaluate

TEACHER_SIZES = (64, 256, 256, 10)
STUDENT_SIZES = (64, 16, 10)
FITNETS_SIZES = (64, 16, 16, 16, 10)
METHODS = ("hard", "hinton", "fitnets_hard", "deep_hinton", "fitnets")


def mlp(sizes: Sequence[int], seed: int) -> nn.Sequential:
    """Linear-ReLU layers of the given widths, the last one without ReLU,
    initialised from ``seed``."""
    nn.init.manual_seed(seed)
    layers = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if index < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def balanced_subset(labels: np.ndarray, budget: int, seed: int = 0) -> np.ndarray:
    """Indices of ``budget`` examples, as equal a number per class as
    possible, drawn with ``seed`` (the same subset for every method)."""
    classes = np.unique(labels)
    if budget < len(classes) or budget > len(labels):
        raise ValueError(f"budget must be between {len(classes)} and {len(labels)}, got {budget}")
    generator = np.random.default_rng(seed)
    # Deal the classes round-robin: every class's first example, then every
    # class's second, ...; a class that runs out is skipped.
    ranks, indices = [], []
    for c in classes:
        members = generator.permutation(np.flatnonzero(labels == c))
        indices.append(members)
        ranks.append(np.arange(len(members)))
    indices, ranks = np.concatenate(indices), np.concatenate(ranks)
    order = np.argsort(ranks, kind="stable")[:budget]
    return np.sort(indices[order])


def _batches(size: int, batch_size: int, seed: int, epoch: int):
    order = np.random.default_rng([seed, epoch]).permutation(size)
    return [order[start : start + batch_size] for start in range(0, size, batch_size)]


def train_classifier(model: nn.Module, x, y, epochs: int, lr: float, seed: int, batch_size: int = 32,
                     teacher_logits=None, loss_fn=None) -> nn.Module:
    """SGD with momentum and a cosine schedule; cross-entropy on ``y``, or
    ``loss_fn(student, teacher_logits[batch], y[batch])`` when a teacher's
    logits are given. The batch order depends on ``seed`` only."""
    optimizer = optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    cross_entropy = nn.CrossEntropyLoss()
    model.train()
    for epoch in range(epochs):
        for batch in _batches(len(x), batch_size, seed, epoch):
            logits = model(Tensor(x[batch]))
            if teacher_logits is None:
                loss = cross_entropy(logits, y[batch])
            else:
                loss = loss_fn(logits, teacher_logits[batch], y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
    return model


def train_teacher(data, seed: int = 0, epochs: int = 30, lr: float = 0.05, sizes=TEACHER_SIZES) -> nn.Module:
    """The teacher on the whole training set."""
    x_train, y_train = data[0], data[1]
    return train_classifier(mlp(sizes, seed), x_train, y_train, epochs, lr, seed)


def logits_of(model: nn.Module, x) -> np.ndarray:
    model.eval()
    with no_grad():
        return np.asarray(model(Tensor(x)).data)


def fitnets_student(teacher: nn.Module, x, y, teacher_logits, seed: int, epochs: int, hint_epochs: int,
                    lr: float, loss_fn, sizes=FITNETS_SIZES, guided_layers: int = 2,
                    hint_lr: float = 0.05) -> nn.Module:
    """Romero et al.'s two stages for a thin, deep MLP student. The hint is the
    teacher's first hidden layer (after its ReLU); the guided layer is the
    student's ``guided_layers``-th hidden layer (after its ReLU), so the
    student's lower half learns to reproduce the teacher's first
    representation through a Linear regressor (``hint_epochs`` passes at
    ``hint_lr``) before the distillation at ``lr``. ``hint_epochs=0`` skips
    stage 1 (plain distillation of the same student)."""
    student = mlp(sizes, seed)
    if hint_epochs == 0:
        return train_classifier(student, x, y, epochs, lr, seed, teacher_logits=teacher_logits, loss_fn=loss_fn)
    guided = student[: 2 * guided_layers]
    hint = teacher[:2]
    regressor = HintRegressor(sizes[guided_layers], teacher[0].out_features, rng=np.random.default_rng(seed))
    optimizer = optim.SGD(list(guided.parameters()) + list(regressor.parameters()), lr=hint_lr, momentum=0.9)
    for epoch in range(hint_epochs):
        batches = [x[batch] for batch in _batches(len(x), 32, seed, 10_000 + epoch)]
        train_hint_stage(guided, regressor, hint, batches, optimizer)
    return train_classifier(student, x, y, epochs, lr, seed, teacher_logits=teacher_logits, loss_fn=loss_fn)


def configuration(full: bool) -> dict:
    """The quick form (a few seconds) or the full one (more seeds, budgets)."""
    if full:
        return {"seeds": tuple(range(10)), "budgets": (100, 200, 400, 1442), "teacher_epochs": 40}
    return {"seeds": (0, 1, 2), "budgets": (200,), "teacher_epochs": 25}


def run(seeds: Sequence[int] = (0, 1, 2), budget: int = 200, temperature: float = 4.0, alpha: float = 0.9,
        epochs: int = 60, hint_epochs: int = 30, lr: float = 0.05, deep_distill_lr: float = 0.02,
        teacher_epochs: int = 25,
        teacher_seed: int = 0, methods: Sequence[str] = METHODS, data=None, teacher=None) -> dict:
    """Train the teacher (unless given), then for every seed the students of
    ``methods`` on a class-balanced subset of ``budget`` training examples;
    returns sizes, per-seed test accuracies per method and their means."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}: choose from {', '.join(METHODS)}")
    data = load_digits(flatten=True) if data is None else data
    x_train, y_train, x_test, y_test = data
    teacher = train_teacher(data, teacher_seed, teacher_epochs) if teacher is None else teacher
    loss_fn = DistillationLoss(temperature=temperature, alpha=alpha)
    accuracies = {method: [] for method in methods}
    for seed in seeds:
        subset = balanced_subset(y_train, budget, seed)
        x, y = x_train[subset], y_train[subset]
        soft = logits_of(teacher, x)
        for method in methods:
            if method == "hard":
                model = train_classifier(mlp(STUDENT_SIZES, seed), x, y, epochs, lr, seed)
            elif method == "hinton":
                model = train_classifier(mlp(STUDENT_SIZES, seed), x, y, epochs, lr, seed,
                                         teacher_logits=soft, loss_fn=loss_fn)
            elif method == "fitnets_hard":
                model = train_classifier(mlp(FITNETS_SIZES, seed), x, y, epochs, lr, seed)
            else:
                model = fitnets_student(teacher, x, y, soft, seed, epochs,
                                        hint_epochs if method == "fitnets" else 0, deep_distill_lr, loss_fn)
            accuracies[method].append(evaluate(model, x_test, y_test))
    return {
        "budget": budget, "temperature": temperature, "alpha": alpha, "epochs": epochs, "seeds": list(seeds),
        "teacher_parameters": teacher.num_parameters(),
        "student_parameters": mlp(STUDENT_SIZES, 0).num_parameters(),
        "fitnets_parameters": mlp(FITNETS_SIZES, 0).num_parameters(),
        "teacher_accuracy": evaluate(teacher, x_test, y_test),
        "accuracies": accuracies,
        "mean": {method: float(np.mean(values)) for method, values in accuracies.items()},
    }


def format_table(results: dict) -> str:
    """Sizes, then one row per method: accuracy per seed and the mean."""
    seeds = results["seeds"]
    lines = [
        f"teacher {'-'.join(map(str, TEACHER_SIZES))}: {results['teacher_parameters']:,} parameters, "
        f"test accuracy {100 * results['teacher_accuracy']:.1f} % (whole training set)",
        f"student {'-'.join(map(str, STUDENT_SIZES))}: {results['student_parameters']:,} parameters "
        f"({results['teacher_parameters'] / results['student_parameters']:.0f}x smaller); FitNets student "
        f"{'-'.join(map(str, FITNETS_SIZES))}: {results['fitnets_parameters']:,} "
        f"({results['teacher_parameters'] / results['fitnets_parameters']:.0f}x smaller)",
        f"students see {results['budget']} labelled examples, {results['epochs']} epochs; "
        f"temperature {results['temperature']}, soft-target weight {results['alpha']}",
        f"{'method':>13} " + " ".join(f"{'seed ' + str(s):>7}" for s in seeds) + f" {'mean':>7}",
    ]
    for method, values in results["accuracies"].items():
        cells = " ".join(f"{100 * v:7.1f}" for v in values)
        lines.append(f"{method:>13} {cells} {100 * results['mean'][method]:7.2f}")
    return "\n".join(lines)


def plot(all_results: Sequence[dict], path) -> Path:
    """Mean test accuracy (with the per-seed points) against the labelled
    budget, one line per method, the teacher as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    budgets = [r["budget"] for r in all_results]
    markers = {"hard": "o", "hinton": "s", "fitnets_hard": "^", "deep_hinton": "v", "fitnets": "D"}
    for index, method in enumerate(all_results[0]["accuracies"]):
        means = [100 * r["mean"][method] for r in all_results]
        axis.plot(budgets, means, marker=markers.get(method, "o"), color=f"C{index}", label=method)
        for budget, r in zip(budgets, all_results):
            axis.scatter([budget] * len(r["accuracies"][method]), 100 * np.asarray(r["accuracies"][method]),
                         color=f"C{index}", alpha=0.25, s=12)
    axis.axhline(100 * all_results[0]["teacher_accuracy"], color="black", linestyle="--",
                 label=f"teacher ({all_results[0]['teacher_parameters']:,} parameters)")
    axis.set_xscale("log")
    axis.set_xticks(budgets)
    axis.set_xticklabels([str(b) for b in budgets])
    axis.minorticks_off()
    axis.set_xlabel("labelled training examples the student sees")
    axis.set_ylabel("test accuracy (%)")
    seeds = len(all_results[0]["seeds"])
    axis.set_title(f"distillation on the digits (mean of {seeds} seeds, dots: each seed)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small")
    return save_figure(figure, path)


def main(argv=None) -> int:
    parser = experiment_parser(
        "distillation",
        "A student 70x smaller than its teacher, trained on hard labels, by Hinton's "
        "distillation and by FitNets, on a limited budget of digits. Without --full, "
        "the quick form (seconds).",
        "10 seeds and four budgets (a few minutes)")
    args, output = parse_with_output(parser, argv, "distillation_output", "the PNG picture")
    if output is None:
        return 2
    config = configuration(args.full)
    data = load_digits(flatten=True)
    teacher = train_teacher(data, epochs=config["teacher_epochs"])
    all_results = []
    for budget in config["budgets"]:
        results = run(seeds=config["seeds"], budget=budget, data=data, teacher=teacher)
        all_results.append(results)
        print(format_table(results), end="\n\n")
    print("saved", plot(all_results, output / "distillation_accuracy.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
