"""FSDP2's hooks: when a unit gathers, frees and reduces (torch's ``FSDPState``).

Read :mod:`.fsdp_params` first (what a unit's all_gather and reduce_scatter
move); :mod:`.fully_shard` puts one state on each module it is applied to.

A step, for a unit U (a module ``fully_shard`` was applied to; the root is
the outermost one, the first called):

1. U's forward pre-hook: the root first checks that the last backward
   reached every unit, and starts a new record of the forward order. U's
   all_gather (waited for, if it was prefetched), its unsharded Parameters
   registered; then the *forward prefetch*: the all_gather of the unit that
   came after U in the previous step's forward (or the modules given to
   ``set_modules_to_forward_prefetch``) is started, and runs while U
   computes. U's floating inputs are cast to ``param_dtype``.
2. U's forward hook: reshard (``reshard_after_forward=True``; never the
   root's, whose weights backward needs first, torch's rule), and a hook on
   each output that requires a gradient: U's *pre-backward*.
3. U's pre-backward (when its output's gradient is complete, before U's
   backward runs): all_gather U again if it was resharded, and start the
   *backward prefetch*: the all_gather of the unit that came before U in this
   step's forward (or ``set_modules_to_backward_prefetch``'s).
4. U's post-backward (its unsharded Parameters' post-accumulate-grad hooks,
   once every one has its gradient): one reduce_scatter (plus HSDP's
   all_reduce) into the shards' ``.grad``, unless
   ``set_requires_gradient_sync(False)`` (the full gradients then accumulate
   on the unsharded Parameters until a step that syncs); reshard
   (``set_reshard_after_backward``, default True).

Why the forward prefetch uses the previous step's order: torch's forward
"prefetch" is its CPU running ahead of the GPU, issuing the next unit's
all_gather on another stream while the current unit's kernels run. NumPy
computes on the CPU that would run ahead, so minidist asks for the next
all_gather explicitly, as torch's ``set_modules_to_forward_prefetch`` does,
taking "next" from the order it saw in the step before (the first step
prefetches nothing). Nothing runs in the background: a prefetched gather's
messages are posted when it starts and moved on at each hook
(``Work.test()``), and the wait finishes it.

What is not as torch's: the reduce_scatter blocks (torch's overlaps the
next unit's backward on a stream of its own; here it would need a callback
at the end of backward to wait for the last one, which minidist's autograd
does not have). Every parameter that requires a gradient must receive one
in every backward: a unit is reduced when all its gradients have arrived,
and the next forward refuses to start if one never came.

Cost: the unit's messages (:mod:`.fsdp_params`): per step one all_gather
in forward, one more in backward when resharded after forward (never the
root's), one reduce_scatter; no message of its own.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.tensor import Tensor, is_grad_enabled


def _tensors(value):
    """The Tensors inside a module's output (a Tensor, or tuples, lists, dicts of them)."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _cast(value, dtype):
    """``value``'s floating Tensors and arrays cast to ``dtype`` (the same structure)."""
    if isinstance(value, Tensor):
        if np.issubdtype(value.data.dtype, np.floating) and value.data.dtype != dtype:
            return value.astype(dtype)
        return value
    if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
        return value.astype(dtype, copy=False)
    if isinstance(value, tuple):
        return tuple(_cast(item, dtype) for item in value)
    if isinstance(value, list):
        return [_cast(item, dtype) for item in value]
    if isinstance(value, dict):
        return {key: _cast(item, dtype) for key, item in value.items()}
    return value


