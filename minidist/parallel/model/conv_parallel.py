"""Splitting one convolution across ranks: by output channel, or by image rows.

Two of the four ways seed 002 lists to split a convolutional network (by
node, by layer, by channel, by space); the other two are data parallelism
and the pipeline, elsewhere in :mod:`minidist.parallel`. Both layers here are
built from an ordinary :class:`~minidist.nn.Conv2d` with ``from_conv`` and,
on any world size the shapes allow, give the same outputs and gradients as
that unsplit layer (up to float32 round-off).

**By channel** (:class:`ChannelParallelConv2d`, ChainerMN's channel-wise
model parallelism). Every rank holds the whole input and a slice of the
output channels (a slice of the weight's first axis). It computes its
channels, then the ranks all-gather the slices into the full output, because
the next layer mixes *every* input channel into each of its outputs: no rank
can go on with a quarter of the channels. Backward mirrors this: each rank
takes the gradient of its own channels, computes its part of the input
gradient, and the parts are summed by an all-reduce (every output channel
contributes to the gradient of every input pixel).

**By space** (:class:`SpatialParallelConv2d`). Every rank holds the whole
weight and a band of image rows. An output row needs ``kernel`` consecutive
input rows, so near a band's border it needs a few rows that live on the
neighbour: the *halo*. Before the convolution the ranks swap just those
rows; backward sends the halo rows' gradients back to their owners, who add
them in. A 3x3 kernel with stride 1 and padding 1 needs one row from each
neighbour, whatever the image's size, so the messages stay small while the
compute grows with the image (seed 002: worthwhile on 1024x1024 images).

Everything here uses the public ``minidist.distributed`` API: all_gather,
all_reduce and isend/irecv, inside autograd nodes made with
``Tensor._make``; the autograd itself knows nothing of processes. Every rank
of the group must run the same layers in the same order (forward and
backward), as with any collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.distributed.collectives.traffic import ring_all_gather_sent, ring_all_reduce_sent
from minidist.distributed.device_mesh import as_group
from minidist.nn import functional as F
from minidist.nn.conv import Conv2d
from minidist.nn.im2col import output_size
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter
from minidist.tensor import Tensor, _shape_str

__all__ = ["ChannelParallelConv2d", "SpatialParallelConv2d", "band", "halo_plan", "HaloPlan",
           "halo_context", "channel_parallel_bytes"]

#: The algorithm of the channel split's collectives (the all_gather of the
#: output, the all_reduce of the input gradient) unless the layer is given
#: another: fixed, not "auto", so the bytes each rank sends are
#: deterministic and :func:`channel_parallel_bytes` gives them.
DEFAULT_ALGORITHM = "ring"

#: Tags of the halo messages (forward rows, backward gradients of those rows),
#: sent in the group's own "halo" message context (:func:`halo_context`), so
#: they never match a point-to-point message of the user's with the same tag.
HALO_TAG = 18_001
HALO_GRAD_TAG = 18_002
HALO_CONTEXT = "halo"


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


# =========================================================================== by channel



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
    parallelism nothing hides them. Seed 002 measured channel-wise model
    parallelism on 4 GPUs about 2x (DCGAN) and 3x (VGG-16) *slower* than one
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


# =========================================================================== by space


@dataclass(frozen=True)
class HaloPlan:
    """Who holds which rows and which rows move, for one layer and one image
    height; a pure function of the geometry (see :func:`halo_plan`).

    ``input_bands[r]`` / ``output_bands[r]``: rank r's rows ``[start, stop)``
    of the input and of the output. ``windows[r] = (top, rows)``: the input
    rows rank r's output band reads, ``top`` (negative inside the top padding)
    to ``top + rows``; rows outside ``[0, height)`` are padding zeros.
    ``transfers``: ``(source, destination, start, stop)``, input rows
    ``[start, stop)`` that ``source`` owns and ``destination`` needs; backward
    sends the gradients of the same rows the other way."""

    height: int
    output_height: int
    input_bands: tuple
    output_bands: tuple
    windows: tuple
    transfers: tuple

    def rows_moved(self) -> int:
        """Halo rows sent, over all ranks, one way (forward)."""
        return sum(stop - start for _, _, start, stop in self.transfers)


def halo_plan(height: int, kernel: int, stride: int, padding: int, world_size: int) -> HaloPlan:
    """The halo rule along the rows of a convolution split into bands.

    Input rows and output rows are both split by :func:`band` (so a
    spatial-parallel layer's output is laid out like its input and the next
    layer can take it as is). Output row ``o`` reads padded rows
    ``o * stride .. o * stride + kernel - 1``, input rows
    ``o * stride - padding .. o * stride - padding + kernel - 1``. Rank r's
    output band ``[o0, o1)`` therefore reads input rows
    ``[o0 * stride - padding, (o1 - 1) * stride - padding + kernel)``: its
    window. The window's rows in ``[0, height)`` that another rank owns are the
    halo; for stride 1 and padding ``(kernel - 1) / 2`` that is ``padding``
    rows from each neighbour (1 for a 3x3 kernel). A thin band can need rows
    from beyond its neighbour; the plan then lists those transfers too.
    """
    output_height = output_size(height, kernel, stride, padding)
    inputs = tuple(band(height, world_size, r) for r in range(world_size))
    outputs = tuple(band(output_height, world_size, r) for r in range(world_size))
    windows, transfers = [], []
    for destination, (first, stop) in enumerate(outputs):
        top = first * stride - padding
        rows = (stop - first - 1) * stride + kernel
        windows.append((top, rows))
        need = (max(top, 0), min(top + rows, height))
        for source, (start, end) in enumerate(inputs):
            low, high = max(start, need[0]), min(end, need[1])
            if source != destination and low < high:
                transfers.append((source, destination, low, high))
    return HaloPlan(height, output_height, inputs, outputs, tuple(windows), tuple(transfers))


class SpatialParallelConv2d(_SplitConv2d):
    """A Conv2d whose images are split by rows across the ranks of ``group``.

    Every rank holds the whole weight and bias (build it with
    :meth:`from_conv`) and the band of input rows :func:`band` gives it:
    input (N, C, H_r, W) with ``(start, stop) = band(H, P, rank)``; output
    (N, C_out, OH_r, OW), its band of the output rows by the same rule.
    ``H`` is learned each forward by an all_gather of every rank's shape
    (4 integers each: a latency term, and the check that the bands follow the
    rule); N, C and W must agree across ranks.

    Forward: (1) the halo exchange of :func:`halo_plan`, with isend/irecv
    straight between the ranks that share a border: each rank sends the
    rows its neighbours' windows read, and builds its own window from its
    rows, the received rows, and zeros for the top and bottom padding;
    (2) an ordinary conv of the window, padded only along the width.
    Backward: the conv's backward gives the window's gradient; the halo
    rows' gradients go back to their owners, who add them to their own rows'
    gradient; the weight and bias gradients (each rank's covers its rows
    only) are summed by an all_reduce.

    Cost per layer and step, for the 3x3, stride 1, padding 1 case: each rank
    sends and receives at most 2 rows of N * C * W values forward and the
    same backward (two messages to each neighbour), plus the all_reduce of
    the weight gradient, against 1 / P of the convolution's work.

    Every message of the exchange carries a label for the trace,
    ``"halo rows a:b to rank d #halo=forward rows=a:b height=H layer=..."``
    (``halo=backward`` for the gradients), so a picture can show which rows
    moved.

    Shapes that cannot be split raise ValueError naming the layer, the
    dimension and the world size: fewer input rows (H) or output rows (OH)
    than ranks, bands that do not follow the rule, or N, C, W that differ.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True, group=None, dtype=np.float32):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, group)
        self._make_parameters(self.out_channels, bias, dtype)   # the whole weight on every rank
        self.last_plan: HaloPlan | None = None

    @classmethod
    def from_conv(cls, conv: Conv2d, group=None) -> SpatialParallelConv2d:
        """A copy of ``conv`` (weights included) that takes a band of rows."""
        layer = cls._shaped_like(conv, group)
        layer.weight.data[...] = conv.weight.data
        if conv.bias is not None:
            layer.bias.data[...] = conv.bias.data
        return layer

    def plan(self, height: int) -> HaloPlan:
        """The halo plan of this layer for an image of ``height`` rows."""
        return halo_plan(height, self.kernel_size[0], self.stride[0], self.padding[0],
                         dist.get_world_size(self.group))

    def _check_shapes(self, x) -> HaloPlan:
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        name = f"SpatialParallelConv2d of {_describe(self)} on {world} ranks"
        if x.ndim != 4:
            raise ValueError(f"{name}: rank {rank} got input {_shape_str(x.shape)}, expected its "
                             "band of rows (N, C, H_r, W)")
        mine = np.array(x.shape, np.int64)
        shapes = [np.empty_like(mine) for _ in range(world)]
        dist.all_gather(shapes, mine, group=self.group)
        shapes = np.stack(shapes)
        for axis, dimension in ((0, "N"), (1, "C"), (3, "W")):
            if len(set(shapes[:, axis].tolist())) > 1:
                raise ValueError(
                    f"{name}: the ranks' inputs differ in dimension {dimension} "
                    f"({shapes[:, axis].tolist()} by rank); only the rows (H) are split")
        height = int(shapes[:, 2].sum())
        if height < world:
            raise ValueError(
                f"{name}: the image has {height} rows (dimension H), fewer than the {world} "
                "ranks; every rank needs at least one row: use fewer ranks or taller images")
        if x.shape[1] != self.in_channels:
            raise ValueError(f"{name}: the input has {x.shape[1]} channels, the layer expects "
                             f"in_channels={self.in_channels}")
        expected = [stop - start for start, stop in
                    (band(height, world, r) for r in range(world))]
        if shapes[:, 2].tolist() != expected:
            raise ValueError(
                f"{name}: the ranks hold {shapes[:, 2].tolist()} rows, but the band rule "
                f"(numpy.array_split) splits H={height} rows as {expected}; split the image "
                "with minidist.parallel.model.conv_parallel.band(H, world_size, rank)")
        kernel, stride, padding = self.kernel_size[0], self.stride[0], self.padding[0]
        if height + 2 * padding < kernel:
            raise ValueError(f"{name}: the {kernel}-row kernel does not fit in H={height} rows "
                             f"padded by {padding}")
        output_height = output_size(height, kernel, stride, padding)
        if output_height < world:
            raise ValueError(
                f"{name}: H={height} input rows give {output_height} output rows (dimension "
                f"OH), fewer than the {world} ranks; every rank needs at least one output row: "
                "use fewer ranks, taller images or a smaller stride")
        return self.plan(height)

    def forward(self, x):
        x = F._tensor(x)
        plan = self._check_shapes(x.data)
        self.last_plan = plan
        what = (f"spatial-parallel conv {self.kernel_size[0]}x{self.kernel_size[1]} "
                f"stride {self.stride[0]} padding {self.padding[0]}")
        window = _halo_exchange(x, plan, self.group, what)
        weight = _gradient_summed_across(self.weight, self.group, what)
        bias = None if self.bias is None else _gradient_summed_across(self.bias, self.group, what)
        with trace.region(f"{what}: local conv"):
            return F.conv2d(window, weight, bias, self.stride, (0, self.padding[1]))



