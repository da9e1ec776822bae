"""A convolution split by image rows, with the halo exchange.

Read after :mod:`.split_conv` (and :mod:`.channel_parallel`, the other
split). Every rank holds the whole weight and a band of image rows. An
output row needs ``kernel`` consecutive input rows, so near a band's border
it needs a few rows that live on the neighbour: the *halo*
(:func:`halo_plan` says which rows move). Before the convolution the ranks
swap just those rows; backward sends the halo rows' gradients back to their
owners, who add them in, and the weight's gradient, each rank's covering
its rows only, is summed over the ranks.

Cost: a 3x3 kernel with stride 1 and padding 1 needs one row from each
neighbour, whatever the image's size: per layer and step each rank sends at
most 2 rows of N * C * W values forward and as many backward, plus the
all_reduce of the weight's gradient, against 1 / P of the convolution's
work. The messages stay small while the compute grows with the image
(worthwhile, Tsunashima's slides say, on 1024x1024 images).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.nn import functional as F
from minidist.nn.conv import Conv2d
from minidist.nn.im2col import output_size
from minidist.parallel.model.split_conv import (
    _describe,
    _gradient_summed_across,
    _SplitConv2d,
    band,
)
from minidist.tensor import Tensor, _shape_str

__all__ = ["SpatialParallelConv2d", "halo_plan", "HaloPlan", "halo_context"]

#: Tags of the halo messages (forward rows, backward gradients of those rows),
#: sent in the group's own "halo" message context (:func:`halo_context`), so
#: they never match a point-to-point message of the user's with the same tag.
HALO_TAG = 18_001
HALO_GRAD_TAG = 18_002
HALO_CONTEXT = "halo"


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
                "with minidist.parallel.model.band(H, world_size, rank)")
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
