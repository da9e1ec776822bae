"""DistBelief-style model parallelism: every layer's units partitioned across
workers, activations and gradients exchanged with all_to_all (lesson 10).

DistBelief (Dean et al., 2012; the LSML lecture's "model-parallel in
DistBelief", and the Greek course slides' "each processing unit holds a
piece of the model ... all train their piece at the same time on the same
mini-batch ... all-to-all communication is needed to exchange
[activations] where neurons are connected") cuts the *network*, not the batch: worker r of n owns a slice
of the units of every layer -- its *partition* -- with their incoming
weights and biases, and every worker sees the whole mini-batch. Where a
connection crosses a partition boundary, the activation (forward) or the
gradient (backward) crossing it must be sent.

For a fully connected MLP (``sizes = [d_0, d_1, ..., d_L]``, layer l maps
d_{l-1} -> d_l), on n workers, batch B, one step in order:

Forward, for each layer l = 1 .. L:

1. worker r computes the pre-activations of its own d_l / n units from the
   whole previous layer H_{l-1} (B x d_{l-1}): Z_r = H_{l-1} W_r^T + b_r,
   W_r being rows ``r*d_l/n : (r+1)*d_l/n`` of the layer's (out, in) weight;
   then its activations A_r = relu(Z_r) (no activation after the last layer);
2. the workers *exchange activations* (:func:`exchange_activations`,
   all_to_all): every worker sends its B x d_l/n activations to every other
   worker, since in a fully connected net every unit of layer l + 1 reads
   every unit of layer l; each worker stacks the n pieces in rank order into
   the whole H_l (B x d_l). (For a locally connected layer, DistBelief's
   case, each worker would send each neighbour only the units it reads: the
   pieces of an all_to_all differ then. Fully connected, the n pieces are
   the same array, and the all_to_all moves what an all_gather would.)
3. after the last layer the logits' pieces are stacked with an all_gather
   (:func:`~minidist.parallel.tensor.regions.gather_from_parallel_region`)
   and every worker computes the same loss on the whole batch.

Backward, for each layer l = L .. 1:

4. the loss's gradient of the logits is the same on every worker; each keeps
   its own columns (the all_gather's backward: no message);
5. worker r backpropagates through its units: dZ_r, its weight and bias
   gradients (complete: its units saw the whole batch, so no gradient is
   ever all-reduced) and a *partial* gradient of the whole previous layer,
   dH_{l-1}^{(r)} = dZ_r W_r (B x d_{l-1}): the part that flowed through its
   units;
6. the workers *exchange gradients* (all_to_all, the backward of step 2):
   worker r cuts its partial dH_{l-1}^{(r)} by owner, sends piece s
   (B x d_{l-1}/n) to worker s, and sums the n pieces it receives: the
   whole gradient of its own units of layer l - 1. (The first layer's
   input is the data: no gradient, no message.)

Every worker then updates its own weights with its own optimizer: nothing
else is sent, unlike data parallelism, which all-reduces every weight
gradient.

Cost per worker per step, in values (times the itemsize for bytes), with the
pairwise all_to_all and the ring all_gather, each sending (n - 1) pieces:

* each hidden layer l < L: forward (n-1) B d_l / n, backward (n-1) B d_l / n;
* the output layer: forward (n-1) B d_L / n (all_gather), backward nothing;

that is 2 (n-1)/n B (d_1 + ... + d_{L-1}) + (n-1)/n B d_L, in 2 (L - 1) + 1
collectives of n - 1 messages each (alpha: (2L - 1)(n - 1) messages).
Activations, not weights: data parallel on the same net would send
2 (n-1)/n (d_0 d_1 + d_1 d_2 + ...) weight-gradient values; model parallel
wins when the layers are wide and the batch small (weights per layer >
activations per layer: d_{l-1} d_l > B d_l, i.e. d_{l-1} > B) -- Dettmers'
argument in "Model Parallelism in Deep Learning" (2014). And it cannot overlap: a worker cannot start layer l + 1 until
every partition of layer l has arrived.
:func:`distbelief_bytes` gives the counts; the tests compare them with the
trace exactly.

Names: :class:`PartitionedLinear` is one layer's partition (its units and
their incoming weights), :class:`DistBeliefMLP` the whole partitioned net.
The split is the column split of
:class:`~minidist.parallel.tensor.layers.ColumnParallelLinear` applied to
*every* layer (units = output features); what differs from Megatron's
column-row pairing is the exchange between layers, which here carries
activations forward and partial gradients backward with all_to_all, as in
DistBelief. Every layer's width must be divisible by n.

Uses only the public :mod:`minidist.distributed` API; the autograd knows
nothing of processes (the exchange is an autograd node whose backward
happens to be a collective).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.collectives.traffic import ring_all_gather_sent
from minidist.distributed.device_mesh import as_group
from minidist.nn import functional as F
from minidist.nn import init
from minidist.nn.linear import Linear
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter
from minidist.parallel.tensor import gather_from_parallel_region
from minidist.tensor import Tensor

#: all_to_all's algorithm for the exchanges (pairwise: (n - 1) pieces sent per worker).
DEFAULT_EXCHANGE_ALGORITHM = "pairwise"
#: all_gather's algorithm for the logits (ring: (n - 1) pieces sent per worker).
DEFAULT_GATHER_ALGORITHM = "ring"


def _all_to_all_pieces(pieces: np.ndarray, group, algorithm: str) -> np.ndarray:
    """``pieces`` (n, ...) with piece s for worker s; returns (n, ...) with
    piece i from worker i."""
    received = np.empty_like(pieces)
    dist.all_to_all_single(received, pieces, group=group, algorithm=algorithm)
    return received


def exchange_activations(own, group=None, algorithm: str = DEFAULT_EXCHANGE_ALGORITHM) -> Tensor:
    """DistBelief's exchange between two partitioned layers, as one autograd node.

    Forward: ``own`` (B x d/n) is this worker's units' activations; every
    worker sends them to every worker (all_to_all) and stacks the n pieces
    it receives in rank order: the whole layer, B x d.
    Backward: the gradient of the whole layer (B x d) is this worker's
    *partial* gradient (what flowed through its units of the next layer); it
    is cut by owner, piece s sent to worker s (all_to_all), and the n pieces
    received are summed: the whole gradient of this worker's own units.
    """
    own = own if isinstance(own, Tensor) else Tensor(own)
    group = as_group(group, "exchange_activations")
    n = dist.get_world_size(group)
    if n == 1:
        return own
    local = backend.to_numpy(own.data, contiguous=True)
    received = _all_to_all_pieces(np.stack([local] * n), group, algorithm)
    whole = np.concatenate(list(received), axis=-1)
    width = local.shape[-1]

    def backward(grad):
        partial = backend.to_numpy(grad, contiguous=True)
        by_owner = np.stack([partial[..., s * width:(s + 1) * width] for s in range(n)])
        pieces = _all_to_all_pieces(by_owner, group, algorithm)
        return backend.from_numpy(pieces.sum(axis=0))

    return Tensor._make(backend.from_numpy(whole), (own,), lambda grad: (backward(grad),),
                        "exchange_activations")


def _partition(width: int, group, what: str) -> tuple[int, int, int]:
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if width % n:
        raise ValueError(
            f"rank {dist.get_rank()}: DistBelief partitions {what}={width} units over {n} "
            f"workers, but {width} is not divisible by {n}. Choose a world size that divides "
            f"every layer's width, or change the width.")
    return rank, n, width // n


class PartitionedLinear(Module):
    """One fully connected layer's partition: this worker's ``out_features / n``
    units with their incoming weights (rows ``self.units`` of the whole
    layer's (out, in) weight) and biases. Input: the whole previous layer,
    B x in_features, on every worker. Output: this worker's units, B x out/n.
    Sends nothing itself; :func:`exchange_activations` moves the results."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None,
                 rng=None, dtype=np.float32):
        super().__init__()
        group = as_group(group, "PartitionedLinear")
        _partition(out_features, group, "out_features")
        self._take_partition(Linear(in_features, out_features, bias=bias, rng=rng, dtype=dtype),
                             group)

    @classmethod
    def from_linear(cls, linear, group=None) -> PartitionedLinear:
        """This worker's partition of ``linear`` (copied)."""
        if not isinstance(linear, Linear):
            raise TypeError(f"PartitionedLinear.from_linear needs an nn.Linear, "
                            f"got {type(linear).__name__}")
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer._take_partition(linear, group)
        return layer

    def _take_partition(self, linear, group):
        group = as_group(group, "PartitionedLinear")
        rank, n, width = _partition(linear.out_features, group, "out_features")
        self.in_features, self.out_features, self.group = (linear.in_features,
                                                          linear.out_features, group)
        self.world_size, self.rank = n, rank
        #: The units of the whole layer held here (rows of its (out, in) weight).
        self.units = slice(rank * width, (rank + 1) * width)
        self.weight = Parameter(linear.weight.data[self.units].copy())
        if linear.bias is not None:
            self.bias = Parameter(linear.bias.data[self.units].copy())
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(units {self.units.start}:{self.units.stop} here, of {self.world_size} "
                f"workers), bias={self.bias is not None}")


