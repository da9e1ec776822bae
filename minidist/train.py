"""Single-process training on the bundled digits: what ``minidist train`` runs.

This is the reference every parallel strategy is later compared with: the
same model and data, one process, one optimizer step per mini-batch.
"""

from __future__ import annotations

import time

from minidist import Tensor, backend, nn, no_grad, optim
from minidist.data import DataLoader, load_digits
from minidist.runtime.allocator import keep_freed_memory
from minidist.runtime.blas_threads import blas_threads, set_blas_threads

# Defaults that reach the accuracy the README promises (>= 95 % MLP, >= 97 % CNN).
DEFAULTS = {
    "mlp": {"epochs": 30, "lr": 0.1},
    "cnn": {"epochs": 15, "lr": 0.05},
}


def build_model(name: str, seed: int = 0) -> nn.Module:
    """The course's models, initialised deterministically from ``seed``.

    * ``mlp``: 64 -> 128 -> ReLU -> 10
    * ``cnn``: 1x8x8 -> conv 16 -> ReLU -> conv 32 -> ReLU -> max-pool 2 ->
      flatten -> 64 -> ReLU -> 10
    * ``gpt``: the character-level GPT of ``minidist train --model gpt`` in
      its default configuration (:mod:`minidist.train_gpt`), for the bundled
      Shakespeare's 62 characters
    """
    if name == "gpt":
        from minidist.train_gpt import build_gpt

        return build_gpt(seed=seed)
    nn.init.manual_seed(seed)
    if name == "mlp":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 64),
            nn.ReLU(),
            nn.Linear(64, 10),
        )
    raise ValueError(f"unknown model {name!r}: choose 'mlp', 'cnn' or 'gpt'")


def evaluate(model: nn.Module, x, y, batch_size: int = 512) -> float:
    """Accuracy of ``model`` on (x, y), in eval mode and without a graph."""
    was_training = model.training
    model.eval()
    correct = 0
    with no_grad():
        for start in range(0, len(x), batch_size):
            logits = model(Tensor(x[start : start + batch_size]))
            predicted = backend.to_numpy(logits.data).argmax(axis=1)
            correct += int((predicted == y[start : start + batch_size]).sum())
    model.train(was_training)
    return correct / max(len(x), 1)


def _metrics(loss: float | None = None, accuracy: float = 0.0, rate: float = 0.0) -> str:
    """The progress line's numbers: "loss 0.1234  train acc 0.953  8,123
    samples/s" (the accuracy on the batches trained so far, not the test
    set's), or "loss -  train acc -" before the first batch has a loss."""
    if loss is None:
        return "loss -  train acc -"
    return f"loss {loss:.4f}  train acc {accuracy:.3f}  {rate:,.0f} samples/s"


def train_digits(
    model: str = "mlp",
    epochs: int | None = None,
    batch_size: int = 64,
    lr: float | None = None,
    seed: int = 0,
    progress: bool = True,
    console=None,
    threads: int | None = 1,
) -> dict:
    """Train ``model`` ("mlp" or "cnn") on the bundled digits and report test accuracy.

    Returns a dict with the final ``test_accuracy``, ``train_accuracy`` and the
    per-epoch ``history`` (loss, accuracy, samples/s).

    ``threads``: BLAS threads while training, restored afterwards (None
    leaves them alone). One by default: the digits' matrices are too small
    to gain from a second thread, and on a busy machine a BLAS thread
    waiting for a core stalls every product: on a loaded machine the CNN
    demo took many times longer with OpenBLAS's default two threads than
    with one, and two were no faster than one on an idle machine
    (benchmarks/README.md, "One training step").
    """
    if model not in DEFAULTS:
        raise ValueError(f"unknown model {model!r}: choose 'mlp' or 'cnn'")
    epochs = DEFAULTS[model]["epochs"] if epochs is None else epochs
    lr = DEFAULTS[model]["lr"] if lr is None else lr
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1 and lr > 0; got {epochs}, {batch_size}, {lr}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int (BLAS threads), or None to leave them alone; got {threads!r}")

    # Every step frees and reallocates the same arrays: keep the pages
    # (see minidist.runtime.allocator; no-op outside glibc).
    keep_freed_memory()
    previous_threads = blas_threads() if threads is not None else {}
    if threads is not None:
        set_blas_threads(threads)
    try:
        return _train(model, epochs, batch_size, lr, seed, progress, console)
    finally:
        if previous_threads:
            set_blas_threads(max(previous_threads.values()))


def _train(model, epochs, batch_size, lr, seed, progress, console) -> dict:
    x_train, y_train, x_test, y_test = load_digits(flatten=(model == "mlp"))
    network = build_model(model, seed)
    optimizer = optim.SGD(network.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader((x_train, y_train), batch_size=batch_size, shuffle=True, seed=seed)

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
    )

    console = console or Console()
    console.print(
        f"[bold]minidist train[/bold]: {model} on the 8x8 digits "
        f"({len(x_train)} train / {len(x_test)} test), {network.num_parameters():,} parameters, "
        f"batch {batch_size}, lr {lr}, {epochs} epoch{'s' if epochs != 1 else ''}, "
        f"backend {backend.name()}"
    )
    history = []
    # A short bar and no time column: the line fits 80 columns whole (epoch,
    # batches done of all, loss, train accuracy, speed), where Rich would
    # otherwise cut the batch count to make room.
    columns = (
        TextColumn("epoch {task.fields[epoch]:>3}"),
        BarColumn(bar_width=10),
        MofNCompleteColumn(),
        TextColumn("{task.fields[metrics]}"),
    )
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        # Until the first batch is done there is no loss to show: "-", not nan.
        task = bar.add_task("train", total=epochs * len(loader), epoch=0, metrics=_metrics())
        for epoch in range(epochs):
            start = time.perf_counter()
            loss_sum = correct = seen = 0
            for xb, yb in loader:
                logits = network(Tensor(xb))
                loss = loss_fn(logits, yb)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                loss_sum += loss.item() * len(yb)
                correct += int((backend.to_numpy(logits.data).argmax(axis=1) == yb).sum())
                seen += len(yb)
                rate = seen / max(time.perf_counter() - start, 1e-9)
                bar.update(task, advance=1, epoch=epoch + 1,
                           metrics=_metrics(loss_sum / seen, correct / seen, rate))
            scheduler.step()
            history.append({"epoch": epoch + 1, "loss": loss_sum / seen, "train_accuracy": correct / seen, "samples_per_s": rate})

    test_accuracy = evaluate(network, x_test, y_test)
    console.print(f"test accuracy: [bold]{100 * test_accuracy:.2f} %[/bold] on {len(x_test)} held-out digits")
    return {
        "model": network,
        "test_accuracy": test_accuracy,
        "train_accuracy": history[-1]["train_accuracy"],
        "history": history,
    }


__all__ = ["build_model", "evaluate", "train_digits", "DEFAULTS"]
