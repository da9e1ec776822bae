"""Step through a collective call in the terminal, one algorithm step at a time.

    from viz.replay import replay
    from viz.terminal import step_through
    step_through(replay("ring.jsonl"))     # n / space: next, b: back, g / G: start / end, q: quit

Each frame shows

* a header: the collective, the algorithm, "step k of K" and the phase
  (step 0 is the state before any message, as in every picture: see
  :mod:`viz.replay`);
* the ranks laid out as the algorithm sees them (a ring for ring
  algorithms, a tree for trees, a list otherwise), each rank's buffer drawn
  as its cells. A cell shows the symbols of every picture of a replay
  (:func:`viz.replay.cell_symbol`: "2" rank 2's data alone, "Σ3" a partial
  result of three ranks, "A" all of them, "·" nothing yet) and its colour is
  the first of those ranks (:func:`first_rank`), so colour is never the only
  signal and ``color=False`` loses nothing. A rank is "rank r", as in the
  GIF and the browser's player, and the legend under the frame names every
  symbol the replay draws, in their words;
* the step's messages as arrows with their byte counts ("0 -> 1  256 B
  combine"), the cost formula, and the time the cost model predicts for the
  whole call against the time measured up to the end of this step.

Above :data:`viz.replay.SUMMARY_ABOVE` ranks a frame is a summary instead:
a table of the steps around the current one (messages, bytes, how much of
every buffer already holds its final data).

Rich only renders; the keys are read here, one at a time, from the terminal
put in cbreak mode (:mod:`termios` / :mod:`tty`). Without a terminal every
frame is printed, one after another.
"""

from __future__ import annotations

import os
import re
import select
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from minidist.alpha_beta import EXCHANGE_BETA_LEGEND, SLOTS_ALPHA_LEGEND
from minidist.units import format_bytes
from viz.replay import (
    Frame,
    Replay,
    alone_ranks,
    cell_kinds,
    cell_symbol,
    cell_words,
    model_gap,
    rank_words,
    step_words,
)

#: matplotlib's "tableau-colorblind10": told apart with every common colour blindness.
PALETTE = ("#006BA4", "#FF800E", "#ABABAB", "#595959", "#5F9ED1",
           "#C85200", "#898989", "#A2C8EC", "#FFBC79", "#CFCFCF")
#: Colours on which black text is easier to read than white.
# The palette colours dark text reads best on (shared by every terminal renderer).
LIGHT_COLOURS = {"#ABABAB", "#A2C8EC", "#FFBC79", "#CFCFCF", "#FF800E", "#5F9ED1", "#898989"}
COMPLETE_STYLE = "bold black on white"
KEYS_HELP = "n/space: next   b: back   g: start   G: end   q: quit"
#: Messages listed under a frame; the rest are counted.
MESSAGES_SHOWN = 12


# --------------------------------------------------------------------------- one cell, one rank


def cell_char(holding: frozenset, world_size: int) -> str:
    """"·" nothing, "A" every rank, "2" rank 2's data alone, "Σ3" three ranks'
    (:func:`viz.replay.cell_symbol`)."""
    return cell_symbol(holding, world_size)


def cell_width(replay: Replay) -> int:
    """Characters a cell takes: its replay's longest symbol ("Σ3": 2)."""
    return max((len(cell_symbol(holding, replay.world_size))
                for frame in replay.frames if frame.holdings is not None
                for row in frame.holdings for holding in row), default=1)


def _cell_gap(replay: Replay) -> str:
    # Ranks from 10 on are two digits: "1011" would read as one number.
    return " " if replay.world_size > 10 else ""


def rank_colour(rank: int) -> str:
    return PALETTE[rank % len(PALETTE)]


def _cell_style(holding: frozenset, world_size: int, color: bool) -> str:
    if not color:
        return ""
    if not holding:
        return "dim"
    if len(holding) == world_size:
        return COMPLETE_STYLE
    colour = rank_colour(first_rank(holding, world_size))
    return f"{'black' if colour in LIGHT_COLOURS else 'white'} on {colour}"


def first_rank(holding: frozenset, world_size: int) -> int:
    """The rank a cell's colour comes from: where its run of consecutive ranks
    starts, counting round the ring ({6, 7, 0} -> 6). A ring's partial sum
    thus keeps the colour of the rank it started from as it travels."""
    starts = [rank for rank in holding if (rank - 1) % world_size not in holding]
    return min(starts) if starts else min(holding)


