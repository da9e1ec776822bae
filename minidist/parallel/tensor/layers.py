"""Tensor parallelism: one dense layer's weight matrix split across ranks
(lessons 10 and 17; Megatron-LM's ColumnParallelLinear and RowParallelLinear).

Data parallelism gives every rank the whole model and a slice of the batch;
model parallelism gives every rank the whole batch and a slice of the model.
Here the slice is a block of one Linear layer's weight. Write the layer as
Y = X A with A = W^T of shape (in_features, out_features), as Megatron and
Dettmers' "Model Parallelism in Deep Learning" (2014) do, and split A over
n ranks one of two ways:

* **by columns** (:class:`ColumnParallelLinear`): rank r holds the columns
  ``r*out/n : (r+1)*out/n`` of A (in PyTorch's (out, in) layout: those *rows*
  of ``weight``) and the same slice of the bias. With the whole X it computes
  its own columns of Y, nothing to add: Y = [X A_0 | X A_1 | ...] -- the
  pieces are *stacked*. Backward: each rank's piece of dY gives a full-sized
  *partial* dX = dY_r A_r^T, and the partial dX of all ranks are *added*
  (all_reduce).
* **by rows** (:class:`RowParallelLinear`): rank r holds the rows
  ``r*in/n : (r+1)*in/n`` of A (columns of ``weight``) and needs only its
  slice X_r of the input's features. X_r A_r is a full-sized *partial* Y;
  Y = sum over r of X_r A_r -- the partial sums are *added* (all_reduce),
  then the whole bias is added once. Backward: dY is whole on every rank and
  dX_r = dY A_r^T is rank r's slice of dX -- the pieces are *stacked*.

In backward the roles of "add" and "stack" swap, as in Dettmers' worked
example (1000x500 weight, batch 128). The communication is written as four
autograd functions, each a collective in one pass and its transpose in the
other (Megatron's names):

==============================  ====================  ==========================
function                        forward               backward
==============================  ====================  ==========================
copy_to_parallel_region         identity              all_reduce (sum)
reduce_from_parallel_region     all_reduce (sum)      identity
gather_from_parallel_region     all_gather, stack     take own slice
scatter_to_parallel_region      take own slice        all_gather, stack
==============================  ====================  ==========================

A column split followed by a row split (an MLP block: Linear, activation,
Linear) needs *one* all_reduce per pass: the column layer's output stays
split (``gather_output=False``) and is exactly the split input the row layer
wants (``input_is_parallel=True``); the row layer's forward all_reduce and
the column layer's backward all_reduce are the only messages.

**Sequence parallelism** (Korthikanti et al., 2022, Megatron's
``sequence_parallel``): between a row layer and the next column layer a
transformer runs LayerNorm (and dropout) on the *whole* activation on every
rank, the same work n times and the same (B, T, C) arrays kept n times. Cut
that region along the sequence instead: the row layer's all_reduce becomes
a reduce_scatter along the sequence (each rank keeps the sum for its T/n
positions) and the column layer's "copy" becomes an all_gather along the
sequence. Same bytes on the wire (a ring all_reduce *is* a reduce_scatter
then an all_gather), the LayerNorm work and memory divided by n. Two more
functions (the sequence axis is the second to last, T of (B, T, C)):

=========================================  ======================  ==================
function                                   forward                 backward
=========================================  ======================  ==================
gather_from_sequence_parallel_region       all_gather along T      reduce_scatter
reduce_scatter_to_sequence_parallel_region reduce_scatter along T  all_gather
=========================================  ======================  ==================

and the two layers take ``sequence_parallel=True`` to use them in place of
``copy_to`` / ``reduce_from``. A parameter used inside the sharded region
(LayerNorm's, the row layer's bias) then sees only its rank's positions:
its gradient must be summed over the group after backward
(:mod:`minidist.parallel.tensor.gpt` does it in one all_reduce).

These functions use only the public :mod:`minidist.distributed` API; the
autograd knows nothing of processes. Every collective is run with a fixed
``algorithm`` ("ring" by default, a parameter of every layer), so the bytes
each rank sends are deterministic: :mod:`minidist.parallel.model.costs`
gives them by formula and the tests compare with the trace.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
import minidist.distributed.tensor.grad_norm  # noqa: F401  (the rule that sums a shard's norm over tp)
import minidist.parallel.tensor.regions as regions
from minidist.distributed.device_mesh import as_group
from minidist.nn import functional as F
from minidist.nn.linear import Linear
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter

# --------------------------------------------------------------------------
# Autograd nodes whose local backward is a collective


# --------------------------------------------------------------------------
# The layers


def _split_size(layer: str, dimension: str, size: int, group) -> tuple[int, int, int]:
    """(rank, world size, this rank's share of ``size``), or a clear error."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if size % world:
        raise ValueError(
            f"rank {dist.get_rank()}: {layer} splits {dimension}={size} over a group of {world} "
            f"ranks, but {size} is not divisible by {world}. Choose a world size that divides "
            f"{size} (e.g. {', '.join(str(d) for d in _divisors(size)[:6])}) or change "
            f"{dimension}.")
    return rank, world, size // world


def set_tensor_model_parallel_attributes(param, is_parallel: bool, dim: int, stride: int = 1,
                                         group=None):
    """Megatron's flags on a split layer's Parameter: ``tensor_model_parallel``
    (this rank holds a piece, the group the rest), ``partition_dim`` (the
    dim it is cut along), ``partition_stride``, and minidist's
    ``tensor_model_parallel_group`` (Megatron has one global tp group; here a
    layer names its own). ``clip_grad_norm_`` sums a flagged gradient's norm
    over the group and counts an unflagged one once
    (:mod:`minidist.distributed.tensor.grad_norm`)."""
    param.tensor_model_parallel = bool(is_parallel) and dist.get_world_size(group) > 1
    param.partition_dim = dim
    param.partition_stride = stride
    param.tensor_model_parallel_group = group
    return param


def _divisors(size: int) -> list[int]:
    return [d for d in range(1, size + 1) if size % d == 0]


def packed_rows(out_features: int, pieces: int, rank: int, world_size: int) -> np.ndarray:
    """The weight rows of ``rank``'s column shard of a Linear whose
    ``out_features`` rows are ``pieces`` equal blocks packed one after the
    other (3 for a fused q, k, v): the rank-th world_size-th of every block,
    so that the shard is the same packing of a narrower layer. The blocks'
    size must divide by ``world_size`` (the callers check and say why)."""
    block = out_features // pieces
    width = block // world_size
    mine = np.arange(rank * width, (rank + 1) * width)
    return np.concatenate([piece * block + mine for piece in range(pieces)])


class _ParallelLinear(Module):
    """What the two split layers share: this rank's shard of a whole
    ``nn.Linear``, split along ``split`` (``"out_features"`` or
    ``"in_features"``), taken by :meth:`_pieces`; ``flag`` names the layer's
    own switch (``gather_output`` or ``input_is_parallel``), ``held`` what the
    shard is of the whole (out, in) weight (``"rows"`` or ``"columns"``)."""

    split = flag = held = ""

    def _build(self, in_features, out_features, bias, flag, group, algorithm, rng, dtype,
               sequence_parallel):
        """``__init__``: the whole layer drawn as ``nn.Linear`` draws it, this rank's shard kept."""
        super().__init__()
        group = as_group(group, type(self).__name__)
        size = in_features if self.split == "in_features" else out_features
        _split_size(type(self).__name__, self.split, size, group)   # before drawing
        full = Linear(in_features, out_features, bias=bias, rng=rng, dtype=dtype)
        self._take_shard(full, flag, group, algorithm, sequence_parallel)

    @classmethod
    def _from_linear(cls, linear, flag, group, algorithm, sequence_parallel=False, shard=None):
        if not isinstance(linear, Linear):
            raise TypeError(f"{cls.__name__}.from_linear needs an nn.Linear, "
                            f"got {type(linear).__name__}")
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer._take_shard(linear, flag, group, algorithm, sequence_parallel, shard)
        return layer

    def _take_shard(self, linear, flag, group, algorithm, sequence_parallel=False, shard=None):
        group = as_group(group, type(self).__name__)
        if shard is None:
            rank, world, width = _split_size(type(self).__name__, self.split,
                                             getattr(linear, self.split), group)
            shard = slice(rank * width, (rank + 1) * width)
        else:
            world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        setattr(self, self.flag, bool(flag))
        self.sequence_parallel = bool(sequence_parallel)
        self.group, self.algorithm = group, algorithm
        self.world_size, self.rank = world, rank
        #: The rows (Column) or columns (Row) of the whole (out, in) weight
        #: held here: a slice, or an index array for a layout of its own
        #: (a fused q, k, v weight split by heads).
        self.shard = shard
        weight, bias = self._pieces(linear)
        # The column layer cuts the weight's rows and the bias, the row layer
        # the weight's columns only: its bias is whole on every rank.
        column = self.split == "out_features"
        self.weight = set_tensor_model_parallel_attributes(
            Parameter(weight.copy()), True, 0 if column else 1, group=group)
        if bias is not None:
            self.bias = set_tensor_model_parallel_attributes(
                Parameter(bias.copy()), column, 0, group=group)
        else:
            self.register_parameter("bias", None)

    def extra_repr(self) -> str:
        # The split dimension carries which part of it this rank holds.
        here = f" ({self.held} {_describe(self.shard)} here, of {self.world_size} ranks)"
        sizes = [f"{name}={getattr(self, name)}" + (here if name == self.split else "")
                 for name in ("in_features", "out_features")]
        return (", ".join(sizes) + f", bias={self.bias is not None}, "
                f"{self.flag}={getattr(self, self.flag)}"
                + (", sequence_parallel=True" if self.sequence_parallel else ""))


class ColumnParallelLinear(_ParallelLinear):
    """``ColumnParallelLinear(in_features, out_features, bias=True, gather_output=False,
    group=None, algorithm="ring", rng=None, dtype=float32)``.

    Y = X A + b with A (in_features, out_features) split by columns: this rank
    holds ``weight`` of shape (out_features / n, in_features) -- rows
    ``self.shard`` of the whole layer's (out, in) weight -- and the same
    slice of the bias. Input: the whole X (batch, in_features) on every rank.
    Output: this rank's columns of Y, (batch, out_features / n), or with
    ``gather_output=True`` the whole Y, every rank's piece stacked.

    Messages (n ranks, batch B, float itemsize s), per pass:
    forward nothing, or with ``gather_output`` an all_gather of the B x out/n
    pieces; backward one all_reduce of the B x in partial input gradients
    (only when the input needs a gradient: not for a first layer fed with
    data, whose backward sends nothing).

    ``sequence_parallel=True``: the input is this rank's positions of the
    sequence (axis -2) and the whole sequence is gathered first
    (:func:`~minidist.parallel.tensor.regions.gather_from_sequence_parallel_region`: all_gather forward,
    reduce_scatter of the partial input gradients backward, the same bytes
    as the all_reduce it replaces).

    Initialisation: the whole (out, in) weight is drawn as ``nn.Linear``
    draws it and this rank keeps its rows; pass the same ``rng`` seed on
    every rank (or build the layer with :meth:`from_linear`) so that the
    shards are pieces of one matrix.
    """

    split, flag, held = "out_features", "gather_output", "rows"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = False, group=None, algorithm: str = regions.DEFAULT_ALGORITHM,
                 rng=None, dtype=np.float32, sequence_parallel: bool = False):
        self._build(in_features, out_features, bias, gather_output, group, algorithm, rng, dtype,
                    sequence_parallel)

    @classmethod
    def from_linear(cls, linear, group=None, gather_output: bool = False,
                    algorithm: str = regions.DEFAULT_ALGORITHM, sequence_parallel: bool = False,
                    rows=None) -> ColumnParallelLinear:
        """This rank's shard of ``linear`` (copied), so that the split layer
        computes exactly what ``linear`` computes. ``rows`` (a slice or an
        index array of the whole (out, in) weight's rows) replaces the even
        contiguous block: an uneven vocabulary's share, or the q, k and v
        rows of this rank's heads in a fused attention projection."""
        return cls._from_linear(linear, gather_output, group, algorithm, sequence_parallel, rows)

    def _pieces(self, linear):
        bias = None if linear.bias is None else linear.bias.data[self.shard]
        return linear.weight.data[self.shard], bias

    def forward(self, x):
        if self.sequence_parallel:
            x = regions.gather_from_sequence_parallel_region(x, self.group, self.algorithm)
        else:
            x = regions.copy_to_parallel_region(x, self.group, self.algorithm)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = regions.gather_from_parallel_region(y, self.group, self.algorithm)
        return y


