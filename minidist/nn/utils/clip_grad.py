"""Gradient clipping, torch's ``torch.nn.utils.clip_grad_norm_`` and friends.

``clip_grad_norm_(parameters, max_norm)`` treats every gradient as one long
vector: its p-norm is the p-norm of the gradients' norms (torch computes it
so: each gradient's norm, then the norm of those), and when it is over
``max_norm`` every gradient is multiplied by the same coefficient

    clip_coef = min(max_norm / (total_norm + 1e-6), 1)

so that the direction of the step is kept and only its length shrinks. torch
2.6 split it in two, both here: ``get_total_norm(grads)`` and
``clip_grads_with_norm_(parameters, max_norm, total_norm)``, so that a
strategy can compute the norm its own way (summed over ranks) and clip with
it. ``clip_grad_value_`` clamps each element instead, which changes the
direction.

Gradients on several ranks. A sharded parameter's local gradient is only a
piece: its norm alone is not the whole gradient's. The piece's term
(sum of ``|g|^p``, or ``max |g|`` for the inf-norm) must be summed over the
ranks that hold the other pieces, and a replicated gradient counted once.
This layer knows no collectives (the layers point down), so the layers that
make such parameters register a *rule* (:func:`register_grad_norm_rule`):
``rule(parameter)`` returns None (a whole gradient) or a *reduction*, an
object with a hashable ``key`` (the same for parameters summed over the same
ranks) and ``reduce(array, op)`` that all-reduces a 1-element array with
``op`` ``"sum"`` or ``"max"`` over those ranks and returns it.
``minidist.distributed.tensor`` registers one for DTensor parameters (summed
over the mesh dims where they are Shard) and for the split layers'
Parameters (Megatron's ``tensor_model_parallel`` flag): then this very
``clip_grad_norm_`` gives, on every rank, the norm one process gives on the
whole gradients. The parameters with the same key share one all-reduce of
one number per key; every rank of a group must pass its parameters in the
same order (as it does in SPMD code).

Cost: one pass over every gradient (norm), another (clip); on several ranks
one all-reduce of one element per distinct reduction key and mesh dim.
"""

from __future__ import annotations

import math
import types
import warnings

import numpy as np

from minidist import backend
from minidist.tensor import Tensor

#: The rules of the layers above, in the order they registered.
_RULES: list = []
#: ``layout(parameters, total) -> total or None``: the layers above give the
#: total norm of their parameters the type torch gives it (a DTensor's: a
#: replicated DTensor).
_LAYOUTS: list = []


def register_total_norm_layout(layout):
    """Register ``layout(parameters, total)``, which returns the total norm as
    :func:`clip_grad_norm_` should return it, or None (a plain Tensor)."""
    if layout not in _LAYOUTS:
        _LAYOUTS.append(layout)
    return layout


def register_grad_norm_rule(rule):
    """Register ``rule(parameter) -> reduction or None`` (see the module
    docstring); registering the same rule again does nothing. Returns it."""
    if rule not in _RULES:
        _RULES.append(rule)
    return rule


def _reduction_of(tensor):
    for rule in _RULES:
        how = rule(tensor)
        if how is not None:
            return how
    return None


def _as_list(tensors) -> list:
    if isinstance(tensors, (Tensor, np.ndarray)) or hasattr(tensors, "__cuda_array_interface__"):
        return [tensors]
    return list(tensors)


def _array(item):
    """A gradient given to get_total_norm: a Tensor (its data) or an array."""
    return item.data if isinstance(item, Tensor) else item


def _norm_type(norm_type) -> float:
    try:
        return float(norm_type)
    except (TypeError, ValueError):
        raise ValueError(f"norm_type must be a number or 'inf', got {norm_type!r}") from None


