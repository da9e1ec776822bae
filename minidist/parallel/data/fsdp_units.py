"""FSDP's units: which layer's flat buffer holds each parameter, a tied one included.

Read :mod:`minidist.parallel.data.fsdp` first: a unit is a module whose
parameters are packed into one flat buffer, gathered in its forward
pre-hook, freed after its forward (FULL_SHARD), and whose gradients are
reduce_scattered once they are all complete. Each unit is a layer, holding
the parameters it owns itself.

A tied parameter, one Parameter serving two layers (the GPT's token
embedding is also its output layer: ``lm_head.weight = wte.weight``), must
belong to one unit only. In two, it would be packed twice, and the first
unit to reduce_scatter its gradient would take that gradient away from the
second. Its gradient is the sum of its uses' and is complete only after the
last use's backward; its weights must be there for every use. So it belongs
to the innermost module that contains every layer holding it (the GPT
itself here): that module's forward runs around every use, so its forward
pre-hook gathers the weights once for all of them, and the gradient is
reduce_scattered once, after the last use has added its part. torch's FSDP
asks the same: a shared parameter belongs to one FSDP unit, one that contains
all its users. A ``ModuleList`` has no forward of its own (its owner calls
its items), so a parameter tied inside one goes to the module above it. The
price: under FULL_SHARD the tied weights stay gathered for the whole forward
of that module, and again for its whole backward, rather than around each
use only.

A layer called twice (the same module at two places) needs nothing: its
hooks run at each call and its gradients are complete after the last.

What FSDP cannot keep tied is refused: two different Parameters over the same
memory (one a view of the other) would each be copied into a flat buffer of
its own, and would then train apart.

Cost: one pass over the modules and parameters when the wrapper is built.
"""

from __future__ import annotations

import numpy as np

from minidist import nn


def _paths(module) -> dict[int, list[tuple[str, ...]]]:
    """For each layer (by id), every path at which it sits in ``module``'s tree
    (a layer used at two places has two)."""
    paths: dict[int, list[tuple[str, ...]]] = {}
    stack = [((), module)]
    while stack:
        path, layer = stack.pop()
        paths.setdefault(id(layer), []).append(path)
        # Reversed, so that the walk meets the children in registration order.
        stack.extend(reversed([(path + (name,), child) for name, child in layer.named_children()]))
    return paths


def _common_prefix(paths) -> tuple[str, ...]:
    first = paths[0]
    length = 0
    while length < len(first) and all(len(p) > length and p[length] == first[length]
                                       for p in paths):
        length += 1
    return first[:length]


def _refuse_overlapping(module, rank: int, who: str) -> None:
    """Refuse two different Parameters over the same memory."""
    by_base: dict[int, list[tuple[str, object]]] = {}
    for name, param in module.named_parameters():
        base = param.data
        while isinstance(base.base, np.ndarray):
            base = base.base
        by_base.setdefault(id(base), []).append((name, param))
    for named in by_base.values():
        for i, (first, a) in enumerate(named):
            for second, b in named[i + 1:]:
                if np.shares_memory(a.data, b.data):
                    raise ValueError(
                        f"rank {rank}: {who}: {first} and {second} are two Parameters over the "
                        "same memory, which FSDP would copy into two flat buffers and train "
                        "apart; tie them as one Parameter (assign the same Parameter to both "
                        "layers, as GPT does: lm_head.weight = wte.weight) or give each its own "
                        "array (.copy())")


def units_of(module, rank: int, who: str = "FullyShardedDataParallel") -> list[tuple]:
    """``[(layer, parameters, names)]``, one per unit, in the order of
    ``module.modules()``: the parameters to train that ``layer`` owns, in the
    order they are met, and their names for error messages
    (``"Linear.weight"``; a tied one by its path from the layer that owns it,
    ``"GPT.transformer.wte.weight"``)."""
    _refuse_overlapping(module, rank, who)
    paths = _paths(module)
    layers = {path: layer for layer in module.modules() for path in paths[id(layer)]}
    holders: dict[int, list] = {}           # id(param) -> [param, name, layers holding it]
    for layer in module.modules():
        for name, param in layer.named_parameters(recurse=False):
            if param.requires_grad:
                holders.setdefault(id(param), [param, name, []])[2].append(layer)
    owned: dict[int, tuple] = {}            # id(owner) -> (owner, parameters, names)
    for param, name, holding in holders.values():
        if len(holding) == 1:               # untied: the layer itself
            owner, label = holding[0], f"{type(holding[0]).__name__}.{name}"
        else:
            where = _common_prefix([p for layer in holding for p in paths[id(layer)]])
            while where and isinstance(layers[where], nn.ModuleList):
                where = where[:-1]
            owner = layers[where]
            inside = paths[id(holding[0])][0][len(where):]
            label = ".".join((type(owner).__name__,) + inside + (name,))
        entry = owned.setdefault(id(owner), (owner, [], []))
        entry[1].append(param)
        entry[2].append(label)
    return [owned[id(layer)] for layer in module.modules() if id(layer) in owned]
