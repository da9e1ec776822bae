"""Data parallel, model parallel and Krizhevsky's hybrid on the digits CNN, 2 processes.

The model is ``minidist.train.build_model("cnn")`` (conv 1->16, ReLU, conv
16->32, ReLU, max-pool 2, flatten 512, Linear 512->64, ReLU, Linear 64->10)
on the bundled 8x8 digits, global batch 64 (``--batch``), SGD lr 0.05.
Three ways to train it on 2 processes, one BLAS thread each:

  DP      DistributedDataParallel: each rank 32 examples, the whole model,
          one ring all_reduce of every gradient (+ an 8-byte example count)
  MP      DenseModelParallel: each rank the whole batch, the convolutions
          *replicated* (each rank runs them on all 64 examples, no message),
          the dense layers split (ColumnParallelLinear, RowParallelLinear)
  hybrid  HybridParallel: convolutions data parallel (32 examples each,
          gradients all_reduced), features all_gathered, dense layers split,
          feature gradients reduce_scattered back

In ONE launch: first one traced step of each (the bytes each rank sends, from
the trace, next to ``strategy_bytes``'s formula), then ``--windows`` rounds;
in each round every strategy runs ``--steps`` steps (after a barrier; the
order rotates from round to round), and the table gives the median over
rounds of the slowest rank's time per step. "(+N int64)" in the
bytes column: the int64 messages the formula leaves out (DP's 8-byte example
count, the hybrid's all_gather of the labels). A last line says which wins and
why, from the ratio of weights to activations per layer; a formula-only table
shows how the bytes move with the batch size.

Usage:  python benchmarks/bench_model_parallel.py [--batch 64 --steps 10 --windows 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

import numpy as np  # noqa: E402

STRATEGIES = ("data_parallel", "model_parallel", "hybrid")
SHORT = {"data_parallel": "DP", "model_parallel": "MP", "hybrid": "hybrid"}
LR = 0.05
INPUT_SHAPE = (1, 8, 8)


def worker(batch_sizes, steps: int, windows: int):
    return {batch: one_batch(batch, steps, windows) for batch in batch_sizes}


def one_batch(batch: int, steps: int, windows: int):
    import minidist.distributed as dist
    from minidist import Tensor, nn, optim, trace
    from minidist.data import load_digits
    from minidist.parallel.data.ddp import DistributedDataParallel
    from minidist.parallel.model.hybrid import DenseModelParallel, HybridParallel, all_gather_batch
    from minidist.runtime.blas_threads import set_blas_threads
    from minidist.train import build_model

    set_blas_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load_digits(flatten=False)[:2]
    share = batch // world
    batches = [(np.ascontiguousarray(x[i * batch:(i + 1) * batch], np.float32),
                y[i * batch:(i + 1) * batch]) for i in range(8)]
    loss_fn = nn.CrossEntropyLoss()

    def own(array):
        return array[rank * share:(rank + 1) * share]

    ddp = DistributedDataParallel(build_model("cnn"), algorithm="ring")
    split = DenseModelParallel(build_model("cnn"))
    hybrid = HybridParallel(build_model("cnn"))
    forwards = {
        "data_parallel": (ddp, lambda xb, yb: (ddp(Tensor(own(xb))), own(yb))),
        "model_parallel": (split, lambda xb, yb: (split(Tensor(xb)), yb)),
        "hybrid": (hybrid, lambda xb, yb: (hybrid(Tensor(own(xb))), all_gather_batch(own(yb)))),
    }
    steppers = {}
    for name, (model, forward) in forwards.items():
        optimizer = optim.SGD(model.parameters(), lr=LR)

        def step(index, model=model, forward=forward, optimizer=optimizer):
            xb, yb = batches[index % len(batches)]
            optimizer.zero_grad(set_to_none=False)
            logits, labels = forward(xb, yb)
            loss_fn(logits, labels).backward()
            optimizer.step()

        steppers[name] = step
    for name in STRATEGIES:  # one traced step each: the bytes
        with trace.region(f"bytes {name} b={batch}"):
            steppers[name](0)
    for name in STRATEGIES:  # warm-up
        for index in range(2):
            steppers[name](index)
    times = {name: [] for name in STRATEGIES}
    for window in range(windows):
        order = STRATEGIES[window % 3:] + STRATEGIES[:window % 3]
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            for index in range(steps):
                steppers[name](index)
            times[name].append((time.perf_counter() - start) / steps)
    return times


def sent_in_region(events, rank, label, skip_int64=True):
    from minidist import trace

    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    inside = [e for e in events if e["rank"] == rank and start <= e["start"] and e["end"] <= end]
    counts = {trace.label_info(e["label"]).get("call") for e in inside
              if e["kind"] == "collective" and trace.label_info(e["label"]).get("itemsize") == 8}
    total = sum(e["bytes"] for e in inside if e["kind"] == "send")
    counted = sum(e["bytes"] for e in inside if e["kind"] == "send"
                  and not (skip_int64 and trace.label_info(e["label"]).get("call") in counts))
    return total, counted


def report(batch, results, events, windows, world) -> None:
    """The tables of one batch size."""
    from minidist.parallel.model.hybrid import strategy_bytes
    from minidist.train import build_model

    table = strategy_bytes(build_model("cnn"), INPUT_SHAPE, batch, world)
    step_time = {name: statistics.median(max(r[name][w] for r in results)
                                         for w in range(windows))
                 for name in STRATEGIES}
    spread = {name: (min(max(r[name][w] for r in results) for w in range(windows)),
                     max(max(r[name][w] for r in results) for w in range(windows)))
              for name in STRATEGIES}
    traced = {name: sent_in_region(events, 0, f"bytes {name} b={batch}") for name in STRATEGIES}

    print(f"\n=== global batch {batch} ({batch // world} examples per rank in DP and the hybrid)")
    print(table)
    print()
    best = min(STRATEGIES, key=lambda n: step_time[n])
    header = ("strategy", "step time", "range", "vs DP", "bytes/step (trace)",
              "bytes/step (formula)", "bytes vs DP")
    rows = []
    for name in STRATEGIES:
        total, counted = traced[name]
        extra = f" (+{total - counted} int64)" if total != counted else ""
        rows.append((SHORT[name], f"{step_time[name] * 1e3:.2f} ms",
                     f"{spread[name][0] * 1e3:.2f}-{spread[name][1] * 1e3:.2f}",
                     f"{step_time[name] / step_time['data_parallel']:.2f}x",
                     f"{counted:,}{extra}", f"{table.bytes(name):,}",
                     f"{table.bytes(name) / table.bytes('data_parallel'):.2f}x"))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    conv = [layer for layer in table.layers if layer.kind == "conv"]
    dense = [layer for layer in table.layers if layer.kind == "dense"]
    fewest = min(STRATEGIES, key=lambda n: table.bytes(n))
    big = max(dense, key=lambda layer: layer.weights)
    verdict = ("its weights outnumber its activations: sending activations (MP) is cheaper "
               "than sending its gradient (DP)" if big.weights > big.activations else
               "its activations outnumber its weights: sending its gradient (DP) is cheaper "
               "than sending activations (MP)")
    print(f"\nwins: {SHORT[best]} on time, {SHORT[fewest]} on bytes. Weights / activations per "
          "layer: convolutions " + ", ".join(f"{layer.weights / layer.activations:.2f}"
                                            for layer in conv)
          + " (few weights, many activations: data parallel is the cheap way for them); dense "
          + ", ".join(f"{layer.weights / layer.activations:.2f}" for layer in dense)
          + f". The big dense layer ({big.name}) has {big.weights:,} weights and "
          f"{big.activations:,} activations at batch {batch}: {verdict}; the hybrid takes the "
          "cheap way for each layer. Time follows bytes only where bytes cost: here a step "
          f"sends at most {max(table.bytes(n) for n in STRATEGIES) / 1e3:.0f} KB through shared "
          "memory (well under a millisecond), so the step time is compute and the number of "
          "collectives: pure MP runs the convolutions on the whole batch on every rank (twice "
          "the convolution work in all), and the hybrid runs 5 collectives a step (convolution "
          "gradients, features, partial outputs, feature gradients, labels) to DP's 2.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="16,64",
                        help="global batch sizes, comma-separated (default 16,64)")
    parser.add_argument("--steps", type=int, default=20, help="steps per window (default 20)")
    parser.add_argument("--windows", type=int, default=9, help="rounds (default 9)")
    args = parser.parse_args()

    import minidist
    from minidist import trace
    from minidist.parallel.model.hybrid import strategy_bytes
    from minidist.train import build_model

    world = 2
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model_parallel.jsonl")
        started = time.perf_counter()
        batch_sizes = [int(b) for b in args.batches.split(",")]
        results = minidist.launch(worker, args=(batch_sizes, args.steps, args.windows),
                                  world_size=world, transport="shm", trace=path, timeout=300)
        elapsed = time.perf_counter() - started
        events = trace.read_jsonl(path).events

    print(f"digits CNN (minidist.train 'cnn'), {world} processes (shm, 1 BLAS thread each); "
          f"median of {args.windows} windows of {args.steps} steps (slowest rank), strategies "
          f"interleaved; launch took {elapsed:.1f} s")
    for batch in batch_sizes:
        report(batch, [r[batch] for r in results], events, args.windows, world)
    print("\nbytes per rank per step by formula (strategy_bytes) as the batch grows, 2 ranks:")
    print("  batch        DP        MP    hybrid")
    for size in (8, 16, 32, 64, 128, 256):
        other = strategy_bytes(build_model("cnn"), INPUT_SHAPE, size, world)
        print(f"  {size:5d}  " + "  ".join(f"{other.bytes(n):8,}" for n in STRATEGIES))


if __name__ == "__main__":
    main()
