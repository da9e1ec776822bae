"""The optimizer base class: parameter groups, per-parameter state, checkpoints.

An optimizer owns a list of *parameter groups*. A group is a dict holding the
parameters (``group["params"]``, a list of Tensors) and the hyper-parameters
that apply to them (``group["lr"]``, ``group["momentum"]``, ...). Giving each
group its own values is how one trains biases without weight decay, or a new
head with a larger learning rate, and it is what an LR scheduler changes::

    optimizer = SGD([
        {"params": weights, "weight_decay": 1e-4},
        {"params": biases},                      # takes the defaults
    ], lr=0.1, momentum=0.9)

Every parameter has a global *index*: its position when the groups are read
in order, first group first. The per-parameter state (momentum buffers, Adam
moments, step counts) lives in ``optimizer.state[index]``, a dict. Keeping the
state addressable by index, and not by object, is what lets a checkpoint be
loaded into fresh parameters, and lets ZeRO later give each rank the state of
its own slice of indices.

Two rules every subclass keeps, because later strategies depend on them:

* ``step()`` writes into ``p.data`` in place (``param -= update``) and never
  rebinds ``p.data``: data parallel and ZeRO keep parameters as views into
  one flat buffer, and a rebinding would silently detach the view.
* ``zero_grad(set_to_none=False)`` fills each ``.grad`` with zeros in place,
  for the same reason: bucketed gradients are views into a flat buffer.
"""

from __future__ import annotations

import copy
import numbers

import numpy

from minidist import backend
from minidist.tensor import Tensor


