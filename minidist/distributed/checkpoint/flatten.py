"""A nested state dict as one flat ``{dotted key: leaf}`` (torch's
``flatten_state_dict``), and its leaves told apart.

``{"model": {"fc.weight": w}, "optim": {"state": {"fc.weight": {"step": 3}}}}``
is saved under the keys ``model.fc.weight`` and ``optim.state.fc.weight.step``:
a checkpoint is a flat table of keys, whatever the nesting of the dict it was
saved from. Dicts are walked, and so are lists that hold dicts or tensors
(an optimizer's ``param_groups`` become ``optim.param_groups.0.lr``); a list
or tuple of plain values (``betas``, ``params``) is one leaf.

A leaf is a *tensor* (a DTensor, a minidist Tensor or a NumPy array: saved
as raw bytes, readable piece by piece) or an *object* (anything else: a step
count, a learning rate, a tuple: pickled, read whole).

Cost: one walk of the dict, no copy.
"""

from __future__ import annotations

import numpy as np

from minidist.tensor import Tensor


def is_tensor(value) -> bool:
    """Saved as bytes (a tensor) rather than pickled (an object)."""
    return isinstance(value, (Tensor, np.ndarray)) or (
        hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "__array__"))


def _walked(value) -> bool:
    if isinstance(value, dict):
        return True
    if isinstance(value, list):
        return any(isinstance(v, (dict, list)) or is_tensor(v) for v in value)
    return False


def leaves(state_dict, prefix: str = ""):
    """Yield ``(key, container, name, value)`` for every leaf: ``container[name]
    is value``, so a load can put a new object in its place."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"a state dict is a dict of names to tensors and values, got "
                        f"{type(state_dict).__name__}")
    items = state_dict.items()
    yield from _leaves(items, state_dict, prefix)


def _leaves(items, container, prefix):
    for name, value in items:
        key = f"{prefix}{name}"
        if not isinstance(name, (str, int)):
            raise TypeError(f"state dict key {name!r} under {prefix or 'the top'!r}: keys "
                            f"are strings (or list positions)")
        if _walked(value):
            inner = value.items() if isinstance(value, dict) else enumerate(value)
            yield from _leaves(inner, value, key + ".")
        else:
            yield key, container, name, value


def flatten_state_dict(state_dict) -> dict:
    """``{dotted key: leaf}`` (torch's function of the same name returns the
    mapping back as well; here the nesting is walked again at load)."""
    flat = {}
    for key, _, _, value in leaves(state_dict):
        if key in flat:
            raise ValueError(f"state dict key {key!r} appears twice once flattened; rename one")
        flat[key] = value
    return flat


__all__ = ["flatten_state_dict", "is_tensor", "leaves"]