def buffer_text(replay: Replay, frame: Frame | None, rank: int, *, color: bool = True) -> Text:
    """Rank ``rank``'s buffer as its cells: "rank 3 │Σ2 A 3 3│" (the cells of
    the frame's holdings; of the initial holdings when ``frame`` is None)."""
    digits = len(str(replay.world_size - 1))
    text = Text(f"rank {rank:>{digits}} ", style="bold" if color else "")
    holdings = frame.holdings if frame is not None else replay.initial
    text.append("│")
    if holdings is None:
        text.append("?" * min(replay.cells, 8), style="dim" if color else "")
    else:
        width, gap = cell_width(replay), _cell_gap(replay)
        for cell, holding in enumerate(holdings[rank]):
            if cell and gap:
                text.append(gap)
            text.append(f"{cell_char(holding, replay.world_size):>{width}}",
                        style=_cell_style(holding, replay.world_size, color))
    text.append("│")
    return text


# --------------------------------------------------------------------------- words


#: Joins words :func:`fold` keeps on one line.
NO_BREAK = "\u00a0"


def fold(text: str, width: int, indent: int = 2) -> str:
    """``text`` in lines of at most ``width`` columns, broken at spaces only, so
    that a name or a number is never cut in two; the lines after the first are
    ``indent`` spaces further in than the first (a word longer than a line
    keeps a line of its own, whole). A number keeps its unit ("84.7 KiB"), and
    a no-break space (\\u00a0) joins other words that stay on one line
    ("rank 0 1,024"); it is printed as a space."""
    text = re.sub(r"(\d) (B|KiB|MiB|GiB|TiB|ns|us|µs|ms|s)\b", rf"\1{NO_BREAK}\2", text)
    lead = " " * (len(text) - len(text.lstrip(" ")) + indent)
    lines = textwrap.wrap(text, width, subsequent_indent=lead, break_long_words=False,
                          break_on_hyphens=False)
    return ("\n".join(lines) or text).replace(NO_BREAK, " ")


def print_folded(console: Console, text: str, indent: int = 2) -> None:
    """Print plain ``text`` (no markup) folded to the console's width."""
    console.print(fold(text, console.width, indent), markup=False, highlight=False,
                  soft_wrap=True)


def print_commands(console: Console, *commands: str) -> None:
    """Commands to type, one a line, two spaces in, each whole even where it
    is wider than the terminal: a command folded in two cannot be pasted."""
    for command in commands:
        console.print(f"  {command}", markup=False, highlight=False, soft_wrap=True)


def format_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _header(replay: Replay, frame: Frame, color: bool) -> Text:
    text = Text()
    text.append(f"{replay.collective} · {replay.algorithm}", style="bold" if color else "")
    root = f" · root {replay.root}" if replay.root is not None else ""
    text.append(f" · {replay.world_size} ranks · {format_bytes(replay.nbytes)}{root}\n")
    text.append(step_words(replay, frame), style="bold reverse" if color else "")
    if frame.phase:
        text.append(f" · {frame.phase}", style="bold" if color else "")
    return text


def _message_lines(replay: Replay, frame: Frame, color: bool) -> Text:
    text = Text()
    if frame.index == 0:
        text.append("(nothing sent yet: each rank holds its own data)",
                    style="dim" if color else "")
        return text
    if not frame.messages:
        text.append("(no messages in this step)", style="dim" if color else "")
        return text
    for message in frame.messages[:MESSAGES_SHOWN]:
        text.append(f"{message.source:>3} -> {message.target:<3}",
                    style=f"bold {rank_colour(message.source)}" if color else "")
        text.append(f" {format_bytes(message.nbytes):>9}  {message.op or '':<7}  ")
        text.append(message.text, style="dim" if color else "")
        text.append("\n")
    hidden = frame.messages[MESSAGES_SHOWN:]
    if hidden:
        text.append(f"... and {len(hidden)} more messages "
                    f"({format_bytes(sum(message.nbytes for message in hidden))})\n")
    text.rstrip()
    return text


def _costs(replay: Replay, frame: Frame, color: bool) -> Text:
    text = Text()
    if replay.formula:
        text.append("cost  ", style="bold" if color else "")
        text.append(f"{replay.formula}\n")
        for symbol, legend in (("βₓ", EXCHANGE_BETA_LEGEND), ("αₛ", SLOTS_ALPHA_LEGEND)):
            if symbol in replay.formula:
                text.append(f"      {legend}\n", style="dim" if color else "")
    clock = " (simulated)" if replay.transport == "sim" else ""
    text.append(f"time  measured {format_seconds(frame.elapsed_ns / 1e9)} so far of "
                f"{format_seconds(replay.measured_s)}{clock}")
    if replay.predicted_s is not None:
        text.append(f"\n      whole call measured {format_seconds(replay.measured_s)} vs model "
                    f"{format_seconds(replay.predicted_s)} ({model_gap(replay)})")
    return text


