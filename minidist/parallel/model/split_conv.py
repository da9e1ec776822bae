"""Splitting one convolution across ranks: what the two splits share.

Two of the four ways to split a convolutional network (by node, by layer, by
channel, by space) that Hideki Tsunashima's slides list
("分散学習のあれこれ~データパラレルからモデルパラレルまで~", 2019); the other two
are data parallelism and the pipeline, elsewhere in :mod:`minidist.parallel`.
Read this first, then :mod:`.channel_parallel` (every rank a slice of the
output channels, the output all-gathered) and :mod:`.spatial_parallel`
(every rank a band of image rows, the border rows swapped with the
neighbours: the halo). Both layers are built from an ordinary :class:`~minidist.nn.Conv2d` with
``from_conv`` and, on any world size the shapes allow, give the same
outputs and gradients as that unsplit layer (up to float32 round-off).

What they share:

* the band rule (:func:`band`): how ``total`` channels or rows are cut into
  consecutive bands, one per rank, as ``numpy.array_split`` cuts them;
* a weight and bias for some rows of the output channels, and the whole
  convolution's shape (``_SplitConv2d``);
* the sum of a gradient over the ranks, for a tensor every rank holds whole
  but whose gradient each knows only a part of (``_gradient_summed_across``:
  the identity forward, one all_reduce of the tensor's size backward).

Everything here uses the public ``minidist.distributed`` API: all_gather,
all_reduce and isend/irecv, inside autograd nodes made with
``Tensor._make``; the autograd itself knows nothing of processes. Every rank
of the group must run the same layers in the same order (forward and
backward), as with any collective.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.distributed.device_mesh import as_group
from minidist.nn import functional as F
from minidist.nn.conv import Conv2d
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter
from minidist.tensor import Tensor

__all__ = ["band"]


def band(total: int, parts: int, index: int) -> tuple[int, int]:
    """The band rule: rows (or channels) ``[start, stop)`` of part ``index``
    when ``total`` are split into ``parts`` consecutive bands, as
    ``numpy.array_split`` does: every band has ``total // parts`` items and the
    first ``total % parts`` bands one more. 10 rows on 4 ranks: 3, 3, 2, 2."""
    size, extra = divmod(total, parts)
    start = index * size + min(index, extra)
    return start, start + size + (1 if index < extra else 0)


def _gradient_summed_across(tensor: Tensor, group, what: str, algorithm: str = "auto") -> Tensor:
    """The identity forward; backward all-reduces (sums) the gradient over
    ``group`` with ``algorithm``. Put in front of something every rank holds
    whole (the input of the channel split, the weight of the spatial split)
    whose gradient each rank knows only a part of."""
    def backward(g):
        total = np.array(g, copy=True, order="C")
        with trace.region(f"{what}: all_reduce of the gradient"):
            dist.all_reduce(total, group=group, algorithm=algorithm)
        return (total,)

    return Tensor._make(tensor.data, (tensor,), backward, "sum_gradient_across_ranks")


def _describe(conv) -> str:
    kernel, stride, padding = conv.kernel_size, conv.stride, conv.padding
    return (f"{type(conv).__name__}({conv.in_channels}, {conv.out_channels}, "
            f"kernel_size={kernel}, stride={stride}, padding={padding})")


def _refuse_grouped(conv, name: str) -> None:
    """The splits here assume a dense convolution (every output channel
    reads every input channel); a grouped one would need its own split."""
    if getattr(conv, "groups", 1) != 1:
        raise ValueError(f"{name}.from_conv: conv has groups={conv.groups}; only dense "
                         "convolutions (groups=1) can be split here. Keep a grouped or "
                         "depthwise convolution whole on every rank.")


class _SplitConv2d(Module):
    """What the two split layers share: the whole convolution's shape
    (channels, kernel, stride, padding, read as :class:`~minidist.nn.Conv2d`
    reads them), the group it is split over, and a weight and bias for
    ``rows`` of its output channels."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride, padding, group):
        super().__init__()
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = F._pair(kernel_size, "kernel_size")
        self.stride = F._pair(stride, "stride")
        self.padding = F._pair(padding, "padding", minimum=0)
        group = as_group(group, type(self).__name__)
        object.__setattr__(self, "group", group)

    def _make_parameters(self, rows: int, bias: bool, dtype) -> None:
        """Zero weight (rows, in_channels, kh, kw) and bias (rows,): :meth:`from_conv` fills them."""
        self.weight = Parameter(np.zeros((rows, self.in_channels) + self.kernel_size, dtype))
        if bias:
            self.bias = Parameter(np.zeros(rows, dtype))
        else:
            self.register_parameter("bias", None)

    @classmethod
    def _shaped_like(cls, conv: Conv2d, group, **options):
        """A layer of ``conv``'s shape, bias and dtype, its parameters not yet copied."""
        _refuse_grouped(conv, cls.__name__)
        return cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                   conv.padding, bias=conv.bias is not None, group=group,
                   dtype=conv.weight.data.dtype, **options)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")