class FSDPState:
    """The hooks of one module ``fully_shard`` was applied to (the module docstring)."""

    def __init__(self, module, group, mesh, reshard_after_forward: bool, policy, label: str):
        self.module = module
        self.group = group                     # an FSDPParamGroup, or None (no parameter)
        self.mesh = mesh
        self.reshard_after_forward = reshard_after_forward
        self.policy = policy
        self.label = label
        self.root = None                       # the root's state, once it ran
        self.states = []                       # the root's: every state under it
        self.order = []                        # the root's: this step's forward order
        self.previous_order = []
        self.forward_prefetch = None           # explicit lists, or None: implicit
        self.backward_prefetch = None
        self.requires_gradient_sync = True
        self.reshard_after_backward = True
        self.in_backward = False
        self._forward_start = 0
        if group is not None:
            group.on_gradient = self._gradient_ready
            group.remaining = len(group.with_grads)

    @property
    def is_root(self) -> bool:
        return self.root is self

    # -- the root -------------------------------------------------------------
    def _lazy_init(self) -> None:
        """The first module called is the root: it takes every state below it."""
        self.root = self
        self.states = [m.__dict__["_fsdp_state"] for m in self.module.modules()
                       if "_fsdp_state" in m.__dict__]
        for state in self.states:
            state.root = self

    def _root_pre_forward(self) -> None:
        for state in self.states:
            group = state.group
            if group is not None and 0 < group.remaining < len(group.with_grads):
                missing = [p.name for p in group.with_grads
                           if p.unsharded is not None and p.unsharded.grad is None]
                raise RuntimeError(
                    f"rank {dist.get_rank()}: fully_shard({state.label}): the last backward "
                    f"gave no gradient to {', '.join(missing)}, so the unit's gradients were "
                    "never reduced; every parameter that requires a gradient must get one in "
                    "every backward (set requires_grad=False on those that are not used)")
        self.previous_order, self.order = self.order, []

    # -- forward ----------------------------------------------------------------
    def pre_forward(self, module, args, kwargs):
        if self.root is None:
            self._lazy_init()
        root = self.root
        if self.is_root:
            self._root_pre_forward()
        if self not in root.order:
            root.order.append(self)
        if self.group is not None:
            self.group.unshard()
        # The trace's "fully_shard forward" region: from the weights' arrival to
        # the forward hook, the time a prefetched all_gather overlaps.
        self._forward_start = trace.now()
        for target in self._forward_targets():
            target.group.unshard(async_op=True)
        if self.policy.cast_forward_inputs and self.policy.param_dtype is not None:
            args, kwargs = _cast(args, self.policy.param_dtype), _cast(kwargs,
                                                                        self.policy.param_dtype)
        return args, kwargs

    def _forward_targets(self):
        if self.forward_prefetch is not None:
            targets = self.forward_prefetch
        else:
            order = self.root.previous_order
            at = order.index(self) if self in order else -1
            targets = order[at + 1:at + 2] if at >= 0 else []
        return [t for t in targets if t.group is not None and t is not self]

    def post_forward(self, module, args, output):
        for state in self.root.states:          # move prefetched gathers on
            if state.group is not None:
                state.group.progress()
        tensors = [t for t in _tensors(output) if t.requires_grad]
        if self.policy.output_dtype is not None:
            output = _cast(output, self.policy.output_dtype)
            tensors = [t for t in _tensors(output) if t.requires_grad]
        if self.group is not None and self.reshard_after_forward and not self.is_root:
            self.group.reshard(keep_arrays=bool(tensors) and is_grad_enabled())
        if tensors and is_grad_enabled():
            self.in_backward = False
            for tensor in tensors:
                tensor.register_hook(self._pre_backward)
        trace.record("compute", self._forward_start, trace.now(),
                     label=f"fully_shard forward {self.label}")
        return output

    # -- backward ---------------------------------------------------------------
    def _pre_backward(self, grad):
        if self.in_backward:
            return None
        self.in_backward = True
        if self.group is not None:
            self.group.unshard()
        for target in self._backward_targets():
            target.group.unshard(async_op=True)
        return None

    def _backward_targets(self):
        if self.backward_prefetch is not None:
            targets = self.backward_prefetch
        else:
            order = self.root.order
            at = order.index(self) if self in order else 0
            targets = order[at - 1:at] if at > 0 else []
        return [t for t in targets if t.group is not None and t is not self
                and not t.group.unsharded]

    def _gradient_ready(self) -> None:
        group = self.group
        group.remaining -= 1
        if group.remaining:
            return
        group.remaining = len(group.with_grads)
        start = trace.now()
        if self.requires_gradient_sync:
            group.reduce_gradients()
        if self.reshard_after_backward:
            group.reshard(keep_arrays=False)
        self.in_backward = False
        trace.record("compute", start, trace.now(),
                     label=f"fully_shard post-backward {self.label}")