class DistBeliefMLP(Module):
    """``DistBeliefMLP(sizes, group=None, rng=None)`` or
    ``DistBeliefMLP.from_linears([nn.Linear, ...])``: a fully connected net
    ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` with ReLU between layers,
    every layer partitioned over the workers of ``group`` (see the module
    docstring for the algorithm and its cost).

    ``model(x)`` takes the whole batch (B x sizes[0], the same on every
    worker) and returns the whole logits (B x sizes[-1]) on every worker;
    compute the loss on them as in one process. ``model.parameters()`` are
    this worker's partitions only: give them to an ordinary optimizer.
    """

    def __init__(self, sizes, group=None, rng=None, dtype=np.float32,
                 exchange_algorithm: str = DEFAULT_EXCHANGE_ALGORITHM,
                 gather_algorithm: str = DEFAULT_GATHER_ALGORITHM):
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2:
            raise ValueError(f"DistBeliefMLP needs at least two sizes (input and output), "
                             f"got {sizes}")
        generator = init.as_generator(rng)
        linears = [Linear(a, b, rng=generator, dtype=dtype) for a, b in zip(sizes, sizes[1:])]
        self._build(linears, group, exchange_algorithm, gather_algorithm)

    @classmethod
    def from_linears(cls, linears, group=None,
                     exchange_algorithm: str = DEFAULT_EXCHANGE_ALGORITHM,
                     gather_algorithm: str = DEFAULT_GATHER_ALGORITHM) -> DistBeliefMLP:
        """The partitions of an existing stack of ``nn.Linear`` layers (ReLU
        between them), so that the partitioned net computes what
        ``Sequential(linears[0], ReLU(), linears[1], ...)`` computes."""
        model = cls.__new__(cls)
        model._build(list(linears), group, exchange_algorithm, gather_algorithm)
        return model

    def _build(self, linears, group, exchange_algorithm, gather_algorithm):
        Module.__init__(self)
        for before, after in zip(linears, linears[1:]):
            if before.out_features != after.in_features:
                raise ValueError(f"DistBeliefMLP: a layer with out_features="
                                 f"{before.out_features} feeds one with in_features="
                                 f"{after.in_features}")
        self.group = group = as_group(group, "DistBeliefMLP")
        self.exchange_algorithm, self.gather_algorithm = exchange_algorithm, gather_algorithm
        self.sizes = [linears[0].in_features] + [layer.out_features for layer in linears]
        self.layers = [PartitionedLinear.from_linear(layer, group) for layer in linears]
        for index, layer in enumerate(self.layers):
            setattr(self, f"layer{index}", layer)

    def forward(self, x):
        h = x
        for index, layer in enumerate(self.layers):
            own = layer(h)
            if index < len(self.layers) - 1:
                h = exchange_activations(F.relu(own), self.group, self.exchange_algorithm)
        return gather_from_parallel_region(own, self.group, self.gather_algorithm)


