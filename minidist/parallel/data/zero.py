"""ZeRO: shard the model states over the data-parallel ranks (lesson 12).

Plain data parallelism keeps on every rank a full copy of everything the
optimizer touches. For fp32 training with Adam, per parameter:

    weights 4 bytes + gradient 4 bytes + Adam's m and v 8 bytes = 16 bytes

on *every* one of the N ranks: adding ranks adds compute, never memory (the
memory wall). ZeRO (Rajbhandari et al., 2020) notices that each rank only
needs the full copy for a moment, and gives each rank one N-th to own:
stage 1 the optimizer state (4 + 4 + 8/N bytes per parameter), stage 2 the
gradients too (4 + 12/N), stage 3 the weights too (16/N), for a little more
traffic than DDP's 2 (N-1)/N P bytes sent per rank and step at stage 1 and
stage 3, 3 (N-1)/N P each (:mod:`minidist.parallel.data.costs` has the
table and its formulas). Stage 1 here sits beside
:class:`DistributedDataParallel`, whose full all_reduce it keeps, as torch's
``ZeroRedundancyOptimizer`` does, so it adds an all_gather of the weights;
stage 3 gathers every layer's weights twice, for forward and again for
backward: 1.5 times DDP's volume.

Stage 1 is :class:`ZeroRedundancyOptimizer`, public collectives only: it
wraps an optimizer class. The parameters become views into one flat buffer,
padded to a multiple of N; rank r builds the inner optimizer on its slice
only (so its state, e.g. Adam's moments, covers one N-th), updates that
slice after DDP's all_reduce, and all_gathers the buffer so every replica
holds the new weights. Stages 2 and 3 shard the gradients and the weights
too: :mod:`minidist.parallel.data.fsdp`, on the same flat shard
(``_FlatShard``), one per layer; :mod:`minidist.parallel.data.zero_stages`
builds any stage by number; :mod:`minidist.parallel.data.costs` has the
formulas.

The padding is zeros with zero gradient: SGD's and Adam's updates leave it
zero, and unpacking copies only the real elements into the model.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist.distributed.device_mesh import as_group
from minidist.parallel.data.costs import _padded
from minidist.tensor import Tensor, no_grad

# --------------------------------------------------------------------------- formulas


# --------------------------------------------------------------------------- flat buffers


class _FlatShard:
    """Parameters laid out one after the other in a flat buffer padded to a
    multiple of N; rank r owns elements ``[r * shard, (r + 1) * shard)``."""

    def __init__(self, parameters, rank: int, world_size: int):
        self.parameters = list(parameters)
        self.dtype = self.parameters[0].data.dtype
        self.numel = sum(p.data.size for p in self.parameters)
        self.padded = _padded(self.numel, world_size)
        self.shard = self.padded // world_size
        self.lo, self.hi = rank * self.shard, (rank + 1) * self.shard
        self.shapes = [p.data.shape for p in self.parameters]   # kept: stage 3 frees .data
        self.offsets = []
        offset = 0
        for param in self.parameters:
            self.offsets.append(offset)
            offset += param.data.size

    def pack(self, arrays, out: np.ndarray) -> np.ndarray:
        for array, offset in zip(arrays, self.offsets):
            out[offset:offset + array.size] = array.reshape(-1)
        out[self.numel:] = 0
        return out

    def pack_slice(self, arrays, out: np.ndarray) -> np.ndarray:
        """Copy only this rank's slice ``[lo, hi)`` of the packed ``arrays`` into
        ``out`` (zeros where the slice covers padding): no full-size scratch."""
        out[...] = 0
        for array, offset in zip(arrays, self.offsets):
            start, end = max(offset, self.lo), min(offset + array.size, self.hi)
            if start < end:
                out[start - self.lo:end - self.lo] = array.reshape(-1)[start - offset:end - offset]
        return out

    def views(self, flat: np.ndarray):
        """One view of ``flat`` per parameter, in its shape: the padding is in none."""
        return [flat[offset:offset + int(np.prod(shape))].reshape(shape)
                for shape, offset in zip(self.shapes, self.offsets)]


# --------------------------------------------------------------------------- stage 1


class ZeroRedundancyOptimizer:
    """``ZeroRedundancyOptimizer(params, optimizer_class, process_group=None, **defaults)``:
    ZeRO stage 1, used beside :class:`DistributedDataParallel`::

        ddp = DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optim.Adam, lr=0.01)
        for x, y in batches:
            optimizer.zero_grad(set_to_none=False)
            loss_fn(ddp(Tensor(x)), y).backward()     # DDP all_reduces the gradients
            optimizer.step()                          # my slice, then all_gather

    The parameters are rebound to views into one flat buffer (padded with
    zeros to a multiple of N); ``self.optimizer``, an ``optimizer_class``, is
    built on one Tensor that is a view of this rank's slice of it. ``step()``
    copies the (all-reduced) gradients of the slice into that Tensor's
    ``.grad``, lets the inner optimizer update the slice in place, and
    all_gathers the buffer: every rank ends with the same weights, and each
    holds the optimizer state of its slice alone. Every parameter must have a
    gradient at ``step()``.

    ``params`` may be param-group dicts, as for any torch optimizer
    (``[{"params": weights, "weight_decay": 1e-4}, {"params": biases}]``):
    the flat buffer lays the groups out one after the other, and the inner
    optimizer gets one group per group, holding the part of this rank's
    slice that falls in it, with its hyper-parameters. (A checkpoint of it is
    saved with one group only.)
    """

    def __init__(self, params, optimizer_class, process_group=None, algorithm: str = "auto",
                 **defaults):
        if "group" in defaults:
            raise TypeError("ZeroRedundancyOptimizer takes the group as process_group= "
                            "(torch's name), not group=")
        group = as_group(process_group, "ZeroRedundancyOptimizer")
        groups = _param_groups(params)
        params = [p for each in groups for p in each["params"]]
        if not params:
            raise ValueError("ZeroRedundancyOptimizer: no parameter that requires a gradient")
        if len({p.data.dtype for p in params}) > 1:
            raise TypeError("ZeroRedundancyOptimizer: the parameters have several dtypes; "
                            "convert the model to one first")
        self.group = group
        self.algorithm = algorithm
        self.rank = dist.get_rank() if group is None else group.rank
        self.world_size = dist.get_world_size() if group is None else group.size
        self.layout = _FlatShard(params, self.rank, self.world_size)
        self.flat = self.layout.pack([p.data for p in params],
                                     np.empty(self.layout.padded, self.layout.dtype))
        for param, view in zip(params, self.layout.views(self.flat)):
            param.data = view
        self.shard = Tensor(self.flat[self.layout.lo:self.layout.hi], requires_grad=True)
        self.shard.grad = np.zeros_like(self.shard.data)
        if len(groups) == 1:
            self.optimizer = optimizer_class([dict(groups[0], params=[self.shard])], **defaults)
        else:
            self.optimizer = optimizer_class(self._pieces(groups), **defaults)

    def _pieces(self, groups) -> list:
        """The inner optimizer's param groups, one per user group (so that
        ``param_groups[i]`` is the user's group i, as in torch, for a
        scheduler to change): each holds the part of this rank's slice that
        falls in the group's parameters, a Tensor viewing the flat buffer,
        whose ``.grad`` views ``shard.grad`` (none where the slice misses the
        group; the padding is in no group and stays zero)."""
        pieces, start = [], 0
        lo, hi = self.layout.lo, self.layout.hi
        for each in groups:
            end = start + sum(p.data.size for p in each["params"])
            first, last = max(start, lo), min(end, hi)
            piece = []
            if first < last:
                tensor = Tensor(self.flat[first:last], requires_grad=True)
                tensor.grad = self.shard.grad[first - lo:last - lo]
                piece.append(tensor)
            pieces.append(dict(each, params=piece))
            start = end
        return pieces

    def track_memory(self, ledger):
        """Register this optimizer's buffers with a :class:`minidist.memory.Ledger`
        as ``buffers``: the flat weights (the parameters are views into it, so
        it adds only the padding, already counted with the parameters) and the
        slice's gradient, ``shard.grad``, which the formula does not count:
        the all-reduced gradient of my slice is copied there for the inner
        optimizer, 4 / N bytes per parameter beside DDP's full buckets."""
        ledger.track("buffers", self.flat)
        ledger.track("buffers", self.shard.grad)
        return ledger

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.layout.parameters:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad[...] = 0

    def step(self) -> None:
        for param in self.layout.parameters:
            if param.grad is None:
                raise RuntimeError(f"rank {self.rank}: ZeroRedundancyOptimizer.step(): a "
                                   f"parameter of shape {param.data.shape} has no gradient")
        self.layout.pack_slice([p.grad for p in self.layout.parameters], self.shard.grad)
        with no_grad():
            self.optimizer.step()
        dist.all_gather_into_tensor(self.flat, self.shard.data.copy(), group=self.group,
                                    algorithm=self.algorithm)


