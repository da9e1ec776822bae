"""A DTensor's layout drawn: a 2-D global tensor as a grid of elements, each
element coloured by the rank(s) that hold it, as a PNG and in the terminal.

    minidist viz layout 5x4 --mesh 2x2 --placements "S(0),S(1)" --save layout.png

Which rank holds which box is :func:`minidist.distributed.tensor.placements.
local_shape_and_offset`'s answer, rank by rank (the ranks laid out on the
mesh as ``init_device_mesh`` lays them out, row-major). An element several
ranks hold (a Replicate) is striped with each holder's colour. A Partial is
drawn as what it is, a sum no rank holds yet: one layer per term, stacked
like cards, the ranks that hold term k drawn on layer k (on a mesh
``(Shard(0), Partial())`` rank (i, j) holds term j of row block i), the
whole tensor being the layers added up. Under the grid, one line per rank:
its coordinate, the global rows and columns of its box, its local shape.

Drawing is free of processes: the layout is computed, not launched.
"""

from __future__ import annotations

import itertools
import re
import sys

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from rich.console import Group
from rich.text import Text

from minidist.atomic_file import atomic_path
from minidist.distributed.device_mesh import mesh_layout
from minidist.distributed.tensor.placements import (
    Partial,
    Replicate,
    Shard,
    layout_text,
    local_shape_and_offset,
    normalize_placements,
)

#: One colour per rank: matplotlib's tableau-colorblind10 (the course's colours).
RANK_COLOURS = ("#006BA4", "#FF800E", "#ABABAB", "#595959", "#5F9ED1", "#C85200",
                "#898989", "#A2C8EC", "#FFBC79", "#CFCFCF")
#: The terminal's colours, in the same order.
RANK_STYLES = ("bold blue", "bold dark_orange", "bold white", "bold bright_black", "bold cyan",
               "bold red", "bold grey50", "bold bright_blue", "bold yellow", "bold grey70")
#: The largest grid drawn element by element (a bigger tensor's boxes would be specks).
MAX_ELEMENTS = 24


class Holding:
    """Which rank holds which box of a 2-D tensor laid out on a mesh."""

    def __init__(self, shape, mesh_shape, placements):
        self.shape, self.mesh_shape = tuple(int(s) for s in shape), tuple(int(m) for m in mesh_shape)
        if len(self.shape) != 2:
            raise ValueError(f"a layout picture draws a 2-D tensor (rows x columns), got a "
                             f"shape of {len(self.shape)} dimension(s): {self.shape}")
        if max(self.shape) > MAX_ELEMENTS or min(self.shape) < 1:
            raise ValueError(f"a layout picture draws 1 to {MAX_ELEMENTS} rows and columns, "
                             f"one box per element; got {self.shape}")
        if not 1 <= len(self.mesh_shape) <= 2 or int(np.prod(self.mesh_shape)) > len(RANK_COLOURS):
            raise ValueError(f"a layout picture draws a mesh of 1 or 2 dimensions and at most "
                             f"{len(RANK_COLOURS)} ranks (a colour each); got {self.mesh_shape}")
        self.placements = normalize_placements(placements, 2, len(self.mesh_shape),
                                               "layout picture")
        layout = mesh_layout(self.mesh_shape)
        #: rank -> (coordinate, (shape, offset)) of its box
        self.boxes = {}
        for coordinate in itertools.product(*(range(m) for m in self.mesh_shape)):
            rank = int(layout[coordinate])
            self.boxes[rank] = (coordinate, local_shape_and_offset(
                self.shape, self.mesh_shape, coordinate, self.placements))
        self.partial_dims = [d for d, p in enumerate(self.placements) if isinstance(p, Partial)]

    @property
    def terms(self) -> int:
        """How many terms the tensor is the sum of (1: no Partial)."""
        return int(np.prod([self.mesh_shape[d] for d in self.partial_dims], dtype=np.int64))

    def term_of(self, rank: int) -> int:
        """Which term a rank holds: its coordinates along the Partial mesh dims, row-major."""
        coordinate = self.boxes[rank][0]
        index = 0
        for d in self.partial_dims:
            index = index * self.mesh_shape[d] + coordinate[d]
        return index

    def holders(self, term: int, row: int, column: int) -> list[int]:
        """The ranks holding element (row, column) of term ``term``."""
        found = []
        for rank, (_, ((rows, columns), (top, left))) in sorted(self.boxes.items()):
            if self.term_of(rank) == term and top <= row < top + rows \
                    and left <= column < left + columns:
                found.append(rank)
        return found

    def rank_lines(self) -> list[tuple[int, str]]:
        """(rank, "rank 1 (0, 1): rows 0-2, columns 2-3, local shape (3, 2)") for each."""
        lines = []
        for rank, (coordinate, ((rows, columns), (top, left))) in sorted(self.boxes.items()):
            where = ("nothing (an empty chunk)" if rows * columns == 0 else
                     f"{_span('row', top, rows)}, {_span('column', left, columns)}")
            term = f", term {self.term_of(rank)} of the sum" if self.partial_dims else ""
            lines.append((rank, f"rank {rank} {_coordinate(coordinate)}: {where}{term}, local shape "
                                f"({rows}, {columns})"))
        return lines

    def title(self) -> str:
        names = ", ".join(repr(p) for p in self.placements)
        return (f"{self.shape[0]} x {self.shape[1]} tensor laid out {layout_text(self.placements)} "
                f"({names}) on a mesh {' x '.join(map(str, self.mesh_shape))}")


