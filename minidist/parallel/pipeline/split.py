"""Cutting a pipeline's work: the model into stages, a batch into micro-batches.

1. **Cost** each layer (:func:`layer_costs`): its number of parameters, or
   its measured forward + backward time on a sample batch.
2. **Cut** the layers into p contiguous stages whose most expensive one
   costs as little as possible (:func:`balanced_partition`, dynamic
   programming), since the slowest stage sets the pipeline's pace;
   :func:`split_model` does both.
3. **Cut** a batch along its first axis into m micro-batches whose sizes
   differ by at most one (:func:`split_microbatches`).

Cost: the partition is O(p n^2) additions for n layers; costing by time runs
every layer's forward and backward ``repeats`` times on the sample, once.
The pieces share the original model's layers: no weight is copied.
"""

from __future__ import annotations

import time

import numpy as np

from minidist import nn
from minidist.tensor import Tensor

__all__ = ["balanced_partition", "layer_costs", "split_model", "split_microbatches"]

def balanced_partition(costs, parts: int) -> list[range]:
    """Cut ``costs`` (one per layer, in order) into ``parts`` contiguous,
    non-empty runs whose largest sum is as small as possible.

    The smallest possible largest sum is found by dynamic programming; the
    cut then fills each part greedily up to it, so layers that cost nothing
    (activations) stay with the layer before them."""
    costs = [float(c) for c in costs]
    layers = len(costs)
    if parts < 1:
        raise ValueError(f"balanced_partition: parts must be >= 1, got {parts}")
    if layers < parts:
        raise ValueError(f"cannot cut {layers} layers into {parts} stages: every stage needs "
                         "at least one layer; use fewer stages or a model with more layers")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    # best[k][i]: the smallest largest part over cuts of the first i layers into k parts
    best = np.full((parts + 1, layers + 1), np.inf)
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, layers + 1):
            best[k][i] = min(max(best[k - 1][j], prefix[i] - prefix[j]) for j in range(k - 1, i))
    bound = best[parts][layers]
    cuts, start = [], 0
    for part in range(parts):
        parts_after = parts - part - 1
        end = start + 1
        while (end < layers - parts_after
               and prefix[end + 1] - prefix[start] <= bound * (1 + 1e-12)):
            end += 1
        if part == parts - 1:
            end = layers
        cuts.append(range(start, end))
        start = end
    return cuts


def layer_costs(sequential: nn.Sequential, by: str = "parameters", sample=None,
                repeats: int = 3) -> list[float]:
    """The cost of each layer: its number of parameters (``by="parameters"``),
    or its measured forward + backward time in seconds on ``sample``
    (``by="time"``; the best of ``repeats`` runs, each layer fed the previous
    layer's output)."""
    layers = list(sequential)
    if by == "parameters":
        return [float(sum(p.data.size for p in layer.parameters())) for layer in layers]
    if by != "time":
        raise ValueError(f"split by {by!r}: choose 'parameters' or 'time'")
    if sample is None:
        raise ValueError("splitting by time runs the model: pass sample=, a batch of inputs")
    costs = []
    current = np.asarray(sample.data if isinstance(sample, Tensor) else sample)
    for layer in layers:
        fastest = np.inf
        for _ in range(repeats):
            inputs = Tensor(current, requires_grad=True)
            started = time.perf_counter()
            output = layer(inputs)
            output.backward(np.ones_like(output.data))
            fastest = min(fastest, time.perf_counter() - started)
        for param in layer.parameters():
            param.grad = None
        costs.append(fastest)
        current = output.data
    return costs


def split_model(sequential: nn.Sequential, stages: int, by: str = "parameters",
                sample=None) -> list[nn.Sequential]:
    """Cut ``sequential`` into ``stages`` consecutive Sequentials of balanced
    cost (:func:`layer_costs`, :func:`balanced_partition`). The pieces share
    the original's layer objects, so they hold its weights."""
    if not isinstance(sequential, nn.Sequential):
        raise TypeError(f"split_model cuts an nn.Sequential, got {type(sequential).__name__}; "
                        "wrap the layers in nn.Sequential(...) or pass a list of stages")
    costs = layer_costs(sequential, by, sample)
    return [sequential[cut.start:cut.stop] for cut in balanced_partition(costs, stages)]


def split_microbatches(batch, microbatches: int) -> list[np.ndarray]:
    """``batch`` cut along its first axis into ``microbatches`` consecutive
    pieces whose sizes differ by at most one (the first ones larger)."""
    array = np.asarray(batch.data if isinstance(batch, Tensor) else batch)
    if len(array) < microbatches:
        raise ValueError(f"a batch of {len(array)} examples cannot be cut into {microbatches} "
                         f"micro-batches; use microbatches <= {len(array)}")
    return np.array_split(array, microbatches)

