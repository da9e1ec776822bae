"""A convolution split by output channel (ChainerMN's channel-wise model parallelism).

Read after :mod:`.split_conv`. Every rank holds the whole input and a slice
of the output channels (a slice of the weight's first axis). It computes its
channels, then the ranks all-gather the slices into the full output, because
the next layer mixes *every* input channel into each of its outputs: no rank
can go on with a quarter of the channels. Backward mirrors this: each rank
takes the gradient of its own channels, computes its part of the input
gradient, and the parts are summed by an all-reduce (every output channel
contributes to the gradient of every input pixel).

Cost per layer and step, A the output's bytes and X the input's, P ranks, on
a ring: ``(P - 1) / P * A`` sent per rank forward and ``2 (P - 1) / P * X``
backward, about the activation's size each way whatever P is, while the
compute shrinks by P (:func:`channel_parallel_bytes` gives the exact bytes).
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.distributed.collectives.traffic import ring_all_gather_sent, ring_all_reduce_sent
from minidist.nn import functional as F
from minidist.nn.conv import Conv2d
from minidist.parallel.model.split_conv import (
    _describe,
    _gradient_summed_across,
    _SplitConv2d,
    band,
)
from minidist.tensor import Tensor

__all__ = ["ChannelParallelConv2d", "channel_parallel_bytes"]

#: The algorithm of the channel split's collectives (the all_gather of the
#: output, the all_reduce of the input gradient) unless the layer is given
#: another: fixed, not "auto", so the bytes each rank sends are
#: deterministic and :func:`channel_parallel_bytes` gives them.
DEFAULT_ALGORITHM = "ring"


class ChannelParallelConv2d(_SplitConv2d):
    """A Conv2d whose output channels are split across the ranks of ``group``.

    Rank r holds the weight rows ``band(out_channels, P, r)`` (and that slice
    of the bias); build it with :meth:`from_conv`. Input: the whole
    (N, C, H, W) batch, the same on every rank. Output: the whole
    (N, out_channels, OH, OW), the same on every rank.

    Forward: conv with the local weights -> (N, C_r, OH, OW), then
    **all_gather** along the channel axis. Backward: the slice of the output
    gradient for the local channels -> local weight and bias gradients (no
    communication: only this rank has these weights) and a partial input
    gradient, summed over the ranks by an **all_reduce**.

    Why every output is gathered, and what it costs: the next layer (a conv,
    a BatchNorm over all channels, a dense layer after flattening) reads all
    channels, so after every split layer each rank needs the whole
    activation. Per layer and step, with A = N * out_channels * OH * OW * 4
    bytes of output and X = N * C * H * W * 4 bytes of input, a ring moves
    per rank ``(P - 1) / P * A`` forward and ``2 (P - 1) / P * X`` backward,
    about the activation's size each way whatever P is, while the compute
    only shrinks by P. The messages sit on the critical path (nothing else
    can run while the next layer waits for its input), so unlike data
    parallelism nothing hides them. Hideki Tsunashima's slides on ChainerMN
    (2019) report channel-wise model parallelism on 4 GPUs about 2x (DCGAN) and 3x (VGG-16) *slower* than one
    GPU on CIFAR-10: it is for a model that does not fit, not for speed.

    When out_channels does not divide by P the slices differ by one channel;
    the all_gather needs equal pieces, so each rank pads its slice to the
    largest and the padding is dropped after the gather.

    Both collectives run with ``algorithm`` (``"ring"`` by default, see
    :data:`DEFAULT_ALGORITHM`); :func:`channel_parallel_bytes` gives the exact
    bytes each rank sends with the ring, padding and uneven chunks included.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True, group=None, dtype=np.float32,
                 algorithm: str = DEFAULT_ALGORITHM):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, group)
        self.algorithm = algorithm
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if self.out_channels < world:
            raise ValueError(
                f"ChannelParallelConv2d of {_describe(self)}: {self.out_channels} output "
                f"channels (dimension C_out) cannot be split over {world} ranks; every rank "
                "needs at least one channel: use fewer ranks or more channels"
            )
        self.channel_start, self.channel_stop = band(self.out_channels, world, rank)
        self.channel_bands = [band(self.out_channels, world, r) for r in range(world)]
        self._make_parameters(self.channel_stop - self.channel_start, bias, dtype)

    @classmethod
    def from_conv(cls, conv: Conv2d, group=None,
                  algorithm: str = DEFAULT_ALGORITHM) -> ChannelParallelConv2d:
        """This rank's share of ``conv``: its slice of the weight and bias
        (copies), same kernel, stride and padding. Every rank calls it with
        the same ``conv``."""
        layer = cls._shaped_like(conv, group, algorithm=algorithm)
        rows = slice(layer.channel_start, layer.channel_stop)
        layer.weight.data[...] = conv.weight.data[rows]
        if conv.bias is not None:
            layer.bias.data[...] = conv.bias.data[rows]
        return layer

    def forward(self, x):
        x = F._tensor(x)
        what = f"channel-parallel conv, channels {self.channel_start}:{self.channel_stop}"
        x_in = _gradient_summed_across(x, self.group, what, self.algorithm)
        with trace.region(f"{what}: local conv"):
            local = F.conv2d(x_in, self.weight, self.bias, self.stride, self.padding)
        return _gather_channels(local, self.channel_bands, self.group, what, self.algorithm)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, channels={self.channel_start}:{self.channel_stop}"