def _coordinate(coordinate) -> str:
    """(0, 1) as the mesh coordinate it is; (0,) as (0)."""
    return "(" + ", ".join(map(str, coordinate)) + ")"


def _span(word: str, start: int, length: int) -> str:
    """"row 4", "rows 0-2"."""
    return f"{word} {start}" if length == 1 else f"{word}s {start}-{start + length - 1}"


#: Inches per element box, and between two terms of a Partial.
CELL = 0.42
GAP = 0.6


def layout_figure(shape, mesh_shape, placements) -> Figure:
    """The picture of a ``shape`` tensor laid out by ``placements`` on a mesh
    of ``mesh_shape``; a matplotlib Figure (see the module docstring). Each
    element's box (a stripe per holder) is a Rectangle whose ``gid`` is
    ``"term t row i column j rank r"``, for a reader (or a test) to find."""
    held = Holding(shape, mesh_shape, placements)
    rows, columns = held.shape
    terms = held.terms
    lines = held.rank_lines()
    panel = columns * CELL
    grid_width = terms * panel + (terms - 1) * GAP
    width = max(6.5, grid_width + 1.2)
    legend_height = 0.22 * len(lines) + 0.15
    top = 0.75 + (0.2 if terms > 1 else 0)
    height = rows * CELL + top + 0.35 + legend_height
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    left = (width - grid_width) / 2
    bottom = (legend_height + 0.3) / height
    for term in range(terms):
        axis = figure.add_axes(((left + term * (panel + GAP)) / width, bottom,
                                panel / width, rows * CELL / height))
        for row in range(rows):
            for column in range(columns):
                ranks = held.holders(term, row, column)
                y = rows - 1 - row
                for stripe, rank in enumerate(ranks):
                    part = 1 / len(ranks)
                    axis.add_patch(Rectangle(
                        (column + stripe * part, y), part, 1, facecolor=RANK_COLOURS[rank],
                        edgecolor="none",
                        gid=f"term {term} row {row} column {column} rank {rank}"))
                axis.add_patch(Rectangle((column, y), 1, 1, fill=False, edgecolor="white",
                                         lw=1.5))
        axis.add_patch(Rectangle((0, 0), columns, rows, fill=False, edgecolor="#333333", lw=1))
        axis.set_xlim(0, columns)
        axis.set_ylim(0, rows)
        axis.set_xticks([c + 0.5 for c in range(columns)], [str(c) for c in range(columns)])
        axis.set_yticks([rows - 1 - r + 0.5 for r in range(rows)],
                        [str(r) for r in range(rows)] if term == 0 else [])
        axis.tick_params(length=0, labelsize=8, labeltop=True, labelbottom=False)
        for side in axis.spines.values():
            side.set_visible(False)
        if terms > 1:
            axis.set_title(f"term {term}", fontsize=9, pad=14)
            if term:
                figure.text((left + term * (panel + GAP) - GAP / 2) / width,
                            bottom + rows * CELL / 2 / height,
                            "+" if held.placements[held.partial_dims[0]].reduce_op == "sum"
                            else ",", fontsize=14, ha="center", va="center")
    op = held.placements[held.partial_dims[0]].reduce_op if terms > 1 else ""
    title = held.title() + (f"\nthe tensor is the {op} of the {terms} terms; no rank holds it"
                            if terms > 1 else "")
    figure.suptitle(title, fontsize=10, y=1 - 0.1 / height, va="top")
    handles = [Rectangle((0, 0), 1, 1, facecolor=RANK_COLOURS[rank], edgecolor="none",
                         label=line) for rank, line in lines]
    figure.legend(handles=handles, loc="lower left", fontsize=8, frameon=False,
                  bbox_to_anchor=(0.1 / width, 0.05 / height), handlelength=1.2)
    return figure


