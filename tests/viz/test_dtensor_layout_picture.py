"""The picture of a DTensor's layout (viz/dtensor_layout.py) and ``minidist viz
layout``: every element's boxes are the ranks whose ``local_shape_and_offset``
box holds it, on a 1-D mesh and a 2 x 2 one, uneven chunks included; a
Partial is drawn as one grid per term, each rank on its own term's; the text
is readable; the terminal view and the command say the same."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from PIL import Image

from minidist.cli import main
from minidist.distributed.device_mesh import mesh_layout
from minidist.distributed.tensor.placements import (
    Partial,
    Replicate,
    Shard,
    local_shape_and_offset,
)
from tests.viz.text_layout import text_problems
from viz.dtensor_layout import layout_figure, layout_text_view, parse_placements

CASES = [
    ((4, 4), (4,), (Shard(0),)),
    ((4, 6), (4,), (Shard(1),)),
    ((3, 4), (4,), (Replicate(),)),
    ((4, 4), (2, 2), (Shard(0), Shard(1))),
    ((8, 4), (2, 2), (Shard(0), Shard(0))),
    ((5, 4), (4,), (Shard(0),)),                 # torch.chunk: 2, 2, 1, 0
    ((5, 3), (2, 2), (Shard(1), Shard(0))),      # uneven on both dims
    ((4, 4), (4,), (Partial(),)),
    ((5, 4), (2, 2), (Shard(0), Partial())),
    ((4, 4), (2, 2), (Replicate(), Shard(1))),
]


def _expected(shape, mesh_shape, placements):
    """{(term, row, column): ranks}, from local_shape_and_offset alone: a
    rank's term is its coordinate along the Partial mesh dims."""
    layout = mesh_layout(mesh_shape)
    partial = [d for d, p in enumerate(placements) if isinstance(p, Partial)]
    found = {}
    for coordinate in itertools.product(*(range(m) for m in mesh_shape)):
        rank = int(layout[coordinate])
        term = int(np.ravel_multi_index([coordinate[d] for d in partial],
                                        [mesh_shape[d] for d in partial])) if partial else 0
        (rows, columns), (top, left) = local_shape_and_offset(shape, mesh_shape, coordinate,
                                                              placements)
        for row in range(top, top + rows):
            for column in range(left, left + columns):
                found.setdefault((term, row, column), []).append(rank)
    return {key: sorted(ranks) for key, ranks in found.items()}


def _drawn(figure):
    found = {}
    for axis in figure.axes:
        for patch in axis.patches:
            gid = patch.get_gid()
            if gid:
                term, row, column, rank = map(int, re.fullmatch(
                    r"term (\d+) row (\d+) column (\d+) rank (\d+)", gid).groups())
                found.setdefault((term, row, column), []).append(rank)
    return {key: sorted(ranks) for key, ranks in found.items()}


@pytest.mark.parametrize(("shape", "mesh_shape", "placements"), CASES,
                         ids=lambda case: str(case))
def test_every_element_is_drawn_in_the_colours_of_the_ranks_that_hold_it(shape, mesh_shape,
                                                                         placements):
    figure = layout_figure(shape, mesh_shape, placements)
    drawn = _drawn(figure)
    assert drawn == _expected(shape, mesh_shape, placements)
    terms = 1 if not any(isinstance(p, Partial) for p in placements) else \
        int(np.prod([m for m, p in zip(mesh_shape, placements) if isinstance(p, Partial)]))
    assert len(figure.axes) == terms                 # a Partial: one grid per term
    # every element of every term is someone's (no hole in a sum, no element lost)
    assert set(drawn) == {(t, r, c) for t in range(terms) for r in range(shape[0])
                          for c in range(shape[1])}
    # a stripe per holder, filling the element's box
    for axis in figure.axes:
        widths = {}
        for patch in axis.patches:
            if patch.get_gid():
                key = patch.get_gid().rsplit(" rank ", 1)[0]
                widths[key] = widths.get(key, 0) + patch.get_width()
        assert all(abs(w - 1) < 1e-9 for w in widths.values())
    assert text_problems(figure) == []
    legend = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
    assert len(legend) == int(np.prod(mesh_shape))   # a line per rank, its box said
    for line in legend:
        rank = int(line.split()[1])
        coordinate = tuple(int(c) for c in np.argwhere(mesh_layout(mesh_shape) == rank)[0])
        (rows, columns), (top, _) = local_shape_and_offset(shape, mesh_shape, coordinate,
                                                           placements)
        assert f"local shape ({rows}, {columns})" in line
        if rows * columns:
            assert re.search(rf": rows? {top}\b", line), line
        else:
            assert "nothing (an empty chunk)" in line


def test_the_uneven_chunks_are_torch_chunks_and_the_empty_rank_is_said():
    figure = layout_figure((5, 4), (4,), (Shard(0),))
    drawn = _drawn(figure)
    rows_of = {rank: sorted({r for (_, r, _), ranks in drawn.items() if rank in ranks})
               for rank in range(4)}
    assert rows_of == {0: [0, 1], 1: [2, 3], 2: [4], 3: []}
    legend = [t.get_text() for legend in figure.legends for t in legend.get_texts()]
    assert "rank 3 (3): nothing (an empty chunk), local shape (0, 4)" in legend


@pytest.mark.parametrize(("shape", "mesh_shape", "placements"), CASES,
                         ids=lambda case: str(case))
def test_the_terminal_view_writes_each_elements_holders(shape, mesh_shape, placements):
    from rich.console import Console

    console = Console(width=200, record=True, no_color=True)
    console.print(layout_text_view(shape, mesh_shape, placements, color=False))
    lines = console.export_text().splitlines()
    expected = _expected(shape, mesh_shape, placements)
    grids = [index for index, line in enumerate(lines) if line.split() ==
             [str(c) for c in range(shape[1])]]
    assert len(grids) == max(term for term, _, _ in expected) + 1
    for term, start in enumerate(grids):
        for row in range(shape[0]):
            cells = lines[start + 1 + row].split()
            assert cells[0] == str(row)
            assert cells[1:] == ["".join(map(str, expected[(term, row, c)]))
                                 for c in range(shape[1])]


def test_minidist_viz_layout_prints_and_saves(tmp_path, capsys):
    out = tmp_path / "layout.png"
    assert main(["viz", "layout", "5x4", "--mesh", "2x2", "--placements", "S(0),S(1)",
                 "--save", str(out), "--no-color"]) == 0
    printed = capsys.readouterr().out
    assert "rank 3 (1, 1): rows 3-4, columns 2-3, local shape (2, 2)" in printed
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > 300


@pytest.mark.parametrize(("argv", "says"), [
    (["viz", "layout", "5x4", "--mesh", "2x2", "--placements", "S(0)"],
     "a mesh of 2 dimension(s) takes 2 placement(s)"),
    (["viz", "layout", "5x4", "--placements", "Q"], "write S(d) or Shard(d)"),
    (["viz", "layout", "5x4x2", "--placements", "R"], "draws a 2-D tensor"),
    (["viz", "layout", "5x4"], "give the layout"),
    (["viz", "layout"], "give the tensor's shape"),
    (["viz", "layout", "5x4", "--placements", "S(2)"], "names a dimension"),
])
def test_minidist_viz_layout_says_what_is_wrong(argv, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file called "layout" here
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_parse_placements():
    assert parse_placements("S(0),R") == (Shard(0), Replicate())
    assert parse_placements("Shard(dim=1), Replicate()") == (Shard(1), Replicate())
    assert parse_placements("P(avg),S1") == (Partial("avg"), Shard(1))
    assert parse_placements("Partial()") == (Partial(),)