def legend(replay: Replay, *, color: bool = True) -> Text:
    """What the cells' symbols and colours mean: each symbol the replay draws
    in some frame, in the words of the GIF's legend (:func:`viz.replay.cell_words`)."""
    text = Text("cells: ")
    kinds = cell_kinds(replay)
    if not kinds:
        text.append("not tracked for this collective (messages only)")
        return text
    words, n = cell_words(replay), replay.world_size
    parts = []
    for kind in kinds:
        symbol, meaning = words[kind]
        if kind == "one":
            ranks = alone_ranks(replay)
            if len(ranks) == 1:
                parts.append((str(ranks[0]), frozenset({0}), rank_words(replay, ranks[0])))
                continue
            consecutive = ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2
            numbers = f"{ranks[0]}..{ranks[-1]}" if consecutive else " ".join(map(str, ranks))
            parts.append((numbers, frozenset({0}),
                          rank_words(replay, 0).replace("rank 0", "that rank")))
        else:
            example = {"partial": frozenset({0, 1}), "complete": frozenset(range(n)),
                       "empty": frozenset()}[kind]
            parts.append((symbol, example, meaning))
    for index, (symbol, example, meaning) in enumerate(parts):
        if index:
            text.append("   ")
        text.append(symbol, style=("bold" if color else "") if example == {0}
                    else _cell_style(example, n, color))
        text.append(f": {meaning}")
    if color:
        text.append("\n       colour: the cell's lowest rank ")
        for rank in range(min(n, len(PALETTE))):
            text.append(str(rank), style=_cell_style(frozenset({rank}), n + 1, True))
        text.append("; a message: its sender's")
    return text


# --------------------------------------------------------------------------- layouts


