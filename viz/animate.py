"""A collective's replay as a matplotlib animation: the state before any
message (step 0), then one frame per algorithm step.

Each frame shows what the terminal step-through shows (``viz/terminal.py``):

* a header: collective, algorithm, step k of K, phase, the cost formula, and
  the time so far (measured) next to the cost model's prediction;
* the ranks laid out as the algorithm sees them (``replay.layout``: a ring, a
  tree grown from the messages, or rows), each rank's buffer drawn as its
  cells after the step, coloured by whose data each cell holds;
* the step's messages as arrows from the sender to the cells they write, with
  their byte counts; the cells written in this step are outlined;
* a legend and the list of the step's messages.

Colour is never the only signal: a cell holding one rank's data shows that
rank's number, a partial reduction ``Σk`` (k ranks summed so far), a complete
one ``A``, an empty one ``·``, the symbols of the terminal
(:func:`viz.replay.cell_symbol`), and the legend names each symbol and colour
the replay draws, in the terminal's words (:func:`legend_entries`). The
colours are matplotlib's tableau-colorblind10; a partial sum is the mix of
its ranks' colours.

Above 16 ranks (``replay.summary``) single cells are unreadable, so a frame
is a summary instead: a heat map of how complete every rank's cells are,
and per step the bytes moved, the messages, and the fraction of complete
cells, the current step highlighted.

Everything draws on a :class:`~matplotlib.figure.Figure` with an Agg canvas,
so no display is needed and pyplot's global state is left alone::

    from viz.animate import animate, save_gif, save_html
    save_gif(replay, "ring.gif", fps=1)      # PillowWriter: no ffmpeg needed
    save_html(replay, "ring.html")           # a page that needs no network (viz.html_player)
    animate(replay)                          # in a notebook: the player inline
"""

from __future__ import annotations

import base64
import io
import math
import os
import textwrap
from collections import deque

import numpy as np
from matplotlib import patches
from matplotlib.animation import FuncAnimation, PillowWriter
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.textpath import TextPath

from minidist.atomic_file import atomic_path, atomic_write
from minidist.units import format_bytes
from viz.replay import (
    alone_ranks,
    cell_kinds,
    cell_symbol,
    cell_words,
    model_gap,
    rank_words,
    step_words,
)

#: matplotlib's tableau-colorblind10, the colour of rank r is PALETTE[r % 10].
PALETTE = ("#006BA4", "#FF800E", "#ABABAB", "#595959", "#5F9ED1",
           "#C85200", "#898989", "#A2C8EC", "#FFBC79", "#CFCFCF")
COMPLETE = "#1B1B1B"
EMPTY = "#FFFFFF"
HIGHLIGHT = "#000000"
SUMMARY_COLORMAP = "cividis"  # perceptually uniform and colour-blind safe

FIGURE_SIZE = (11.0, 7.0)
LARGE_FIGURE_SIZE = (14.0, 9.0)  # from 9 ranks on, so that 16 ranks' cells stay readable
DPI = 80
MESSAGES_LISTED = 10
#: Characters per line of the measured-vs-model explanation (8 pt on 11 in).
WHY_WIDTH = 165
#: The ranks' and the side panel's height (figure fraction), under the header.
RANKS_HEIGHT = 0.69
RING_STRETCH = 1.4
#: Rank colours the legend lists one by one; above, they repeat.
LEGEND_RANKS = len(PALETTE)
#: Characters a line of the GIF's legend holds.
LEGEND_WIDTH = 38
#: What the receiver does with a message, as the legend says it.
OP_WORDS = {"copy": "replaces its cells", "combine": "adds to them",
            "merge": "merges the block in"}


# --------------------------------------------------------------------------- cells


def cell_text(holders: frozenset, world_size: int) -> str:
    """The text a cell shows, as in the terminal: "2" rank 2's data alone,
    "Σ3" a partial result of three ranks, "A" all of them, "·" nothing yet."""
    return cell_symbol(holders, world_size)


def cell_color(holders: frozenset, world_size: int):
    """The fill of a cell: its rank's colour, the mix of several, dark when complete."""
    if not holders:
        return EMPTY
    if len(holders) == 1:
        return PALETTE[next(iter(holders)) % len(PALETTE)]
    if len(holders) == world_size:
        return COMPLETE
    return tuple(np.mean([to_rgb(PALETTE[rank % len(PALETTE)]) for rank in holders], axis=0))


def _text_color(fill) -> str:
    red, green, blue = to_rgb(fill)
    return "white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.5 else "black"


# --------------------------------------------------------------------------- layouts