def _gather_channels(local: Tensor, bands, group, what: str, algorithm: str) -> Tensor:
    """All-gather the (N, C_r, OH, OW) slices into (N, C_out, OH, OW); backward
    hands this rank the gradient of its own channels."""
    y = local.data
    widest = max(stop - start for start, stop in bands)
    piece = np.zeros((y.shape[0], widest) + y.shape[2:], y.dtype)
    piece[:, :y.shape[1]] = y
    pieces = [np.empty_like(piece) for _ in bands]
    with trace.region(f"{what}: all_gather of the output"):
        dist.all_gather(pieces, piece, group=group, algorithm=algorithm)
    out = np.concatenate([p[:, :stop - start] for p, (start, stop) in zip(pieces, bands)], axis=1)
    start, stop = bands[dist.get_rank(group)]

    def backward(g):
        return (np.ascontiguousarray(g[:, start:stop]),)

    return Tensor._make(out, (local,), backward, "all_gather_channels")


def channel_parallel_bytes(batch: int, in_channels: int, out_channels: int, height_in: int,
                           width_in: int, height_out: int, width_out: int, world_size: int,
                           itemsize: int = 4) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The bytes each rank sends in one forward and one backward pass of a
    :class:`ChannelParallelConv2d` with ring collectives (its default):
    ``(forward, backward)``, each a tuple with one entry per rank, in rank
    order (what the rank's ``send`` events in the trace add up to).

    N = batch, C = in_channels, n = world_size, OH x OW the output's and
    H x W the input's height and width, ``itemsize`` bytes a value
    (4 for float32), AG(P) = :func:`~minidist.distributed.collectives.traffic.ring_all_gather_sent`
    ((n - 1) P values), AR(V) = :func:`~minidist.distributed.collectives.traffic.ring_all_reduce_sent`
    (2 V - c[(r+1) mod n] - c[(r+2) mod n] values on rank r, c the n
    ``numpy.array_split`` chunk sizes of V; 2 (n-1)/n V when n divides V)::

        widest   = ceil(out_channels / n)        (the slices, padded to the widest)
        forward  = itemsize * AG(N * widest * OH * OW)     all_gather of the output
        backward = itemsize * AR(N * C * H * W)            all_reduce of the input gradient

    The backward all_reduce runs only when the input needs a gradient (a
    layer below it, or an input with ``requires_grad``); the weight and bias
    gradients need no message. On one rank both are 0.
    """
    for name, value in (("batch", batch), ("in_channels", in_channels),
                        ("out_channels", out_channels), ("height_in", height_in),
                        ("width_in", width_in), ("height_out", height_out),
                        ("width_out", width_out), ("world_size", world_size),
                        ("itemsize", itemsize)):
        if int(value) < 1:
            raise ValueError(f"channel_parallel_bytes needs {name} >= 1, got {value}")
    widest = -(-out_channels // world_size)
    forward = ring_all_gather_sent(batch * widest * height_out * width_out, world_size)
    backward = ring_all_reduce_sent(batch * in_channels * height_in * width_in, world_size)
    return (tuple(itemsize * v for v in forward), tuple(itemsize * v for v in backward))