def halo_context(group=None):
    """The group (the world when None) in the message context of the halo
    exchange: the same members, a separate message space, as the parameter
    server does with its messages."""
    return (group if group is not None else dist.world_group()).with_context(HALO_CONTEXT)


def _halo_label(direction: str, start: int, stop: int, text: str, what: str,
                height: int) -> str:
    """A halo message's trace label: readable text, then the rows it carries
    and the image's height (so a picture can lay out every rank's band)."""
    return trace.with_info(text, halo=direction, rows=(start, stop), height=height, layer=what)


def _halo_exchange(x: Tensor, plan: HaloPlan, group, what: str) -> Tensor:
    """This rank's window of input rows (its band plus the halo, zero rows for
    padding), as an autograd node: forward receives the halo rows, backward
    returns their gradients to the ranks that own them. The messages go in
    the group's "halo" context (none are sent on one rank, or with a 1x1
    kernel: the plan has no transfers)."""
    rank = dist.get_rank(group)
    data = x.data
    n, c, _, width = data.shape
    start, stop = plan.input_bands[rank]
    top, rows = plan.windows[rank]
    sends = [t for t in plan.transfers if t[0] == rank]
    receives = [t for t in plan.transfers if t[1] == rank]
    messages = halo_context(group) if plan.transfers else group

    window = np.zeros((n, c, rows, width), data.dtype)
    own = (max(start, top), min(stop, top + rows))
    # (peer, low, high): rows low:high of the image go to, or come from, peer.
    from_owners = [(source, low, high) for source, _, low, high in receives]
    to_readers = [(destination, low, high) for _, destination, low, high in sends]

    def label(direction, noun, to):
        return lambda low, high, peer, sending: _halo_label(
            direction, low, high,
            f"{noun} {low}:{high} {to if sending else 'from'} rank {peer}", what, plan.height)

    with trace.region(f"{what}: halo exchange"):
        _exchange_rows(window, top, data, start, from_owners, to_readers, own, messages,
                       HALO_TAG, label("forward", "halo rows", "to"), add=False)

    def backward(g):
        grad = np.zeros_like(data)
        with trace.region(f"{what}: halo gradients back"):
            # Gradients of my rows that my neighbours read come back to me.
            _exchange_rows(grad, start, g, top, to_readers, from_owners, own, messages,
                           HALO_GRAD_TAG, label("backward", "halo gradient rows", "back to"),
                           add=True)
        return (grad,)

    return Tensor._make(window, (x,), backward, "halo_exchange")


