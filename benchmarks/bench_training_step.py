"""Time one training step (forward, loss, backward, SGD-with-momentum update)
in minidist, in a hand-written NumPy version of the same step, and in PyTorch
(CPU) when it is installed: all in one run, with the same thread count.

Models (float32):
  mlp  784-512-512-10, ReLU, batch 128
  cnn  Conv(1->16, 3x3, pad 1) ReLU MaxPool2 Conv(16->32, 3x3, pad 1) ReLU
       MaxPool2 Flatten Linear(32*7*7 -> 10), batch 64, 28x28 inputs
  digits  the course's digits CNN, ``minidist.train.build_model("cnn")``:
       Conv(1->16) ReLU Conv(16->32) ReLU MaxPool2 Flatten Linear(512 -> 64)
       ReLU Linear(64 -> 10), batch 64, 8x8 inputs

The table names the BLAS kernels NumPy runs (OpenBLAS picks its kernel set,
"SkylakeX", "Haswell", ..., by the CPU, or ``OPENBLAS_CORETYPE`` picks it):
the convolution sizes its GEMMs by that family
(:mod:`minidist.nn.conv_gemm_sizing`), so a CNN's ratio holds for one
family. To time the Haswell kernels on an AVX-512 machine:
``OPENBLAS_CORETYPE=Haswell python benchmarks/bench_training_step.py``.

Usage:
  python benchmarks/bench_training_step.py [--threads 1] [--repeats 30] [--json out.json]
                                           [--clock wall|cpu] [--default-malloc]
                                           [--models mlp,cnn,digits]

The frameworks take turns: each round times ``--steps`` steps of each (10),
in the same process, so a change in the machine's load reaches them alike
(the first step of a turn runs with the caches the other left: with 3 steps
a turn the minidist CNN step measured about 1 ms slower than alone). The
figure reported per framework is the median over ``repeats`` rounds of the
time per step, after warm-up steps; the ratio column is minidist / PyTorch
(lower is better). ``--clock cpu`` measures the process's CPU time instead
of wall time: on a shared machine it leaves out the time spent waiting for a
core, but it is only the step time with ``--threads 1``.

Like ``minidist train``, the run first calls
:func:`minidist.runtime.allocator.keep_freed_memory` (glibc keeps freed
pages for the next step; it applies to the whole process, PyTorch included);
``--default-malloc`` leaves glibc's defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _limit_threads(threads: int):
    # Must happen before NumPy or PyTorch load their thread pools.
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)


def interleaved_medians(steps: dict, repeats: int, steps_per_round: int = 3, warmup: int = 5, clock=time.perf_counter) -> dict:
    """Median seconds per step of each of ``steps`` (name -> callable), timed
    in turns: round r runs ``steps_per_round`` steps of every one in order."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = clock()
            for _ in range(steps_per_round):
                step()
            times[name].append((clock() - start) / steps_per_round)
    return {name: sorted(values)[len(values) // 2] for name, values in times.items()}


def sgd_step(model, sgd, loss_fn, x, y):
    """One training step, SGD (lr 0.01, momentum 0.9) on ``loss_fn``: the same
    code for minidist and torch, whose names and meanings agree."""
    optimizer = sgd(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


# ----------------------------------------------------------------- minidist
def minidist_mlp_step(batch, rng):
    import numpy as np

    import minidist
    from minidist import nn, optim

    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    return sgd_step(model, optim.SGD, nn.CrossEntropyLoss(), minidist.Tensor(x), y)


def minidist_cnn_step(batch, rng):
    import numpy as np

    import minidist
    from minidist import nn, optim

    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )
    x = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    return sgd_step(model, optim.SGD, nn.CrossEntropyLoss(), minidist.Tensor(x), y)


def minidist_digits_step(batch, rng):
    import numpy as np

    import minidist
    from minidist import nn, optim
    from minidist.train import build_model

    model = build_model("cnn")
    x = rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    return sgd_step(model, optim.SGD, nn.CrossEntropyLoss(), minidist.Tensor(x), y)


# ------------------------------------------------------------ plain NumPy
def numpy_mlp_step(batch, rng):
    """The same step written out by hand: the floor minidist's autograd adds to."""
    import numpy as np

    sizes = [784, 512, 512, 10]
    weights = [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32) for a, b in zip(sizes, sizes[1:])]
    biases = [np.zeros(b, np.float32) for b in sizes[1:]]
    velocity = [np.zeros_like(p) for p in weights + biases]
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    lr, momentum = np.float32(0.01), np.float32(0.9)

    def step():
        activations = [x]
        h = x
        for i, (w, b) in enumerate(zip(weights, biases)):
            h = h @ w + b
            if i < len(weights) - 1:
                h = np.maximum(h, 0)
            activations.append(h)
        logits = activations[-1]
        shifted = logits - logits.max(1, keepdims=True)
        probs = np.exp(shifted)
        probs /= probs.sum(1, keepdims=True)
        grad = probs
        grad[np.arange(batch), y] -= 1
        grad /= batch
        grads_w, grads_b = [], []
        for i in reversed(range(len(weights))):
            grads_w.append(activations[i].T @ grad)
            grads_b.append(grad.sum(0))
            if i > 0:
                grad = (grad @ weights[i].T) * (activations[i] > 0)
        grads = list(reversed(grads_w)) + list(reversed(grads_b))
        for p, g, v in zip(weights + biases, grads, velocity):
            v *= momentum
            v += g
            p -= lr * v

    return step


# ------------------------------------------------------------------ PyTorch
def torch_mlp_step(batch, rng):
    import torch

    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    x = torch.from_numpy(rng.standard_normal((batch, 784)).astype("float32"))
    y = torch.from_numpy(rng.integers(0, 10, batch))
    return sgd_step(model, torch.optim.SGD, torch.nn.CrossEntropyLoss(), x, y)


def torch_cnn_step(batch, rng):
    import torch

    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )
    x = torch.from_numpy(rng.standard_normal((batch, 1, 28, 28)).astype("float32"))
    y = torch.from_numpy(rng.integers(0, 10, batch))
    return sgd_step(model, torch.optim.SGD, torch.nn.CrossEntropyLoss(), x, y)