def positions(replay) -> dict[int, tuple[float, float]]:
    """Where each rank sits: on a circle (ring), in levels (tree), or in rows."""
    n = replay.world_size
    if replay.layout == "ring" and n > 1:
        # Rank 0 on top, ranks clockwise: the direction the ring sends in. A
        # big ring is stretched into an ellipse to use the figure's width.
        stretch = RING_STRETCH if n > 8 else 1.0
        return {rank: (stretch * math.sin(2 * math.pi * rank / n),
                       math.cos(2 * math.pi * rank / n)) for rank in range(n)}
    if replay.layout == "tree" and n > 1:
        return _tree_positions(replay)
    per_row = min(n, 8)
    return {rank: (float(rank % per_row), -float(rank // per_row)) for rank in range(n)}


def _tree_positions(replay) -> dict[int, tuple[float, float]]:
    """Levels of the tree the messages draw, grown breadth first from the root.

    The tree is read from the messages rather than assumed, so every tree
    algorithm (binomial, binary, chain, ...) is drawn as it really ran: a
    rank's parent is the first rank it exchanged a message with that is
    already in the tree.
    """
    n = replay.world_size
    root = replay.root if replay.root is not None and 0 <= replay.root < n else 0
    neighbours: dict[int, list[int]] = {rank: [] for rank in range(n)}
    for frame in replay.frames:
        for message in frame.messages:
            for a, b in ((message.source, message.target), (message.target, message.source)):
                if b not in neighbours[a]:
                    neighbours[a].append(b)
    children: dict[int, list[int]] = {rank: [] for rank in range(n)}
    depth = {root: 0}
    queue = deque([root])
    while queue:
        rank = queue.popleft()
        for peer in neighbours[rank]:
            if peer not in depth:
                depth[peer] = depth[rank] + 1
                children[rank].append(peer)
                queue.append(peer)
    roots = [root] + [rank for rank in range(n) if rank not in depth]
    for rank in roots[1:]:
        depth[rank] = 0

    x_of: dict[int, float] = {}
    next_leaf = [0.0]

    def place(rank):
        # A leaf takes the next free column; a parent sits above its children.
        if not children[rank]:
            x_of[rank] = next_leaf[0]
            next_leaf[0] += 1.0
        else:
            for child in children[rank]:
                place(child)
            x_of[rank] = float(np.mean([x_of[child] for child in children[rank]]))

    for rank in roots:
        place(rank)
    return {rank: (x_of[rank], -1.3 * depth[rank]) for rank in range(n)}


def tree_edges(replay) -> list[tuple[int, int]]:
    """Every pair of ranks that exchanged a message (drawn faintly under a tree)."""
    edges = []
    for frame in replay.frames:
        for message in frame.messages:
            pair = tuple(sorted((message.source, message.target)))
            if pair not in edges:
                edges.append(pair)
    return edges


class _Geometry:
    """Sizes in data units: the cell grid of one buffer, as large as the layout allows.

    Two buffers may not overlap: for every pair of ranks either their
    horizontal distance fits a grid's width or their vertical distance fits
    its height plus the rank's name. The grid's shape (columns x rows) is the
    one that gives the largest cells.
    """

    def __init__(self, replay, where):
        self.cells = replay.cells if _has_holdings(replay) else 0
        points = list(where.values())
        pairs = [(abs(a[0] - b[0]), abs(a[1] - b[1]))
                 for i, a in enumerate(points) for b in points[i + 1:]]
        best = None
        for columns in range(1, max(self.cells, 1) + 1):
            rows = math.ceil(max(self.cells, 1) / columns)
            size = min((max(dx / (columns + 0.5), dy / (rows + 1.6)) for dx, dy in pairs),
                       default=0.3)
            # Rows of cells read more easily than tall stacks, and full grids
            # more easily than ragged ones.
            score = size * (1.0 + 0.05 * min(columns, 8))
            if self.cells % columns:
                score *= 0.75
            if best is None or score > best[0]:
                best = (score, size, columns, rows)
        _, self.size, self.columns, self.rows = best
        self.width = self.columns * self.size
        self.height = self.rows * self.size

    def edge_towards(self, centre, point):
        """Where the line from the grid's centre to ``point`` leaves the grid."""
        x, y = centre
        dx, dy = point[0] - x, point[1] - y
        scale = min(self.width / 2 / abs(dx) if dx else math.inf,
                    self.height / 2 / abs(dy) if dy else math.inf, 1.0)
        return (x + dx * scale, y + dy * scale)

    def cell_origin(self, centre, cell):
        x, y = centre
        row, column = divmod(cell, self.columns)
        return (x - self.width / 2 + column * self.size,
                y + self.height / 2 - (row + 1) * self.size)

    def cells_centre(self, centre, cells):
        first, stop = cells
        stop = max(stop, first + 1)
        origins = [self.cell_origin(centre, cell) for cell in range(first, min(stop, self.cells))]
        if not origins:
            return centre
        xs, ys = zip(*origins)
        return (float(np.mean(xs)) + self.size / 2, float(np.mean(ys)) + self.size / 2)


def _bezier_points(start, control, end, points: int = 48, stop: float | None = None) \
        -> np.ndarray:
    """Points along the quadratic Bezier curve arc3 draws (the arrow's path):
    ``points`` of them evenly in t, or the one at t = ``stop``."""
    t = (np.linspace(0.0, 1.0, points) if stop is None else np.array([stop]))[:, None]
    return ((1 - t) ** 2 * np.asarray(start) + 2 * (1 - t) * t * np.asarray(control)
            + t ** 2 * np.asarray(end))


def _segments_hit_box(segments: np.ndarray, box) -> int:
    """How many of ``segments`` (rows x0, y0, x1, y1) cross the rectangle
    (left, bottom, right, top): each clipped against it (Liang-Barsky), all at once."""
    if not len(segments):
        return 0
    left, bottom, right, top = box
    ax, ay, bx, by = segments.T
    dx, dy = bx - ax, by - ay
    low, high = np.zeros(len(segments)), np.ones(len(segments))
    inside = np.ones(len(segments), bool)
    for p, q in ((-dx, ax - left), (dx, right - ax), (-dy, ay - bottom), (dy, top - ay)):
        parallel = p == 0
        inside &= ~(parallel & (q < 0))
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(parallel, 0.0, q / np.where(parallel, 1.0, p))
        low = np.where(~parallel & (p < 0), np.maximum(low, r), low)
        high = np.where(~parallel & (p > 0), np.minimum(high, r), high)
    return int(np.count_nonzero(inside & (low <= high)))


def _title_candidates(x, y, geometry, width, height) -> list:
    """Places for a ``width`` x ``height`` title next to the grid centred at
    (x, y), in the order preferred: (x, y, ha, va, (left, bottom, right, top))."""
    gap = 0.25 * geometry.size
    top, bottom = y + geometry.height / 2 + gap, y - geometry.height / 2 - gap
    left, right = x - geometry.width / 2 - gap, x + geometry.width / 2 + gap
    candidates = [
        (x, top, "center", "bottom", (x - width / 2, top, x + width / 2, top + height)),
        (x, bottom, "center", "top", (x - width / 2, bottom - height, x + width / 2, bottom)),
        (right, y, "left", "center", (right, y - height / 2, right + width, y + height / 2)),
        (left, y, "right", "center", (left - width, y - height / 2, left, y + height / 2)),
        (left + gap, top, "left", "bottom", (left + gap, top, left + gap + width, top + height)),
        (right - gap, top, "right", "bottom", (right - gap - width, top, right - gap, top + height)),
        (left + gap, bottom, "left", "top", (left + gap, bottom - height, left + gap + width, bottom)),
        (right - gap, bottom, "right", "top",
         (right - gap - width, bottom - height, right - gap, bottom)),
    ]
    # Then those above and below once more, a title's height further out.
    for x_at, y_at, ha, va, (x0, y0, x1, y1) in list(candidates):
        if va in ("bottom", "top"):
            lift = 1.2 * height * (1 if va == "bottom" else -1)
            candidates.append((x_at, y_at + lift, ha, va, (x0, y0 + lift, x1, y1 + lift)))
    return candidates


def _boxes_overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _uniform(messages) -> bool:
    """Many messages all alike: one note says their size instead of a label on each."""
    return len(messages) > 4 and len({(m.nbytes, m.op) for m in messages}) == 1


def _written(frame) -> dict[int, set[int]]:
    """rank -> the cells the frame's messages write (outlined)."""
    written: dict[int, set[int]] = {}
    for message in frame.messages:
        if message.cells is not None:
            written.setdefault(message.target, set()).update(
                range(message.cells[0], max(message.cells[1], message.cells[0] + 1)))
    return written


def _has_holdings(replay) -> bool:
    return any(frame.holdings is not None for frame in replay.frames)


def legend_entries(replay) -> list[dict]:
    """The cells' legend: one entry per symbol and colour some frame of
    ``replay`` draws, in the terminal's words (:func:`viz.replay.cell_words`),
    each ``{"symbol", "label", "note", "fill", "edge", "width", "line"}``
    (``label``: "symbol: words"; ``note``: what its colour says, or ""; fill
    and edge as hex colours; ``line``: drawn as an arrow's line, not a
    cell). Then the arrows: each rank's colour that only its messages show,
    and what an arrow and its label say. The GIF's side panel and the
    browser's player both draw these."""
    words = cell_words(replay)
    kinds = cell_kinds(replay)
    entries = []

    def entry(symbol, label, fill, edge="#777777", width=0.6, note="", line=False):
        entries.append({"symbol": symbol, "label": label, "note": note, "fill": to_hex(fill),
                        "edge": edge, "width": width, "line": line})

    shown = alone_ranks(replay) if not kinds or "one" in kinds else []

    if shown:
        # A rank's number: its cells holding its data alone (or its box,
        # when the collective's cells are not tracked), in its colour.
        ranks = shown
        for rank in ranks[:LEGEND_RANKS]:
            entry(str(rank), f"{rank}: {rank_words(replay, rank)}", PALETTE[rank % len(PALETTE)])
        if len(ranks) > LEGEND_RANKS:
            rest = ranks[LEGEND_RANKS:]
            span = f"{rest[0]}..{rest[-1]}" if len(rest) > 1 else str(rest[0])
            entry(span, f"{span}: the same, colours repeat (read the number)",
                  EMPTY, edge="#FFFFFF")
    for kind in kinds:
        if kind == "one":
            continue
        symbol, meaning = words[kind]
        fill = {"partial": cell_color(frozenset({0, 1}), 3), "complete": COMPLETE,
                "empty": EMPTY}[kind]
        note = {"partial": "(colour: the mix of theirs)", "complete": "(dark)"}.get(kind, "")
        entry(symbol, f"{symbol}: {meaning}", fill, note=note)
    if any(_written(frame) for frame in replay.frames) and kinds:
        entry("outlined", "outlined: written in this step", EMPTY, edge=HIGHLIGHT, width=2.4)
    messages = [message for frame in replay.frames for message in frame.messages]
    # A sender whose colour no cell shows (a broadcast's relays): its arrows'.
    listed = {rank % len(PALETTE) for rank in shown}
    for rank in sorted({message.source for message in messages}):
        if rank % len(PALETTE) not in listed:
            entry(f"rank {rank}", f"rank {rank}: its arrows' colour", PALETTE[rank % len(PALETTE)],
                  line=True)
            listed.add(rank % len(PALETTE))
    if messages:
        ops = sorted({message.op for message in messages if message.op})
        entry("arrow", "arrow: a message (its sender's colour)", PALETTE[0], line=True,
              note="(label: its bytes" + "".join(f"; {op}: the receiver {OP_WORDS.get(op, op)}"
                                                 for op in ops) + ")")
    return entries


# --------------------------------------------------------------------------- text


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "no formula"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def header_lines(replay, frame) -> list[str]:
    """The header of a frame, the same words as the terminal view."""
    size = format_bytes(replay.count * replay.itemsize)
    root = "" if replay.root is None else f", root {replay.root}"
    predicted = (f"cost model {format_seconds(replay.predicted_s)} for the whole call"
                 if replay.predicted_s is not None else "no cost-model time for this call")
    gap = model_gap(replay)
    return [
        f"{replay.collective} · {replay.algorithm} · {replay.world_size} ranks · "
        f"{replay.count} elements ({size}){root}",
        f"{step_words(replay, frame)}: {frame.phase}" if frame.phase else step_words(replay, frame),
        (f"cost: {replay.formula}" + ("   (αₛ: the shared slots' latency)"
                                      if "αₛ" in replay.formula else ""))
        if replay.formula else "cost: (no formula)",
        f"measured {format_seconds(frame.elapsed_ns / 1e9)} so far of "
        f"{format_seconds(replay.measured_s)} (from the first rank's entry) · {predicted}",
        f"measured / model = {gap}" if gap else "",
    ]


def message_line(message) -> str:
    op = f"  {message.op}" if message.op else ""
    return f"{message.source} → {message.target}  {format_bytes(message.nbytes)}{op}"


# --------------------------------------------------------------------------- drawing


class _Painter:
    """Draws any frame of one replay on one figure (the animation redraws per frame)."""

    def __init__(self, replay, figure: Figure | None = None):
        # A replay of no step (one rank; a student's run that yielded only
        # empty steps) is drawn too: its one frame, the state before any message.
        self.replay = replay
        size = FIGURE_SIZE if replay.world_size <= 8 or replay.summary else LARGE_FIGURE_SIZE
        self.figure = figure or Figure(figsize=size, dpi=DPI)
        if not isinstance(self.figure.canvas, FigureCanvasAgg):
            FigureCanvasAgg(self.figure)
        self.summary = bool(replay.summary)
        if self.summary:
            self._prepare_summary()
        else:
            self.where = positions(replay)
            self.geometry = _Geometry(replay, self.where)

    # -- common parts

    def draw(self, index: int):
        self.figure.clear()
        frame = self.replay.frames[index]
        lines = header_lines(self.replay, frame)
        self.figure.text(0.02, 0.975, lines[0], fontsize=13, weight="bold", va="top")
        self.figure.text(0.02, 0.935, lines[1], fontsize=13, va="top", color=PALETTE[5])
        self.figure.text(0.02, 0.898, lines[2], fontsize=10, va="top", family="monospace")
        self.figure.text(0.02, 0.866, lines[3], fontsize=10, va="top")
        # The why of the gap: up to three lines under the times, above the ranks.
        self.figure.text(0.02, 0.838, "\n".join(textwrap.wrap(lines[4], WHY_WIDTH)[:3]),
                         fontsize=8, va="top", color=PALETTE[3])
        self._draw_time_bar(frame)
        if self.summary:
            self._draw_summary(frame)
        else:
            self._draw_ranks(frame)
            self._draw_side_panel(frame)
        return []

    def _draw_time_bar(self, frame):
        replay = self.replay
        axis = self.figure.add_axes((0.06, 0.035, 0.56, 0.025))
        total = max(replay.measured_s, replay.predicted_s or 0.0,
                    replay.frames[-1].elapsed_ns / 1e9, 1e-12)
        axis.barh([0], [frame.elapsed_ns / 1e9], color=PALETTE[0], height=1.0)
        axis.axvline(replay.measured_s, color=PALETTE[3], linewidth=2)
        if replay.predicted_s is not None:
            axis.axvline(replay.predicted_s, color=PALETTE[1], linewidth=2, linestyle="--")
        axis.set_xlim(0, total * 1.02)
        axis.set_yticks([])
        axis.set_xticks([])
        note = "bar: time so far · solid line: slowest rank's call"
        if replay.predicted_s is not None:
            note += " · dashed: predicted"
        axis.set_title(note, fontsize=8, loc="left", pad=2)

    # -- the ranks view

    def _ranks_axis(self):
        """The axes the ranks are drawn on, their limits set: (axis, font, points_per_unit)."""
        replay, geometry, where = self.replay, self.geometry, self.where
        axis = self.figure.add_axes((0.01, 0.09, 0.67, RANKS_HEIGHT))
        axis.set_axis_off()
        axis.set_aspect("equal")
        xs = [x for x, _ in where.values()]
        ys = [y for _, y in where.values()]
        # Room for arrows bulging out of a ring, and for a rank's title on any
        # side of its grid (it goes where no arrow or label is: _title_places).
        bulge = 0.2 if replay.layout == "ring" else 0.0
        title_width = 0.62 * 0.45 * geometry.size * len(f"rank {replay.world_size - 1}")
        margin_x = geometry.width / 2 + 0.3 * geometry.size + max(title_width, geometry.size) \
            + bulge
        margin_y = geometry.height / 2 + 1.2 * geometry.size + bulge
        axis.set_xlim(min(xs) - margin_x, max(xs) + margin_x)
        axis.set_ylim(min(ys) - margin_y, max(ys) + margin_y)
        points_per_unit = self._points_per_unit(axis)
        font = max(5.0, min(13.0, 0.45 * geometry.size * points_per_unit))
        return axis, font, points_per_unit

    def _draw_ranks(self, frame):
        replay, where = self.replay, self.where
        axis, font, points_per_unit = self._ranks_axis()
        self._places = self._title_places(font, points_per_unit, frame.index)

        if replay.layout == "tree":
            for a, b in tree_edges(replay):
                axis.plot(*zip(where[a], where[b]), color="#DDDDDD", linewidth=1, zorder=0)
        elif replay.layout == "ring" and replay.world_size > 2:
            stretch = RING_STRETCH if replay.world_size > 8 else 1.0
            axis.add_patch(patches.Ellipse((0, 0), 2.0 * stretch, 2.0, fill=False,
                                           color="#E5E5E5", linewidth=1, zorder=0))

        written = _written(frame)
        for rank, centre in where.items():
            self._draw_buffer(axis, rank, centre, frame, written.get(rank, ()), font)

        for message, place in zip(frame.messages, self._label_at[frame.index]):
            self._draw_message(axis, message, font, place)

    def scene(self, index: int) -> dict:
        """Frame ``index``'s ranks view as plain data, for a browser to draw
        (:mod:`viz.html_player`): the same places, cells, colours, arrows and
        labels this painter draws, in data units (y upwards), so the page and
        the GIF show one picture. Not for the summary view."""
        replay, geometry, where = self.replay, self.geometry, self.where
        frame = replay.frames[index]
        self.figure.clear()
        axis, font, points_per_unit = self._ranks_axis()
        places = self._title_places(font, points_per_unit, index)
        written = _written(frame)
        ranks = []
        for rank, centre in where.items():
            x, y, ha, va, _ = places[rank]
            entry = {"rank": rank, "x": centre[0], "y": centre[1], "title": [x, y, ha, va]}
            if frame.holdings is None:
                entry["box"] = [centre[0] - geometry.width / 2, centre[1] - geometry.height / 2,
                                geometry.width, geometry.height, PALETTE[rank % 10],
                                _text_color(PALETTE[rank % 10])]
            else:
                entry["cells"] = []
                for cell, holders in enumerate(frame.holdings[rank]):
                    fill = cell_color(holders, replay.world_size)
                    origin = geometry.cell_origin(centre, cell)
                    entry["cells"].append([origin[0], origin[1], to_hex(fill),
                                           cell_text(holders, replay.world_size),
                                           _text_color(fill), cell in written.get(rank, ())])
            ranks.append(entry)
        messages = []
        for message, place in zip(frame.messages, self._label_at[index]):
            start, end, _, control, _ = self._arrow(message)
            label = None
            if place is not None:
                label = [*place[0], format_bytes(message.nbytes)
                         + (f" {message.op}" if message.op else "")]
            messages.append({"source": message.source, "target": message.target,
                             "path": [*start, *control, *end],
                             "color": PALETTE[message.source % 10], "label": label})
        stretch = RING_STRETCH if replay.world_size > 8 else 1.0
        return {"view": [*axis.get_xlim(), *axis.get_ylim()], "size": geometry.size,
                "font": font / points_per_unit, "ranks": ranks, "messages": messages,
                "ring": [stretch, 1.0] if replay.layout == "ring" and replay.world_size > 2
                else None,
                "edges": [[*where[a], *where[b]] for a, b in tree_edges(replay)]
                if replay.layout == "tree" else []}

    def _points_per_unit(self, axis) -> float:
        width, height = self.figure.get_size_inches()
        box = axis.get_position()
        x0, x1 = axis.get_xlim()
        y0, y1 = axis.get_ylim()
        return 72 * min(box.width * width / (x1 - x0), box.height * height / (y1 - y0))

    def _draw_buffer(self, axis, rank, centre, frame, written, font):
        geometry, n = self.geometry, self.replay.world_size
        x, y = centre
        title_x, title_y, ha, va, _ = self._places[rank]
        axis.text(title_x, title_y, f"rank {rank}", ha=ha, va=va, fontsize=font,
                  weight="bold")
        if frame.holdings is None:
            axis.add_patch(patches.FancyBboxPatch(
                (x - geometry.width / 2, y - geometry.height / 2), geometry.width,
                geometry.height, boxstyle="round,pad=0.01", facecolor=PALETTE[rank % 10],
                edgecolor="black", linewidth=1))
            axis.text(x, y, str(rank), ha="center", va="center", fontsize=font,
                      color=_text_color(PALETTE[rank % 10]))
            return
        for cell, holders in enumerate(frame.holdings[rank]):
            fill = cell_color(holders, n)
            origin = geometry.cell_origin(centre, cell)
            outlined = cell in written
            axis.add_patch(patches.Rectangle(
                origin, geometry.size, geometry.size, facecolor=fill,
                edgecolor=HIGHLIGHT if outlined else "#777777",
                linewidth=2.4 if outlined else 0.6, zorder=2 if outlined else 1))
            text = cell_text(holders, n)
            axis.text(origin[0] + geometry.size / 2, origin[1] + geometry.size / 2,
                      text, ha="center", va="center",
                      fontsize=font * (0.8 if len(text) > 1 else 1.0),
                      color=_text_color(fill), zorder=3)

    def _arrow(self, message):
        """(start, end, bend, middle) of a message's arrow, in data units: from the
        sender's grid edge to the cells it writes, an arc3 curve; ``middle`` is
        where its label sits."""
        geometry = self.geometry
        if message.cells is not None and geometry.cells:
            end = geometry.cells_centre(self.where[message.target], message.cells)
        else:
            end = self.where[message.target]
        start = geometry.edge_towards(self.where[message.source], end)
        # Ring arrows bulge outwards, away from the other buffers.
        bend = -0.3 if self.replay.layout == "ring" else 0.25
        # The midpoint of arc3's quadratic Bezier curve.
        (x0, y0), (x1, y1) = start, end
        control = ((x0 + x1) / 2 + bend * (y1 - y0), (y0 + y1) / 2 - bend * (x1 - x0))
        middle = (0.25 * x0 + 0.5 * control[0] + 0.25 * x1,
                  0.25 * y0 + 0.5 * control[1] + 0.25 * y1)
        return start, end, bend, control, middle

    def _title_places(self, font: float, points_per_unit: float, index: int) -> dict:
        """rank -> (x, y, ha, va, box) of its title in frame ``index``: a place
        next to its grid (above, below, right, left, the corners, then the
        same further out) whose box no arrow of the frame crosses and that
        covers no message label, other grid or other title. Among those, the
        one clear in the most frames, so that a title moves only in a frame
        where its usual place is taken; none clear: the fewest hits.

        Texts are measured with matplotlib's own glyph extents (TextPath) at
        the fonts drawn, in data units. Cost: once per replay, ranks x 14
        places x (every frame's arrow segments, vectorised), then per frame
        ranks x 14 look-ups.
        """
        if getattr(self, "_candidates", None) is None:
            self._prepare_title_places(font, points_per_unit)
        places, taken = {}, []
        for rank, candidates in self._candidates.items():
            in_frame = self._hits[rank][:, index]
            overlaps = np.array([sum(_boxes_overlap(box, other) for other in taken)
                                 for *_, box in candidates])
            order = np.lexsort((np.arange(len(candidates)), self._hits[rank].sum(axis=1),
                                in_frame + overlaps))
            places[rank] = candidates[order[0]]
            taken.append(places[rank][4])
        return places

    #: Where along its arc a label may sit (fractions of the curve), in the
    #: order tried: the midpoint first, then further out to either end.
    LABEL_STOPS = (0.5, 0.38, 0.62, 0.27, 0.73, 0.18, 0.82)

    def _place_labels(self, frame, label_font, points_per_unit, extent) -> list:
        """Per message of ``frame``: ((x, y), box) of its label, or None when the
        frame's messages are all alike (one note says their size). A label
        sits on its arc, at the first of :data:`LABEL_STOPS` where its box
        covers no label placed before it (two arcs that cross, or two short
        ones side by side, would otherwise stack their labels) and no rank's
        cells (whose symbols it would hide); none clear: the stop covering
        the fewest. Messages all alike whose labels would cover cells get the
        note too."""
        if _uniform(frame.messages):
            return [None] * len(frame.messages)
        pad = 0.25 * label_font / points_per_unit  # the round box's pad, each side
        geometry = self.geometry
        grids = [(x - geometry.width / 2, y - geometry.height / 2,
                  x + geometry.width / 2, y + geometry.height / 2)
                 for x, y in self.where.values()]
        placed, boxes = [], []
        for message in frame.messages:
            start, end, _, control, _ = self._arrow(message)
            text = format_bytes(message.nbytes) + (f" {message.op}" if message.op else "")
            width, height = extent(text, label_font)
            half_w, half_h = width / 2 + pad, height / 2 + pad
            best = None
            for stop in self.LABEL_STOPS:
                (x, y), = _bezier_points(start, control, end, stop=stop)
                box = (x - half_w, y - half_h, x + half_w, y + half_h)
                covered = sum(_boxes_overlap(box, other) for other in boxes + grids)
                if best is None or covered < best[0]:
                    best = (covered, (x, y), box)
                if not covered:
                    break
            placed.append(best[1:])
            boxes.append(best[2])
        if len({(m.nbytes, m.op) for m in frame.messages}) == 1 and any(
                _boxes_overlap(box, grid) for box in boxes for grid in grids):
            # Short arcs between big cells: labels alike would hide symbols,
            # so one note says them all (as for many messages).
            return [None] * len(frame.messages)
        return placed

    def _prepare_title_places(self, font: float, points_per_unit: float) -> None:
        """Every rank's candidate places and, per frame, how many obstacles each hits."""
        geometry, where = self.geometry, self.where
        label_font = max(5.0, font * 0.75)
        # A few points of clearance: the arrows' width, the glyphs' descent.
        clear = 4.0 / points_per_unit

        def extent(text, fontsize, weight="normal"):
            box = TextPath((0, 0), text, size=fontsize,
                           prop=FontProperties(weight=weight)).get_extents()
            return box.width / points_per_unit, 1.2 * fontsize / points_per_unit

        frames = len(self.replay.frames)
        segments, labels = [], []   # per frame: arrow segments (k, 4), label boxes
        self._label_at = []  # per frame: where each message's label sits (or None)
        for frame in self.replay.frames:
            pieces = [np.empty((0, 4))]
            for message in frame.messages:
                start, end, _, control, _ = self._arrow(message)
                curve = _bezier_points(start, control, end)
                pieces.append(np.hstack([curve[:-1], curve[1:]]))
            places = self._place_labels(frame, label_font, points_per_unit, extent)
            self._label_at.append(places)
            segments.append(np.vstack(pieces))
            labels.append([box for place in places if place is not None
                           for box in (place[1],)])
        grids = {rank: (x - geometry.width / 2, y - geometry.height / 2,
                        x + geometry.width / 2, y + geometry.height / 2)
                 for rank, (x, y) in where.items()}
        self._candidates, self._hits = {}, {}
        for rank, (x, y) in where.items():
            width, height = extent(f"rank {rank}", font, "bold")
            candidates = _title_candidates(x, y, geometry, width, height)
            hits = np.zeros((len(candidates), frames), np.int64)
            for row, (*_, box) in enumerate(candidates):
                box = (box[0] - clear, box[1] - clear, box[2] + clear, box[3] + clear)
                fixed = sum(_boxes_overlap(box, grid) for other, grid in grids.items()
                            if other != rank)
                for column in range(frames):
                    hits[row, column] = (fixed + _segments_hit_box(segments[column], box)
                                         + sum(_boxes_overlap(box, label)
                                               for label in labels[column]))
            self._candidates[rank], self._hits[rank] = candidates, hits

    def _draw_message(self, axis, message, font, place):
        """The message's arrow, and its label at ``place`` ((x, y), box) unless None."""
        start, end, bend, _, _ = self._arrow(message)
        color = PALETTE[message.source % 10]
        axis.add_patch(patches.FancyArrowPatch(
            start, end, arrowstyle="-|>", mutation_scale=10 + font,
            connectionstyle=f"arc3,rad={bend}", color=color, linewidth=2.2,
            shrinkA=0, shrinkB=2, zorder=4, alpha=0.95))
        if place is None:
            return
        # The label sits on the arc (see _place_labels).
        text = format_bytes(message.nbytes)
        if message.op:
            text += f" {message.op}"
        axis.text(*place[0], text, ha="center", va="center", fontsize=max(5.0, font * 0.75),
                  zorder=5, bbox={"boxstyle": "round,pad=0.15", "facecolor": "white",
                                  "edgecolor": color, "linewidth": 1})

    def _draw_side_panel(self, frame):
        replay = self.replay
        axis = self.figure.add_axes((0.70, 0.09, 0.29, RANKS_HEIGHT))
        axis.set_axis_off()
        # The same entries every frame: the legend names each symbol the
        # whole replay draws, so it stands still while the frames play.
        handles = []
        for item in legend_entries(replay):
            # The panel holds about 38 characters a line at this size.
            label = "\n".join([item["label"]] + textwrap.wrap(item["note"], LEGEND_WIDTH))
            if item["line"]:
                # A line ending in the arrows' head (the legend draws a line of two points).
                handles.append(Line2D([0, 1], [0, 0], color=item["fill"], linewidth=2.2,
                                      marker=">", markevery=[-1], label=label))
            else:
                handles.append(patches.Patch(facecolor=item["fill"], edgecolor=item["edge"],
                                             linewidth=item["width"], label=label))
        title = "cells" if _has_holdings(replay) else "ranks (cells not tracked)"
        legend = axis.legend(handles=handles, loc="upper left", fontsize=9, frameon=False,
                             title=title, title_fontsize=10, alignment="left")
        legend.get_title().set_weight("bold")
        lines = [message_line(message) for message in frame.messages[:MESSAGES_LISTED]]
        if len(frame.messages) > MESSAGES_LISTED:
            lines.append(f"... and {len(frame.messages) - MESSAGES_LISTED} more")
        title = f"messages of this step ({len(frame.messages)})"
        if frame.messages and all(place is None for place in self._label_at[frame.index]):
            title += f"\nevery arrow: {message_line(frame.messages[0]).split('  ', 1)[1]}"
        # Under the legend, however long the replay's legend is.
        bottom = axis.transAxes.inverted().transform(
            legend.get_window_extent(self.figure.canvas.get_renderer()))[0][1]
        top = min(0.36, bottom - 0.02)
        axis.text(0.0, top, title, fontsize=10, weight="bold", va="top",
                  transform=axis.transAxes)
        nothing = "(none yet: each rank holds its own data)" if frame.index == 0 \
            else "(none: this step is local work)"
        axis.text(0.0, top - 0.09, "\n".join(lines) or nothing,
                  fontsize=9, va="top", family="monospace", transform=axis.transAxes)

    # -- the summary view

    def _prepare_summary(self):
        replay = self.replay
        self.step_bytes = [sum(m.nbytes for m in frame.messages) for frame in replay.frames]
        self.step_messages = [len(frame.messages) for frame in replay.frames]
        final = replay.frames[-1].holdings
        self.completeness = None
        if final is not None and all(frame.holdings is not None for frame in replay.frames):
            self.completeness = [completeness(frame.holdings, final) for frame in replay.frames]
        if self.completeness is not None:
            self.complete_fraction = [float(np.mean(grid == 1.0)) for grid in self.completeness]
        elif all(getattr(frame, "complete", None) is not None for frame in replay.frames):
            # Big worlds keep no per-cell holdings, only each step's share of complete cells.
            self.complete_fraction = [frame.complete for frame in replay.frames]
        else:
            self.complete_fraction = None

    def _draw_summary(self, frame):
        replay, index = self.replay, frame.index
        steps = np.arange(len(replay.frames))  # step 0: before any message
        if self.completeness is not None:
            heat = self.figure.add_axes((0.06, 0.17, 0.34, 0.6))
            image = heat.imshow(self.completeness[index], aspect="auto", vmin=0, vmax=1,
                                cmap=SUMMARY_COLORMAP, interpolation="nearest")
            heat.set_xlabel(f"cell of the buffer ({replay.cells} cells)")
            heat.set_ylabel("rank")
            heat.set_title("how complete each cell is\n(share of its final contributors held)",
                           fontsize=10)
            colorbar = self.figure.colorbar(image, ax=heat, fraction=0.05, pad=0.02)
            colorbar.set_label("0 = none yet, 1 = final")
            left = 0.52
        else:
            left = 0.08
        width = 0.94 - left
        colors = [PALETTE[0] if step != index else PALETTE[1] for step in steps]

        bytes_axis = self.figure.add_axes((left, 0.53, width, 0.25))
        bytes_axis.bar(steps, self.step_bytes, color=colors)
        bytes_axis.set_ylabel("bytes moved")
        bytes_axis.set_title(f"per step (step {index} highlighted, hatched)", fontsize=10)
        bytes_axis.patches[index].set_hatch("//")
        bytes_axis.axvline(index, color=PALETTE[1], linewidth=2, linestyle="--")
        bytes_axis.set_xticks([])
        bytes_axis.grid(axis="y", alpha=0.3)

        lower = self.figure.add_axes((left, 0.17, width, 0.3))
        lower.plot(steps, self.step_messages, marker="o", color=PALETTE[0], label="messages")
        lower.set_ylabel("messages")
        lower.set_ylim(0, max(self.step_messages) * 1.15 + 1)
        lower.set_xlabel("step")
        lower.axvline(index, color=PALETTE[1], linewidth=2, linestyle="--")
        lower.grid(alpha=0.3)
        if self.complete_fraction is not None:
            fraction_axis = lower.twinx()
            fraction_axis.plot(steps, self.complete_fraction, marker="s", color=PALETTE[5],
                               linestyle=":", label="cells complete")
            fraction_axis.set_ylim(-0.02, 1.02)
            fraction_axis.set_ylabel("fraction of cells complete")
            lower.legend(handles=lower.get_lines()[:1] + fraction_axis.get_lines(),
                         loc="upper left", fontsize=8)
        self.figure.text(0.64, 0.035, f"{replay.world_size} ranks: summary view "
                         "(cells are readable up to 16 ranks)", fontsize=9)


def completeness(holdings, final) -> np.ndarray:
    """[rank, cell] -> the share of the cell's final contributors it holds (1 = done)."""
    grid = np.ones((len(holdings), len(holdings[0]) if holdings else 0))
    for rank, cells in enumerate(holdings):
        for cell, holders in enumerate(cells):
            wanted = final[rank][cell]
            if wanted:
                grid[rank, cell] = len(holders & wanted) / len(wanted)
    return grid


# --------------------------------------------------------------------------- public


def draw_frame(replay, index: int = 0, figure: Figure | None = None) -> Figure:
    """One frame as a static figure: step ``index`` (0: before any message)."""
    painter = _Painter(replay, figure)
    if not 0 <= index < len(replay.frames):
        raise IndexError(f"frame {index} does not exist: this replay has steps 0 "
                         f"(before any message) to {replay.steps}")
    painter.draw(index)
    return painter.figure


def animate(replay, interval_ms: float = 1000.0) -> FuncAnimation:
    """The whole replay as a FuncAnimation, one frame per step (step 0 first).

    In a notebook the animation displays as the player of
    :mod:`viz.html_player` (matplotlib's own player loads its button icons
    from the network: offline they are blank).
    """
    painter = _Painter(replay)
    animation = FuncAnimation(painter.figure, painter.draw, frames=len(replay.frames),
                              interval=interval_ms, blit=False, repeat=True)
    animation._repr_html_ = lambda: to_html(replay, 1000.0 / interval_ms, standalone=False)
    return animation


def save_gif(replay, path, fps: float = 1.0, dpi: int = DPI) -> str:
    """Write the animation as a GIF (Pillow, no ffmpeg); returns the path."""
    animation = animate(replay, interval_ms=1000.0 / fps)
    path = os.fspath(path)
    with atomic_path(path) as name:  # a link at path is replaced, not written through
        animation.save(name, writer=PillowWriter(fps=fps), dpi=dpi)
    return path


def player_panel(replay, caption: str = "") -> dict:
    """One replay's frames as the data a panel of the browser's player draws
    (:mod:`viz.html_player`): each step's header, messages and time, and its
    picture as :meth:`_Painter.scene` (the summary view: as a PNG)."""
    painter = _Painter(replay)
    total = max(replay.measured_s, replay.predicted_s or 0.0,
                replay.frames[-1].elapsed_ns / 1e9, 1e-12)
    steps = []
    for frame in replay.frames:
        entry = {
            "header": [line for line in header_lines(replay, frame) if line],
            "messages": [[message.source, message.target,
                          message_line(message) + (f"   {message.text}" if message.text else "")]
                         for message in frame.messages],
            "elapsed": frame.elapsed_ns / 1e9 / total,
            "elapsed_text": format_seconds(frame.elapsed_ns / 1e9),
        }
        if painter.summary:
            entry["image"] = _png(painter, frame.index)
        else:
            entry["scene"] = painter.scene(frame.index)
        steps.append(entry)
    return {
        "caption": caption,
        "world": replay.world_size,
        "follow": not painter.summary,
        "palette": list(PALETTE),
        "legend": [] if painter.summary else legend_entries(replay),
        "measured": replay.measured_s / total,
        "predicted": None if replay.predicted_s is None else replay.predicted_s / total,
        "steps": steps,
    }


def _png(painter, index: int) -> str:
    painter.draw(index)
    buffer = io.BytesIO()
    painter.figure.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def title_of(replay) -> str:
    return (f"{replay.collective} · {replay.algorithm} · {replay.world_size} ranks "
            f"(call {replay.call})")


def to_html(replay, fps: float = 1.0, *, standalone: bool = True) -> str:
    """The replay as a page that needs no network (:mod:`viz.html_player`):
    step 0 (before any message) to the end, a rank to follow, keys."""
    from viz.html_player import player_html

    return player_html(title_of(replay), [player_panel(replay)], fps=fps,
                       standalone=standalone)


def save_html(replay, path, fps: float = 1.0) -> str:
    """Write the HTML player to a file that opens in any browser; returns the path."""
    path = os.fspath(path)
    page = to_html(replay, fps)
    with atomic_write(path) as file:
        file.write(page)
    return path
