"""The norm of gradients whose pieces lie on several ranks: summed over the
ranks that hold the pieces, a replicated gradient counted once.

A gradient's p-norm to the p-th power is a sum over its elements, so each
rank computes its piece's term (sum of ``|g|^p``; for the inf-norm its max),
and the terms are added (or maxed) over the ranks holding the other pieces:

* a DTensor parameter (its gradient has its layout): over each mesh dim
  where it is ``Shard``; a ``Replicate`` dim holds the same piece on every
  rank, so it is counted once (nothing sent). A ``Partial`` gradient is
  refused: its norm needs the sum first (redistribute it to Replicate);
* a split layer's Parameter, flagged as Megatron flags it
  (``tensor_model_parallel = True``) with the group it is split over
  (``tensor_model_parallel_group``): over that group. The layer's whole
  parameters (LayerNorms, a row layer's bias) are counted once, each rank
  having the same copy (Megatron's ``clip_grad_norm_fp32`` counts them on
  tp rank 0 only and sums over tp: the same number).

This file registers that rule with :mod:`minidist.nn.utils.clip_grad` (the
layers below know no collectives), so ``minidist.nn.utils.clip_grad_norm_``
itself sums over the mesh: on a 2-D mesh a parameter sharded on one dim
(tensor parallel) and another sharded on both (FSDP2 over TP) each add
their terms over their own dims, and the total is one process's norm on
every rank. It also gives torchtitan's :func:`clip_grad_norm_`, which adds
the pipeline: ``pp_mesh=`` names the group over which the stages' terms
are summed (each stage holds other parameters), and a Parameter flagged
``shared = True`` (Megatron's flag: a copy of a tied weight another stage
also holds) is clipped but not counted.

Cost: one all-reduce of one element per mesh dim (or group) that shards
some parameter, and one over ``pp_mesh``.
"""

from __future__ import annotations

import math

import numpy as np

import minidist.distributed as dist
from minidist.distributed.device_mesh import as_group
from minidist.distributed.tensor.dtensor import DTensor
from minidist.distributed.tensor.placements import (
    DTensorSpec,
    Partial,
    Replicate,
    Shard,
    layout_text,
)
from minidist.nn.utils import clip_grad as _clip
from minidist.tensor import Tensor


class SumOver:
    """A reduction of :mod:`minidist.nn.utils.clip_grad`: all-reduce a term
    over each of ``groups`` in turn (None: the world); groups of one rank
    are left out. Parameters reduced over the same ranks share the ``key``."""

    def __init__(self, groups):
        self.groups = [g for g in groups if dist.get_world_size(g) > 1]
        self.key = tuple(tuple(g.ranks) if g is not None else ("world",) for g in self.groups)

    def reduce(self, array: np.ndarray, op: str) -> np.ndarray:
        how = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM
        for group in self.groups:
            dist.all_reduce(array, op=how, group=group)
        return array


def _rule(tensor):
    """The reduction of a DTensor's or a split layer's gradient, else None."""
    if isinstance(tensor, DTensor):
        spec = tensor._spec
        groups = []
        for mesh_dim, placement in enumerate(spec.placements):
            if isinstance(placement, Partial):
                raise ValueError(
                    f"rank {dist.get_rank()}: clip_grad_norm_: a gradient laid out "
                    f"{layout_text(spec.placements)} is a sum still to be taken on mesh dim "
                    f"{mesh_dim}, and the norm of a sum is not a sum of norms; redistribute it "
                    "to Replicate() on that dim (one all_reduce) before clipping")
            if isinstance(placement, Shard):
                groups.append(spec.mesh.get_group(mesh_dim))
        return SumOver(groups) if groups else None
    if getattr(tensor, "tensor_model_parallel", False):
        return SumOver([getattr(tensor, "tensor_model_parallel_group", None)])
    return None


_clip.register_grad_norm_rule(_rule)


def _total_layout(parameters, total):
    """torch's clip_grad_norm_ of DTensor parameters returns a DTensor: the
    total (the same on every rank) replicated on the first one's mesh."""
    for param in parameters:
        if isinstance(param, DTensor) and param.grad is not None:
            mesh = param._spec.mesh
            spec = DTensorSpec(mesh, [Replicate()] * mesh.ndim, (), total.data.dtype)
            return DTensor._node(total.data, spec, None, None, "")
    return None


_clip.register_total_norm_layout(_total_layout)


def _reduce_total(total: Tensor, p: float, group) -> Tensor:
    """The stages' totals combined over ``group``: their p-th powers summed
    (the inf-norm: their max), then the p-th root."""
    if dist.get_world_size(group) == 1:
        return total
    value = np.array([total.data], dtype=total.data.dtype)
    if p == math.inf:
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
        return Tensor(np.asarray(value[0]))
    if p <= 0:
        raise ValueError(f"clip_grad_norm_(pp_mesh=): norm_type {p} is not a sum over the "
                         "elements, so the stages' norms cannot be summed; use a p > 0 or 'inf'")
    dtype = value.dtype.type
    value = value ** dtype(p)
    dist.all_reduce(value, group=group)
    root = np.sqrt(value[0]) if p == 2 else value[0] if p == 1 else value[0] ** dtype(1.0 / p)
    return Tensor(np.asarray(root, value.dtype))


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None, *,
                    pp_mesh=None) -> Tensor:
    """torchtitan's ``clip_grad_norm_``: ``minidist.nn.utils.clip_grad_norm_``
    (DTensors and split layers summed over their ranks) whose total is also
    summed over ``pp_mesh`` (a ProcessGroup or 1-D DeviceMesh: the pipeline
    stages, each holding other parameters; None: no pipeline). A Parameter
    flagged ``shared = True`` is clipped but not counted (the other stage's
    copy is). Every rank of ``pp_mesh`` must call it, with or without
    parameters. Returns the total norm, a 0-d Tensor, the same on every rank."""
    _clip._check_foreach(foreach)
    stages = [] if pp_mesh is None else [as_group(pp_mesh, "clip_grad_norm_(pp_mesh=)")]
    return clip_over_stages(parameters, max_norm, norm_type, error_if_nonfinite, stages)


def clip_over_stages(parameters, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                     stages: list) -> Tensor:
    """:func:`clip_grad_norm_` with the stages' groups given as a list: empty
    (no pipeline) or one group, None standing for the world (the Pipeline's
    pipeline group when it spans the launch)."""
    parameters = _clip._parameters(parameters)
    p = _clip._norm_type(norm_type)
    pairs = [(param.grad, _clip._reduction_of(param)) for param in parameters
             if param.grad is not None and not getattr(param, "shared", False)]
    if pairs:
        total = _clip._total_norm(pairs, p, error_if_nonfinite=False)
    else:
        # Nothing counted here, but the stages' all-reduce needs this rank's
        # zero in the dtype the others send.
        dtype = parameters[0].data.dtype if parameters else np.dtype(np.float32)
        total = Tensor(np.zeros((), dtype))
    for group in stages:
        total = _reduce_total(total, p, group)
    if error_if_nonfinite and not np.isfinite(total.data):
        raise RuntimeError(
            f"The total norm of order {p} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite "
            "norm anyway, set `error_if_nonfinite=False`")
    _clip.clip_grads_with_norm_(parameters, max_norm, total)
    return total


__all__ = ["SumOver", "clip_grad_norm_", "clip_over_stages"]
