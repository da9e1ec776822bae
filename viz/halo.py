"""The halo exchange of a spatial-parallel convolution, drawn row by row.

A :class:`~minidist.parallel.model.spatial_parallel.SpatialParallelConv2d` splits the
image's rows into bands, one per rank; before its convolution each rank
receives the few border rows (the *halo*) its kernel reads from its
neighbours, and backward sends the gradients of those rows back to their
owners. This module reads which rows moved, either

* from a real run's trace: every halo message is labelled
  ``"halo rows a:b to rank d #halo=forward rows=a:b height=H layer=..."``
  (``halo=backward`` for the gradients), or
* from a :class:`~minidist.parallel.model.spatial_parallel.HaloPlan`, the plan the
  layer follows (``layer.last_plan``),

into a :class:`HaloPicture` (plain data, tested), and draws it: one column of
cells per rank, a cell per image row coloured by the rank that owns it, the
halo rows a rank receives as hatched cells beside its band, and an arrow for
each message labelled with its rows; forward on the left, the gradients sent
back on the right. Tall images are shortened: only the rows near a band's
border are drawn, the runs between them are a gap marked "⋮". A legend under
the panels names each of these (:func:`legend_handles`): the numbers, the
colours, the hatching, the gap and the two kinds of arrow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from minidist import trace as _trace
from minidist.atomic_file import atomic_path
from minidist.parallel.model.spatial_parallel import HaloPlan
from minidist.parallel.model.split_conv import band
from viz.animate import PALETTE

#: Rows drawn either side of every band border when an image is shortened.
BORDER_ROWS = 2
#: Images up to this many rows are drawn whole.
WHOLE_UP_TO = 40
#: Inches under the panels for the legend.
LEGEND_INCHES = 0.75


@dataclass(frozen=True)
class HaloPicture:
    """Which rows moved in one halo exchange.

    ``bands[r]``: rank r's input rows ``[start, stop)``. ``forward``: the
    messages ``(source, destination, start, stop)`` of rows ``start:stop``,
    from their owner to the rank that reads them; ``backward``: the
    gradients of those rows, ``(source, destination, start, stop)`` from the
    reader back to the owner. ``forward_bytes`` / ``backward_bytes``: bytes
    of those messages in the trace (None when read from a plan)."""

    height: int
    world_size: int
    bands: tuple
    forward: tuple
    backward: tuple
    layer: str = ""
    forward_bytes: int | None = None
    backward_bytes: int | None = None

    def rows_moved(self) -> int:
        """Rows sent forward, over all ranks (the same number go back)."""
        return sum(stop - start for _, _, start, stop in self.forward)

    def received(self, rank: int) -> list[tuple[int, int, int]]:
        """``(source, start, stop)``: the halo rows ``rank`` receives forward."""
        return sorted((source, start, stop) for source, destination, start, stop in self.forward
                      if destination == rank)


def _events(source) -> tuple[dict, list[dict]]:
    if isinstance(source, (str, os.PathLike)):
        source = _trace.read_jsonl(source)
    if isinstance(source, _trace.Trace):
        return dict(source.header), list(source.events)
    if isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], dict):
        return dict(source[0]), list(source[1])
    return {}, [event if isinstance(event, dict) else dict(zip(_trace.FIELDS, event))
                for event in source]


def halo_picture(source, *, layer: str | None = None, world_size: int | None = None) -> HaloPicture:
    """The rows moved by a halo exchange, from a :class:`HaloPlan` or a trace
    (a path, a :class:`minidist.trace.Trace`, ``(header, events)`` or a list
    of events as dicts or as the recorder's tuples).

    From a trace, the first halo exchange's layer and image height are
    taken (or the layer whose description contains ``layer``), and every
    halo message sent for that layer and height counts; a transfer repeated
    over several steps is listed once and its bytes counted once. The number
    of ranks is ``world_size``, else the trace header's, else one more than
    the highest rank in a halo message."""
    if isinstance(source, HaloPlan):
        backward = tuple(sorted((destination, owner, start, stop)
                                for owner, destination, start, stop in source.transfers))
        return HaloPicture(source.height, len(source.input_bands), tuple(source.input_bands),
                           tuple(sorted(source.transfers)), backward)
    header, events = _events(source)
    chosen = None
    moves = {"forward": {}, "backward": {}}
    highest = -1
    for event in events:
        if event.get("kind") != "send":
            continue
        info = _trace.label_info(event.get("label") or "")
        if "halo" not in info or "rows" not in info:
            continue
        key = (str(info.get("layer", "")), info.get("height"))
        if chosen is None and (layer is None or layer in key[0]):
            chosen = key
        if key != chosen:
            continue
        start, stop = info["rows"]
        move = (int(event["rank"]), int(event["peer"]), start, stop)
        moves[info["halo"]].setdefault(move, int(event.get("bytes") or 0))
        highest = max(highest, move[0], move[1])
    if chosen is None:
        raise ValueError("no halo messages in this trace"
                         + (f" for a layer matching {layer!r}" if layer else "")
                         + ": record a run of SpatialParallelConv2d with trace=... "
                         "(minidist.launch(..., trace='run.jsonl'))")
    if chosen[1] is None:
        raise ValueError("the halo messages in this trace do not say the image's height "
                         "(height=H in their label): record it with this minidist")
    world = world_size or header.get("world_size") or highest + 1
    height = int(chosen[1])
    return HaloPicture(height, int(world), tuple(band(height, world, r) for r in range(world)),
                       tuple(sorted(moves["forward"])), tuple(sorted(moves["backward"])),
                       chosen[0], sum(moves["forward"].values()),
                       sum(moves["backward"].values()))


# --------------------------------------------------------------------------- layout


def shown_rows(picture: HaloPicture) -> list[int | None]:
    """The rows drawn, top to bottom; None for a gap of rows left out. Whole
    images up to :data:`WHOLE_UP_TO` rows; taller ones keep the rows within
    :data:`BORDER_ROWS` of a band border or a moved row, and the first and
    last rows."""
    if picture.height <= WHOLE_UP_TO:
        return list(range(picture.height))
    keep = {0, picture.height - 1}
    edges = [start for start, _ in picture.bands] + [picture.height]
    for edge in edges:
        keep.update(range(edge - BORDER_ROWS, edge + BORDER_ROWS))
    for _, _, start, stop in picture.forward:
        keep.update(range(start, stop))
    rows: list[int | None] = []
    for row in sorted(r for r in keep if 0 <= r < picture.height):
        if rows and rows[-1] is not None and row > rows[-1] + 1:
            rows.append(None)
        rows.append(row)
    return rows


def _owner(picture: HaloPicture, row: int) -> int:
    return next(r for r, (start, stop) in enumerate(picture.bands) if start <= row < stop)


def _colours(count: int):
    return [PALETTE[r % len(PALETTE)] for r in range(count)]


def _dark(colour: str) -> bool:
    from matplotlib.colors import to_rgb

    red, green, blue = to_rgb(colour)
    return 0.299 * red + 0.587 * green + 0.114 * blue < 0.55


def _draw_panel(axis, picture: HaloPicture, direction: str, colours, rows) -> None:
    from matplotlib.patches import FancyArrowPatch, Rectangle

    y_of = {row: y for y, row in enumerate(rows) if row is not None}
    spacing = 3.0
    moves = picture.forward if direction == "forward" else picture.backward
    for rank, (start, stop) in enumerate(picture.bands):
        x = rank * spacing
        halo = {row: source for source, low, high in picture.received(rank)
                for row in range(low, high)}
        for row, y in y_of.items():
            mine = start <= row < stop
            if not mine and row not in halo:
                continue
            owner = rank if mine else halo[row]
            axis.add_patch(Rectangle((x, y), 1, 1, facecolor=colours[owner],
                                     alpha=1.0 if mine else 0.45, edgecolor="black",
                                     linewidth=0.6, hatch=None if mine else "///"))
            axis.text(x + 0.5, y + 0.5, str(row), ha="center", va="center", fontsize=6.5,
                      color="white" if mine and _dark(colours[owner]) else "black")
        for y, row in enumerate(rows):
            if row is None and any(start <= r < stop for r in (rows[y - 1], rows[y + 1])):
                axis.text(x + 0.5, y + 0.5, "⋮", ha="center", va="center", fontsize=9)
        axis.text(x + 0.5, -0.8, f"rank {rank}\nrows {start}:{stop}", ha="center", va="bottom",
                  fontsize=7.5)
    for source, destination, start, stop in moves:
        # Forward the rows land in the destination's halo cells; backward the
        # gradients leave the source's halo cells for the owner's band.
        y = (y_of[start] + y_of[stop - 1] + 1) / 2
        going_down = destination > source
        x0 = source * spacing + (1 if going_down else 0)
        x1 = destination * spacing + (0 if going_down else 1)
        owner = source if direction == "forward" else destination
        bend = 0.0 if abs(destination - source) == 1 else (0.35 if going_down else -0.35)
        axis.add_patch(FancyArrowPatch((x0, y), (x1, y), arrowstyle="-|>", mutation_scale=9,
                                       color=colours[owner], linewidth=1.4,
                                       linestyle="-" if direction == "forward" else "--",
                                       connectionstyle=f"arc3,rad={bend}"))
        text = f"{start}:{stop}" if direction == "forward" else f"grad {start}:{stop}"
        if bend:
            # In the gap beside the sender's column, under the arc (a fifth of
            # the way along, the curve is 0.32 of its control point's offset
            # down): the middle of the arc passes over another rank's column.
            sign = 1 if going_down else -1
            axis.text(x0 + sign * (spacing - 1) / 2, y + 0.32 * abs(bend) * abs(x1 - x0) + 0.1,
                      text, ha="center", va="top", fontsize=6.5)
        else:
            axis.text((x0 + x1) / 2, y - 0.35, text, ha="center", va="bottom", fontsize=6.5)
    axis.set_xlim(-0.6, (picture.world_size - 1) * spacing + 1.6)
    low = max((abs(destination - source) * spacing / 2 * 0.35 + 1.0 for source, destination, *_
               in moves if abs(destination - source) > 1), default=0.0)
    axis.set_ylim(len(rows) + max(1.2, low), -2.2)
    axis.set_axis_off()
    total = sum(stop - start for _, _, start, stop in moves)
    title = ("forward: rows sent to the neighbours" if direction == "forward"
             else "backward: their gradients sent back")
    axis.set_title(f"{title}\n{len(moves)} messages, {total} rows", fontsize=8.5)


#: Rank colours the legend lists one by one; above, "colours repeat".
LEGEND_RANKS = 8


def legend_handles(picture: HaloPicture, rows=None) -> list:
    """The legend's entries for ``picture`` (matplotlib handles): each rank's
    colour, what a cell's number is, a halo cell, the gap (when ``rows`` has
    one), the forward and the backward arrow."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colours = _colours(picture.world_size)
    handles = [Patch(facecolor=colours[rank], edgecolor="black", linewidth=0.6,
                     label=f"rank {rank}'s rows")
               for rank in range(min(picture.world_size, LEGEND_RANKS))]
    if picture.world_size > LEGEND_RANKS:
        handles.append(Patch(facecolor="white", edgecolor="white",
                             label="(colours repeat: see the column's rank)"))
    handles += [Patch(facecolor="white", edgecolor="black", linewidth=0.6,
                      label="n: image row n (a cell)"),
                Patch(facecolor=colours[0], alpha=0.45, edgecolor="black", linewidth=0.6,
                      hatch="///", label="hatched: a halo row received, its owner's colour")]
    if rows is not None and None in rows:
        handles.append(Line2D([], [], linestyle="none", marker="$⋮$", markersize=9,
                              color="black", label="⋮: rows left out"))
    handles += [Line2D([], [], color="#595959", linewidth=1.4, linestyle="-",
                       label="a:b: forward, rows a to b-1 sent (owner's colour)"),
                Line2D([], [], color="#595959", linewidth=1.4, linestyle="--",
                       label="grad a:b: backward, their gradients sent back")]
    return handles


