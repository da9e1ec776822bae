"""A model's and its optimizers' state under the one-process model's names
(torch's ``torch.distributed.checkpoint.state_dict``).

``get_state_dict(model, optimizer)`` gives two dicts a checkpoint can hold
whatever the parallelism:

* the model's: ``{fqn: tensor}``, the fully qualified names of the model in
  one process (``transformer.h.0.attn.c_attn.weight``); a DTensor parameter
  stays a DTensor of its layout (:meth:`Module.state_dict`).
* the optimizer's, torch's nested form: ``{"state": {fqn: {"step": 3,
  "exp_avg": ..., "exp_avg_sq": ...}}, "param_groups": [{"lr": ...,
  "params": [fqn, ...]}]}``. State is keyed by the parameter's name, not
  its position in the optimizer (positions differ between a pipeline's
  stages, or after a model is wrapped); each state array takes its
  parameter's layout: Adam's moments of a ``Shard(0)`` parameter are
  ``Shard(0)`` DTensors of the same spec. An optimizer that has not stepped
  yet gets its state made first (one step with zero gradients and lr 0, as
  torch's ``_init_optim_state``), so that a fresh model has every key a load
  fills.

``set_state_dict`` puts them back: the model's through ``load_state_dict``
(``strict``), the optimizer's by name into the optimizer's positions.

With ``StateDictOptions(full_state_dict=True)`` every DTensor is gathered
whole (``full_tensor()``, a collective every rank calls) and a whole array
given to ``set_*`` is cut to each rank's box. ``cpu_offload`` changes
nothing here: minidist's arrays live in host memory already, or are copied
there by the checkpoint writer.

Cost: the model's and the optimizer's state copied once (these are
snapshots, as ``Module.state_dict``'s); no message unless
``full_state_dict``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from minidist import backend
from minidist.distributed.tensor import DTensor


@dataclass
class StateDictOptions:
    """torch's options: ``full_state_dict`` (gather DTensors whole),
    ``cpu_offload`` (accepted; the arrays are in host memory), ``strict``
    (missing or unexpected model keys raise), ``ignore_frozen_params``."""

    full_state_dict: bool = False
    cpu_offload: bool = False
    strict: bool = True
    ignore_frozen_params: bool = False
    broadcast_from_rank0: bool = False

    def __post_init__(self):
        if self.broadcast_from_rank0:
            raise NotImplementedError("StateDictOptions(broadcast_from_rank0=True) is not "
                                      "supported in minidist: load on every rank")


def _options(options):
    return StateDictOptions() if options is None else options


def _optimizers(optimizers):
    if optimizers is None:
        return []
    return list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]


def _names(model):
    """``{id(param): fqn}`` (a tied parameter under its first name)."""
    return {id(p): name for name, p in model.named_parameters()}


def _as_layout(array, param):
    """A state array (this rank's piece) in its parameter's layout (a packed
    shard's, which no layout says: the whole, gathered)."""
    whole = getattr(param, "checkpoint_whole", None)
    if whole is not None:
        return whole(array)
    spec = getattr(param, "_spec", None)
    if spec is None:
        return array.copy()
    return DTensor._node(array.copy(), spec, None, None, "")


def _full(value):
    return backend.to_numpy(value.full_tensor().data) if isinstance(value, DTensor) else value


def get_model_state_dict(model, *, submodules=None, options=None) -> dict:
    """``{fqn: tensor}``: the model's parameters and buffers under the names
    of the model in one process, DTensors in their layouts (or gathered whole
    with ``full_state_dict``)."""
    if submodules is not None:
        raise NotImplementedError("get_model_state_dict(submodules=) is deprecated in torch "
                                  "and not supported here")
    options = _options(options)
    state = dict(model.state_dict())
    if options.ignore_frozen_params:
        frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        state = {k: v for k, v in state.items() if k not in frozen}
    if options.full_state_dict:
        state = {k: _full(v) for k, v in state.items()}
    return state


def _init_state(model, optimizer):
    """torch's ``_init_optim_state``: an optimizer without state takes one
    step on zero gradients with lr 0, which makes its state; the weights are
    put back as they were (bit for bit) and the step counts set back to 0."""
    if optimizer.state:
        return
    params = [p for _, p, _ in optimizer._indexed_params()]
    grads = [p.grad for p in params]
    weights = [p.data.copy() for p in params]   # put back after: lr 0 may still move them
    rates = [group["lr"] for group in optimizer.param_groups]   # (LARS: 0 * (|w| / 0) is NaN)
    try:
        for p in params:
            p.grad = backend.of(p.data).zeros_like(p.data)
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        optimizer.step()
    finally:
        for p, g, w in zip(params, grads, weights):
            p.grad = g
            p.data[...] = w
        for group, lr in zip(optimizer.param_groups, rates):
            group["lr"] = lr
    for entries in optimizer.state.values():   # the made-up step is no step
        if "step" in entries:
            entries["step"] = 0


def get_optimizer_state_dict(model, optimizers, *, submodules=None, options=None) -> dict:
    """torch's nested form keyed by parameter name (the module docstring)."""
    options = _options(options)
    names = _names(model)
    state, groups = {}, []
    for optimizer in _optimizers(optimizers):
        _init_state(model, optimizer)
        for index, param, _ in optimizer._indexed_params():
            if id(param) not in names:
                raise ValueError(f"get_optimizer_state_dict: the optimizer's parameter "
                                 f"{index} (shape {tuple(param.shape)}) is not a parameter of "
                                 f"the model; pass the model the optimizer trains")
            entries = optimizer.state.get(index, {})
            state[names[id(param)]] = {
                k: (_as_layout(v, param) if hasattr(v, "shape") and np.ndim(v) else
                    copy.deepcopy(v)) for k, v in entries.items()}
        for group in optimizer.param_groups:
            saved = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            saved["params"] = [names[id(p)] for p in group["params"]]
            groups.append(saved)
    if options.full_state_dict:
        state = {n: {k: _full(v) for k, v in e.items()} for n, e in state.items()}
    return {"state": state, "param_groups": groups}


def get_state_dict(model, optimizers, *, submodules=None, options=None):
    """``(model_state_dict, optimizer_state_dict)``."""
    return (get_model_state_dict(model, options=options),
            get_optimizer_state_dict(model, optimizers, options=options))


def set_model_state_dict(model, model_state_dict, *, options=None):
    """Load ``model_state_dict`` into ``model`` in place (its own
    ``load_state_dict``: every key and shape checked first)."""
    return model.load_state_dict(model_state_dict, strict=_options(options).strict)


def _local(value, param):
    """The piece of a state value this rank's optimizer holds."""
    if isinstance(value, DTensor):
        return backend.to_numpy(value.data).copy()
    spec = getattr(param, "_spec", None)
    array = np.asarray(backend.to_numpy(value.data if hasattr(value, "data") and
                                        not isinstance(value, np.ndarray) else value))
    piece = getattr(param, "checkpoint_piece", None)
    if piece is not None:
        return piece(array)
    if spec is not None:
        sizes, offsets = spec.local_shape_and_offset()
        array = array[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
    return array.copy()


def set_optimizer_state_dict(model, optimizers, optim_state_dict, *, options=None):
    """Put a state dict of :func:`get_optimizer_state_dict`'s form into the
    optimizers: each parameter's state found by its name; hyper-parameters
    group by group."""
    names = _names(model)
    saved_groups = list(optim_state_dict.get("param_groups", []))
    state = optim_state_dict.get("state", {})
    for optimizer in _optimizers(optimizers):
        new_state = {}
        for index, param, _ in optimizer._indexed_params():
            name = names.get(id(param))
            if name not in state:
                if _options(options).strict:
                    raise KeyError(f"set_optimizer_state_dict: no state for parameter {name!r}; "
                                   f"the state dict has {sorted(state)[:4]}...")
                continue
            restored = {}
            for key, value in state[name].items():
                if hasattr(value, "shape") and np.ndim(value):
                    local = _local(value, param)
                    if local.shape != tuple(param.data.shape):
                        raise ValueError(f"set_optimizer_state_dict: state {key!r} of {name!r} "
                                         f"has local shape {local.shape}, the parameter "
                                         f"{tuple(param.data.shape)}")
                    restored[key] = backend.of(param.data).asarray(local.astype(param.data.dtype))
                else:
                    restored[key] = copy.deepcopy(value)
            new_state[index] = restored
        for position, group in enumerate(optimizer.param_groups):
            mine = {names[id(p)] for p in group["params"]}
            match = [g for g in saved_groups if mine & set(g.get("params", []))]
            if not match and len(saved_groups) == len(optimizer.param_groups):
                # a pipeline stage saved by another rank: the group's hyper-parameters
                # were written once (by the lowest rank), listing that rank's names
                match = [saved_groups[position]]
            for saved in match[:1]:
                for key, value in saved.items():
                    if key != "params":
                        group[key] = copy.deepcopy(value)
        optimizer.state = new_state


def set_state_dict(model, optimizers, *, model_state_dict, optim_state_dict, options=None):
    """Both: the model's (:func:`set_model_state_dict`) and the optimizers'."""
    result = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return result


__all__ = ["StateDictOptions", "get_model_state_dict", "get_optimizer_state_dict",
           "get_state_dict", "set_model_state_dict", "set_optimizer_state_dict",
           "set_state_dict"]
