"""DDP's buckets: the gradients packed into a few flat buffers, one all-reduce each.

A model of many small parameters would pay one all-reduce, and its alpha
terms, per parameter. DDP instead packs consecutive parameters, in the order
backward completes their gradients, into buckets of about ``bucket_cap_mb``
megabytes (torch's name and default, 25): each gradient is a view into its
bucket's flat buffer, so backward writes straight into what is sent, and a
step costs one all-reduce per bucket, ``B`` alpha terms instead of one per
parameter, for the same ``2 (N - 1) / N P`` bytes per rank on a ring.

:class:`GradBucket` is what a communication hook sees of one bucket (torch's
``torch.distributed.GradBucket``): the flat buffer to send and the number
the average divides by. Read with :mod:`.ddp`, which fills the buckets
during backward; the hooks of :mod:`.compression` and :mod:`.powersgd`
send fewer bytes.

Cost: no byte beside the gradients (the gradients *are* the buckets' views),
one copy into the bucket for a gradient that arrives as a fresh array.
"""

from __future__ import annotations

import numpy as np

from minidist import backend


class _Bucket:
    """Consecutive parameters (in backward's order) whose gradients are
    views into one flat buffer, all-reduced as one message."""

    def __init__(self, parameters, dtype):
        self.parameters = parameters
        # On the parameters' device (NumPy, or CuPy on a GPU: the all-reduce
        # stages it through host memory, see distributed/device_arrays.py).
        xp = backend.of(parameters[0].data)
        self.flat = xp.zeros(sum(p.data.size for p in parameters), dtype)
        self.views = {}
        offset = 0
        for param in parameters:
            size = param.data.size
            self.views[id(param)] = self.flat[offset:offset + size].reshape(param.data.shape)
            offset += size
        self.pending = len(parameters)
        self.queued = False
        self.hooked = False     # a comm hook wrote the averaged gradient this step


def _make_buckets(parameters, bucket_bytes: int, dtype) -> list[_Bucket]:
    """Cut ``parameters`` (in backward's order) into consecutive buckets of at
    most ``bucket_bytes`` each; a parameter larger than that is a bucket alone."""
    buckets, current, current_bytes = [], [], 0
    for param in parameters:
        if current and current_bytes + param.data.nbytes > bucket_bytes:
            buckets.append(_Bucket(current, dtype))
            current, current_bytes = [], 0
        current.append(param)
        current_bytes += param.data.nbytes
    buckets.append(_Bucket(current, dtype))
    return buckets


class GradBucket:
    """What a communication hook receives: one bucket of DDP, as in
    ``torch.distributed.GradBucket``.

    * ``buffer()``: the flat gradient of the bucket, this rank's gradient
      multiplied by its number of examples (b_r g_r), the array an all-reduce
      would sum. The hook may change it in place.
    * ``divisor()``: the examples of all ranks (sum of b_r); the average is
      ``sum_r buffer_r / divisor()``, the whole batch's mean gradient (with
      equal shards, ``divisor() == world_size * b``).
    * ``index()``, ``is_last()``, ``parameters()``, ``gradients()``, ``group``,
      ``world_size``, ``rank``, ``algorithm`` (DDP's all-reduce algorithm).
    """

    def __init__(self, bucket: _Bucket, index: int, count: int, *, last: bool, group,
                 world_size: int, rank: int, algorithm: str):
        self._bucket = bucket
        self._index = index
        self._count = count
        self._last = last
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self.algorithm = algorithm

    def buffer(self) -> np.ndarray:
        return self._bucket.flat

    def divisor(self) -> int:
        return self._count

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def parameters(self) -> list:
        """The bucket's parameters, in the order their gradients sit in ``buffer()``."""
        return list(self._bucket.parameters)

    def gradients(self) -> list[np.ndarray]:
        """Each parameter's gradient: views into ``buffer()``, shaped as the parameter."""
        return [self._bucket.views[id(p)] for p in self._bucket.parameters]

    def __repr__(self):
        return (f"GradBucket(index={self._index}, size={self._bucket.flat.size}, "
                f"dtype={self._bucket.flat.dtype})")