def draw_halo_figure(source, figure=None, **options):
    """The halo picture on a matplotlib figure (a new Agg one when None);
    ``options`` go to :func:`halo_picture`. Returns the figure."""
    picture = source if isinstance(source, HaloPicture) else halo_picture(source, **options)
    rows = shown_rows(picture)
    if figure is None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        width = max(6.0, 0.75 * 3 * picture.world_size * 2 / 1.6)
        figure = Figure(figsize=(min(width, 12), min(2.0 + 0.2 * len(rows), 13) + LEGEND_INCHES),
                        dpi=100)
        FigureCanvasAgg(figure)
    colours = _colours(picture.world_size)
    left, right = figure.subplots(1, 2)
    _draw_panel(left, picture, "forward", colours, rows)
    _draw_panel(right, picture, "backward", colours, rows)
    caption = f"halo exchange, image of {picture.height} rows on {picture.world_size} ranks"
    if picture.layer:
        caption += f"\n{picture.layer}"
    if picture.forward_bytes is not None:
        caption += (f" - from the trace: {picture.forward_bytes:,} B forward, "
                    f"{picture.backward_bytes:,} B back")
    figure.suptitle(caption, fontsize=9, y=0.995, va="top")
    inches = figure.get_figheight()
    handles = legend_handles(picture, rows)
    columns = 4 if figure.get_figwidth() >= 10 else 2
    figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), columns), fontsize=7,
                  frameon=False, bbox_to_anchor=(0.5, 0.0))
    figure.subplots_adjust(left=0.02, right=0.98, top=1 - (0.75 if picture.layer else 0.55) / inches,
                           bottom=LEGEND_INCHES / inches, wspace=0.08)
    return figure


def draw_halo(source, path, *, dpi: int = 100, colors: int | None = 48, **options) -> str:
    """Draw the halo exchange of ``source`` (a trace, a :class:`HaloPlan` or a
    :class:`HaloPicture`) to the PNG ``path``: each rank's band as a column
    of row cells coloured by owner, hatched halo cells, an arrow per message
    labelled with its rows (forward left, gradients back right). ``colors``:
    save with a palette of that many colours (a small file), None for full
    colour. Returns the path."""
    figure = draw_halo_figure(source, **options)
    path = os.fspath(path)
    with atomic_path(path) as name:  # a link at path is replaced, not written through
        figure.savefig(name, dpi=dpi)
        if colors:
            from PIL import Image  # matplotlib's own dependency

            with Image.open(name) as image:
                reduced = image.convert("RGB").quantize(colors=colors)
            reduced.save(name, optimize=True)
    return path


__all__ = ["HaloPicture", "halo_picture", "shown_rows", "draw_halo_figure", "draw_halo",
           "legend_handles", "BORDER_ROWS", "WHOLE_UP_TO"]
