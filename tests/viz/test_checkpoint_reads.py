"""The picture and the table of which saved chunks each new rank reads
(viz/checkpoint_reads.py), on the table a tp2 save of a (8, 32) weight in
Shard(1) writes: loaded as FSDP2's Shard(0) on 4 ranks every new rank meets
both saved column halves and reads its 2 rows of each; as Shard(1) on 4,
each reads the whole half holding its columns. The figure draws every chunk and box with readable text."""

from __future__ import annotations

from PIL import Image
from rich.console import Console

from minidist.distributed.checkpoint import Metadata
from minidist.distributed.tensor import Shard
from tests.viz.text_layout import text_problems
from viz.checkpoint_reads import (
    layout_boxes,
    reads_figure,
    reads_of,
    reads_table,
    save_reads_figure,
)

KEY = "model.mlp.c_proj.weight"


def _saved() -> Metadata:
    half = 8 * 16 * 8
    chunks = [{"offsets": (0, 0), "sizes": (8, 16), "file": "__0_0.distcp", "byte_offset": 0,
               "nbytes": half, "rank": 0},
              {"offsets": (0, 16), "sizes": (8, 16), "file": "__1_0.distcp", "byte_offset": 0,
               "nbytes": half, "rank": 1}]
    return Metadata({KEY: {"shape": (8, 32), "dtype": "<f8", "chunks": chunks}}, {}, 2)


def test_each_new_rank_reads_the_chunks_its_box_meets():
    metadata = _saved()
    rows = layout_boxes((8, 32), (4,), [Shard(0)])
    assert rows == {0: ((0, 0), (2, 32)), 1: ((2, 0), (2, 32)), 2: ((4, 0), (2, 32)),
                    3: ((6, 0), (2, 32))}
    assert {r: [(c["rank"], n) for c, n in cs] for r, cs in reads_of(metadata, KEY, rows).items()} \
        == {r: [(0, 2 * 16 * 8), (1, 2 * 16 * 8)] for r in range(4)}     # 2 rows of each half
    columns = layout_boxes((8, 32), (4,), [Shard(1)])
    assert {r: [(c["rank"], n) for c, n in cs] for r, cs in
            reads_of(metadata, KEY, columns).items()} == \
        {0: [(0, 1024)], 1: [(0, 1024)], 2: [(1, 1024)], 3: [(1, 1024)]}   # a whole half each
    console = Console(width=160, record=True, no_color=True)
    console.print(reads_table(metadata, KEY, columns))
    text = console.export_text()
    assert "rank 1 [0:8, 16:32]" in text and "[0:8, 24:32]" in text
    assert text.count("1 KiB of 2 KiB") == 4


def test_the_picture_draws_with_readable_text(tmp_path):
    metadata = _saved()
    boxes = layout_boxes((8, 32), (2, 2), [Shard(0), Shard(1)])
    figure = reads_figure(metadata, KEY, boxes)
    assert text_problems(figure) == []
    path = save_reads_figure(metadata, KEY, boxes, tmp_path / "reads.png")
    with Image.open(path) as image:
        assert image.size[0] > 600 and image.size[1] > 300
