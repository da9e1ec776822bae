"""Synchronised batch normalisation: batch statistics over the global batch.

Under data parallelism each rank sees only its shard of the batch. A plain
:class:`~minidist.nn.BatchNorm2d` then normalises by the mean and variance of
that shard: with 4 ranks of 8 images each, every rank normalises by its own 8
images, not by the 32 the step is about. Small shards give noisy statistics
(and different ranks different ones), which is what Hideki Tsunashima's
slides on ChainerMN (分散学習のあれこれ, 2019) call out and
what ChainerMN's ``MultiNodeBatchNormalization`` (PyTorch's
``SyncBatchNorm``) fixes: the ranks agree on the statistics of the whole
batch before normalising.

Forward, per channel, with M_r values of that channel on rank r (M_r = N_r,
or N_r * H * W for images)::

    local:       s1 = sum(x), s2 = sum(x * x), m = M_r
    all_reduce:  [s1 | s2 | m]  (2C + 1 numbers, one message per step)
    global:      M = sum m, mean = s1 / M, var = s2 / M - mean^2
    then:        x_hat = (x - mean) / sqrt(var + eps), y = weight * x_hat + bias

Backward needs two more global sums per channel, the ones that make the
input gradient go through the shared statistics::

    local:       sum(g), sum(g * x_hat)
    all_reduce:  [sum(g) | sum(g * x_hat)]  (2C numbers)
    grad_x = weight / sqrt(var + eps) * (g - sum(g) / M - x_hat * sum(g * x_hat) / M)

The weight and bias gradients stay *local* (``sum(g * x_hat)`` and
``sum(g)`` over this rank's shard), as in PyTorch: the data-parallel wrapper
already sums every parameter's gradient across ranks, and summing them here
too would count them twice. The sum over ranks of the local gradients is the
single-process gradient on the global batch.

Cost per layer and step: two all-reduces of about 2C numbers, so the
bandwidth term is tiny and the price is latency, 2 alpha log P (tree) or
2 * 2 (P - 1) alpha (ring), paid in the middle of forward and of backward
where nothing overlaps it. Tsunashima's slides report about 10 % more time
on DCGAN.
Both all-reduces run with a fixed ``algorithm`` (``"ring"`` by default,
:data:`DEFAULT_ALGORITHM`), so the bytes each rank sends are deterministic:
:func:`sync_batchnorm_bytes` gives them and the tests compare with the trace.

Uneven shards are exact: counts are summed, not assumed equal, so a rank
with 3 images and one with 5 give the statistics of the 8. A rank may even
hold no samples (its sums are zero); only the global batch needs more than
one value per channel. The sums are taken in float64, because
``E[x^2] - mean^2`` loses digits to cancellation in float32.

Running statistics are updated with the global mean and the *unbiased*
global variance, ``var * M / (M - 1)``, exactly as BatchNorm does on the
whole batch, so every rank holds the same running statistics. Evaluation
uses them and communicates nothing. Outside a launched run (or on one rank)
the layer is an ordinary BatchNorm.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.collectives.traffic import ring_all_reduce_sent
from minidist.distributed.device_mesh import as_group
from minidist.nn import functional as F
from minidist.nn.batchnorm import _BatchNorm
from minidist.nn.module import Module
from minidist.tensor import Tensor, _shape_str, no_grad

__all__ = ["SyncBatchNorm", "sync_batch_norm", "sync_batchnorm_bytes"]

#: The algorithm of the two all-reduces unless the layer is given another:
#: fixed, not "auto", so :func:`sync_batchnorm_bytes` is exact.
DEFAULT_ALGORITHM = "ring"


class SyncBatchNorm(_BatchNorm):
    """``SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True,
    track_running_stats=True, process_group=None, algorithm="ring")`` (torch's
    keywords): BatchNorm whose training statistics are those of the batch
    summed over the ranks of ``process_group`` (the world by default), with
    all-reduces of ``algorithm``.
    Input (N, C), (N, C, L) or (N, C, H, W); N may differ between ranks and
    may be 0. See the module docstring for the algorithm and its cost."""

    _expected_ndim = (2, 3, 4)
    _shape_text = "(N, C), (N, C, L) or (N, C, H, W)"

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, process_group=None,
                 dtype=np.float32, algorithm: str = DEFAULT_ALGORITHM):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, dtype)
        # Not a submodule or a buffer: a process group is not state to save.
        object.__setattr__(self, "process_group", as_group(process_group, "SyncBatchNorm"))
        self.algorithm = algorithm

    def forward(self, x):
        self._check_input(x)
        # PyTorch's rule: synchronise only when training in a distributed run;
        # evaluation (running statistics, or local batch statistics when none
        # are tracked) is purely local.
        if not (self.training and dist.is_initialized()):
            return super().forward(x)
        momentum = self.momentum
        if self.track_running_stats:
            self.num_batches_tracked.data += 1
            if momentum is None:
                momentum = 1.0 / int(self.num_batches_tracked.data)
        return sync_batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                               momentum=0.0 if momentum is None else momentum, eps=self.eps,
                               group=self.process_group, algorithm=self.algorithm)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        if self.process_group is None:
            return text
        return f"{text}, process_group={self.process_group!r}"

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group=None) -> Module:
        """Replace every BatchNorm1d/BatchNorm2d in ``module``'s tree by a
        SyncBatchNorm with the same arguments, sharing the same weight and
        bias Parameters (an optimizer built before still updates them) and
        copying the running statistics and the train/eval mode. Returns the
        converted module (a new object if ``module`` itself is a BatchNorm;
        otherwise ``module``, changed in place), as PyTorch's does; the new
        layers synchronise over ``process_group`` (None: the world)."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            dtype = (module.weight.data.dtype if module.weight is not None
                     else module.running_mean.data.dtype if module.running_mean is not None
                     else np.float32)
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group=process_group,
                            dtype=dtype)
            if module.affine:
                converted.weight = module.weight
                converted.bias = module.bias
            if module.track_running_stats:
                with no_grad():
                    converted.running_mean = module.running_mean.data.copy()
                    converted.running_var = module.running_var.data.copy()
                    converted.num_batches_tracked = module.num_batches_tracked.data.copy()
            converted.training = module.training
        for name, child in list(module.named_children()):
            if child is not None:
                converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return converted