def _ring(replay: Replay, frame: Frame, color: bool, width: int) -> Group | None:
    """The ranks round a ring: 0 -> 1 -> ... along the top, back along the
    bottom. None when that is wider than ``width`` (then the list is drawn)."""
    n = replay.world_size
    top = list(range((n + 1) // 2))
    bottom = list(range(n - 1, len(top) - 1, -1))
    boxes = {rank: buffer_text(replay, frame, rank, color=color) for rank in range(n)}
    box_width = max(len(box) for box in boxes.values())
    if len(top) * (box_width + 4) + 2 > width:
        return None
    talking = {(message.source, message.target) for message in frame.messages}

    def arrow(source: int, target: int, glyph: str) -> Text:
        active = (source, target) in talking
        style = (f"bold {rank_colour(source)}" if active else "dim") if color else ""
        return Text(glyph if active else glyph.replace(">", "-").replace("<", "-"), style=style)

    def row(ranks: list[int], glyph: str, forwards: bool) -> Text:
        line = Text("  ")
        for position, rank in enumerate(ranks):
            line.append_text(boxes[rank].copy())
            line.append(" " * (box_width - len(boxes[rank])))
            if position + 1 < len(ranks):
                following = ranks[position + 1]
                line.append_text(arrow(rank, following, glyph) if forwards
                                 else arrow(following, rank, glyph))
        return line

    top_line = row(top, " -> ", True)
    bottom_line = row(bottom, " <- ", False)
    if n % 2:
        bottom_line = Text(" " * (box_width + 4)).append_text(bottom_line) if len(bottom) else \
            bottom_line
    # The two ends close the ring: down on the right, up on the left.
    down = arrow(top[-1], bottom[0] if bottom else top[0], "v")
    up = arrow(bottom[-1] if bottom else top[-1], top[0], "^")
    right_edge = len(top_line) - box_width // 2 - 1
    middle = Text("  ").append_text(
        Text(" " * (box_width // 2 - 1))).append_text(up)
    middle.append(" " * max(1, right_edge - len(middle)))
    middle.append_text(down)
    return Group(top_line, middle, bottom_line)


def _tree_parents(replay: Replay) -> list[int]:
    """The parent of every rank in the tree the algorithm works on (-1: root)."""
    n = replay.world_size
    root = replay.root or 0
    if replay.algorithm in ("linear", "coordinator"):
        return [-1 if rank == root else root for rank in range(n)]
    if replay.algorithm == "double_binary_tree":
        from minidist.distributed.collectives.all_reduce import double_binary_trees

        return double_binary_trees(n)[0][0]
    # Binomial: a virtual rank's parent clears its lowest set bit.
    parents = []
    for rank in range(n):
        virtual = (rank - root) % n
        parents.append(-1 if virtual == 0 else ((virtual & (virtual - 1)) + root) % n)
    return parents


def _tree(replay: Replay, frame: Frame, color: bool) -> Tree:
    parents = _tree_parents(replay)
    arrivals = {}
    for message in frame.messages:
        arrivals.setdefault(message.target, []).append(message)

    def label(rank: int) -> Text:
        text = buffer_text(replay, frame, rank, color=color)
        for message in arrivals.get(rank, ()):
            text.append(f"  <- {message.source} {format_bytes(message.nbytes)} {message.op}",
                        style=f"bold {rank_colour(message.source)}" if color else "")
        return text

    roots = [rank for rank, parent in enumerate(parents) if parent < 0]
    tree = Tree(label(roots[0]), guide_style="dim" if color else "")
    nodes = {roots[0]: tree}
    # Children in rank order under their parent, parents first.
    pending = [rank for rank in range(replay.world_size) if parents[rank] >= 0]
    while pending:
        waiting = []
        for rank in pending:
            if parents[rank] in nodes:
                nodes[rank] = nodes[parents[rank]].add(label(rank))
            else:
                waiting.append(rank)
        if len(waiting) == len(pending):
            break  # not a tree after all; the message list still says everything
        pending = waiting
    return tree


def _row(replay: Replay, frame: Frame, color: bool) -> Text:
    text = Text()
    sends: dict[int, list] = {}
    for message in frame.messages:
        sends.setdefault(message.source, []).append(message)
    for rank in range(replay.world_size):
        text.append("  ")
        text.append_text(buffer_text(replay, frame, rank, color=color))
        outgoing = sends.get(rank, ())
        if outgoing:
            targets = ", ".join(str(message.target) for message in outgoing[:6])
            more = "..." if len(outgoing) > 6 else ""
            text.append(f"  -> {targets}{more}",
                        style=f"bold {rank_colour(rank)}" if color else "")
        text.append("\n")
    text.rstrip()
    return text


# --------------------------------------------------------------------------- frames


def _summary(replay: Replay, frame: Frame, color: bool, rows: int = 12) -> Table:
    """The steps around ``frame`` as a table (big worlds)."""
    table = Table(box=None, pad_edge=False, header_style="bold" if color else "")
    for name, justify in (("step", "right"), ("phase", "left"), ("messages", "right"),
                          ("bytes", "right"), ("complete", "left")):
        table.add_column(name, justify=justify)
    first = max(0, min(frame.index - rows // 2, len(replay.frames) - rows))
    for shown in replay.frames[first:first + rows]:
        if shown.complete is None:
            progress = "-"
        else:
            filled = round(shown.complete * 20)
            progress = f"{'#' * filled}{'.' * (20 - filled)} {shown.complete:4.0%}"
        current = shown.index == frame.index
        table.add_row(f"{'>' if current else ' '}{shown.index}", shown.phase,
                      str(len(shown.messages)), format_bytes(shown.nbytes), progress,
                      style=("bold reverse" if current else "") if color else "")
    return table


def render_frame(replay: Replay, index: int, *, color: bool = True, width: int | None = None):
    """Frame ``index`` of ``replay`` as a Rich renderable (print it with a
    Console). ``width``: the columns it may use (default 80)."""
    if not replay.steps:
        return Text(f"{replay.collective} {replay.algorithm}: no steps (nothing was sent)")
    if not 0 <= index < len(replay.frames):
        raise IndexError(f"frame {index} out of range: the replay has steps "
                         f"0 (before any message) to {replay.steps}")
    width = width or 80
    frame = replay.frames[index]
    parts = [_header(replay, frame, color), Text()]
    if replay.summary:
        parts.append(Text(f"{replay.world_size} ranks: the summary view "
                          f"(complete = cells that already hold their final data)"))
        parts.append(_summary(replay, frame, color))
    else:
        drawn = None
        if replay.layout == "ring":
            drawn = _ring(replay, frame, color, width)
        elif replay.layout == "tree" and replay.initial is not None:
            drawn = _tree(replay, frame, color)
        parts.append(drawn if drawn is not None else _row(replay, frame, color))
        parts.append(Text())
        parts.append(_message_lines(replay, frame, color))
        parts.append(legend(replay, color=color))
    parts.append(Text())
    parts.append(_costs(replay, frame, color))
    return Group(*parts)


# --------------------------------------------------------------------------- keys


_MOVES = {"n": "next", " ": "next", "\r": "next", "\n": "next", "l": "next", "j": "next",
          "\x1b[C": "next", "\x1b[B": "next",
          "b": "back", "p": "back", "h": "back", "k": "back", "\x7f": "back",
          "\x1b[D": "back", "\x1b[A": "back",
          "g": "start", "\x1b[H": "start", "G": "end", "\x1b[F": "end",
          "q": "quit", "Q": "quit", "\x1b": "quit", "\x03": "quit", "\x04": "quit"}


def move(index: int, key: str, frames: int) -> int | None:
    """The frame after pressing ``key`` at ``index`` (None: quit; unknown keys stay)."""
    action = _MOVES.get(key)
    if action == "quit":
        return None
    if action == "next":
        return min(index + 1, frames - 1)
    if action == "back":
        return max(index - 1, 0)
    if action == "start":
        return 0
    if action == "end":
        return frames - 1
    return index


def terminal_keys(stream=None) -> Iterator[str]:
    """Single key presses from the terminal, without waiting for Enter.

    The terminal is put in cbreak mode (keys arrive one by one, Ctrl-C still
    works) and restored however the loop ends. An arrow key arrives as three
    bytes (ESC [ C); the bytes that follow an ESC at once are read with it.
    """
    import termios
    import tty

    stream = stream or sys.stdin
    descriptor = stream.fileno()
    saved = termios.tcgetattr(descriptor)
    try:
        tty.setcbreak(descriptor)
        while True:
            key = os.read(descriptor, 1).decode(errors="replace")
            if key == "\x1b" and select.select([descriptor], [], [], 0.05)[0]:
                key += os.read(descriptor, 8).decode(errors="replace")
            if not key:
                return
            yield key
    finally:
        termios.tcsetattr(descriptor, termios.TCSADRAIN, saved)


def _interactive(console: Console) -> bool:
    return console.is_terminal and sys.stdin.isatty()


def step_through(replay: Replay, console: Console | None = None,
                 keys: Iterable[str] | None = None, *, color: bool = True) -> list[int]:
    """Show one frame at a time and move with the keys (see :data:`KEYS_HELP`).

    ``keys``: the key presses to act on (tests pass a list); by default they
    are read from the terminal. Without a terminal and without ``keys``,
    every frame is printed in order. Returns the frame indices shown, in order.
    """
    console = console or Console()
    width = min(console.width, 120)
    return step_through_frames(
        lambda index: render_frame(replay, index, color=color, width=width),
        len(replay.frames), console, keys, color=color)


def step_through_frames(render, frames: int, console: Console | None = None,
                        keys: Iterable[str] | None = None, *, color: bool = True) -> list[int]:
    """The step-through of any sequence of ``frames`` frames: ``render(index)``
    gives frame ``index`` as a Rich renderable (the collective replay above and
    the pipeline chart of :mod:`viz.pipeline_chart` both use it). Keys, the
    printing without a terminal and the result are those of :func:`step_through`.
    """
    console = console or Console()
    if keys is None and not _interactive(console):
        for index in range(frames):
            console.print(render(index))
            console.rule(style="dim" if color else "")
        return list(range(frames))
    shown = []
    index = 0
    presses = iter(terminal_keys() if keys is None else keys)
    while frames:
        if keys is None:
            console.clear()
        console.print(render(index))
        console.print(Text(KEYS_HELP, style="dim" if color else ""))
        shown.append(index)
        while True:
            key = next(presses, "q")
            following = move(index, key, frames)
            if following != index:
                break
        if following is None:
            break
        index = following
    return shown


def play(replay: Replay, console: Console | None = None, speed: float = 2.0, *,
         color: bool = True, sleep=time.sleep) -> None:
    """Show every frame in turn without input, ``speed`` frames a second,
    redrawn in place (rich.live)."""
    console = console or Console()
    width = min(console.width, 120)
    play_frames(lambda index: render_frame(replay, index, color=color, width=width),
                len(replay.frames), console, speed, sleep=sleep)


def play_frames(render, frames: int, console: Console | None = None, speed: float = 2.0, *,
                sleep=time.sleep) -> None:
    """:func:`play` for any sequence of frames (``render(index)`` as in
    :func:`step_through_frames`); with no frames, ``render(0)`` is printed once."""
    if speed <= 0:
        raise ValueError(f"speed must be a positive number of frames per second, got {speed}")
    console = console or Console()
    if not frames:
        console.print(render(0))
        return
    with Live(render(0), console=console, auto_refresh=False, transient=False) as live:
        for index in range(frames):
            live.update(render(index), refresh=True)
            sleep(1.0 / speed)
    if not console.is_terminal:
        # Rich ends the last frame's last line only on a terminal: without
        # this, what is printed next would run on from it.
        console.line()
