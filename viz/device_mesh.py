"""A device mesh drawn: which global rank sits where, and the groups of each
dimension (the "parallel groups" drawing of Megatron-LM and the Ultra-Scale
Playbook), as a PNG and in the terminal.

    minidist viz mesh 2x2x2 --names dp,tp,pp --save mesh.png

The layout is :func:`minidist.distributed.device_mesh.mesh_layout`'s, the one
``init_device_mesh`` makes: row-major, the last dimension varying fastest. A
mesh of one or two dimensions is one panel (a row, or rows x columns); of
three, one panel per index of the first dimension, side by side. In a panel
the groups of the last dimension are the rows (framed in its colour), those
of the dimension before it the columns; a group of the first dimension of a
3-D mesh holds the ranks at the same place in every panel. Under the panels,
each dimension's groups are listed, in the order every rank makes them; above
them a legend names the numbers and each frame (:func:`legend_handles`).

Drawing is free of processes: the layout is computed, not launched.
"""

from __future__ import annotations

import sys

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle
from rich.console import Group
from rich.text import Text

from minidist.atomic_file import atomic_path
from minidist.distributed.device_mesh import groups_along, mesh_layout

#: One colour per dimension: the last dimension (rows) first, as it is the
#: innermost, then the columns' dimension, then the panels'.
DIM_COLOURS = ("#006BA4", "#FF800E", "#5F9ED1")
#: The terminal's colours, in the same order.
DIM_STYLES = ("bold blue", "bold dark_orange", "bold cyan")
#: Groups listed per dimension before "...": enough to see the pattern.
GROUPS_SHOWN = 8
#: ... and no more characters of them on a line (a group of 8 ranks is long).
LINE_CHARACTERS = 60


def parse_shape(text: str) -> tuple[int, ...]:
    """``"2x2x2"`` (or ``"2,2,2"``) -> ``(2, 2, 2)``, with a clear error."""
    parts = text.replace(",", "x").lower().split("x")
    try:
        shape = tuple(int(part) for part in parts)
    except ValueError:
        raise ValueError(f"a mesh shape is whole numbers joined by 'x', such as 2x2x2; got "
                         f"{text!r}") from None
    if any(n < 1 for n in shape):
        raise ValueError(f"mesh shape {text!r}: every dimension needs at least one rank")
    return shape


def _names(shape, names) -> tuple[str, ...]:
    if names is None:
        return tuple(f"dim {d}" for d in range(len(shape)))
    names = tuple(names)
    if len(names) != len(shape) or len(set(names)) != len(names):
        raise ValueError(f"names {names}: give one distinct name per dimension of the mesh "
                         f"{'x'.join(map(str, shape))}")
    return names


def _check_drawable(shape) -> None:
    if not 1 <= len(shape) <= 3:
        raise ValueError(f"a mesh of {len(shape)} dimensions: the picture draws meshes of 1 to "
                         "3 dimensions (data x tensor x pipeline)")


def _panels(shape):
    """The ranks as a (panels, rows, columns) array: a 1-D mesh is one row of
    one panel, a 2-D mesh one panel."""
    layout = mesh_layout(shape)
    return layout.reshape((1,) * (3 - layout.ndim) + layout.shape)


def _colour_of_dim(ndim: int, dim: int) -> int:
    """Dimension ``dim``'s colour index: the last dimension's is 0."""
    return ndim - 1 - dim


def _group_lines(shape, names) -> list[tuple[int, str]]:
    """(dimension, "tp: 4 groups of 2: [0 1] [2 3] ...") for each dimension."""
    layout = mesh_layout(shape)
    lines = []
    where = {3: ("across panels", "down a column", "along a row"),
             2: ("down a column", "along a row"), 1: ("along the row",)}[len(shape)]
    for dim, name in enumerate(names):
        groups = groups_along(layout, dim)
        written = []
        for group in groups[:GROUPS_SHOWN]:
            written.append("[" + " ".join(map(str, group)) + "]")
            if sum(len(w) + 1 for w in written) > LINE_CHARACTERS:
                break
        shown = " ".join(written)
        more = f" ... ({len(groups) - len(written)} more)" if len(groups) > len(written) else ""
        lines.append((dim, f"{name}: {len(groups)} group{'s' * (len(groups) != 1)} of "
                           f"{shape[dim]}, {where[dim]}: {shown}{more}"))
    return lines


#: Inches under the title for each line of the legend.
LEGEND_LINE_INCHES = 0.2


def legend_handles(shape, names) -> list:
    """The PNG's legend: a cell's number, and how each dimension's groups are
    drawn (the rows' solid frames, the columns' dashed ones, the panels)."""
    from matplotlib.lines import Line2D

    ndim = len(shape)
    handles = [Rectangle((0, 0), 1, 1, facecolor="#F2F2F2", edgecolor="#595959",
                         label="n: global rank n")]
    handles.append(Line2D([], [], color=DIM_COLOURS[0], lw=2,
                          label=f"{names[-1]}: a group (framed, a row)"))
    if ndim >= 2 and shape[-2] > 1:
        handles.append(Line2D([], [], color=DIM_COLOURS[1], lw=2, ls="--",
                              label=f"{names[-2]}: a group (dashed, a column)"))
    if ndim == 3:
        handles.append(Line2D([], [], color=DIM_COLOURS[2], lw=0, marker="s",
                              label=f"{names[0]} = k: panel k (a group: one place in each)"))
    return handles