def sync_batch_norm(input, running_mean, running_var, weight, bias, momentum: float = 0.1,
                    eps: float = 1e-5, group=None, algorithm: str = DEFAULT_ALGORITHM) -> Tensor:
    """Batch normalisation in training mode with statistics over every rank of
    ``group``: one all_reduce (of ``algorithm``) forward, one backward (when
    the input needs a gradient). Every rank of the group must call it, in the
    same order, with the same channel count; batch sizes may differ.
    ``running_mean`` and ``running_var`` (Tensors, arrays or None) are
    updated in place."""
    input = F._tensor(input)
    dtype = weight.data.dtype if weight is not None else input.data.dtype
    x = F._in_dtype(input.data, dtype)
    xp = backend.of(x)
    channels = x.shape[1]
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, channels) + (1,) * (x.ndim - 2)
    group = as_group(group, "sync_batch_norm")
    rank = dist.get_rank(group)

    # One message carries the three sums: [sum x | sum x^2 | count].
    wide = x.astype(np.float64)
    sums = np.empty(2 * channels + 1, np.float64)
    sums[:channels] = wide.sum(axis=axes)
    sums[channels:2 * channels] = (wide * wide).sum(axis=axes)
    sums[-1] = x.size // channels
    dist.all_reduce(sums, group=group, algorithm=algorithm)
    count = int(round(sums[-1]))
    if count <= 1:
        raise ValueError(
            f"SyncBatchNorm on rank {rank}: the global batch has {count} value(s) per channel "
            f"(this rank's input is {_shape_str(x.shape)}); training needs more than one: use a "
            "bigger batch, or call model.eval()"
        )
    mean64 = sums[:channels] / count
    var64 = np.maximum(sums[channels:2 * channels] / count - mean64 * mean64, 0.0)
    mean, var = mean64.astype(dtype), var64.astype(dtype)
    inv_std = (1.0 / np.sqrt(var64 + eps)).astype(dtype)

    rm = running_mean.data if isinstance(running_mean, Tensor) else running_mean
    rv = running_var.data if isinstance(running_var, Tensor) else running_var
    if rm is not None and rv is not None:
        rm *= 1.0 - momentum
        rm += momentum * mean
        rv *= 1.0 - momentum
        rv += (momentum * count / (count - 1)) * var

    x_hat = (x - mean.reshape(shape)) * inv_std.reshape(shape)
    w = weight.data if weight is not None else None
    out = x_hat if w is None else x_hat * w.reshape(shape)
    if bias is not None:
        out = out + bias.data.reshape(shape)

    def backward(g):
        need_x = input.requires_grad
        sum_g = g.sum(axis=axes)
        sum_g_x_hat = (g * x_hat).sum(axis=axes)
        grad_x = None
        if need_x:
            # The input gradient goes through the global mean and variance, so
            # it needs the global sums; weight and bias keep the local ones.
            both = np.concatenate([sum_g, sum_g_x_hat]).astype(np.float64)
            dist.all_reduce(both, group=group, algorithm=algorithm)
            global_g = both[:channels].astype(dtype)
            global_g_x_hat = both[channels:].astype(dtype)
            scale = inv_std if w is None else w * inv_std
            grad_x = g - (global_g / count).reshape(shape)
            grad_x -= x_hat * (global_g_x_hat / count).reshape(shape)
            grad_x *= scale.reshape(shape)
            grad_x = xp.asarray(grad_x, dtype=input.data.dtype)
        grads = (grad_x,)
        if weight is not None:
            grads += (sum_g_x_hat,)
        if bias is not None:
            grads += (sum_g,)
        return grads

    parents = tuple(p for p in (input, weight, bias) if p is not None)
    return Tensor._make(out, parents, backward, "sync_batch_norm")


def sync_batchnorm_bytes(num_features: int, world_size: int,
                         itemsize: int = 8) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The bytes each rank sends in one training step of a
    :class:`SyncBatchNorm` of ``num_features`` channels with ring
    all-reduces (its default): ``(forward, backward)``, each a tuple with one
    entry per rank, in rank order (what the rank's ``send`` events in the
    trace add up to). Independent of the batch and the image size.

    C = num_features, n = world_size, ``itemsize`` = 8 (the sums are
    float64), AR(V) = :func:`~minidist.distributed.collectives.traffic.ring_all_reduce_sent`:
    2 V - c[(r+1) mod n] - c[(r+2) mod n] values on rank r, c the n
    ``numpy.array_split`` chunk sizes of V (2 (n-1)/n V when n divides V)::

        forward  = itemsize * AR(2 C + 1)    [sum x | sum x^2 | count]
        backward = itemsize * AR(2 C)        [sum g | sum g * x_hat]

    The backward all_reduce runs only when the input needs a gradient.
    """
    if int(num_features) < 1 or int(world_size) < 1 or int(itemsize) < 1:
        raise ValueError(f"sync_batchnorm_bytes needs num_features, world_size and itemsize "
                         f">= 1, got {num_features}, {world_size}, {itemsize}")
    forward = ring_all_reduce_sent(2 * num_features + 1, world_size)
    backward = ring_all_reduce_sent(2 * num_features, world_size)
    return (tuple(itemsize * v for v in forward), tuple(itemsize * v for v in backward))
