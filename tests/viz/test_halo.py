"""The halo picture reads the rows that really moved.

A spatial-parallel conv on 3 and 4 ranks (3x3 kernels, a tall image, and a
5x5 kernel on bands thinner than its halo) runs traced, forward and backward, twice; the rows
:func:`viz.halo.halo_picture` extracts from the trace must equal the plan's
transfers (forward) and the same rows the other way (backward), with the
bytes the messages carried; a plan gives the same picture, and the drawing
is a small palette PNG. The data is tested, not the pixels.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, trace
from minidist.parallel.model.spatial_parallel import SpatialParallelConv2d, halo_plan
from minidist.parallel.model.split_conv import band
from tests.viz.legends import legend_texts, unnamed
from tests.viz.text_layout import text_problems
from viz.halo import draw_halo, draw_halo_figure, halo_picture, shown_rows

N, C_IN, WIDTH = 2, 3, 5

# world, height, kernel, padding
RUNS = [(4, 12, 3, 1), (3, 9, 3, 1), (4, 6, 5, 2), (4, 200, 3, 1)]


def _spatial_run(height, kernel, padding, steps=2):
    rank, world = dist.get_rank(), dist.get_world_size()
    conv = nn.Conv2d(C_IN, 4, kernel, padding=padding, rng=1)
    layer = SpatialParallelConv2d.from_conv(conv)
    start, stop = band(height, world, rank)
    x = np.random.default_rng(0).standard_normal((N, C_IN, height, WIDTH)).astype(np.float32)
    for _ in range(steps):
        layer(Tensor(x[:, :, start:stop].copy(), requires_grad=True)).sum().backward()
    return layer.last_plan


@pytest.fixture(scope="module", params=RUNS, ids=lambda r: f"world{r[0]}-h{r[1]}-k{r[2]}")
def traced(request, tmp_path_factory):
    world, height, kernel, padding = request.param
    path = tmp_path_factory.mktemp("halo") / "halo.jsonl"
    plans = minidist.launch(_spatial_run, world_size=world, transport="shm", trace=str(path),
                            args=(height, kernel, padding))
    return request.param, path, plans[0]


def test_rows_read_from_the_trace_are_the_plans_transfers(traced):
    (world, height, kernel, padding), path, plan = traced
    assert plan == halo_plan(height, kernel, 1, padding, world)
    picture = halo_picture(path)
    assert (picture.height, picture.world_size) == (height, world)
    assert picture.bands == plan.input_bands
    assert picture.forward == tuple(sorted(plan.transfers))
    assert picture.backward == tuple(sorted((d, s, a, b) for s, d, a, b in plan.transfers))
    assert picture.rows_moved() == plan.rows_moved()
    row_bytes = N * C_IN * WIDTH * 4
    # Two steps ran; each transfer is listed, and its bytes counted, once.
    assert picture.forward_bytes == picture.backward_bytes == plan.rows_moved() * row_bytes
    assert picture.layer.startswith("spatial-parallel-conv-")
    if kernel == 3:
        # One row to each neighbour: 2 (P - 1) messages of one row.
        assert len(picture.forward) == 2 * (world - 1)
        assert all(stop - start == 1 for _, _, start, stop in picture.forward)
    else:
        # Bands of 2, 2, 1, 1 rows and a 5x5 kernel: rows come from two ranks away.
        assert any(abs(source - destination) == 2 for source, destination, _, _ in picture.forward)
    # The plan gives the same rows (without bytes: nothing was measured).
    from_plan = halo_picture(plan)
    assert (from_plan.forward, from_plan.backward, from_plan.bands) == (
        picture.forward, picture.backward, picture.bands)
    assert from_plan.forward_bytes is None


def test_every_moved_row_and_band_border_is_drawn(traced):
    (world, height, _, _), path, plan = traced
    picture = halo_picture(path)
    rows = shown_rows(picture)
    drawn = {row for row in rows if row is not None}
    assert {row for _, _, start, stop in plan.transfers for row in range(start, stop)} <= drawn
    assert {start for start, _ in plan.input_bands} <= drawn
    if height > 40:
        assert None in rows and len(rows) < 60  # shortened, with gaps
    else:
        assert rows == list(range(height))
    received = {rank: picture.received(rank) for rank in range(world)}
    assert sum(len(r) for r in received.values()) == len(plan.transfers)


def test_draws_a_small_palette_png(traced, tmp_path):
    _, path, plan = traced
    for source in (path, plan):
        png = draw_halo(source, tmp_path / "halo.png")
        with Image.open(png) as image:
            assert image.mode == "P"
            assert image.width > 200 and image.height > 100
        assert (tmp_path / "halo.png").stat().st_size < 150_000


def test_a_trace_without_halo_messages_says_so(tmp_path):
    header = trace.make_header(world_size=2)
    with pytest.raises(ValueError, match="no halo messages"):
        halo_picture((header, []))


@pytest.mark.parametrize("height, kernel, padding, world", [(12, 3, 1, 4), (200, 3, 1, 4),
                                                           (6, 5, 2, 4), (9, 3, 1, 2)])
def test_the_legend_names_every_symbol_drawn(height, kernel, padding, world):
    """Every text the panels draw (a row's number, "⋮", "3:4", "grad 3:4") is
    named in the legend under them, and no text overlaps another."""
    figure = draw_halo_figure(halo_plan(height, kernel, 1, padding, world))
    drawn = [text.get_text() for axis in figure.axes for text in axis.texts
             if not text.get_text().startswith("rank ")]
    assert drawn and unnamed(drawn, legend_texts(figure)) == []
    assert {"rank 0's rows", "hatched: a halo row received, its owner's colour"} <= \
        set(legend_texts(figure))
    assert text_problems(figure) == []