def mesh_figure(mesh_shape, names=None) -> Figure:
    """The picture of a mesh of ``mesh_shape`` (1 to 3 dimensions) with the
    dimensions' ``names``; a matplotlib Figure (see the module docstring)."""
    shape = tuple(mesh_shape)
    _check_drawable(shape)
    names = _names(shape, names)
    grid = _panels(shape)
    panels, rows, columns = grid.shape
    ndim = len(shape)
    lines = _group_lines(shape, names)
    cell = 0.9
    width = max(4.0, panels * (columns * cell + 0.6) + 0.4)
    # A wide mesh is drawn smaller (at most 16 inches): its numbers with it.
    scale = min(1.0, 16.0 / width)
    font = 13 * scale * (0.75 if grid.size > 100 else 1.0)
    text_height = 0.3 * len(lines) + 0.3
    handles = legend_handles(shape, names)
    legend_columns = len(handles) if width >= 9 else 1 if width < 5.5 else 2
    legend_height = 0.15 + LEGEND_LINE_INCHES * -(-len(handles) // legend_columns)
    figure = Figure(figsize=(min(width, 16.0),
                             rows * cell * scale + 1.2 + text_height + legend_height))
    FigureCanvasAgg(figure)
    bottom = text_height / figure.get_figheight()
    axes = figure.subplots(1, panels, squeeze=False)[0]
    figure.subplots_adjust(left=0.03, right=0.97,
                           top=1 - (0.7 + legend_height) / figure.get_figheight(),
                           bottom=bottom + 0.02, wspace=0.15)
    figure.legend(handles=handles, loc="upper center", fontsize=8, frameon=False,
                  ncol=legend_columns,
                  bbox_to_anchor=(0.5, 1 - 0.4 / figure.get_figheight()))
    for panel, axis in enumerate(axes):
        for row in range(rows):
            for column in range(columns):
                rank = int(grid[panel, row, column])
                axis.add_patch(Rectangle((column + 0.12, rows - 1 - row + 0.12), 0.76, 0.76,
                                         facecolor="#F2F2F2", edgecolor="#595959", lw=1))
                axis.text(column + 0.5, rows - 1 - row + 0.5, str(rank), ha="center",
                          va="center", fontsize=font, weight="bold")
        for row in range(rows):  # the last dimension's groups: the rows
            axis.add_patch(FancyBboxPatch(
                (0.06, rows - 1 - row + 0.06), columns - 0.12, 0.88,
                boxstyle="round,pad=0,rounding_size=0.12", fill=False,
                edgecolor=DIM_COLOURS[0], lw=2))
        if ndim >= 2 and rows > 1:  # the dimension before: the columns
            for column in range(columns):
                axis.add_patch(FancyBboxPatch(
                    (column + 0.02, 0.02), 0.96, rows - 0.04,
                    boxstyle="round,pad=0,rounding_size=0.12", fill=False,
                    edgecolor=DIM_COLOURS[1], lw=2, ls="--"))
        axis.set_xlim(-0.05, columns + 0.05)
        axis.set_ylim(-0.05, rows + 0.05)
        axis.set_aspect("equal")
        axis.axis("off")
        if ndim == 3:
            axis.set_title(f"{names[0]} = {panel}", fontsize=11,
                           color=DIM_COLOURS[_colour_of_dim(ndim, 0)])
    title = " x ".join(f"{name}={n}" for name, n in zip(names, shape))
    figure.suptitle(f"device mesh {title}: global ranks, row-major", fontsize=12)
    for index, (dim, line) in enumerate(lines):
        figure.text(0.03, (text_height - 0.3 * (index + 1)) / figure.get_figheight(), line,
                    fontsize=9, color=DIM_COLOURS[_colour_of_dim(ndim, dim)], ha="left",
                    va="bottom")
    return figure


def save_mesh_figure(mesh_shape, path, names=None) -> str:
    """Write :func:`mesh_figure` as a PNG at ``path``; returns the path."""
    figure = mesh_figure(mesh_shape, names)
    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png", dpi=110)
    return str(path)


def mesh_text(mesh_shape, names=None, *, color: bool = True) -> Group:
    """The same picture for the terminal (Rich): each panel's grid of ranks,
    then each dimension's groups, in its colour."""
    shape = tuple(mesh_shape)
    _check_drawable(shape)
    names = _names(shape, names)
    grid = _panels(shape)
    panels, rows, columns = grid.shape
    ndim = len(shape)
    width = len(str(grid.size - 1))
    style = (lambda dim: DIM_STYLES[_colour_of_dim(ndim, dim)]) if color else (lambda dim: "")
    title = " x ".join(f"{name}={n}" for name, n in zip(names, shape))
    parts = [Text(f"device mesh {title}: global ranks, row-major", style="bold" if color else "")]
    for panel in range(panels):
        if ndim == 3:
            parts.append(Text(f"{names[0]} = {panel}", style=style(0)))
        for row in range(rows):
            line = Text("")
            for column in range(columns):
                line.append("  ")
                line.append(f"{int(grid[panel, row, column]):>{width}}", style="bold")
            parts.append(line)
    parts.append(Text(""))
    for dim, line in _group_lines(shape, names):
        parts.append(Text(line, style=style(dim)))
    return Group(*parts)


def mesh_command(shape_text: str, names_text: str | None, save: str | None,
                 color: bool = True, console=None) -> int:
    """``minidist viz mesh SHAPE [--names a,b,c] [--save OUT.png]``: print the
    mesh, and write its PNG with ``--save``. Returns the exit status."""
    from rich.console import Console

    console = console or Console(no_color=not color)
    try:
        shape = parse_shape(shape_text)
        names = None if not names_text else tuple(n.strip() for n in names_text.split(","))
        picture = mesh_text(shape, names, color=color)
        if save:
            save_mesh_figure(shape, save, names)
    except ValueError as error:
        print(f"minidist viz mesh: {error}", file=sys.stderr)
        return 2
    console.print(picture, highlight=False)
    if save:
        console.print(f"wrote {save}", highlight=False)
    return 0
