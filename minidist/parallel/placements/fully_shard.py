"""FSDP2: ``fully_shard``, torch's ``torch.distributed.fsdp.fully_shard`` (torch 2.6+).

Read :mod:`.fsdp_params` (the shards and the unit's two collectives) and
:mod:`.fsdp_state` (the hooks) first; this is the API that puts them on a
module. Applied bottom-up, as torch users do::

    model = GPT(config, rng=0)                  # the same weights on every rank
    for block in model.transformer.h:
        fully_shard(block)                      # a unit per block
    fully_shard(model)                          # the root: embeddings, ln_f, lm_head
    optimizer = optim.AdamW(model.parameters(), lr=1e-3)   # the Shard(0) DTensors
    for x, y in batches:                        # this rank's slice of each batch
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

``fully_shard(module)`` changes ``module`` in place and returns it: its class
becomes ``FSDP<Class>``, a subclass of :class:`FSDPModule` and of its class
(torch's trick), and each parameter it holds that no inner ``fully_shard``
already took becomes a ``Shard(0)`` :class:`DTensorParameter` (a unit's
parameters, :mod:`.fsdp_params`). A parameter tied between layers (the GPT's
``lm_head.weight`` is ``wte.weight``) is one parameter of the unit that holds
every layer using it (the root, above: its forward runs around both uses);
shard a layer holding it by itself and the other layer would keep the
unsharded original, so ``fully_shard`` refuses that, naming both.

Against FSDP1 (:class:`minidist.parallel.FullyShardedDataParallel`, a
wrapper over flat, padded buffers): the module stays itself, ``parameters()``
are per-parameter DTensors that say their layout (torch.chunk's pieces, a
rank may hold none), and the state dict holds them; the messages are
FSDP1's three per unit (all_gather, all_gather again in backward,
reduce_scatter; the root's second all_gather is saved, its weights kept from
its forward to its backward), padded per parameter rather than per flat
buffer, and a unit is what ``fully_shard`` was applied to (a block), not
every layer. The data-parallel average is the ranks' mean, as torch's
(each rank's loss a mean over an equal share of the batch).

What minidist supports of torch's arguments: ``mesh`` (1-D, or 2-D
``(replicate, shard)`` for HSDP), ``reshard_after_forward`` True or False
(torch's int, resharding to a smaller world, is refused), ``mp_policy``
(:class:`MixedPrecisionPolicy`); ``shard_placement_fn``, ``offload_policy``
and ``ignored_params`` are refused. ``algorithm=`` (minidist's) picks the
collectives' algorithm.

Cost: building sends nothing (each rank cuts its own weights); per step the
messages of :mod:`.fsdp_state`.
"""

from __future__ import annotations

import weakref

import minidist.distributed as dist
from minidist import nn
from minidist.distributed.device_mesh import DeviceMesh, init_device_mesh
from minidist.distributed.tensor import DTensor
from minidist.parallel.placements.fsdp_params import FSDPParam, FSDPParamGroup
from minidist.parallel.placements.fsdp_state import FSDPState
from minidist.parallel.placements.mixed_precision_policy import MixedPrecisionPolicy

#: id(original Parameter) -> (weak reference to it, the unit that sharded it):
#: a tie that a later fully_shard finds outside the unit is refused.
_SHARDED_ORIGINALS: dict = {}


class UnshardHandle:
    """What ``unshard(async_op=True)`` returns: ``wait()`` finishes the all_gather."""

    def __init__(self, group):
        self._group = group

    def wait(self) -> None:
        if self._group is not None:
            self._group.wait_for_unshard()


