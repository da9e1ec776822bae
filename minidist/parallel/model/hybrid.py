"""Krizhevsky's hybrid: convolutions data parallel, dense layers model parallel
(lesson 10; "One weird trick for parallelizing convolutional neural
networks", 2014, which Dettmers' "Model Parallelism in Deep Learning"
closes with).

Why: per layer, compare what data parallelism must send (the layer's
*weights'* gradient) with what model parallelism must send (the layer's
*activations*, B x features). A convolution has few weights and large
activations (a 3x3 conv 16 -> 32 on 8x8 images: 4,640 weights, 2,048
activations per example), so sending its gradient is cheap: data parallel.
A dense layer has many weights and small activations (512 -> 64: 32,832
weights, 512 activations per example), so sending activations is cheap when
the batch is small: model parallel. Krizhevsky's rule: data parallel where
weights < activations, model parallel where weights > activations.

One step of :class:`HybridParallel` on n ranks, batch B, each rank holding
b = B/n examples, step by step:

1. **convolutions, data parallel**: every rank runs the (replicated)
   convolutional part on its own b examples: features f_r, b x d;
2. **all_gather the features** (:func:`gather_batch`): every rank stacks the
   n ranks' features in rank order: the whole batch's B x d on every rank;
3. **dense layers, model parallel**: the first dense layer split by columns
   (this rank's out/n output units, :class:`ColumnParallelLinear`'s
   weights), the activation, the second by rows
   (:class:`RowParallelLinear`, one all_reduce of the B x out partial
   outputs); further layers alternate. Every rank ends with the whole
   batch's logits and computes the same loss on the whole batch;
4. backward through the dense layers (as in tensor parallelism: their
   weight gradients are complete on their owners, nothing to all_reduce);
   the column layer leaves each rank a *partial* gradient of the whole
   batch's features, B x d (the part that flowed through its units);
5. **the features' gradients back to their owners** (the backward of step
   2): a reduce_scatter along the batch sums the n partial gradients and
   leaves each rank the b x d rows of its own examples;
6. backward through the convolutions on each rank's own examples;
7. **all_reduce (SUM) the convolutions' weight gradients** (one ring
   all_reduce of all of them, started when the last one is ready). SUM,
   not average: the loss is already the mean over the whole batch.

Every rank then runs the same optimizer step; the replicated convolutions
stay equal, and each rank updates its own dense shards.

(Step 5 is why the first column layer is applied here without
:func:`copy_to_parallel_region`, which :class:`ColumnParallelLinear`'s
``forward`` would add: its backward all_reduce of the B x d partial
gradients, followed by each rank keeping its rows, moves twice what the
reduce_scatter moves for the same result.)

:class:`DenseModelParallel` is pure model parallel on the same model, for
comparison: every rank runs the *replicated* convolutions on the *whole*
batch (no message, but n times the convolution work in all), and the dense
layers are split as above with the Megatron layers as they are (the first
column layer's backward all_reduces the B x d feature gradient, so every
replica of the convolutions gets the whole gradient).

Bytes per rank per step, ring collectives (AR(N): ring all_reduce,
2 (n-1)/n N; AG: ring all_gather of pieces P, (n-1) P; RS(N): ring
reduce_scatter, (n-1)/n N), for a conv part with C weights and dense
layers d_0 -> d_1 -> d_2 (the pair), batch B:

* data parallel (:class:`DistributedDataParallel`): AR(C + dense weights)
  (plus an 8-byte example count, not counted here);
* model parallel: AR(B d_0) backward (features' gradient) + AR(B d_2)
  forward (the row layer's output);
* hybrid: AR(C) + AG(B d_0 / n) forward + RS(B d_0) backward + AR(B d_2).

:func:`strategy_bytes` gives the table per layer (weights against
activations) and the exact totals; the tests compare them with the trace.
Uses only the public :mod:`minidist.distributed` API.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.collectives.traffic import ring_all_gather_sent, ring_all_reduce_sent
from minidist.distributed.device_mesh import as_group
from minidist.nn import functional as F
from minidist.nn.container import Sequential
from minidist.nn.linear import Linear
from minidist.nn.module import Module
from minidist.parallel.replicas import all_reduce_gradients, broadcast_module
from minidist.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    gather_from_parallel_region,
)
from minidist.tensor import Tensor, no_grad

DEFAULT_ALGORITHM = "ring"


def all_gather_batch(array, group=None, algorithm: str = DEFAULT_ALGORITHM) -> np.ndarray:
    """Every rank's ``array`` (b, ...) stacked along the batch axis in rank
    order: (n b, ...). No gradient (for labels)."""
    local = backend.to_numpy(array, contiguous=True)
    n = dist.get_world_size(group)
    if n == 1:
        return local
    whole = np.empty((n,) + local.shape, local.dtype)
    dist.all_gather_into_tensor(whole, local, group=group, algorithm=algorithm)
    return whole.reshape((n * local.shape[0],) + local.shape[1:])


def gather_batch(own, group=None, algorithm: str = DEFAULT_ALGORITHM) -> Tensor:
    """Forward: the n ranks' (b, ...) pieces stacked along the batch axis
    (all_gather): the whole batch on every rank. Backward: every rank's
    gradient of the whole batch is partial; they are summed and each rank
    keeps its own b rows (reduce_scatter along the batch axis)."""
    own = own if isinstance(own, Tensor) else Tensor(own)
    n = dist.get_world_size(group)
    if n == 1:
        return own
    whole = all_gather_batch(own.data, group, algorithm)

    def backward(grad):
        partial = backend.to_numpy(grad, contiguous=True)
        mine = np.empty((partial.shape[0] // n,) + partial.shape[1:], partial.dtype)
        dist.reduce_scatter_tensor(mine, partial, op=dist.ReduceOp.SUM, group=group,
                                   algorithm=algorithm)
        return backend.from_numpy(mine)

    return Tensor._make(backend.from_numpy(whole), (own,), lambda grad: (backward(grad),), "gather_batch")


def split_at_first_linear(model: Sequential) -> tuple[Sequential, list]:
    """(the layers before the first ``nn.Linear``, the layers from it on)."""
    layers = list(model)
    first = next((i for i, layer in enumerate(layers) if isinstance(layer, Linear)), None)
    if first is None:
        raise ValueError("a hybrid split needs a Sequential with at least one nn.Linear "
                         "(the dense part); found none")
    return Sequential(*layers[:first]), layers[first:]


class _SplitDense(Module):
    """The dense part: Linear layers alternately split by columns and by
    rows (the last, if it is a column layer, gathers its output), other
    layers (activations) kept as they are, applied to the whole batch."""

    def __init__(self, layers, group, algorithm, first_input_reduced: bool):
        super().__init__()
        linears = [layer for layer in layers if isinstance(layer, Linear)]
        last = linears[-1]
        self.first_input_reduced = first_input_reduced
        self.steps = []
        count = 0
        for index, layer in enumerate(layers):
            if isinstance(layer, Linear):
                if count % 2 == 0:
                    split = ColumnParallelLinear.from_linear(
                        layer, group, gather_output=layer is last, algorithm=algorithm)
                else:
                    split = RowParallelLinear.from_linear(layer, group, input_is_parallel=True,
                                                          algorithm=algorithm)
                self.steps.append(split)
                count += 1
            else:
                self.steps.append(layer)
            self.add_module(str(index), self.steps[-1])

    def forward(self, x):
        for index, step in enumerate(self.steps):
            if index == 0 and self.first_input_reduced:
                # gather_batch's backward already sums the partial gradients
                # (reduce_scatter): no copy_to_parallel_region here.
                x = F.linear(x, step.weight, step.bias)
                if step.gather_output:
                    x = gather_from_parallel_region(x, step.group, step.algorithm)
            else:
                x = step(x)
        return x


class HybridParallel(Module):
    """``HybridParallel(model, group=None, algorithm="ring")``: Krizhevsky's
    hybrid of a ``Sequential`` whose layers before the first ``nn.Linear``
    are the convolutional part (data parallel) and the rest the dense part
    (model parallel). See the module docstring for the step.

    ``hybrid(x)`` takes this rank's share of the batch (b examples, the same
    b on every rank) and returns the logits of the *whole* batch (n b rows,
    rank 0's examples first) on every rank; take the loss on them with the
    whole batch's labels (:func:`all_gather_batch`). After ``backward`` the
    convolutions' gradients are summed over the ranks; give
    ``hybrid.parameters()`` (the replicated convolutions and this rank's
    dense shards) to an ordinary optimizer.

    On construction rank 0's weights are broadcast, then each rank cuts its
    dense shards from them.
    """

    def __init__(self, model: Sequential, group=None, algorithm: str = DEFAULT_ALGORITHM):
        super().__init__()
        group = as_group(group, type(self).__name__)
        broadcast_module(model, group=group, group_src=0)
        convolutions, dense = split_at_first_linear(model)
        self.group, self.algorithm = group, algorithm
        self.convolutions = convolutions
        self.dense = _SplitDense(dense, group, algorithm, first_input_reduced=True)
        self._conv_parameters = list(convolutions.parameters())
        self._pending = len(self._conv_parameters)
        for parameter in self._conv_parameters:
            parameter.register_post_accumulate_grad_hook(self._gradient_ready)

    def forward(self, x):
        return self.dense(gather_batch(self.convolutions(x), self.group, self.algorithm))

    def _gradient_ready(self, parameter) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._pending = len(self._conv_parameters)
            self._sum_conv_gradients()

    def _sum_conv_gradients(self) -> None:
        """Step 7: one ring all_reduce (SUM) of every convolution gradient."""
        all_reduce_gradients(self._conv_parameters, self.group, algorithm=self.algorithm)


class DenseModelParallel(Module):
    """``DenseModelParallel(model, group=None, algorithm="ring")``: pure model
    parallel for comparison. Every rank runs the replicated convolutional
    part on the *whole* batch (no message; n times the convolution work in
    all) and the dense layers split as in :class:`HybridParallel`, with the
    first column layer's backward all_reducing the features' gradient so that
    every replica of the convolutions gets the whole gradient. ``model(x)``
    takes the whole batch on every rank and returns its logits."""

    def __init__(self, model: Sequential, group=None, algorithm: str = DEFAULT_ALGORITHM):
        super().__init__()
        group = as_group(group, type(self).__name__)
        broadcast_module(model, group=group, group_src=0)
        convolutions, dense = split_at_first_linear(model)
        self.convolutions = convolutions
        self.dense = _SplitDense(dense, group, algorithm, first_input_reduced=False)

    def forward(self, x):
        return self.dense(self.convolutions(x))


# --------------------------------------------------------------------------
# Bytes per step: weights against activations, per layer


@dataclass(frozen=True)
class LayerTraffic:
    """One layer with weights: its weight count, the activations it reads
    (batch x input size), and the values each rank sends for it per step
    under each strategy."""

    name: str
    kind: str  # "conv" (data parallel in the hybrid) or "dense" (model parallel)
    weights: int
    activations: int
    data_parallel: int
    model_parallel: int
    hybrid: int


@dataclass(frozen=True)
class StrategyBytes:
    """The table :func:`strategy_bytes` returns: ``layers`` (per layer, values
    rank 0 sends), and the exact totals of every rank: ``per_rank(name)``
    (values, rank order; the ring's chunks differ by one value when n does
    not divide a count), ``values(name)`` and ``bytes(name)`` (the most any
    rank sends), for name in ``STRATEGY_NAMES``."""

    batch: int
    world_size: int
    itemsize: int
    layers: tuple[LayerTraffic, ...]
    totals: dict

    def per_rank(self, strategy: str) -> tuple[int, ...]:
        return self.totals[strategy]

    def values(self, strategy: str) -> int:
        return max(self.totals[strategy])

    def bytes(self, strategy: str) -> int:
        return self.values(strategy) * self.itemsize

    def bytes_per_rank(self, strategy: str) -> tuple[int, ...]:
        return tuple(v * self.itemsize for v in self.totals[strategy])

    def __str__(self) -> str:
        return format_strategy_table(self)


STRATEGY_NAMES = ("data_parallel", "model_parallel", "hybrid")


def _layer_inputs(model: Sequential, input_shape) -> list[tuple[int, Module, int]]:
    """(position, layer, values per example of the layer's input) for every
    layer with weights, from a forward pass of one zero example."""
    x = Tensor(np.zeros((1,) + tuple(input_shape), np.float32))
    found = []
    with no_grad():
        for position, layer in enumerate(model):
            if list(layer.parameters()):
                found.append((position, layer, int(np.prod(x.shape[1:]))))
            x = layer(x)
    return found


def strategy_bytes(model: Sequential, input_shape, batch: int, world_size: int,
                   itemsize: int = 4) -> StrategyBytes:
    """Values (and bytes) each rank sends in one training step of ``model``
    (a Sequential: convolutional part, then dense layers) on inputs of
    ``input_shape`` (one example, e.g. (1, 8, 8)) at ``batch`` (the whole
    batch; each rank has batch / n in data parallel and the hybrid), for
    data parallel (DistributedDataParallel: one ring all_reduce of every
    gradient, one bucket), model parallel (:class:`DenseModelParallel`) and
    the hybrid (:class:`HybridParallel`), ring collectives.

    Per layer: ``weights`` (weight and bias values) against ``activations``
    (B x the layer's input size); the per-layer figures for data parallel
    are each layer's share, 2 (n-1)/n of its weights (exact on 2 ranks),
    the totals exact (one all_reduce of everything). The dense layers' counts
    assume every split divides evenly (the split layers require it)."""
    n, B = int(world_size), int(batch)
    if B % n:
        raise ValueError(f"strategy_bytes: the batch {B} must split evenly over {n} ranks")
    _, dense = split_at_first_linear(model)
    first_dense = next(i for i, layer in enumerate(model) if layer is dense[0])
    linears = [layer for layer in dense if isinstance(layer, Linear)]
    rows, conv_weights = [], 0
    total_weights = sum(p.data.size for p in model.parameters())
    for position, layer, per_example in _layer_inputs(model, input_shape):
        weights = sum(p.data.size for p in layer.parameters())
        activations = B * per_example
        share = ring_all_reduce_sent(weights, n)[0]
        if position < first_dense:
            conv_weights += weights
            rows.append(LayerTraffic(f"{position}: {type(layer).__name__}", "conv", weights,
                                     activations, share, 0, share))
            continue
        index = linears.index(layer)
        last = index == len(linears) - 1
        out = B * layer.out_features
        if index % 2 == 0:  # column split
            gather = ring_all_gather_sent(out // n, n)[0] if last else 0
            backward = ring_all_reduce_sent(activations, n)[0]
            model_parallel = gather + backward
            if index == 0:  # hybrid: all_gather of the features + reduce_scatter back
                hybrid = gather + 2 * ring_all_gather_sent(activations // n, n)[0]
            else:
                hybrid = model_parallel
        else:  # row split: all_reduce of the partial outputs
            model_parallel = hybrid = ring_all_reduce_sent(out, n)[0]
        rows.append(LayerTraffic(f"{position}: {type(layer).__name__}", "dense", weights,
                                 activations, share, model_parallel, hybrid))
    dense_model_parallel = sum(r.model_parallel for r in rows)
    dense_hybrid = sum(r.hybrid for r in rows if r.kind == "dense")
    totals = {
        "data_parallel": ring_all_reduce_sent(total_weights, n),
        "model_parallel": (dense_model_parallel,) * n,
        "hybrid": tuple(conv + dense_hybrid for conv in ring_all_reduce_sent(conv_weights, n)),
    }
    return StrategyBytes(B, n, itemsize, tuple(rows), totals)


def format_strategy_table(table: StrategyBytes, measured: dict | None = None) -> str:
    """The table as text; ``measured`` (strategy -> bytes per rank from a
    trace) adds a line to compare with the totals."""
    head = ["layer", "kind", "weights", "activations (B x in)", "weights/act.",
            "DP values", "MP values", "hybrid values"]
    lines = [[r.name, r.kind, f"{r.weights:,}", f"{r.activations:,}",
              f"{r.weights / r.activations:.2f}", f"{r.data_parallel:,}",
              f"{r.model_parallel:,}", f"{r.hybrid:,}"] for r in table.layers]
    lines.append(["total values", "", "", "", "", *(f"{table.values(s):,}"
                                                    for s in STRATEGY_NAMES)])
    lines.append(["total bytes", "", "", "", "", *(f"{table.bytes(s):,}"
                                                   for s in STRATEGY_NAMES)])
    if measured is not None:
        lines.append(["bytes in trace", "", "", "", "",
                      *(f"{measured[s]:,}" if s in measured else "" for s in STRATEGY_NAMES)])
    widths = [max(len(head[i]), *(len(line[i]) for line in lines)) for i in range(len(head))]

    def render(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    title = (f"Sent per rank per step, batch {table.batch}, {table.world_size} ranks, "
             f"{table.itemsize}-byte values, ring collectives "
             "(DP: data parallel, MP: dense layers split, convs replicated)")
    return "\n".join([title, render(head), render(["-" * w for w in widths])]
                     + [render(line) for line in lines])
