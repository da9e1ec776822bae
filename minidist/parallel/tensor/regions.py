"""Megatron's communication regions: the autograd functions whose forward or
backward is a collective over the tensor-parallel group (Megatron-LM's f
and g, and sequence parallelism's pair).

==========================================  ======================  =====================
function                                    forward                 backward
==========================================  ======================  =====================
copy_to_parallel_region (Megatron's f)      identity                all_reduce (sum)
reduce_from_parallel_region (Megatron's g)  all_reduce (sum)        identity
gather_from_parallel_region                 all_gather, stack       take own slice
scatter_to_parallel_region                  take own slice          all_gather, stack
gather_from_sequence_parallel_region        all_gather along T      reduce_scatter
reduce_scatter_to_sequence_parallel_region  reduce_scatter along T  all_gather
==========================================  ======================  =====================

Each is one autograd node (``_node``): the forward's result with a backward
that runs the transposed collective. The split layers
(:mod:`minidist.parallel.tensor.layers`) put them around their products;
why each goes where it does is told there. Every collective runs with a
fixed ``algorithm`` ("ring" by default), so the bytes each rank sends are
deterministic: an all_reduce of N values sends 2 (n-1)/n N per rank, an
all_gather or a reduce_scatter (n-1)/n of the whole
(:mod:`minidist.distributed.collectives.traffic`).
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.device_mesh import as_group
from minidist.tensor import Tensor

DEFAULT_ALGORITHM = "ring"


def _node(data, parent: Tensor, backward, op: str) -> Tensor:
    """A graph node with one parent: ``backward(grad_out)`` returns the
    parent's gradient. The autograd calls it like any other op's backward;
    that the function talks to other processes is its own business."""
    return Tensor._make(data, (parent,), lambda grad: (backward(grad),), op)


def _tensor(value) -> Tensor:
    return value if isinstance(value, Tensor) else Tensor(value)


def _all_reduce_sum(array, group, algorithm: str):
    """A contiguous copy of ``array`` summed over the group. (A copy: the
    gradient arrays the autograd hands a backward may be shared with
    another branch of the graph, and all_reduce works in place.)"""
    summed = np.array(backend.to_numpy(array), copy=True, order="C")
    if dist.get_world_size(group) > 1:
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group, algorithm=algorithm)
    return backend.from_numpy(summed)


def _all_gather_last_axis(array, group, algorithm: str):
    """Every rank's ``array`` stacked along the last axis, in rank order."""
    size = dist.get_world_size(group)
    if size == 1:
        return array
    piece = np.ascontiguousarray(backend.to_numpy(array))
    pieces = np.empty((size,) + piece.shape, piece.dtype)
    dist.all_gather_into_tensor(pieces, piece, group=group, algorithm=algorithm)
    whole = np.concatenate(list(pieces), axis=-1)
    return backend.from_numpy(whole)


def _own_slice_last_axis(array, group):
    """This rank's 1/n of ``array``'s last axis (a contiguous copy)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    width = array.shape[-1] // size
    return array[..., rank * width:(rank + 1) * width].copy()


def _sequence_pieces(array, world: int, function: str) -> int:
    """The length of one rank's piece of the sequence axis (-2), or a clear error."""
    if array.ndim < 2:
        raise ValueError(f"{function}: needs (..., sequence, features), got shape {array.shape}")
    length = array.shape[-2]
    if length % world:
        raise ValueError(
            f"rank {dist.get_rank()}: {function} cuts the sequence axis of length {length} into "
            f"{world} equal pieces, but {length} is not divisible by {world}; use a sequence "
            f"length that is a multiple of the tensor-parallel group size {world}.")
    return length // world


def _all_gather_sequence(array, group, algorithm: str):
    """Every rank's (..., T/n, C) piece stacked along the sequence axis, in
    rank order. The axis goes first for the message (pieces contiguous), as
    Megatron keeps its activations (sequence, batch, hidden)."""
    size = dist.get_world_size(group)
    if size == 1:
        return array
    piece = np.ascontiguousarray(np.moveaxis(backend.to_numpy(array), -2, 0))
    pieces = np.empty((size,) + piece.shape, piece.dtype)
    dist.all_gather_into_tensor(pieces, piece, group=group, algorithm=algorithm)
    whole = np.moveaxis(pieces.reshape((size * piece.shape[0],) + piece.shape[1:]), 0, -2)
    whole = np.ascontiguousarray(whole)
    return backend.from_numpy(whole)