def _vector_norm(array, p: float):
    """torch.linalg.vector_norm(array, p) of a flat array, in its dtype."""
    a = abs(array.reshape(-1))
    dtype = array.dtype
    if a.size == 0:
        return dtype.type(0)
    if p == math.inf:
        return dtype.type(backend.to_numpy(a.max()))
    if p == -math.inf:
        return dtype.type(backend.to_numpy(a.min()))
    if p == 0:
        return dtype.type(backend.to_numpy((a != 0).sum()))
    if p == 1:
        return dtype.type(backend.to_numpy(a.sum()))
    if p == 2:
        # A pairwise sum of the squares, no BLAS: the same bits on every machine.
        return np.sqrt(dtype.type(backend.to_numpy((a * a).sum())))
    return dtype.type(backend.to_numpy((a ** dtype.type(p)).sum())) ** dtype.type(1.0 / p)


def _term(array, p: float):
    """A piece's share of the p-th power of the norm (the inf-norm: its max),
    which adds up over the pieces of one gradient."""
    a = abs(array.reshape(-1))
    dtype = array.dtype
    if a.size == 0:
        return dtype.type(0)
    if p == math.inf:
        return dtype.type(backend.to_numpy(a.max()))
    if p == 1:
        return dtype.type(backend.to_numpy(a.sum()))
    if p == 2:
        return dtype.type(backend.to_numpy((a * a).sum()))
    return dtype.type(backend.to_numpy((a ** dtype.type(p)).sum()))


def _total_norm(pairs, p: float, error_if_nonfinite: bool) -> Tensor:
    """The total p-norm of ``pairs`` ``(gradient array, reduction or None)``:
    the whole gradients as torch does (the norm of each, grouped by dtype as
    torch groups them, then the norm of the norms), the pieces summed over
    their ranks, one all-reduce per reduction key."""
    if not pairs:
        return Tensor(np.array(0.0, np.float32))
    dtype = np.result_type(*[g.dtype for g, _ in pairs])
    whole, pieces = {}, {}
    for grad, how in pairs:
        if how is None:
            whole.setdefault(grad.dtype, []).append(grad)
        else:
            pieces.setdefault(how.key, [how, []])[1].append(grad)
    norms = [_vector_norm(g, p) for group in whole.values() for g in group]
    if not pieces:
        total = _vector_norm(np.array(norms, dtype), p)
    else:
        if p in (0, -math.inf) or p < 0:
            raise ValueError(
                f"clip_grad_norm_: norm_type {p} is not a sum over the elements, so it cannot "
                "be summed over the ranks that hold a sharded gradient; use a p > 0 or 'inf'")
        op = "max" if p == math.inf else "sum"
        terms = []
        for how, grads in pieces.values():
            local = np.zeros(1, dtype)
            for g in grads:
                local[0] = max(local[0], _term(g, p)) if op == "max" else local[0] + _term(g, p)
            terms.append(how.reduce(local, op)[0])
        if op == "max":
            total = dtype.type(max([dtype.type(n) for n in norms] + terms))
        else:
            summed = sum((dtype.type(n) ** dtype.type(p) for n in norms), dtype.type(0))
            summed = summed + sum(terms, dtype.type(0))
            total = (np.sqrt(summed) if p == 2 else
                     summed if p == 1 else summed ** dtype.type(1.0 / p))
    total = np.asarray(total, dtype)
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {p} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite "
            "norm anyway, set `error_if_nonfinite=False`")
    return Tensor(total)


def _check_foreach(foreach) -> None:
    # torch's foreach kernels fuse the loop over the tensors; NumPy has none,
    # so every value of foreach computes the same loop (and the same result).
    if foreach not in (None, True, False):
        raise TypeError(f"foreach must be None, True or False, got {foreach!r}")


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: bool | None = None) -> Tensor:
    """The p-norm of ``tensors`` (gradients: arrays, Tensors, or one of them)
    seen as one vector: torch's ``torch.nn.utils.get_total_norm``. A 0-d
    Tensor of the gradients' dtype (float32 when there are none). A DTensor
    is summed over its mesh (its data is the local piece); an array is a
    whole gradient. ``error_if_nonfinite=True``: a nan or inf total raises."""
    _check_foreach(foreach)
    p = _norm_type(norm_type)
    pairs = []
    for item in _as_list(tensors):
        pairs.append((_array(item), _reduction_of(item) if isinstance(item, Tensor) else None))
    return _total_norm(pairs, p, error_if_nonfinite)