class FSDPModule:
    """What ``fully_shard`` makes a module (its class becomes a subclass of
    this and of its own): the methods torch's ``FSDPModule`` has."""

    @property
    def _state(self) -> FSDPState:
        return self.__dict__["_fsdp_state"]

    def _states(self, recurse: bool):
        if not recurse:
            return [self._state]
        return [m.__dict__["_fsdp_state"] for m in self.modules() if "_fsdp_state" in m.__dict__]

    def unshard(self, async_op: bool = False):
        """All_gather this module's parameters and register them unsharded
        (until :meth:`reshard` or its forward hook reshards); with
        ``async_op=True`` return a handle to ``wait()`` on."""
        group = self._state.group
        if group is not None:
            group.unshard(async_op=async_op)
        return UnshardHandle(group) if async_op else None

    def reshard(self) -> None:
        """Register the shards again and drop the unsharded weights."""
        if self._state.group is not None:
            self._state.group.reshard(keep_arrays=False)

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *,
                                   recurse: bool = True) -> None:
        """False: backward leaves the full gradients on the unsharded
        Parameters (accumulating, no message) until a backward with True
        reduces them all at once: k micro-batches, then one step, train as
        one batch k times as large does."""
        for state in self._states(recurse):
            state.requires_gradient_sync = bool(requires_gradient_sync)

    def set_reshard_after_forward(self, reshard_after_forward: bool,
                                  recurse: bool = True) -> None:
        """Change ``reshard_after_forward`` (the root's is never resharded after forward)."""
        for state in self._states(recurse):
            state.reshard_after_forward = _check_reshard(reshard_after_forward)

    def set_reshard_after_backward(self, reshard_after_backward: bool, *,
                                   recurse: bool = True) -> None:
        """False: keep the unsharded weights after backward (with gradient
        accumulation, the next micro-batch's forward gathers nothing; the
        optimizer's step then updates the shards only: reshard() before the
        next forward, or the weights it uses are the old ones)."""
        for state in self._states(recurse):
            state.reshard_after_backward = bool(reshard_after_backward)

    def set_modules_to_forward_prefetch(self, modules) -> None:
        """Start these FSDP modules' all_gathers in this module's forward pre-hook."""
        self._state.forward_prefetch = _states_of(modules, "set_modules_to_forward_prefetch")

    def set_modules_to_backward_prefetch(self, modules) -> None:
        """Start these FSDP modules' all_gathers in this module's pre-backward."""
        self._state.backward_prefetch = _states_of(modules, "set_modules_to_backward_prefetch")

    def track_memory(self, ledger):
        """minidist's: count the gathered arrays (the unsharded weights, the
        all_gather's and reduce_scatter's buffers) of every unit under this
        module as a :class:`minidist.memory.Ledger`'s ``buffers``."""
        for state in self._states(recurse=True):
            if state.group is not None:
                state.group.ledgers.append(ledger)
        return ledger


_CLASSES: dict = {}


def _fsdp_class(cls):
    made = _CLASSES.get(cls)
    if made is None:
        made = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
        _CLASSES[cls] = made
    return made


def _states_of(modules, what):
    states = []
    for module in modules:
        if not isinstance(module, FSDPModule):
            raise TypeError(f"{what}: {type(module).__name__} is not an FSDP module; pass "
                            "modules that fully_shard was applied to")
        states.append(module._state)
    return states