def save_layout_figure(shape, mesh_shape, placements, path) -> str:
    """Write :func:`layout_figure` as a PNG at ``path``; returns the path."""
    figure = layout_figure(shape, mesh_shape, placements)
    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png", dpi=110)
    return str(path)


def layout_text_view(shape, mesh_shape, placements, *, color: bool = True) -> Group:
    """The same picture for the terminal (Rich): the grid with each element
    written as the ranks that hold it (``0123``: all four), one grid per
    term of a Partial, then one line per rank."""
    held = Holding(shape, mesh_shape, placements)
    rows, columns = held.shape
    world = len(held.boxes)
    parts = [Text(held.title(), style="bold" if color else "")]
    for term in range(held.terms):
        if held.terms > 1:
            parts.append(Text(f"term {term} (the tensor is the "
                              f"{held.placements[held.partial_dims[0]].reduce_op} of the "
                              f"{held.terms} terms):"))
        cells = [[held.holders(term, r, c) for c in range(columns)] for r in range(rows)]
        width = max(max((len(cell) for row in cells for cell in row), default=1), 1)
        width = max(width, len(str(columns - 1)))
        label = len(str(rows - 1))
        header = Text(" " * (label + 2) + " ".join(f"{c:>{width}}" for c in range(columns)),
                      style="dim" if color else "")
        parts.append(header)
        for r, row in enumerate(cells):
            line = Text(f"{r:>{label}}  ", style="dim" if color else "")
            for c, ranks in enumerate(row):
                if c:
                    line.append(" ")
                text = "".join(str(rank) for rank in ranks) or "."
                style = RANK_STYLES[ranks[0]] if color and len(ranks) == 1 else ""
                line.append(f"{text:>{width}}", style=style)
            parts.append(line)
    parts.append(Text(f"each box: the rank(s) holding it, of {world}"))
    for rank, line in held.rank_lines():
        parts.append(Text(line, style=RANK_STYLES[rank] if color else ""))
    return Group(*parts)


_PLACEMENT = re.compile(r"^(?:S\(?(-?\d+)\)?|Shard\((?:dim=)?(-?\d+)\)|R|Replicate\(\)|"
                        r"P(?:\((\w+)\))?|Partial\((?:reduce_op=)?[\"']?(\w*)[\"']?\))$")


def parse_placements(text: str) -> tuple:
    """``"S(0),R"`` (or ``"S0,R"``, ``"Shard(0),Replicate()"``, ``"P"``,
    ``"P(avg)"``) -> the placements, with a clear error."""
    found = []
    for part in re.split(r",(?![^()]*\))", text.replace(" ", "")):
        match = _PLACEMENT.match(part)
        if not match:
            raise ValueError(f"placement {part!r}: write S(d) or Shard(d) for a shard of "
                             f"tensor dim d, R or Replicate(), P or P(avg) for a Partial")
        shard = match.group(1) or match.group(2)
        if shard is not None:
            found.append(Shard(int(shard)))
        elif part.startswith("R"):
            found.append(Replicate())
        else:
            found.append(Partial(match.group(3) or match.group(4) or "sum"))
    return tuple(found)


def layout_command(shape_text: str, mesh_text: str | None, placements_text: str | None,
                   save: str | None, color: bool = True, console=None) -> int:
    """``minidist viz layout SHAPE --mesh 2x2 --placements "S(0),S(1)" [--save OUT.png]``:
    print which rank holds which element, and write the PNG with ``--save``."""
    from rich.console import Console

    from viz.device_mesh import parse_shape

    console = console or Console(no_color=not color)
    try:
        shape = parse_shape(shape_text)
        mesh = parse_shape(mesh_text or "4")
        if not placements_text:
            raise ValueError("give the layout, one placement per mesh dim, such as "
                             "--placements \"S(0),S(1)\" on a 2x2 mesh")
        placements = parse_placements(placements_text)
        picture = layout_text_view(shape, mesh, placements, color=color)
        if save:
            save_layout_figure(shape, mesh, placements, save)
    except (ValueError, TypeError) as error:
        print(f"minidist viz layout: {error}", file=sys.stderr)
        return 2
    console.print(picture, highlight=False)
    if save:
        console.print(f"wrote {save}", highlight=False)
    return 0


__all__ = ["Holding", "layout_figure", "save_layout_figure", "layout_text_view",
           "parse_placements", "layout_command"]