def _coefficient(max_norm: float, total_norm):
    total = np.asarray(backend.to_numpy(total_norm.data if isinstance(total_norm, Tensor)
                                        else total_norm))
    dtype = total.dtype if np.issubdtype(total.dtype, np.floating) else np.dtype(np.float32)
    total = total.astype(dtype)
    # torch: max_norm / (total_norm + 1e-6), clamped to 1, in the norm's dtype;
    # torch's scalar / tensor is the reciprocal times the scalar (two roundings).
    coef = (dtype.type(1.0) / (total + dtype.type(1e-6))) * dtype.type(max_norm)
    return np.minimum(coef, dtype.type(1.0))


def clip_grads_with_norm_(parameters, max_norm: float, total_norm,
                          foreach: bool | None = None) -> None:
    """Multiply every gradient of ``parameters`` in place by
    ``min(max_norm / (total_norm + 1e-6), 1)``: torch's
    ``torch.nn.utils.clip_grads_with_norm_``, the second half of
    :func:`clip_grad_norm_`. A sharded parameter's local piece is multiplied
    by the same coefficient as every other gradient."""
    _check_foreach(foreach)
    parameters = [parameters] if isinstance(parameters, Tensor) else parameters
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    coef = _coefficient(float(max_norm), total_norm)
    # A nan norm makes every gradient nan, silently, as torch's does.
    with np.errstate(invalid="ignore"):
        for grad in grads:
            # In the gradient's dtype, as torch's mul_ by a 0-d tensor.
            grad *= grad.dtype.type(coef)


def _parameters(parameters) -> list:
    if isinstance(parameters, Tensor):
        return [parameters]
    generator = isinstance(parameters, types.GeneratorType)
    parameters = list(parameters)
    if generator and not parameters:
        warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.",
                      stacklevel=3)
    return parameters


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Clip the gradients of ``parameters`` (a Tensor, or an iterable of them:
    a generator is read once) so that their total ``norm_type``-norm is at
    most ``max_norm``; returns the total norm before clipping, a 0-d Tensor.
    torch's ``torch.nn.utils.clip_grad_norm_``: :func:`get_total_norm` of the
    gradients, then :func:`clip_grads_with_norm_`. Parameters without a
    gradient are skipped. A parameter whose gradient lies on several ranks
    (a DTensor, a tensor-parallel shard) is summed over them, so every rank
    gets one process's norm (the module docstring); with DTensor parameters
    the norm is, as torch's, a DTensor replicated on their mesh
    (``.full_tensor()``, ``.item()``)."""
    _check_foreach(foreach)
    parameters = _parameters(parameters)
    p = _norm_type(norm_type)
    pairs = [(param.grad, _reduction_of(param)) for param in parameters
             if param.grad is not None]
    total = _total_norm(pairs, p, error_if_nonfinite)
    clip_grads_with_norm_(parameters, max_norm, total)
    for layout in _LAYOUTS:
        laid = layout(parameters, total)
        if laid is not None:
            return laid
    return total


def clip_grad_value_(parameters, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient element of ``parameters`` to ``[-clip_value,
    clip_value]`` in place: torch's ``torch.nn.utils.clip_grad_value_``
    (element by element, so a sharded gradient needs no message)."""
    _check_foreach(foreach)
    parameters = [parameters] if isinstance(parameters, Tensor) else parameters
    clip_value = float(clip_value)
    for param in parameters:
        grad = param.grad
        if grad is not None:
            value = grad.dtype.type(clip_value)
            grad[...] = grad.clip(-value, value)


__all__ = ["clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm",
           "register_grad_norm_rule", "register_total_norm_layout"]
