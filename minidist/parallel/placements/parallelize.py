"""``parallelize_module``: put a plan of styles on a module's submodules
(torch's ``torch.distributed.tensor.parallel.parallelize_module``)::

    mesh = init_device_mesh("cpu", (tp,))
    for block in model.transformer.h:
        parallelize_module(block, mesh, {
            "attn.c_attn": PackedColwiseParallel(3),  # q, k, v fused: see styles.py
            "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(),
            "mlp.c_proj": RowwiseParallel(),
        })
        block.attn.n_head //= tp                     # as torch users (torchtitan) do

``device_mesh`` is a 1-D DeviceMesh (the tensor-parallel dim), or,
minidist's addition, a ProcessGroup or None (the world), taken as the 1-D
mesh of its ranks. ``parallelize_plan`` is a
:class:`~minidist.parallel.placements.styles.ParallelStyle` for ``module``
itself, or a dict from a submodule's dotted name (as ``named_modules``
gives it; an atom may be an ``fnmatch`` pattern, ``"h.*.mlp.c_fc"``) to a
style. Each matched submodule is laid out in place (its parameters become
DTensorParameters, its hooks lay out the inputs and output); a style that
builds another module (``PackedColwiseParallel``) puts it in the parent.
``module`` is returned.

As in torch, the plan lays out the weights and nothing else: a module that
reads a head count must be told it now has n_head / n heads; a tied weight
(the GPT's ``lm_head`` and ``wte``) is laid out twice: tie it again
(``lm_head.weight = wte.weight``; both Shard(0) under RowwiseParallel on
``wte`` and ColwiseParallel on ``lm_head``); the loss of class-sharded
logits is ``F.cross_entropy`` inside :func:`loss_parallel` (with
``use_local_output=False``) or the tensor family's
``vocab_parallel_cross_entropy`` on the local logits.

Cost: that of the styles (:mod:`.styles`): a copy of each weight's shard.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import numpy as np

import minidist.distributed as dist
from minidist.distributed.device_mesh import DeviceMesh, init_device_mesh
from minidist.models.gpt import CausalSelfAttention
from minidist.nn.module import Module
from minidist.parallel.placements.styles import ColwiseParallel, ParallelStyle


def as_mesh(device_mesh, what: str = "parallelize_module") -> DeviceMesh:
    """A 1-D DeviceMesh for a mesh, a ProcessGroup or None (the world)."""
    if isinstance(device_mesh, DeviceMesh):
        return device_mesh
    if device_mesh is None:
        return init_device_mesh("cpu", (dist.get_world_size(),))
    ranks = getattr(device_mesh, "ranks", None)
    if ranks is None:
        raise TypeError(f"{what}: device_mesh is a DeviceMesh (init_device_mesh('cpu', (n,))), a "
                        f"ProcessGroup or None, got {type(device_mesh).__name__}")
    mesh = DeviceMesh.__new__(DeviceMesh)   # the group's ranks as a 1-D mesh, no new group
    mesh._setup("cpu", np.array(ranks, dtype=np.int64), None, [device_mesh],
                (list(ranks).index(dist.get_rank()),), None)
    return mesh


def _matches(module: Module, path: list[str], prefix: str = ""):
    """(parent, child name, child, full name) for every submodule whose
    dotted name matches ``path`` atom by atom."""
    head, rest = path[0], path[1:]
    for name, child in list(module.named_children()):
        if not fnmatchcase(name, head):
            continue
        full = f"{prefix}{name}"
        if rest:
            yield from _matches(child, rest, full + ".")
        else:
            yield module, name, child, full


def _check(parent, name, style, full):
    if (isinstance(parent, CausalSelfAttention) and name == "c_attn"
            and type(style) is ColwiseParallel):
        raise ValueError(
            f"parallelize_module: {full!r} is the GPT's fused q, k, v projection; ColwiseParallel "
            f"would cut its rows as one block (rank 0 all of q and part of k). Use "
            f"PackedColwiseParallel(3), which takes each rank's heads' rows of q, k and v, and "
            f"divide the attention's n_head by the tensor-parallel size")


def parallelize_module(module: Module, device_mesh=None, parallelize_plan=None) -> Module:
    """Lay ``module``'s submodules out by ``parallelize_plan`` on
    ``device_mesh`` (the module docstring); returns ``module``."""
    mesh = as_mesh(device_mesh)
    if parallelize_plan is None:
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        return parallelize_plan._apply(module, mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_module: the plan is a ParallelStyle or a dict of "
                        f"submodule name -> ParallelStyle, got {type(parallelize_plan).__name__}")
    for key, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_module: the plan's {key!r} maps to "
                            f"{type(style).__name__}, not a ParallelStyle (ColwiseParallel(), ...)")
        found = list(_matches(module, key.split(".")))
        if not found:
            names = [name for name, _ in module.named_modules() if name][:12]
            raise ValueError(f"parallelize_module: no submodule matches {key!r}; the names are "
                             f"like {', '.join(names)}")
        for parent, name, child, full in found:
            _check(parent, name, style, full)
            laid = style._apply(child, mesh)
            if laid is not child:
                setattr(parent, name, laid)
    return module


__all__ = ["parallelize_module"]