def _param_groups(params) -> list[dict]:
    """``params`` as torch's optimizers take them (Tensors, or param-group
    dicts ``{"params": [...], "lr": ...}``) as a list of groups, each keeping
    its own hyper-parameters and only the parameters that require a gradient."""
    if isinstance(params, Tensor):
        params = [params]
    elif isinstance(params, dict):
        params = [params]
    params = list(params)
    if not params or not isinstance(params[0], dict):
        return [{"params": [p for p in params if _needs_update(p)]}]
    groups = []
    for index, each in enumerate(params):
        if not isinstance(each, dict) or "params" not in each:
            raise TypeError(f"ZeroRedundancyOptimizer: param group {index} is "
                            f"{type(each).__name__}, not a dict with a 'params' key; pass "
                            "Tensors, or dicts like {'params': [...], 'lr': 0.1}, not both")
        members = each["params"]
        members = [members] if isinstance(members, Tensor) else list(members)
        groups.append(dict(each, params=[p for p in members if _needs_update(p)]))
    return groups


def _needs_update(param) -> bool:
    if not isinstance(param, Tensor):
        raise TypeError(f"ZeroRedundancyOptimizer updates minidist Tensors, got "
                        f"{type(param).__name__}")
    return param.requires_grad


# --------------------------------------------------------------------------- stages 2 and 3


# --------------------------------------------------------------------------- one call per stage


