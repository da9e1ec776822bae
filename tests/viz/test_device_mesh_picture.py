"""The picture of a device mesh (viz/device_mesh.py) and ``minidist viz mesh``:
every global rank drawn where torch's layout puts it, each dimension's groups
listed as the mesh makes them (checked against the rule of
tests/collectives/test_device_mesh.py, itself checked against torch), in the
terminal and in the PNG, with readable text."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from minidist.cli import main
from tests.collectives.test_device_mesh import _rule_group
from tests.viz.text_layout import text_problems
from viz.device_mesh import mesh_figure, mesh_text, parse_shape

CASES = [((8,), ("dp",)), ((2, 4), ("dp", "tp")), ((2, 2, 2), ("dp", "tp", "pp")),
         ((3, 2, 2), None)]


def _rule_groups(shape, dim) -> list[list[int]]:
    """Every group of ``dim`` by torch's rule, without repeats, by first rank."""
    world = int(np.prod(shape))
    found = {tuple(_rule_group(shape, rank, dim)) for rank in range(world)}
    return sorted(map(list, found))


def _listed(line: str) -> list[list[int]]:
    return sorted([int(r) for r in group.split()] for group in re.findall(r"\[([\d ]+)\]", line))


@pytest.mark.parametrize(("shape", "names"), CASES)
def test_terminal_picture_puts_each_rank_in_its_place(shape, names):
    from rich.console import Console

    console = Console(width=200, record=True, no_color=True)
    console.print(mesh_text(shape, names, color=False))
    lines = console.export_text().splitlines()
    rows = [[int(x) for x in line.split()] for line in lines
            if line.strip() and all(x.isdigit() for x in line.split())]
    world = int(np.prod(shape))
    columns = shape[-1]
    # The grid, panel after panel, row after row: rank r at its row-major place.
    assert [r for row in rows for r in row] == list(range(world))
    assert all(len(row) == columns for row in rows)
    names = names or tuple(f"dim {d}" for d in range(len(shape)))
    for dim, name in enumerate(names):
        line = next(line for line in lines if line.startswith(f"{name}:"))
        assert _listed(line) == _rule_groups(shape, dim)


@pytest.mark.parametrize(("shape", "names"), CASES + [((4, 4, 8), ("dp", "tp", "pp"))])
def test_figure_draws_every_rank_once_with_readable_text(shape, names):
    figure = mesh_figure(shape, names)
    assert text_problems(figure) == []
    panels = [axis for axis in figure.axes]
    drawn = [[int(t.get_text()) for t in axis.texts] for axis in panels]
    world = int(np.prod(shape))
    assert sorted(r for panel in drawn for r in panel) == list(range(world))
    if len(shape) == 3:  # a panel per index of the first dimension
        assert [sorted(p) for p in drawn] == [list(range(i * world // shape[0],
                                                        (i + 1) * world // shape[0]))
                                             for i in range(shape[0])]


def test_minidist_viz_mesh_prints_and_saves(tmp_path, capsys):
    out = tmp_path / "mesh.png"
    assert main(["viz", "mesh", "2x2x2", "--names", "dp,tp,pp", "--save", str(out),
                 "--no-color"]) == 0
    printed = capsys.readouterr().out
    assert "dp = 1" in printed and "pp: 4 groups of 2" in printed
    assert _listed(next(line for line in printed.splitlines() if line.startswith("tp:"))) == \
        _rule_groups((2, 2, 2), 1)
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > 300


@pytest.mark.parametrize(("argv", "says"), [
    (["viz", "mesh", "2xb"], "whole numbers joined by 'x'"),
    (["viz", "mesh", "2x2", "--names", "a"], "one distinct name per dimension"),
    (["viz", "mesh", "2x2x2x2"], "1 to 3 dimensions"),
    (["viz", "mesh"], "give the mesh's shape"),
])
def test_minidist_viz_mesh_says_what_is_wrong(argv, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file called "mesh" here
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_parse_shape():
    assert parse_shape("2x2x2") == (2, 2, 2) == parse_shape("2,2,2")
    assert parse_shape("8") == (8,)
    with pytest.raises(ValueError, match="at least one rank"):
        parse_shape("2x0")


@pytest.mark.parametrize(("shape", "names"), CASES + [((1, 4), ("dp", "tp"))])
def test_the_legend_names_the_numbers_and_every_dimensions_frame(shape, names):
    from tests.viz.legends import legend_texts, unnamed

    figure = mesh_figure(shape, names)
    legend = legend_texts(figure)
    drawn = [text.get_text() for axis in figure.axes for text in axis.texts]
    assert unnamed(drawn, legend) == [], legend
    names = names or tuple(f"dim {d}" for d in range(len(shape)))
    # The rows' frames always; the columns' where a column holds two ranks; the panels in 3-D.
    framed = [names[-1]] + ([names[-2]] if len(shape) >= 2 and shape[-2] > 1 else []) \
        + ([f"{names[0]} = k"] if len(shape) == 3 else [])
    assert [entry.split(":")[0] for entry in legend[1:]] == framed
