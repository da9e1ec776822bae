"""ZeRO: shard the model states over the data-parallel ranks (course topic 20).

Plain data parallelism keeps on every rank a full copy of everything the
optimizer touches. For fp32 training with Adam, per parameter:

    weights 4 bytes + gradient 4 bytes + Adam's m and v 8 bytes = 16 bytes

on *every* one of the N ranks: adding ranks adds compute, never memory (the
memory wall). ZeRO (Rajbhandari et al., 2020) notices that each rank only
needs the full copy for a moment, and gives each rank one N-th to own:

====================  ==========================  ===========================
stage                 bytes per parameter, rank   bytes each rank sends/step
====================  ==========================  ===========================
DDP                   4 + 4 + 8 = 16              all_reduce 2 (N-1)/N P
1 optimizer state     4 + 4 + 8/N                 all_reduce + all_gather 3 (N-1)/N P
2 + gradients         4 + (4 + 8)/N               reduce_scatter + all_gather 2 (N-1)/N P
3 + parameters        16/N                        2 all_gathers + reduce_scatter 3 (N-1)/N P
====================  ==========================  ===========================

(P: the model's bytes, padded up to a multiple of N; "sends" counts the ring
algorithms. Stage 1 here sits beside :class:`DistributedDataParallel`, whose
full all_reduce it keeps, as torch's ``ZeroRedundancyOptimizer`` does, so it
adds an all_gather of the weights; stage 3 gathers every layer's weights twice,
for forward and again for backward: 1.5 times DDP's volume.)
:func:`zero_model_state_bytes` and :func:`zero_bytes_per_step` are these
formulas; the tests compare the second with the trace.

Three classes, public collectives only:

* :class:`ZeroRedundancyOptimizer` (stage 1): wraps an optimizer class. The
  parameters become views into one flat buffer, padded to a multiple of N;
  rank r builds the inner optimizer on its slice only (so its state, e.g.
  Adam's moments, covers one N-th), updates that slice after DDP's all_reduce,
  and all_gathers the buffer so every replica holds the new weights.
* :class:`FullyShardedDataParallel` ``(sharding_strategy="SHARD_GRAD_OP")`` (stage 2): as
  torch's FSDP, ``fsdp.parameters()`` are the *shards* (one flat slice per
  layer), the optimizer is built on them. In backward, as soon as a layer's
  gradients are complete, they are packed and reduce_scattered: each rank
  receives the summed gradient of its slice only, and the full gradients are
  dropped. Before each layer's forward its weights are all_gathered from the
  shards the optimizer updated.
* ``FullyShardedDataParallel(..., sharding_strategy="FULL_SHARD")`` (stage 3): the layers' full
  weights exist only around their use: all_gathered before the layer's
  forward, freed after it, all_gathered again just before the layer's
  backward, freed after its gradients were reduce_scattered.

All of it hangs on hooks, as in torch, and no layer is changed: a forward
pre-hook on each layer gathers, a forward hook frees (FULL_SHARD) and puts a
hook on the gradient of the layer's output, which gathers again when that
gradient is complete, just before the layer's backward runs (torch's FSDP
does the same, ``_register_pre_backward_hooks``; a full backward pre-hook
would work too, but adds an identity node to the graph per layer), and each
parameter's post-accumulate-grad hook counts the layer's gradients in and
reduce_scatters them.

The padding is zeros with zero gradient: SGD's and Adam's updates leave it
zero, and unpacking copies only the real elements into the model.

Freeing, and a NumPy detail. A freed parameter's ``.data`` is a
:class:`FreedParameter`: an empty array (no storage, as torch's FSDP
resizes the storage to 0) that raises a clear error when anything computes
with it or reads its shape. But minidist's layers keep the arrays their
backward needs in the autograd closure (``Linear`` keeps ``W``), and NumPy
cannot release memory a view still points at: the freed full weights stay
alive in that closure until the layer's backward has run, and the backward
gather refills that same array. So stage 3's peak here holds a full-size copy
of the layers between forward and backward; torch frees it.
"""

from __future__ import annotations

import enum

import numpy as np

import minidist.distributed as dist
from minidist import nn
from minidist.distributed.device_mesh import as_group
from minidist.parallel.data_parallel import (
    DistributedDataParallel,
    _check_model,
    _local_count,
    broadcast_module,
)
from minidist.tensor import Tensor, no_grad