@dataclass(frozen=True)
class DistBeliefTraffic:
    """Values each worker sends per step, per layer: ``forward[l]`` and
    ``backward[l]`` for layer l (0-based); ``bytes`` their sum times itemsize."""

    sizes: tuple[int, ...]
    batch: int
    world_size: int
    itemsize: int
    forward: tuple[int, ...]
    backward: tuple[int, ...]

    @property
    def values(self) -> int:
        return sum(self.forward) + sum(self.backward)

    @property
    def bytes(self) -> int:
        return self.values * self.itemsize

    @property
    def data_parallel_values(self) -> int:
        """What data parallel would send on the same net (ring all_reduce of
        all weights and biases, 2 (n-1)/n of them when n divides the count)."""
        from minidist.distributed.collectives.traffic import ring_all_reduce_sent

        count = sum(a * b + b for a, b in zip(self.sizes, self.sizes[1:]))
        return max(ring_all_reduce_sent(count, self.world_size))


def distbelief_bytes(sizes, batch: int, world_size: int, itemsize: int = 4) -> DistBeliefTraffic:
    """What each worker of a :class:`DistBeliefMLP` with layer widths ``sizes``
    sends in one step at ``batch`` (pairwise all_to_all exchanges, ring
    all_gather of the logits): hidden layer l forward and backward
    (n-1) B d_l / n each, the output layer forward (n-1) B d_L / n."""
    sizes, n, B = tuple(int(s) for s in sizes), int(world_size), int(batch)
    for width in sizes[1:]:
        if width % n:
            raise ValueError(f"distbelief_bytes: world_size={n} must divide every layer's "
                             f"width, got {sizes[1:]}")
    exchange = [(n - 1) * B * width // n for width in sizes[1:-1]]
    last = ring_all_gather_sent(B * sizes[-1] // n, n)[0]
    return DistBeliefTraffic(sizes, B, n, itemsize, tuple(exchange) + (last,),
                             tuple(exchange) + (0,))
