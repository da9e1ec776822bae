"""Replicas kept in step: the glue every strategy shares.

Whatever a strategy splits, some of its parameters are *replicated*: every
rank of a group holds the same copy (data parallel: all of them; tensor
parallel: the LayerNorms; context and expert parallel: the dense weights;
a pipeline's replicas: each stage's). Two things keep such copies equal,
and every strategy does them the same way:

1. **the same start**: :func:`broadcast_module` copies one rank's weights
   into every rank's model, whatever seed each used;
2. **the same step**: after each backward, every copy's gradient is
   combined over the group (:func:`all_reduce_gradients`), so the optimizer
   takes the same step everywhere.

A strategy then shows only *which* parameters are combined over *which*
group (and whether a sum or a mean): the tensor-parallel GPT sums its
sequence-parallel parameters over ``tp``, the context-parallel GPT sums
everything over ``cp`` and averages over ``dp``, a pipeline weighs each
replica by its examples.

Cost of :func:`all_reduce_gradients`: one all_reduce of the P gradient
values concatenated (on a ring: 2 (n-1)/n P values sent per rank,
2 (n-1) alpha), one copy in and one copy out, where P separate
all_reduces would pay 2 (n-1) alpha each.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.device_mesh import as_group


def broadcast_module(model, src: int | None = None, group=None,
                     group_src: int | None = None) -> None:
    """Copy rank ``src``'s parameters and buffers into ``model`` on every rank of
    ``group`` (in place): all replicas start from the same weights, whatever
    seed each rank used. ``src`` is a global rank and ``group_src`` a rank of
    ``group``, as in ``dist.broadcast``; neither: the group's first rank."""
    group = as_group(group, "broadcast_module")
    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=src, group=group, group_src=group_src)


def all_reduce_gradients(parameters, group=None, *, algorithm: str = "auto",
                         average: bool = False, weight: float | None = None) -> None:
    """Combine the gradients of ``parameters`` over ``group`` (None: the
    world; a 1-D device mesh is taken as its group) in one all_reduce of
    their concatenation, and write each parameter's share back.

    * default: the **sum** over the group's ranks (a parameter that saw only
      its rank's tokens, positions or experts' inputs);
    * ``average=True``: the sum divided by the group's size (each rank's
      gradient a mean over a batch of the same size);
    * ``weight=w``: this rank's gradient counts ``w`` times (its number of
      examples) and the sum is divided by the sum of the weights: the exact
      mean over uneven batches. The weights travel in the same message, one
      value more.

    A parameter without a gradient counts as zeros and leaves with one: all
    ranks must pass the same parameters in the same order (they do, built
    from the same model), and a parameter used on one rank only still ends
    with the group's gradient everywhere. On one rank nothing is sent (a
    weighted mean of one is the gradient itself)."""
    group = as_group(group, "all_reduce_gradients")
    parameters = list(parameters)
    if not parameters or dist.get_world_size(group) == 1:
        return
    dtype = next((p.grad.dtype for p in parameters if p.grad is not None),
                 parameters[0].data.dtype)
    pieces = [np.zeros(p.data.size, dtype) if p.grad is None
              else backend.to_numpy(p.grad).reshape(-1) for p in parameters]
    if weight is not None:
        pieces = [piece * weight for piece in pieces] + [np.array([weight], dtype)]
    flat = np.concatenate(pieces)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, algorithm=algorithm)
    if weight is not None:
        total, flat = flat[-1], flat[:-1]
        if total == 0:
            raise ValueError(f"rank {dist.get_rank()}: all_reduce_gradients: the weights of "
                             "every rank sum to 0 (no replica had an example); give each "
                             "replica at least one example")
        flat = flat / total
    elif average:
        flat /= dist.get_world_size(group)
    offset = 0
    for param in parameters:
        piece = flat[offset:offset + param.data.size].reshape(param.data.shape)
        if param.grad is not None and param.grad.shape == piece.shape \
                and param.grad.dtype == piece.dtype \
                and getattr(getattr(param.grad, "flags", None), "writeable", True):
            param.grad[...] = backend.from_numpy(piece)
        else:
            param.grad = backend.from_numpy(piece.copy())
        offset += param.data.size
