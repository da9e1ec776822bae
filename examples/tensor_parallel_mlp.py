"""Tensor parallel training of the digits MLP on 2 processes, and the bytes it moves.

    python examples/tensor_parallel_mlp.py
    python examples/tensor_parallel_mlp.py --world-size 4

1. Trains 64 -> 32 -> 10 on the bundled digits twice from the same seed: in
   one process, and with the hidden layer split over the ranks (a
   ColumnParallelLinear, ReLU, then a RowParallelLinear). Same data on every
   rank, each holding 1/n of each weight matrix; the accuracies agree.
2. Runs the dense layer of Tim Dettmers' "Model Parallelism in Deep Learning"
   (2014; 1000 -> 500, batch 128) once per strategy
   with tracing on and prints the bytes each rank sent, counted from the
   trace, next to :func:`split_bytes`' formula.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import load_digits
from minidist.parallel.model.costs import STRATEGIES, format_table, split_bytes
from minidist.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear

HIDDEN, EPOCHS, BATCH, LR = 32, 10, 64, 0.3
LAYER = (1000, 500, 128)  # in_features, out_features, batch: Dettmers' example


def unsplit_layers():
    nn.init.manual_seed(0)
    return nn.Linear(64, HIDDEN), nn.Linear(HIDDEN, 10)


def train(model):
    """Mini-batch SGD on the digits; the same batches on every rank."""
    x, y, x_test, y_test = load_digits()
    optimizer = optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    order = np.random.default_rng(0)
    for _ in range(EPOCHS):
        indices = order.permutation(len(x))
        for start in range(0, len(x), BATCH):
            rows = indices[start:start + BATCH]
            optimizer.zero_grad()
            loss_fn(model(Tensor(x[rows])), y[rows]).backward()
            optimizer.step()
    return float((model(Tensor(x_test)).data.argmax(axis=1) == y_test).mean())


def train_split():
    first, second = unsplit_layers()
    # Each rank keeps its shard of the very layers the single process trains.
    model = nn.Sequential(ColumnParallelLinear.from_linear(first), nn.ReLU(),
                          RowParallelLinear.from_linear(second))
    return train(model)


def run_seed_layer():
    """One forward and backward pass per strategy, each pass a trace region."""
    rank, world = dist.get_rank(), dist.get_world_size()
    in_features, out_features, batch = LAYER
    full = nn.Linear(in_features, out_features, bias=False, rng=0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(batch, in_features)).astype(np.float32)
    upstream = rng.normal(size=(batch, out_features)).astype(np.float32)

    def own(array):
        width = array.shape[-1] // world
        return np.ascontiguousarray(array[:, rank * width:(rank + 1) * width])

    layers = {"column": ColumnParallelLinear.from_linear(full, gather_output=True),
              "row": RowParallelLinear.from_linear(full, input_is_parallel=False),
              "column_split_output": ColumnParallelLinear.from_linear(full),
              "row_split_input": RowParallelLinear.from_linear(full)}
    for name in STRATEGIES:
        if name == "data_parallel":  # every rank: the whole layer, 1/n of the batch
            rows = np.array_split(np.arange(batch), world)[rank]
            layer, inputs, grad = full, x[rows], upstream[rows]
        else:
            layer = layers[name]
            inputs = own(x) if name == "row_split_input" else x
            grad = own(upstream) if name == "column_split_output" else upstream
        # The input needs a gradient, as it would with a layer below.
        inputs = Tensor(inputs, requires_grad=True)
        with trace.region(f"{name} forward"):
            y = layer(inputs)
        with trace.region(f"{name} backward"):
            (y * Tensor(grad)).sum().backward()
            if name == "data_parallel":
                dist.all_reduce(full.weight.grad, algorithm="ring")


def bytes_sent(events, world):
    """Row name -> bytes each rank's send events carried inside its two regions."""
    sent = {}
    for name in STRATEGIES:
        per_rank = []
        for rank in range(world):
            total = 0
            for region in (e for e in events if e["rank"] == rank and e["kind"] == "compute"
                           and e["label"] in (f"{name} forward", f"{name} backward")):
                total += sum(e["bytes"] for e in events
                             if e["rank"] == rank and e["kind"] == "send"
                             and region["start"] <= e["start"] and e["end"] <= region["end"])
            per_rank.append(total)
        sent[name] = per_rank
    return sent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks; must divide 32 (the hidden layer), 1000 and 500")
    parser.add_argument("--transport", default="shm", choices=["shm", "pipe"])
    args = parser.parse_args()
    world = args.world_size

    first, second = unsplit_layers()
    alone = train(nn.Sequential(first, nn.ReLU(), second))
    split = minidist.launch(train_split, world_size=world, transport=args.transport)
    print(f"digits MLP 64 -> {HIDDEN} -> 10, {EPOCHS} epochs: test accuracy "
          f"{alone:.4f} in one process, {split[0]:.4f} split over {world} ranks")

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "tensor_parallel.trace.jsonl")
        minidist.launch(run_seed_layer, world_size=world, transport=args.transport, trace=path)
        events = trace.read_jsonl(path).events
    table = split_bytes(*LAYER, world_size=world)
    print()
    print(format_table(table, bytes_sent(events, world)))


if __name__ == "__main__":
    main()