def _check_reshard(value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        raise NotImplementedError(
            f"fully_shard(reshard_after_forward={value}): torch's int (reshard to a smaller "
            "world after forward) is not implemented in minidist; pass True (free after "
            "forward, gather again in backward) or False (keep them until after backward)")
    raise TypeError(f"fully_shard: reshard_after_forward is True or False, got {value!r}")


def _managed(module, label=""):
    """``[(name, parameter, [(holder, attribute)])]``: the parameters of
    ``module`` and of its descendants that no inner fully_shard took, each
    once, with every place it is registered (a tied one several). An inner
    unit is an FSDPModule, not walked; a parameter laid out by another
    strategy (a DTensor here, a split layer's piece) is refused."""
    found: dict[int, list] = {}
    stack = [("", module)]
    while stack:
        prefix, layer = stack.pop()
        for attribute, param in layer._parameters.items():
            if param is None:
                continue
            if isinstance(param, DTensor) or getattr(param, "tensor_model_parallel", False):
                _refuse_laid_out(label, prefix + attribute, param)
            entry = found.setdefault(id(param), [prefix + attribute, param, []])
            entry[2].append((layer, attribute))
        children = [(f"{prefix}{name}.", child) for name, child in layer.named_children()
                    if not isinstance(child, FSDPModule)]
        stack.extend(reversed(children))
    return list(found.values())


def _refuse_laid_out(label, where, param) -> None:
    layout = (f"a DTensor laid out {param.placements} on a mesh {param.device_mesh.shape}"
              if isinstance(param, DTensor) else "a split layer's piece (tensor parallel)")
    raise NotImplementedError(
        f"rank {dist.get_rank()}: fully_shard({label}): {where} is already {layout}, by "
        f"parallelize_module or distribute_tensor. FSDP2 over tensor parallelism (torch's 2-D "
        f"dp x tp, which shards the TP shards again) is not supported in minidist, and sharding "
        f"the other parameters only would train wrong. Use fully_shard on a model that is not "
        f"laid out, or tensor parallelism alone with the data-parallel replicas' gradients "
        f"averaged by hand (all_reduce over mesh['dp']), or minidist.parallel.mesh's GPT3D for "
        f"dp x tp")


def _refuse_torn_ties(module, label) -> None:
    for prefix, layer in module.named_modules():
        for attribute, param in layer._parameters.items():
            known = _SHARDED_ORIGINALS.get(id(param))
            if known is not None and known[0]() is param:
                where = f"{prefix}.{attribute}" if prefix else attribute
                raise ValueError(
                    f"rank {dist.get_rank()}: fully_shard({label}): {where} is the Parameter "
                    f"that fully_shard({known[1]}) already sharded (a tied weight, used outside "
                    f"that unit); a tied parameter belongs to one unit around all its uses: do "
                    f"not fully_shard({known[1]}) by itself, let an enclosing module's "
                    "fully_shard take it (the GPT's root takes wte and lm_head)")


def fully_shard(module, *, mesh=None, reshard_after_forward=True, shard_placement_fn=None,
                mp_policy: MixedPrecisionPolicy | None = None, offload_policy=None,
                ignored_params=None, algorithm: str = "auto"):
    """Shard ``module``'s parameters over ``mesh`` (default: every rank, 1-D)
    and gather them around its forward and backward (the module docstring);
    returns the module, now an :class:`FSDPModule`."""
    label = type(module).__name__
    if isinstance(module, (list, tuple)):
        raise NotImplementedError("fully_shard([modules]): minidist takes one module per call; "
                                  "call it on each")
    if not isinstance(module, nn.Module):
        raise TypeError(f"fully_shard: needs a minidist.nn.Module, got {label}")
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard({label}): this module is already sharded; apply "
                         "fully_shard once per module")
    if isinstance(module, nn.ModuleList):
        raise ValueError("fully_shard(ModuleList): a ModuleList has no forward to hook; "
                         "fully_shard its items, or the module that calls them")
    for name, value in (("shard_placement_fn", shard_placement_fn),
                        ("offload_policy", offload_policy), ("ignored_params", ignored_params)):
        if value is not None:
            raise NotImplementedError(f"fully_shard({name}=...): not implemented in minidist; "
                                      "leave it None (every parameter Shard(0), kept here)")
    reshard_after_forward = _check_reshard(reshard_after_forward)
    policy = MixedPrecisionPolicy() if mp_policy is None else mp_policy
    if not isinstance(policy, MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got "
                        f"{type(policy).__name__}")
    if mesh is None:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if not isinstance(mesh, DeviceMesh) or mesh.ndim not in (1, 2):
        raise ValueError(f"fully_shard({label}): mesh must be a 1-D DeviceMesh (shard) or a "
                         "2-D one (replicate, shard) for HSDP, e.g. init_device_mesh('cpu', "
                         f"(2, 2), mesh_dim_names=('replicate', 'shard')); got {mesh!r}")
    _refuse_torn_ties(module, label)
    managed = _managed(module, label)
    params = [FSDPParam(f"{label}.{name}", param, holders, mesh)
              for name, param, holders in managed]
    group = (FSDPParamGroup(params, mesh, policy, algorithm, label) if params else None)
    for _, original, _ in managed:
        _SHARDED_ORIGINALS[id(original)] = (weakref.ref(original), label)
    for p in params:
        p.register(p.sharded)
    state = FSDPState(module, group, mesh, reshard_after_forward, policy, label)
    module.__dict__["_fsdp_state"] = state
    module.register_forward_pre_hook(state.pre_forward, with_kwargs=True)
    module.register_forward_hook(state.post_forward)
    module.__class__ = _fsdp_class(type(module))
    return module