def torch_digits_step(batch, rng):
    import torch

    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )
    x = torch.from_numpy(rng.standard_normal((batch, 1, 8, 8)).astype("float32"))
    y = torch.from_numpy(rng.integers(0, 10, batch))
    return sgd_step(model, torch.optim.SGD, torch.nn.CrossEntropyLoss(), x, y)


def blas_kernels() -> str:
    """The kernel set NumPy's OpenBLAS runs ("SkylakeX", "Haswell", ...), or
    what NumPy's BLAS is when it cannot say."""
    from minidist.runtime.blas_threads import openblas_cores

    cores = openblas_cores()
    return "OpenBLAS " + "/".join(cores) if cores else "not OpenBLAS, or kernels unknown"


CASES = {
    "mlp": ("mlp 784-512-512-10, batch 128", 128, minidist_mlp_step, numpy_mlp_step, torch_mlp_step),
    "cnn": ("cnn 2 conv + linear, batch 64, 28x28", 64, minidist_cnn_step, None, torch_cnn_step),
    "digits": ("digits cnn (build_model), batch 64, 8x8", 64, minidist_digits_step, None, torch_digits_step),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads for every framework")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--steps", type=int, default=10,
                        help="steps of one framework per turn (its first step after the other's turn finds cold caches)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or the process's CPU time (for a shared machine, with --threads 1)")
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc's malloc thresholds as they are (minidist train raises them)")
    parser.add_argument("--models", default="mlp,cnn,digits",
                        help=f"comma-separated, of {', '.join(CASES)}")
    args = parser.parse_args(argv)
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in models if name not in CASES]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(CASES)}")
    _limit_threads(args.threads)
    kept = False
    if not args.default_malloc:
        from minidist.runtime.allocator import keep_freed_memory

        kept = keep_freed_memory()
    clock = time.perf_counter if args.clock == "wall" else time.process_time

    import numpy as np

    try:
        import torch

        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
        torch_version = torch.__version__
    except ImportError:
        torch = None
        torch_version = None

    from rich.console import Console
    from rich.table import Table

    rng = np.random.default_rng(0)
    kernels = blas_kernels()
    results = []
    for name, batch, ours, by_hand, theirs in (CASES[model] for model in models):
        row = {"model": name, "threads": args.threads, "clock": args.clock, "malloc_kept": kept,
               "steps_per_turn": args.steps, "blas_kernels": kernels}
        steps = {"minidist": ours(batch, rng)}
        if by_hand:
            steps["numpy"] = by_hand(batch, rng)
        if torch:
            steps["torch"] = theirs(batch, rng)
        medians = interleaved_medians(steps, args.repeats, steps_per_round=args.steps, clock=clock)
        for key in ("minidist", "numpy", "torch"):
            row[f"{key}_ms"] = 1e3 * medians[key] if key in medians else None
        results.append(row)

    table = Table(title=f"one training step, float32, {args.threads} thread(s), {args.clock} time, "
                        f"median of {args.repeats} interleaved rounds, malloc {'kept' if kept else 'default'}, "
                        f"NumPy's BLAS: {kernels}")
    columns = ("model", "minidist ms", "NumPy by hand ms", f"PyTorch {torch_version or '(absent)'} ms",
               f"minidist / PyTorch ({kernels})", "minidist / NumPy")
    for column in columns:
        table.add_column(column, justify="right" if column != "model" else "left")
    for row in results:
        def fmt(value):
            return "-" if value is None else f"{value:.2f}"

        vs_torch = row["minidist_ms"] / row["torch_ms"] if row["torch_ms"] else None
        vs_numpy = row["minidist_ms"] / row["numpy_ms"] if row["numpy_ms"] else None
        table.add_row(
            row["model"], fmt(row["minidist_ms"]), fmt(row["numpy_ms"]), fmt(row["torch_ms"]),
            "-" if vs_torch is None else f"{vs_torch:.2f}x", "-" if vs_numpy is None else f"{vs_numpy:.2f}x",
        )
        row["ratio_vs_torch"] = vs_torch
        row["ratio_vs_numpy"] = vs_numpy
    Console(width=max(Console().width, 120)).print(table)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"python": sys.version.split()[0], "numpy": np.__version__, "torch": torch_version,
                       "blas_kernels": kernels, "results": results}, handle, indent=2)


if __name__ == "__main__":
    main()