class ShardingStrategy(str, enum.Enum):
    """FSDP's sharding strategies, torch's names (``torch.distributed.fsdp.ShardingStrategy``).

    A ``str`` enum, so the strings ``"FULL_SHARD"``, ... are the same thing.

    * ``FULL_SHARD``: ZeRO stage 3, weights, gradients and optimizer state sharded;
    * ``SHARD_GRAD_OP``: ZeRO stage 2, the weights kept whole between forward and backward;
    * ``NO_SHARD``: nothing sharded, gradients all-reduced: DDP's computation;
    * ``HYBRID_SHARD``: torch's shard-within-a-node, replicate-across; not
      implemented here (FullyShardedDataParallel refuses it).
    """

    FULL_SHARD = "FULL_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"
    HYBRID_SHARD = "HYBRID_SHARD"


STRATEGIES = ("SHARD_GRAD_OP", "FULL_SHARD", "NO_SHARD")


def _strategy(value) -> ShardingStrategy:
    """``value`` (a ShardingStrategy or its name) as a ShardingStrategy, or a clear error."""
    if value is None:
        return ShardingStrategy.FULL_SHARD   # torch's default
    try:
        strategy = ShardingStrategy(value.name if isinstance(value, enum.Enum) else value)
    except ValueError:
        strategy = None
    if strategy is None or strategy is ShardingStrategy.HYBRID_SHARD:
        what = "is not implemented here" if strategy is not None else "is not one"
        raise ValueError(f"FullyShardedDataParallel: sharding_strategy {value!r} {what}; "
                         f"choose ShardingStrategy.FULL_SHARD, SHARD_GRAD_OP or NO_SHARD "
                         "(or their names as strings)")
    return strategy

# --------------------------------------------------------------------------- formulas