def _reduce_scatter_sequence(array, group, algorithm: str, function: str):
    """The sum over the group of ``array`` (..., T, C), of which this rank
    keeps its T/n positions (..., T/n, C)."""
    size = dist.get_world_size(group)
    if size == 1:
        return array
    _sequence_pieces(array, size, function)
    whole = np.ascontiguousarray(np.moveaxis(backend.to_numpy(array), -2, 0))
    mine = np.empty((whole.shape[0] // size,) + whole.shape[1:], whole.dtype)
    dist.reduce_scatter_tensor(mine, whole, op=dist.ReduceOp.SUM, group=group, algorithm=algorithm)
    mine = np.ascontiguousarray(np.moveaxis(mine, 0, -2))
    return backend.from_numpy(mine)


def copy_to_parallel_region(input, group=None, algorithm: str = DEFAULT_ALGORITHM) -> Tensor:
    """Forward: the input unchanged (every rank already has the whole of it).
    Backward: the gradients of all ranks summed (all_reduce), since each
    rank's copy fed a different part of the model."""
    input, group = _tensor(input), as_group(group, "copy_to_parallel_region")
    return _node(input.data, input, lambda grad: _all_reduce_sum(grad, group, algorithm),
                 "copy_to_parallel_region")


def reduce_from_parallel_region(input, group=None, algorithm: str = DEFAULT_ALGORITHM) -> Tensor:
    """Forward: the partial results of all ranks summed (all_reduce).
    Backward: the gradient unchanged (the sum passes it to every term)."""
    input, group = _tensor(input), as_group(group, "reduce_from_parallel_region")
    return _node(_all_reduce_sum(input.data, group, algorithm), input, lambda grad: grad,
                 "reduce_from_parallel_region")


def gather_from_parallel_region(input, group=None, algorithm: str = DEFAULT_ALGORITHM) -> Tensor:
    """Forward: every rank's piece stacked along the last axis (all_gather).
    Backward: this rank's slice of the gradient (no message)."""
    input, group = _tensor(input), as_group(group, "gather_from_parallel_region")
    return _node(_all_gather_last_axis(input.data, group, algorithm), input,
                 lambda grad: _own_slice_last_axis(grad, group), "gather_from_parallel_region")


def scatter_to_parallel_region(input, group=None, algorithm: str = DEFAULT_ALGORITHM) -> Tensor:
    """Forward: this rank's slice of the last axis (no message: every rank
    has the whole input). Backward: the slices' gradients stacked (all_gather)."""
    input, group = _tensor(input), as_group(group, "scatter_to_parallel_region")
    return _node(_own_slice_last_axis(input.data, group), input,
                 lambda grad: _all_gather_last_axis(grad, group, algorithm),
                 "scatter_to_parallel_region")


def gather_from_sequence_parallel_region(input, group=None,
                                         algorithm: str = DEFAULT_ALGORITHM) -> Tensor:
    """Forward: every rank's positions stacked along the sequence axis (-2)
    (all_gather), the whole sequence for a column layer. Backward: the
    gradients summed over the group, this rank keeping its positions
    (reduce_scatter): the column layer's input gradient is partial on each
    rank, as in :func:`copy_to_parallel_region`."""
    input = _tensor(input)
    return _node(_all_gather_sequence(input.data, group, algorithm), input,
                 lambda grad: _reduce_scatter_sequence(
                     grad, group, algorithm, "gather_from_sequence_parallel_region"),
                 "gather_from_sequence_parallel_region")


def reduce_scatter_to_sequence_parallel_region(input, group=None,
                                               algorithm: str = DEFAULT_ALGORITHM) -> Tensor:
    """Forward: the partial results of all ranks summed, this rank keeping
    its positions of the sequence axis (-2) (reduce_scatter). Backward: the
    positions' gradients stacked (all_gather), the whole gradient every
    rank's partial product needs."""
    input = _tensor(input)
    return _node(_reduce_scatter_sequence(input.data, group, algorithm,
                                          "reduce_scatter_to_sequence_parallel_region"),
                 input, lambda grad: _all_gather_sequence(grad, group, algorithm),
                 "reduce_scatter_to_sequence_parallel_region")


