"""``parallelize_module``: apply a plan of styles to a module's submodules
(torch's ``torch.distributed.tensor.parallel.parallelize_module``; in
minidist ``from minidist.parallel import parallelize_module, ColwiseParallel,
RowwiseParallel``: it builds the strategies of this package, so it stands
with them, above ``minidist.distributed``, as DDP and FSDP do)::

    for block in model.transformer.h:
        parallelize_module(block, group, {
            "attn.c_attn": PackedColwiseParallel(3),  # q, k, v fused: see parallel_styles.py
            "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(),
            "mlp.c_proj": RowwiseParallel(),
        })
        block.attn.n_head //= tp                     # as torch users (torchtitan) do

``parallelize_module(module, device_mesh, parallelize_plan)``: ``device_mesh``
is a 1-D device mesh (anything with ``get_group()``) or, minidist's
addition, a ProcessGroup (None: the world); ``parallelize_plan`` a
:class:`~minidist.parallel.tensor.styles.ParallelStyle` for ``module`` itself, or a dict from a
submodule's name (dotted, as ``named_modules`` gives it; an atom may be a
``fnmatch`` pattern, ``"h.*.mlp.c_fc"``) to a style. Each named submodule is
replaced in its parent by its split on this rank; ``module`` is changed in
place and returned (when the plan is one style for ``module`` itself, the
split module is returned: there is no parent to put it in).

As in torch, the plan splits the weights and nothing else:

* a module that reads a head count must be told that it now has
  n_head / n heads (torch users set ``attn.n_heads //= tp``, as torchtitan
  did); minidist's GPT attention refuses clearly when it was not told;
* a tied weight (the GPT's ``lm_head`` and ``wte``) is split twice into two
  Parameters; tie the shards again (``lm_head.weight = wte.weight``) when
  both take the same rows (RowwiseParallel on ``wte``, ColwiseParallel on
  ``lm_head``, the vocabulary divisible by n);
* the loss of vocabulary-sharded logits is
  :func:`~minidist.parallel.tensor.vocab.vocab_parallel_cross_entropy`
  (torch's ``loss_parallel()``).

Cost: a copy of each split weight's shard; the messages are those of the
styles (:mod:`minidist.parallel.tensor.styles`).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from minidist.distributed.device_mesh import as_group
from minidist.models.gpt import CausalSelfAttention
from minidist.nn.module import Module
from minidist.parallel.tensor.styles import ColwiseParallel, ParallelStyle


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
    """Split ``module``'s submodules by ``parallelize_plan`` over the ranks of
    ``device_mesh`` (the module docstring); returns ``module``."""
    group = as_group(device_mesh, "parallelize_module")
    if parallelize_plan is None:
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        return parallelize_plan.apply(module, group)
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
            setattr(parent, name, style.apply(child, group))
    return module


__all__ = ["parallelize_module"]
