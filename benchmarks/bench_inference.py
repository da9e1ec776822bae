"""Faster inference: int8 against float32, and batch inference on N processes.

    .venv/bin/python benchmarks/bench_inference.py             # about a minute
    .venv/bin/python benchmarks/bench_inference.py --quick     # a smoke run

Four tables, all from this run:

1. **Accuracy and size.** The digits MLP and CNN (``minidist.train``'s
   defaults), test accuracy in float32 and after ``quantize`` (calibrated on
   512 training digits), and ``model_size_bytes`` of each.
2. **The product alone.** One (M, K) @ (K, N) matrix product in float32
   (BLAS), in int32 (what ``accumulate="int32"`` does: NumPy has no integer
   BLAS, so this is NumPy's plain loop) and as the same integers in float32
   (``accumulate="float32"``: BLAS, exact for K <= 1,040). One BLAS thread.
3. **Inference per batch.** A forward of a batch of 256 through the float32
   model and through its int8 copies (both accumulators). One BLAS thread.
4. **Batch inference on N processes.** ``parallel_predict`` of the digits
   CNN over the test digits repeated ``--copies`` times, N = 1, 2, 4,
   examples/s and the ratio to N = 1 (each worker has one BLAS thread; the
   time includes starting the processes). The single-process ``predict`` in
   this process (with its default BLAS threads) is shown for reference.

Timings are medians over ``--rounds`` rounds, the variants' order rotating
from round to round (interleaved), so a busy neighbour slows every column a
little rather than one column a lot. The machine's core count is printed:
N processes on fewer cores take turns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from minidist import Tensor, no_grad  # noqa: E402
from minidist.data import load_digits  # noqa: E402
from minidist.distributed.launch import cores  # noqa: E402
from minidist.nn.quantization import int8_matmul, model_size_bytes, quantize  # noqa: E402
from minidist.parallel.data.inference import parallel_predict, predict  # noqa: E402
from minidist.runtime.blas_threads import blas_threads, set_blas_threads  # noqa: E402
from minidist.train import evaluate, train_digits  # noqa: E402


def interleaved(variants: dict, rounds: int) -> dict:
    """Median seconds of each ``name: function``, the order rotating each round."""
    names = list(variants)
    times = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def accuracy_and_size(console, quick: bool):
    table = Table(title="accuracy on the 355 test digits, and bytes of the state dict")
    for column in ("model", "float32", "int8", "difference", "float32 bytes", "int8 bytes", "ratio"):
        table.add_column(column, justify="left" if column == "model" else "right")
    quiet = Console(file=open(os.devnull, "w"))
    models = {}
    for name in ("mlp", "cnn"):
        trained = train_digits(name, epochs=(3 if quick else None), progress=False, console=quiet)
        x_train, _, x_test, y_test = load_digits(flatten=(name == "mlp"))
        quantised = quantize(trained["model"], x_train[:512])
        float_accuracy, int8_accuracy = trained["test_accuracy"], evaluate(quantised, x_test, y_test)
        float_bytes, int8_bytes = model_size_bytes(trained["model"]), model_size_bytes(quantised)
        table.add_row(name, f"{100 * float_accuracy:.2f} %", f"{100 * int8_accuracy:.2f} %",
                      f"{100 * (int8_accuracy - float_accuracy):+.2f} pt", f"{float_bytes:,}",
                      f"{int8_bytes:,}", f"{float_bytes / int8_bytes:.2f}x")
        models[name] = (trained["model"], x_train[:512], x_test)
    console.print(table)
    return models


def products(console, rounds: int, quick: bool):
    table = Table(title="one matrix product (M, K) @ (K, N), one BLAS thread")
    for column in ("M, K, N", "float32 BLAS", "int32 (NumPy loop)", "int8 values in float32 BLAS",
                   "int32 / float32"):
        table.add_column(column, justify="right")
    shapes = [(256, 512, 64), (256, 1024, 1024)] if not quick else [(256, 512, 64)]
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        a = rng.integers(-127, 128, (m, k)).astype(np.int8)
        b = rng.integers(-127, 128, (k, n)).astype(np.int8)
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        times = interleaved({"float32": lambda a32=a32, b32=b32: a32 @ b32,
                             "int32": lambda a=a, b=b: int8_matmul(a, b, "int32"),
                             "int8 in float32": lambda a=a, b=b: int8_matmul(a, b, "float32")},
                            rounds)
        assert (int8_matmul(a, b, "float32") == int8_matmul(a, b, "int32")).all()
        table.add_row(f"{m}, {k}, {n}", *(f"{times[key] * 1e3:.3f} ms" for key in times),
                      f"{times['int32'] / times['float32']:.1f}x")
    console.print(table)


def per_batch(console, models, rounds: int):
    table = Table(title="one forward of a batch of 256, one BLAS thread")
    for column in ("model", "float32", "int8 (int32 accumulate)", "int8 (float32 accumulate)",
                   "int8 int32 / float32", "int8 float32 / float32"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, (model, calibration, x_test) in models.items():
        batch = Tensor(np.concatenate([x_test] * 2)[:256])
        variants = {"float32": model.eval(), "int32": quantize(model, calibration),
                    "float32 acc": quantize(model, calibration, accumulate="float32")}

        def forward(network, batch=batch):
            def run():
                with no_grad():
                    network(batch)
            return run
        times = interleaved({key: forward(network) for key, network in variants.items()}, rounds * 5)
        table.add_row(name, *(f"{times[key] * 1e3:.3f} ms" for key in times),
                      f"{times['int32'] / times['float32']:.2f}x",
                      f"{times['float32 acc'] / times['float32']:.2f}x")
    console.print(table)


def throughput(console, models, rounds: int, copies: int, world_sizes, batch_size: int):
    model, _, x_test = models["cnn"]
    x = np.concatenate([x_test] * copies)
    reference = predict(model, x, batch_size=batch_size)
    variants = {n: (lambda n=n: parallel_predict(model, x, world_size=n, batch_size=batch_size,
                                                 progress=False)) for n in world_sizes}
    variants["in-process"] = lambda: predict(model, x, batch_size=batch_size)
    for n in world_sizes:  # the check, and a warm-up
        assert (parallel_predict(model, x, world_size=n, batch_size=batch_size, progress=False)
                == reference).all()
    times = interleaved(variants, rounds)
    table = Table(title=f"parallel_predict: the digits CNN on {len(x):,} examples, batch "
                        f"{batch_size}, {os.cpu_count()} cores (os.cpu_count()), "
                        f"{cores()} usable")
    for column in ("processes", "examples/s", "ratio to N = 1"):
        table.add_column(column, justify="right")
    base = times[world_sizes[0]]
    for n in world_sizes:
        table.add_row(str(n), f"{len(x) / times[n]:,.0f}", f"{base / times[n]:.2f}")
    table.add_row("predict() in this process (1 BLAS thread, as each rank)",
                  f"{len(x) / times['in-process']:,.0f}", f"{base / times['in-process']:.2f}")
    console.print(table)
    console.print("Every N gave the single-process predictions bit for bit.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller input")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every table (default 7)")
    parser.add_argument("--copies", type=int, default=None,
                        help="the test digits repeated this many times (default 40)")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 7)
    copies = args.copies or (4 if args.quick else 40)
    console = Console(highlight=False)
    console.print(f"bench_inference: {os.cpu_count()} cores, NumPy {np.__version__}")
    models = accuracy_and_size(console, args.quick)
    default_threads = blas_threads()
    set_blas_threads(1)
    products(console, rounds, args.quick)
    per_batch(console, models, rounds)
    set_blas_threads(max(default_threads.values(), default=1))
    throughput(console, models, rounds, copies, [1, 2, 4], args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