def _padded(numel: int, world_size: int) -> int:
    return -(-numel // world_size) * world_size


def zero_model_state_bytes(num_parameters: int, world_size: int, stage: int,
                           buffers: int = 0) -> float:
    """Bytes of model states per rank for fp32 training with Adam (4-byte
    weights, 4-byte gradients, two 4-byte moments), ``buffers`` bytes added::

        stage 0 (DDP):  16 psi
        stage 1:        (4 + 4 + 8 / N) psi         optimizer state sharded
        stage 2:        (4 + (4 + 8) / N) psi       + gradients sharded
        stage 3:        16 / N psi                  + parameters sharded

    (``psi`` parameters, N ranks; the padding to a multiple of N left out.)
    """
    psi, n = num_parameters, world_size
    if stage not in (0, 1, 2, 3) or n < 1:
        raise ValueError(f"zero_model_state_bytes: stage in 0..3 and world_size >= 1, "
                         f"got stage={stage!r}, world_size={world_size!r}")
    per_parameter = {0: 16, 1: 4 + 4 + 8 / n, 2: 4 + 12 / n, 3: 16 / n}[stage]
    return per_parameter * psi + buffers


def zero_bytes_per_step(numels, world_size: int, stage: int, itemsize: int = 4) -> dict:
    """Bytes one rank sends per training step, by collective, with the ring
    algorithms: ``{"all_reduce": ..., "reduce_scatter": ..., "all_gather": ...}``.

    ``numels``: the element count of each flat buffer (an int for one: stage 1's
    buffer; a list for FSDP's one buffer per layer), each padded up to a multiple
    of N: ``P = itemsize * sum(padded)``. A ring reduce_scatter or all_gather
    sends ``(N - 1) / N P``, a ring all_reduce (the two in a row) ``2 (N - 1) / N P``::

        stage 0 (DDP):  all_reduce 2 (N-1)/N P
        stage 1:        all_reduce 2 (N-1)/N P (DDP's) + all_gather (N-1)/N P
        stage 2:        reduce_scatter (N-1)/N P + all_gather (N-1)/N P
        stage 3:        reduce_scatter (N-1)/N P + all_gather 2 (N-1)/N P

    Stage 3 moves 1.5 times what DDP does; stages 1 and 2 the same (stage 1 as
    here, beside a full all_reduce: 1.5 times). The example count every step
    all-reduces (8 bytes) is left out.
    """
    if isinstance(numels, (int, np.integer)):
        numels = [numels]
    n = world_size
    one = sum(_padded(int(m), n) for m in numels) * itemsize * (n - 1) // n
    table = {0: (2, 0, 0), 1: (2, 0, 1), 2: (0, 1, 1), 3: (0, 1, 2)}
    if stage not in table:
        raise ValueError(f"zero_bytes_per_step: stage in 0..3, got {stage!r}")
    all_reduce, reduce_scatter, all_gather = table[stage]
    return {"all_reduce": all_reduce * one, "reduce_scatter": reduce_scatter * one,
            "all_gather": all_gather * one}


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


class FreedParameter(np.ndarray):
    """What a FULL_SHARD layer's parameter holds while its full weights are
    freed: an empty array (no bytes: a memory ledger counts none) that refuses
    to be computed with, read or shaped, with an error that says why, where
    torch's FSDP reports a tensor whose storage was freed. Build with
    :func:`freed_parameter`."""

    _ALLOWED = frozenset(("nbytes", "size", "base", "dtype", "itemsize", "ndim", "what",
                          "__class__", "__dict__", "__array_finalize__", "__repr__"))

    def __getattribute__(self, name):
        if name in FreedParameter._ALLOWED:
            return super().__getattribute__(name)
        raise FreedParameter._error(self, f"reading .{name} of")

    def _error(self, action):
        return RuntimeError(
            f"{action} {object.__getattribute__(self, 'what')}, whose full weights are freed: "
            "FullyShardedDataParallel (FULL_SHARD) keeps only this rank's shard between uses "
            "and gathers the layer in its forward pre-hook; call the layer (or the wrapper), "
            "or read fsdp.full_weights()")

    def __getitem__(self, key):
        raise FreedParameter._error(self, "indexing")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        raise FreedParameter._error(self, f"computing {ufunc.__name__} with")

    def __array_function__(self, function, types, args, kwargs):
        raise FreedParameter._error(self, f"calling {function.__name__} on")

    def __repr__(self):
        return f"FreedParameter({object.__getattribute__(self, 'what')})"


def freed_parameter(what: str, dtype) -> FreedParameter:
    freed = np.empty(0, dtype).view(FreedParameter)
    freed.__dict__["what"] = what
    return freed


class _Unit:
    """One layer's (a module owning parameters) flat buffer and shard."""

    def __init__(self, module, parameters, rank, world_size, keep_full: bool):
        self.module = module
        self.layout = _FlatShard(parameters, rank, world_size)
        full = self.layout.pack([p.data for p in parameters],
                                np.empty(self.layout.padded, self.layout.dtype))
        mine = full[self.layout.lo:self.layout.hi]
        # SHARD_GRAD_OP keeps the full weights: the shard is a view into them
        # (gathered in place). FULL_SHARD keeps the shard alone.
        self.shard = Tensor(mine if keep_full else mine.copy(), requires_grad=True)
        self.full = full if keep_full else None     # the gathered weights, while they exist
        names = {id(p): name for name, p in module.named_parameters(recurse=False)}
        self.names = [f"{type(module).__name__}.{names[id(p)]}" for p in parameters]
        self.pending = len(parameters)


class FullyShardedDataParallel(nn.Module):
    """``FullyShardedDataParallel(module, process_group=None, sharding_strategy=FULL_SHARD)``:
    ZeRO stage 2 (``ShardingStrategy.SHARD_GRAD_OP``) or 3 (``FULL_SHARD``), or
    nothing sharded (``NO_SHARD``: DDP's computation), torch FSDP style::

        fsdp = FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
        optimizer = optim.Adam(fsdp.parameters(), lr=0.01)     # the shards
        for x, y in batches:
            optimizer.zero_grad()
            loss_fn(fsdp(Tensor(x)), y).backward()
            optimizer.step()

    Every module that owns parameters (a layer) is one unit with its own flat
    buffer, padded to a multiple of N; ``parameters()`` gives one shard per
    unit, this rank's slice, and the optimizer's state covers the shards only.
    Rank 0's weights are broadcast at construction, then sharded.

    * forward of a unit (its forward pre-hook): all_gather its weights from
      the shards (so the optimizer's updates arrive) and point the layer's
      parameters at them; FULL_SHARD frees them after (its forward hook), and
      hooks the output's gradient to all_gather them again first in backward;
    * backward (the parameters' post-accumulate-grad hooks): once the unit's
      gradients are complete they are packed, scaled by this rank's example
      count and reduce_scattered into the shard's ``.grad`` (added to it, so
      gradients accumulate as usual); the full gradients are dropped. The
      summed example count (all-reduced in forward) divides, exactly as
      :class:`DistributedDataParallel` averages.

    ``NO_SHARD``: each unit's shard is its whole flat buffer on every rank,
    no gather before forward, and the gradients are all-reduced (scaled by
    the example counts, as DDP) instead of reduce_scattered: what DDP
    computes, bit for bit on two ranks (per layer rather than per bucket).

    Every parameter must receive a gradient in every backward.
    """

    def __init__(self, module: nn.Module, process_group=None, sharding_strategy=None, *,
                 algorithm: str = "auto", device_mesh=None):
        super().__init__()
        _check_model(module, "FullyShardedDataParallel")
        process_group = as_group(process_group, "FullyShardedDataParallel",
                                 device_mesh=device_mesh)
        self.module = module
        self._strategy = _strategy(sharding_strategy)
        self._group = process_group
        self._algorithm = algorithm
        self._rank = dist.get_rank() if process_group is None else process_group.rank
        self._world_size = (dist.get_world_size() if process_group is None
                            else process_group.size)
        self._total = None
        self._ledgers = []
        broadcast_module(module, src=0, group=process_group)
        # NO_SHARD: one "shard" per unit, the whole buffer (a world of one's layout).
        rank, shards = (self._rank, self._world_size) if self.sharded else (0, 1)
        self._units = []
        for layer in module.modules():
            own = [p for p in layer.parameters(recurse=False) if p.requires_grad]
            if own:
                self._units.append(_Unit(layer, own, rank, shards,
                                         keep_full=not self.reshard_after_forward))
        for unit in self._units:
            unit.module.register_forward_pre_hook(
                lambda layer, args, unit=unit: self._gather(unit))
            if self.reshard_after_forward:
                unit.module.register_forward_hook(
                    lambda layer, args, output, unit=unit: self._reshard(unit, output))
            for param in unit.layout.parameters:
                param.register_post_accumulate_grad_hook(
                    lambda tensor, unit=unit: self._gradient_ready(unit))
            if self.reshard_after_forward:
                self._free(unit)

    def track_memory(self, ledger):
        """Register this wrapper's buffers with a :class:`minidist.memory.Ledger`
        as ``buffers`` from now on: each unit's gathered full weights (SHARD_GRAD_OP
        keeps them, and the shards are views into them, so they are already
        ``parameters``; FULL_SHARD gathers them per layer, and they stay alive
        in the autograd graph from a layer's forward to its backward, as the
        module docstring says: a full-size copy per layer the formula does not
        count) and the full gradient of a layer from its pack to its
        reduce_scatter."""
        self._ledgers.append(ledger)
        for unit in self._units:
            if unit.full is not None:
                ledger.track("buffers", unit.full)
        return ledger

    def _track(self, array) -> None:
        for ledger in self._ledgers:
            ledger.track("buffers", array)

    @property
    def sharding_strategy(self) -> ShardingStrategy:
        return self._strategy

    @property
    def reshard_after_forward(self) -> bool:
        return self._strategy is ShardingStrategy.FULL_SHARD

    @property
    def sharded(self) -> bool:
        """Whether each rank keeps one N-th of the weights (not NO_SHARD)."""
        return self._strategy is not ShardingStrategy.NO_SHARD

    @property
    def shards(self) -> list:
        return [unit.shard for unit in self._units]

    @property
    def units(self) -> list:
        """The modules whose parameters are gathered and sharded together."""
        return [unit.module for unit in self._units]

    def parameters(self, recurse: bool = True):
        return iter(self.shards)

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        for index, shard in enumerate(self.shards):
            yield f"{prefix}{'.' if prefix else ''}shard{index}", shard

    def full_weights(self) -> list:
        """Every parameter of the module, gathered (a collective: all ranks call it)."""
        out = []
        for unit in self._units:
            if not self.sharded:
                out.extend(view.copy() for view in unit.layout.views(unit.shard.data))
                continue
            full = np.empty(unit.layout.padded, unit.layout.dtype)
            dist.all_gather_into_tensor(full, unit.shard.data, group=self._group,
                                        algorithm=self._algorithm)
            out.extend(view.copy() for view in unit.layout.views(full))
        return out

    # -- gathering and freeing (the hooks) ----------------------------------
    def _gather(self, unit, into=None) -> None:
        """All_gather the unit's full weights (into ``into``, the kept ones,
        or a new array) and point the layer's parameters at them."""
        if into is None:
            into = unit.full
        full = np.empty(unit.layout.padded, unit.layout.dtype) if into is None else into
        if self.sharded:
            # The shard may be a view into ``full``: send a copy of it.
            dist.all_gather_into_tensor(full, unit.shard.data.copy(), group=self._group,
                                        algorithm=self._algorithm)
        if full is not into:
            self._track(full)
        unit.full = full
        for param, view in zip(unit.layout.parameters, unit.layout.views(full)):
            param.data = view

    def _free(self, unit) -> None:
        """Drop the unit's full weights: the parameters hold FreedParameters."""
        unit.full = None
        for param, name in zip(unit.layout.parameters, unit.names):
            param.data = freed_parameter(name, unit.layout.dtype)

    def _reshard(self, unit, output) -> None:
        """FULL_SHARD's forward hook: free the weights; gather them again
        into the same array (which the layer's backward closure reads) when
        the output's gradient is complete, just before the layer's backward."""
        weights = unit.full
        self._free(unit)
        if isinstance(output, Tensor) and output.requires_grad:
            output.register_hook(lambda grad: self._gather(unit, into=weights))

    # -- forward ----------------------------------------------------------
    def forward(self, *args, batch_size: int | None = None, **kwargs):
        if batch_size is None:
            if not args or not hasattr(args[0], "shape") or len(args[0].shape) == 0:
                raise ValueError(f"rank {self._rank}: FullyShardedDataParallel could not read "
                                 "the batch size from the first argument; pass batch_size=")
            batch_size = args[0].shape[0]
        count = _local_count(batch_size, self._rank, "FullyShardedDataParallel")
        total = np.array([count], np.int64)
        dist.all_reduce(total, group=self._group)
        if int(total[0]) == 0:
            raise ValueError("FullyShardedDataParallel: no rank had any example in this step")
        self._count = count
        self._total = int(total[0])
        for unit in self._units:
            unit.pending = len(unit.layout.parameters)
        return self.module(*args, **kwargs)

    # -- backward ---------------------------------------------------------
    def _gradient_ready(self, unit) -> None:
        unit.pending -= 1
        if unit.pending:
            return
        unit.pending = len(unit.layout.parameters)
        layout = unit.layout
        # The layer's full gradient lives only from here to the reduce_scatter.
        gradient = layout.pack([p.grad for p in layout.parameters],
                               np.empty(layout.padded, layout.dtype))
        self._track(gradient)
        mine = np.empty(layout.shard, layout.dtype)
        if self._world_size == 1:       # as DDP: nothing to average, no rounding added
            mine[...] = gradient
        elif not self.sharded:          # NO_SHARD: DDP's all-reduce, scaled as DDP scales
            gradient *= layout.dtype.type(self._count)
            dist.all_reduce(gradient, group=self._group, algorithm=self._algorithm)
            mine[...] = gradient
            mine /= layout.dtype.type(self._total)
        else:
            gradient *= layout.dtype.type(self._count)
            dist.reduce_scatter_tensor(mine, gradient, group=self._group,
                                       algorithm=self._algorithm)
            mine /= layout.dtype.type(self._total)
        del gradient
        if unit.shard.grad is None:
            unit.shard.grad = mine
        else:
            unit.shard.grad += mine
        for param in layout.parameters:
            param.grad = None
        if self.reshard_after_forward:
            self._free(unit)


# --------------------------------------------------------------------------- one call per stage

STAGES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def wrap(model, stage: int, optimizer_class, *, group=None, algorithm: str = "auto",
         **defaults):
    """``(the module to call, its optimizer)`` for ZeRO ``stage`` (0: plain
    DDP), the way the lesson, the demo and the benchmark compare them:

    * 0: ``DistributedDataParallel`` + ``optimizer_class`` on every parameter;
    * 1: ``DistributedDataParallel`` + ``ZeroRedundancyOptimizer``;
    * 2, 3: ``FullyShardedDataParallel`` (``SHARD_GRAD_OP``, ``FULL_SHARD``)
      + ``optimizer_class`` on its shards.

    ``defaults`` go to the optimizer (``lr=...``)."""
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be 0 (plain DDP), 1, 2 or 3, got {stage!r}")
    group = as_group(group, "wrap")
    if stage in (0, 1):
        wrapped = DistributedDataParallel(model, process_group=group, algorithm=algorithm)
        if stage == 0:
            return wrapped, optimizer_class(wrapped.parameters(), **defaults)
        return wrapped, ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class,
                                                process_group=group, algorithm=algorithm,
                                                **defaults)
    strategy = ShardingStrategy.SHARD_GRAD_OP if stage == 2 else ShardingStrategy.FULL_SHARD
    wrapped = FullyShardedDataParallel(model, process_group=group, sharding_strategy=strategy,
                                       algorithm=algorithm)
    return wrapped, optimizer_class(wrapped.parameters(), **defaults)
