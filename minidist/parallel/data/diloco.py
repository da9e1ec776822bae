"""DiLoCo: local steps with an inner optimizer, then an outer step on the averaged pseudo-gradient.

Douillard et al., "DiLoCo: Distributed Low-Communication Training of
Language Models" (2023). Read after :mod:`.local_sgd`: the replicas again
train alone for H (``sync_every``) steps, but what is averaged and how it
is applied changes:

1. every rank keeps the weights of the last sync, theta (the same on every
   rank);
2. H inner steps: every rank runs the *inner* optimizer (AdamW in the
   paper) on its own batches, from theta to its own theta_r;
3. the pseudo-gradient of each rank, Delta_r = theta - theta_r (the way the
   weights moved, reversed, so that it points like a gradient), is averaged
   over the ranks: Delta = (1/n) sum_r Delta_r, one all_reduce;
4. the *outer* optimizer takes one step from theta (not from theta_r) with
   Delta as the gradient: SGD with Nesterov momentum, lr 0.7 and momentum
   0.9 in the paper. Every rank holds the same theta, Delta and momentum,
   so every rank ends with the same new theta, which is kept for 1.

With an outer SGD of lr 1 and no momentum, step 4 gives theta - Delta, the
mean of the theta_r: local SGD. The outer momentum is what DiLoCo adds.

**Streaming** (Douillard et al., "Streaming DiLoCo with overlapping
communication", 2025): the model is given as F fragments (a list of
modules); fragment f is synced at steps (f + 1) H / F, (f + 1) H / F + H,
... so each fragment is still synced every H steps but each all_reduce
holds 1/F of the model, the peak bandwidth F times lower for the same
bytes. ``fragment_sync_delay`` (tau): the pseudo-gradient is taken and
all-reduced tau steps before it is applied (where torchft overlaps that
all_reduce with the tau inner steps; here the all_reduce blocks, the values
are the same); ``fragment_update_alpha``: the fragment ends at
(1 - alpha) theta_new + alpha theta_r, mixing back the local steps (0: the
outer result alone).

torchft's names and meaning (``torchft.local_sgd.DiLoCo``: a context
manager, the syncs run after the inner optimizer's steps, the outer
optimizer steps the model's own parameters). Dropped: the ``Manager``
(no quorum, no discarded sync) and torchft's ``backup_device``,
``pin_memory``, ``use_bucketization``, ``bucket_cap_mb``,
``should_quantize`` (a GPU's pinned host copy, buckets and quantized
all-reduces: one flat all_reduce per sync here). Unlike torchft, an outer
optimizer shared by several fragments steps only the fragment being synced
(torchft leaves the other fragments' inner gradients on them).

Cost, P parameter values of s bytes, n ranks, the ring: one all_reduce of
P / F values every H / F steps, 2 (n - 1) / n P s / H bytes sent per rank
per step whatever F is (DDP's divided by H), 2 (n - 1) alpha per sync.
Memory: theta (P values) and the outer momentum (P values) on every rank.
"""

from __future__ import annotations

import numpy as np

from minidist import backend, nn
from minidist.distributed.device_mesh import as_group
from minidist.parallel.data.local_sgd import (
    _CountedSteps,
    average_arrays,
    check_no_manager,
    check_sync_every,
)
from minidist.parallel.replicas import broadcast_module


