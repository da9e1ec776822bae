"""Activation recomputation: the activation bytes it saves and the compute it costs.

    .venv/bin/python benchmarks/bench_recompute.py            # about 20 s
    .venv/bin/python benchmarks/bench_recompute.py --batch 256 --rounds 9

One process, one BLAS thread. The model is a deep MLP on the bundled 8x8
digits (64 -> 8 x (256, ReLU) -> 10), trained with SGD; the same weights
run plainly and through ``CheckpointedSequential(model, every=k)`` for a
few k. Each round times ``--steps`` training steps of every variant, the
order rotating from round to round, and the table gives the median over
rounds of the time per step, the ratio to the plain step, and the
activation bytes the graph holds at the end of the forward (the memory
ledger's "activations", measured from the arrays that exist) with their
ratio. Recomputation runs every segment's forward twice except the last, so
its extra compute is about the forward share of the recomputed segments.
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

import minidist  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.data import load_digits  # noqa: E402
from minidist.memory import Ledger  # noqa: E402
from minidist.nn.recompute import CheckpointedSequential  # noqa: E402
from minidist.runtime.blas_threads import set_blas_threads  # noqa: E402

DEPTH, WIDTH = 8, 256


def build(seed: int = 0) -> nn.Sequential:
    layers = [nn.Linear(64, WIDTH, rng=seed), nn.ReLU()]
    for index in range(DEPTH - 1):
        layers += [nn.Linear(WIDTH, WIDTH, rng=seed + 1 + index), nn.ReLU()]
    layers.append(nn.Linear(WIDTH, 10, rng=seed + DEPTH))
    return nn.Sequential(*layers)


def variants(every_values):
    base = build()
    out = {"plain": base}
    for every in every_values:
        out[f"every={every}"] = CheckpointedSequential(build(), every=every)
    return out


def activation_bytes(model, x, y) -> int:
    loss = nn.CrossEntropyLoss()(model(minidist.Tensor(x)), y)
    ledger = Ledger(model)
    return ledger.measure(graph=loss)["activations"]


def time_steps(model, optimizer, x, y, steps: int) -> float:
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for _ in range(steps):
        loss = loss_fn(model(minidist.Tensor(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--every", default="1,2,4", help="layers per recomputed segment")
    args = parser.parse_args(argv)
    set_blas_threads(1)
    x_train, y_train, _, _ = load_digits()
    x, y = x_train[:args.batch].astype(np.float32), y_train[:args.batch]
    models = variants([int(k) for k in args.every.split(",")])
    optimizers = {name: optim.SGD(model.parameters(), lr=0.01) for name, model in models.items()}
    held = {name: activation_bytes(model, x, y) for name, model in models.items()}
    for name, model in models.items():  # warm up
        time_steps(model, optimizers[name], x, y, 2)
    times = {name: [] for name in models}
    names = list(models)
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            times[name].append(time_steps(models[name], optimizers[name], x, y, args.steps))
    plain_time = statistics.median(times["plain"])
    print(f"MLP 64 -> {DEPTH} x {WIDTH} -> 10, batch {args.batch}, 1 thread, median of "
          f"{args.rounds} rounds of {args.steps} steps\n")
    print("| variant | step (ms) | vs plain | activation bytes held | vs plain |")
    print("|---|---|---|---|---|")
    for name in names:
        step = statistics.median(times[name])
        print(f"| {name} | {step * 1e3:.2f} | {step / plain_time:.2f}x | {held[name]:,} | "
              f"{held[name] / held['plain']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
