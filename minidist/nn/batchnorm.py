"""BatchNorm1d and BatchNorm2d: normalise each channel by batch statistics.

In training, each channel is normalised by the mean and variance of the
current batch, then scaled and shifted by the learned ``weight`` and
``bias``; the running statistics (buffers, saved in the state dict, not
learned) track an exponential average of the batch statistics. In
evaluation the running statistics are used instead, so a sample's output no
longer depends on the rest of its batch. The formulas and the hand-written
backward are in :func:`minidist.nn.functional.batch_norm`.

Why this matters for the course: the batch statistics are the one place
where samples of a batch interact, so under data parallelism each rank
normalises by its *local* batch unless the statistics are all-reduced
(synchronised batch norm, ``parallel/data/sync_batchnorm.py``).
"""

from __future__ import annotations

import numpy

from minidist import backend
from minidist.nn import functional as F
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter
from minidist.tensor import _shape_str


class _BatchNorm(Module):
    _expected_ndim: tuple = ()
    _shape_text = ""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        dtype=numpy.float32,
    ):
        super().__init__()
        if num_features < 1:
            raise ValueError(f"{type(self).__name__} needs num_features >= 1, got {num_features}")
        self.num_features = int(num_features)
        self.eps = float(eps)
        self.momentum = momentum
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        xp = backend.get()
        if affine:
            self.weight = Parameter(xp.ones(num_features, dtype=dtype))
            self.bias = Parameter(xp.zeros(num_features, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", xp.zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", xp.ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", xp.zeros((), dtype=numpy.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.data[...] = 0
            self.running_var.data[...] = 1
            self.num_batches_tracked.data[...] = 0

    def _check_input(self, x) -> None:
        """The input's shape fits this layer (also used by SyncBatchNorm)."""
        shape = x.shape
        if len(shape) not in self._expected_ndim or shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}) expects input of shape "
                f"{self._shape_text} with C={self.num_features}, got {_shape_str(shape)}; "
                "check num_features against the previous layer's output channels"
            )

    def forward(self, x):
        self._check_input(x)
        momentum = self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.data += 1
            if momentum is None:
                # momentum=None: the cumulative average of all batches so far.
                momentum = 1.0 / int(self.num_batches_tracked.data)
        return F.batch_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            training=self.training or not self.track_running_stats,
            momentum=0.0 if momentum is None else momentum,
            eps=self.eps,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    """``BatchNorm1d(num_features, eps=1e-5, momentum=0.1, affine=True,
    track_running_stats=True)`` for (N, C) or (N, C, L) input: statistics per
    channel C over N (and L). Cost: a few passes over the input each way."""

    _expected_ndim = (2, 3)
    _shape_text = "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """``BatchNorm2d(num_features, ...)`` for (N, C, H, W) images: statistics
    per channel C over N, H and W. Cost: a few passes over the input each way."""

    _expected_ndim = (4,)
    _shape_text = "(N, C, H, W)"