class DiLoCo(_CountedSteps):
    """``with DiLoCo(model_fragments, inner_optimizer, outer_optimizer, sync_every): ...
    inner_optimizer.step()``: H = ``sync_every`` inner steps, then the outer
    step (one fragment every H / F steps when ``model_fragments`` lists F
    modules; a single module is one fragment). ``outer_optimizer``: one over
    the model's parameters, or a list, one per fragment."""

    def __init__(self, model_fragments, inner_optimizer, outer_optimizer, sync_every, *extra,
                 fragment_sync_delay: int = 0, fragment_update_alpha: float = 0.0,
                 group=None, algorithm: str = "auto"):
        usage = "DiLoCo(model_fragments, inner_optimizer, outer_optimizer, sync_every)"
        check_no_manager("DiLoCo", model_fragments, usage, extra)
        fragments = [model_fragments] if isinstance(model_fragments, nn.Module) \
            else list(model_fragments)
        sync_every = check_sync_every("DiLoCo", sync_every)
        count = len(fragments)
        if sync_every % count:
            raise ValueError(f"DiLoCo: sync_every={sync_every} is not a multiple of the "
                             f"{count} fragments; each fragment is synced every sync_every "
                             "steps, one every sync_every / F: give a multiple of F")
        self._every = sync_every // count
        if not isinstance(fragment_sync_delay, int) or \
                not 0 <= fragment_sync_delay < self._every:
            raise ValueError(f"DiLoCo: fragment_sync_delay={fragment_sync_delay!r}; it must be "
                             f"an int in [0, sync_every / F = {self._every}): a fragment's "
                             "all_reduce must be applied before the next one starts")
        if not 0.0 <= fragment_update_alpha <= 1.0:
            raise ValueError(f"DiLoCo: fragment_update_alpha={fragment_update_alpha!r}; give "
                             "a weight in [0, 1] (0: the outer step's weights alone)")
        outers = list(outer_optimizer) if isinstance(outer_optimizer, (list, tuple)) \
            else [outer_optimizer] * count
        if len(outers) != count:
            raise ValueError(f"DiLoCo: {len(outers)} outer optimizers for {count} fragments; "
                             "give one per fragment, or one for the whole model")
        self._group = as_group(group, "DiLoCo")
        self._algorithm = algorithm
        self._delay = fragment_sync_delay
        self._alpha = float(fragment_update_alpha)
        self._fragments = [list(f.parameters()) for f in fragments]
        self._outers = outers
        self._local_step = 0
        self._syncs = 0              # which fragment is next: syncs % F
        self._pending = None         # the averaged pseudo-gradient between prepare and apply
        self._install(inner_optimizer)
        for fragment in fragments:
            broadcast_module(fragment, group=self._group)
        # theta: the weights of the last sync, every rank's the same.
        self.original_parameters = [[backend.to_numpy(p.data).copy() for p in params]
                                    for params in self._fragments]

    def _after_step(self) -> None:
        self._local_step += 1
        fragment = self._syncs % len(self._fragments)
        if self._local_step == self._every - self._delay:
            self._pending = self.pseudo_gradient(fragment)
        if self._local_step == self._every:
            self.outer_step(fragment, self._pending)
            self._pending = None
            self._local_step = 0
            self._syncs += 1

    def pseudo_gradient(self, fragment: int = 0) -> list[np.ndarray]:
        """Delta = theta - theta_r averaged over the group (one all_reduce)."""
        mine = [theta - backend.to_numpy(p.data) for theta, p
                in zip(self.original_parameters[fragment], self._fragments[fragment])]
        return average_arrays(mine, self._group, self._algorithm) if mine else []

    def outer_step(self, fragment: int, delta) -> None:
        """Back to theta, one outer step with ``delta`` as the gradient, the
        result kept as the new theta (and mixed with theta_r by alpha)."""
        params = self._fragments[fragment]
        local = [backend.to_numpy(p.data).copy() for p in params] if self._alpha else None
        outer = self._outers[fragment]
        mine = {id(p) for p in params}
        for group in outer.param_groups:            # a shared outer optimizer: this fragment only
            for param in group["params"]:
                if id(param) not in mine:
                    param.grad = None
        for param, theta, grad in zip(params, self.original_parameters[fragment], delta):
            param.data[...] = backend.from_numpy(theta)
            param.grad = backend.from_numpy(np.asarray(grad, dtype=theta.dtype).copy())
        outer.step()
        self.original_parameters[fragment] = [backend.to_numpy(p.data).copy() for p in params]
        if local is not None:                        # torch's lerp: p + alpha (local - p)
            for param, theta_r in zip(params, local):
                param.data[...] += self._alpha * (backend.from_numpy(theta_r) - param.data)
        outer.zero_grad()