class Optimizer:
    """Base class. A subclass passes its default hyper-parameters to
    ``__init__``, checks a group's values in :meth:`_check_group`, and
    implements :meth:`step`."""

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self.param_groups: list[dict] = []
        self.state: dict[int, dict] = {}
        if isinstance(params, Tensor):
            raise TypeError(
                f"{type(self).__name__} got a single Tensor as params; pass an iterable of "
                "Tensors, e.g. [tensor] or model.parameters(), or a list of param-group dicts"
            )
        if isinstance(params, dict):
            raise TypeError(
                f"{type(self).__name__} got a dict as params; pass a list of param-group "
                "dicts, e.g. [{'params': model.parameters(), 'lr': 0.1}]"
            )
        params = list(params)
        if not params:
            raise ValueError(
                f"{type(self).__name__} got an empty parameter list: there is nothing to "
                "optimize. Did model.parameters() return nothing, or was the generator "
                "already used up?"
            )
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        for group in params:
            self.add_param_group(group)

    # -- parameter groups -------------------------------------------------
    def add_param_group(self, param_group: dict):
        """Append a group. Missing hyper-parameters take the defaults given
        to the constructor; the new parameters get the next indices."""
        if not isinstance(param_group, dict):
            raise TypeError(
                f"a param group must be a dict like {{'params': [...], 'lr': 0.1}}, "
                f"got {type(param_group).__name__}"
            )
        group = dict(param_group)
        if "params" not in group:
            raise ValueError(
                f"param group {len(self.param_groups)} has no 'params' key; a group looks "
                "like {'params': [tensor, ...], 'lr': 0.1}"
            )
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        group_index = len(self.param_groups)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for position, param in enumerate(group["params"]):
            if not isinstance(param, Tensor):
                raise TypeError(
                    f"param group {group_index}, entry {position}: optimizers update "
                    f"minidist Tensors, got {type(param).__name__}. Wrap arrays in "
                    "Tensor(array, requires_grad=True)."
                )
            if not numpy.issubdtype(numpy.dtype(param.data.dtype), numpy.floating):
                raise TypeError(
                    f"param group {group_index}, entry {position}: cannot optimize a tensor "
                    f"of dtype {param.data.dtype}; parameters must be floating point"
                )
            if not param.is_leaf:
                raise ValueError(
                    f"param group {group_index}, entry {position}: cannot optimize a tensor "
                    "computed from others (a non-leaf); pass the leaf parameters"
                )
            if id(param) in seen:
                raise ValueError(
                    f"param group {group_index}, entry {position}: this parameter is already "
                    "given to the optimizer; each parameter may appear once, in one group, "
                    "or it would be updated twice per step"
                )
            seen.add(id(param))
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        self._check_group(group, group_index)
        self.param_groups.append(group)

    def _check_group(self, group: dict, group_index: int):
        """Raise ValueError if a hyper-parameter of ``group`` is invalid."""

    def _indexed_params(self):
        """Yield ``(index, param, group)`` for every parameter, in index order."""
        index = 0
        for group in self.param_groups:
            for param in group["params"]:
                yield index, param, group
                index += 1

    def _params_with_grad(self):
        """Yield ``(index, param, grad, group)`` for every parameter that has a
        gradient, in index order: what ``step`` updates (a parameter without
        one, e.g. unused in this forward, is left as it is, as in torch)."""
        for index, param, group in self._indexed_params():
            if param.grad is not None:
                yield index, param, param.grad, group

    # -- the training-loop calls -------------------------------------------
    def zero_grad(self, set_to_none: bool = True):
        """Forget the gradients of the last step.

        ``set_to_none=True`` drops the arrays (the next backward allocates
        fresh ones; a parameter that gets no gradient is then skipped by
        ``step``). ``set_to_none=False`` writes zeros into the existing arrays,
        which keeps a ``.grad`` that is a view into a flat buffer a view.
        """
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.fill(0)

    def step(self, closure=None):
        """Update every parameter that has a gradient. ``closure``, if given,
        re-evaluates the model and returns the loss (it is called first, and
        its value returned)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement step()")

    @staticmethod
    def _evaluate(closure):
        return None if closure is None else closure()

    # -- checkpoints --------------------------------------------------------
    def state_dict(self) -> dict:
        """A snapshot of the optimizer: ``{"state": {index: {...}},
        "param_groups": [{hyper-parameters..., "params": [indices]}]}``.

        Arrays are copied, so later steps do not change a saved snapshot.
        Parameters are named by index, so the snapshot can be loaded into
        another optimizer built over other Tensors of the same shapes.
        """
        groups, index = [], 0
        for group in self.param_groups:
            saved = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            saved["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(saved)
        state = {
            i: {name: (value.copy() if hasattr(value, "shape") else copy.deepcopy(value))
                for name, value in entries.items()}
            for i, entries in self.state.items()
        }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict):
        """Restore a snapshot made by :meth:`state_dict`: the hyper-parameters
        of every group and the state of every parameter. The groups must have
        the same sizes. Arrays are copied onto each parameter's backend and
        dtype, so a checkpoint written on the GPU loads on the CPU."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the state dict has {len(saved_groups)} param groups, this optimizer has "
                f"{len(self.param_groups)}; build the optimizer with the same groups as the "
                "one that was saved"
            )
        for group_index, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"param group {group_index} has {len(group['params'])} parameters here but "
                    f"{len(saved['params'])} in the state dict"
                )
        params = [param for _, param, _ in self._indexed_params()]
        saved_to_index = {
            saved_index: index
            for index, saved_index in enumerate(i for g in saved_groups for i in g["params"])
        }
        new_state = {}
        for saved_index, entries in state_dict["state"].items():
            if saved_index not in saved_to_index:
                raise ValueError(
                    f"the state dict has state for parameter {saved_index}, which none of "
                    "its param groups lists"
                )
            index = saved_to_index[saved_index]
            param = params[index]
            restored = {}
            for name, value in entries.items():
                if hasattr(value, "shape") and hasattr(value, "dtype"):
                    if tuple(value.shape) != tuple(param.data.shape):
                        raise ValueError(
                            f"state {name!r} of parameter {index} has shape {tuple(value.shape)}, "
                            f"but the parameter has shape {tuple(param.data.shape)}"
                        )
                    restored[name] = _array_like(value, param.data)
                else:
                    restored[name] = copy.deepcopy(value)
            new_state[index] = restored
        for saved, group in zip(saved_groups, self.param_groups):
            for name, value in saved.items():
                if name != "params":
                    group[name] = copy.deepcopy(value)
        self.state = new_state

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"  group {i}: {len(group['params'])} parameters")
            for name in sorted(k for k in group if k != "params"):
                lines.append(f"    {name}: {group[name]}")
        lines.append(")")
        return "\n".join(lines)


def _array_like(value, param_data):
    """A fresh copy of ``value`` on ``param_data``'s backend, in its dtype."""
    xp = backend.of(param_data)
    if backend.of(value) is not xp:
        value = backend.to_numpy(value)
    return xp.array(value, dtype=param_data.dtype, copy=True)


def check_non_negative(optimizer_name: str, name: str, value, group_index: int, meaning: str):
    """Raise a ValueError naming the hyper-parameter unless ``value >= 0``
    (NaN fails too, since every comparison with NaN is false)."""
    if not (isinstance(value, numbers.Real) and value >= 0):
        raise ValueError(
            f"{optimizer_name}: invalid {name}={value!r} in param group {group_index}; "
            f"{meaning} must be a number >= 0"
        )


def check_momentum_group(optimizer_name: str, group: dict, group_index: int, meanings: dict):
    """The checks SGD and LARS share: ``group`` has a learning rate (no
    default has one) and every hyper-parameter ``meanings`` names
    (``{"lr": "the learning rate", ...}``) is a number >= 0."""
    if group["lr"] is None:
        raise ValueError(
            f"{optimizer_name} needs a learning rate: pass lr=..., or give param group "
            f"{group_index} an 'lr'"
        )
    for name, meaning in meanings.items():
        check_non_negative(optimizer_name, name, group[name], group_index, meaning)