class RowParallelLinear(_ParallelLinear):
    """``RowParallelLinear(in_features, out_features, bias=True, input_is_parallel=True,
    group=None, algorithm="ring", rng=None, dtype=float32)``.

    Y = X A + b with A (in_features, out_features) split by rows: this rank
    holds ``weight`` of shape (out_features, in_features / n) -- columns
    ``self.shard`` of the whole layer's (out, in) weight -- and the whole
    bias. Input: this rank's slice of X's features, (batch, in_features / n)
    (``input_is_parallel=True``, what a :class:`ColumnParallelLinear` with
    ``gather_output=False`` produces), or the whole X, of which each rank
    takes its slice (``input_is_parallel=False``). Output: the whole Y on
    every rank: the partial products summed (all_reduce), then the bias
    added once.

    Messages per pass: forward one all_reduce of the B x out partial
    outputs; backward nothing, or with ``input_is_parallel=False`` an
    all_gather of the B x in/n input-gradient pieces.

    The bias is replicated, and its gradient (the batch sum of the whole dY,
    the same on every rank) needs no message.

    ``sequence_parallel=True``: the partial products are reduce_scattered
    along the sequence (axis -2) instead (:func:`~minidist.parallel.tensor.regions.reduce_scatter_to_sequence_parallel_region`),
    each rank keeping its T/n positions, and the bias is added to those;
    backward all_gathers the positions' gradients. The bias gradient is then
    this rank's positions' share: sum it over the group after backward.
    """

    split, flag, held = "in_features", "input_is_parallel", "columns"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 input_is_parallel: bool = True, group=None,
                 algorithm: str = regions.DEFAULT_ALGORITHM, rng=None, dtype=np.float32,
                 sequence_parallel: bool = False):
        self._build(in_features, out_features, bias, input_is_parallel, group, algorithm, rng, dtype,
                    sequence_parallel)

    @classmethod
    def from_linear(cls, linear, group=None, input_is_parallel: bool = True,
                    algorithm: str = regions.DEFAULT_ALGORITHM,
                    sequence_parallel: bool = False) -> RowParallelLinear:
        """This rank's shard of ``linear`` (copied), so that the split layer
        computes exactly what ``linear`` computes."""
        return cls._from_linear(linear, input_is_parallel, group, algorithm, sequence_parallel)

    def _pieces(self, linear):
        bias = None if linear.bias is None else linear.bias.data     # replicated
        return linear.weight.data[:, self.shard], bias

    def forward(self, x):
        if not self.input_is_parallel:
            x = regions.scatter_to_parallel_region(x, self.group, self.algorithm)
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = regions.reduce_scatter_to_sequence_parallel_region(partial, self.group, self.algorithm)
        else:
            y = regions.reduce_from_parallel_region(partial, self.group, self.algorithm)
        if self.bias is not None:
            y = y + self.bias
        return y


def _describe(shard) -> str:
    if isinstance(shard, slice):
        return f"{shard.start}:{shard.stop}"
    return f"{len(shard)} chosen"