def _exchange_rows(out, out_top: int, source, source_top: int, receive, send, own,
                   messages, tag: int, label, add: bool) -> None:
    """One direction of the halo exchange. ``out``'s row 0 is the image's row
    ``out_top``, ``source``'s row 0 its row ``source_top``; ``receive`` and
    ``send`` list ``(peer, low, high)``: image rows low:high to receive from
    peer into ``out`` (written, or added when ``add``: a row several ranks
    read gets the sum of their gradients), or to send to peer from
    ``source``; ``own = (low, high)``: the rows this rank has on both sides,
    copied. Every receive is posted before the sends, so no pair waits on the
    other; ``label(low, high, peer, sending)`` names each message."""
    n, c, _, width = out.shape
    inbox = [np.empty((n, c, high - low, width), out.dtype) for _, low, high in receive]
    requests = [dist.irecv(box, group_src=peer, group=messages, tag=tag,
                           label=label(low, high, peer, False))
                for box, (peer, low, high) in zip(inbox, receive)]
    requests += [dist.isend(np.ascontiguousarray(source[:, :, low - source_top:high - source_top]),
                            group_dst=peer, group=messages, tag=tag,
                            label=label(low, high, peer, True))
                 for peer, low, high in send]
    low, high = own
    if low < high:
        out[:, :, low - out_top:high - out_top] = source[:, :, low - source_top:high - source_top]
    dist.wait_all(requests, group=messages)
    for box, (_, low, high) in zip(inbox, receive):
        if add:
            out[:, :, low - out_top:high - out_top] += box
        else:
            out[:, :, low - out_top:high - out_top] = box
