"""FSDP: ZeRO stages 2 and 3 as torch's ``FullyShardedDataParallel`` (lesson 12).

Read :mod:`minidist.parallel.data.zero` first: stage 1 and the flat, padded
shard (``_FlatShard``) this module builds on, one per layer here (a
parameter tied between layers in one of them only:
:mod:`minidist.parallel.data.fsdp_units`).

* ``FullyShardedDataParallel(..., sharding_strategy="SHARD_GRAD_OP")`` (stage
  2): ``fsdp.parameters()`` are the *shards* (one flat slice per layer), the
  optimizer is built on them. In backward, as soon as a layer's gradients are
  complete, they are packed and reduce_scattered: each rank receives the
  summed gradient of its slice only, and the full gradients are dropped.
  Before each layer's forward its weights are all_gathered from the shards
  the optimizer updated.
* ``sharding_strategy="FULL_SHARD"`` (stage 3): the layers' full weights
  exist only around their use: all_gathered before the layer's forward,
  freed after it, all_gathered again just before the layer's backward, freed
  after its gradients were reduce_scattered.
* ``sharding_strategy="NO_SHARD"``: DDP's computation, gradients all-reduced.

All of it hangs on hooks, as in torch, and no layer is changed: a forward
pre-hook on each layer gathers, a forward hook frees (FULL_SHARD) and puts a
hook on the gradient of the layer's output, which gathers again when that
gradient is complete, just before the layer's backward runs (torch's FSDP
does the same, ``_register_pre_backward_hooks``; a full backward pre-hook
would work too, but adds an identity node to the graph per layer), and each
parameter's post-accumulate-grad hook counts the layer's gradients in and
reduce_scatters them. Each rank sends per step (ring algorithms, P the
model's padded bytes): stage 2 a reduce_scatter and an all_gather,
2 (N-1)/N P; stage 3 two all_gathers and a reduce_scatter, 3 (N-1)/N P
(:mod:`minidist.parallel.data.costs`).

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
from minidist.distributed.tensor.grad_norm import SumOver
from minidist.nn.utils import clip_grad as _clip
from minidist.parallel.data.checks import _check_model, _examples_in
from minidist.parallel.data.fsdp_units import units_of
from minidist.parallel.data.zero import _FlatShard
from minidist.parallel.replicas import broadcast_module
from minidist.tensor import Tensor


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
    """One unit's flat buffer and shard: a layer (a module owning parameters), or the
    module around the layers that share a tied parameter (:mod:`.fsdp_units`)."""

    def __init__(self, module, parameters, names, rank, world_size, keep_full: bool):
        self.module = module
        self.layout = _FlatShard(parameters, rank, world_size)
        full = self.layout.pack([p.data for p in parameters],
                                np.empty(self.layout.padded, self.layout.dtype))
        mine = full[self.layout.lo:self.layout.hi]
        # SHARD_GRAD_OP keeps the full weights: the shard is a view into them
        # (gathered in place). FULL_SHARD keeps the shard alone.
        self.shard = Tensor(mine if keep_full else mine.copy(), requires_grad=True)
        self.full = full if keep_full else None     # the gathered weights, while they exist
        self.names = names
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
    buffer, padded to a multiple of N; a parameter tied between layers (a
    GPT's ``lm_head.weight`` is ``wte.weight``) belongs to the module that
    contains them all (:mod:`minidist.parallel.data.fsdp_units`).
    ``parameters()`` gives one shard per unit, this rank's slice, and the
    optimizer's state covers the shards only.
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
        self._syncing = True
        self._ledgers = []
        broadcast_module(module, src=0, group=process_group)
        # NO_SHARD: one "shard" per unit, the whole buffer (a world of one's layout).
        rank, shards = (self._rank, self._world_size) if self.sharded else (0, 1)
        # A tied parameter belongs to one unit, the module around all its uses.
        self._units = [_Unit(layer, own, names, rank, shards,
                             keep_full=not self.reshard_after_forward)
                       for layer, own, names in units_of(module, self._rank)]
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
        """Every parameter of the module that trains, gathered, in the order of
        ``module.parameters()`` (a tied one once). A collective: all ranks call it."""
        gathered = self._gathered_weights()
        return [gathered[id(p)] for p in self.module.parameters() if id(p) in gathered]

    def _gathered_weights(self) -> dict:
        """``{id(parameter): its full weights}`` for every unit's parameters (a
        unit holds a tied parameter out of the module's order)."""
        out = {}
        for unit in self._units:
            if not self.sharded:
                full = unit.shard.data
            else:
                full = np.empty(unit.layout.padded, unit.layout.dtype)
                dist.all_gather_into_tensor(full, unit.shard.data, group=self._group,
                                            algorithm=self._algorithm)
            for param, view in zip(unit.layout.parameters, unit.layout.views(full)):
                out[id(param)] = view.copy()
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
        count = _examples_in(args, batch_size, self._rank, "FullyShardedDataParallel")
        total = np.array([count], np.int64)
        dist.all_reduce(total, group=self._group)
        if int(total[0]) == 0:
            raise ValueError("FullyShardedDataParallel: no rank had any example in this step")
        self._count = count
        self._total = int(total[0])
        for unit in self._units:
            unit.pending = len(unit.layout.parameters)
        return self.module(*args, **kwargs)

    # -- gradient accumulation and clipping -----------------------------------
    class _NoSync:
        def __init__(self, fsdp):
            self.fsdp = fsdp

        def __enter__(self):
            self.previous = self.fsdp._syncing
            self.fsdp._syncing = False
            return self

        def __exit__(self, *exc):
            self.fsdp._syncing = self.previous
            return False

    def no_sync(self):
        """Context manager (torch's): backward inside it leaves each layer's
        full gradients in the layers' parameters, adding up, and communicates
        nothing (forward still all-reduces the example count); the first
        backward after it reduce_scatters the sum into the shards. Costs one
        full gradient's memory per rank, as torch's; without it, gradients
        accumulate too, in the shards, for one reduce_scatter per backward.
        As with DDP, divide each micro-batch's loss by the number of
        micro-batches (exact when each rank's micro-batches are of one size)."""
        return FullyShardedDataParallel._NoSync(self)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0):
        """torch's ``FullyShardedDataParallel.clip_grad_norm_``: the total
        ``norm_type``-norm of the whole model's gradients, each rank's shard's
        term (sum of ``|g|^p``, the padding's zeros adding nothing) summed over
        the group (inf: the max), then every shard's gradient multiplied by
        ``min(max_norm / (norm + 1e-6), 1)``. Returns the norm, a 0-d Tensor,
        the same on every rank; call it after backward, before the step (all
        ranks). NO_SHARD: each rank holds the whole gradient, nothing is sent.
        Cost: one all-reduce of one element. ``minidist.nn.utils.clip_grad_norm_``
        on ``fsdp.parameters()`` would take this rank's shard for the whole
        and give each rank another, wrong norm."""
        how = SumOver([self._group]) if self.sharded else None
        pairs = [(shard.grad, how) for shard in self.shards if shard.grad is not None]
        total = _clip._total_norm(pairs, _clip._norm_type(norm_type), error_if_nonfinite=False)
        _clip.clip_grads_with_norm_(self.shards, max_norm, total)
        return total

    # -- backward ---------------------------------------------------------
    def _gradient_ready(self, unit) -> None:
        unit.pending -= 1
        if unit.pending:
            return
        unit.pending = len(unit.layout.parameters)
        if not self._syncing:
            # no_sync: the full gradients stay in the parameters and add up.
            if self.reshard_after_forward:
                self._free(unit)
            return
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


