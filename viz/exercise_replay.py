"""The student's run next to the reference's, step by step, with the first
step where they differ marked.

The frame model is pure Python (tested without pixels): two
:class:`~viz.replay.Replay` of the same call (same world size, elements,
root), frame i of one beside frame i of the other, and for each pair
whether the step's messages differ (who sends to whom, how many bytes,
copy or combine). The renderers are thin: the Rich step-through of
:mod:`viz.terminal` with the two frames side by side, and a matplotlib
animation whose two halves are the usual replay drawing (GIF, HTML).

    model = side_by_side(student_events, reference_events, first_step=2)
    model.marked                   # index of the frame of the first difference
    save_side_by_side_gif(model, "ring_allreduce.replay.gif")
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

from minidist.atomic_file import atomic_path
from minidist.trace import label_info
from viz.replay import Frame, Replay, replays

MARK = ">>> FIRST DIFFERENCE <<<"

#: Characters of the checker's sentence per line of the GIF's banner (two
#: lines at most; 11-point text across two 11-inch halves).
BANNER_WIDTH = 190


@dataclass(frozen=True)
class Pair:
    """One step: the student's frame and the reference's (None past the end of one)."""

    index: int
    student: Frame | None
    reference: Frame | None
    differs: bool


@dataclass(frozen=True)
class SideBySide:
    student: Replay
    reference: Replay
    pairs: tuple[Pair, ...]
    #: the index of the pair marked as the first difference (None: none found)
    marked: int | None
    #: the checker's words for it ("rank 0, step 2: you send ...")
    difference: str = ""

    @property
    def frames(self) -> int:
        """Pairs to show: step 0 (before any message) to :attr:`steps`."""
        return len(self.pairs)

    @property
    def steps(self) -> int:
        """The longer run's steps (pair k is step k; pair 0 before any message)."""
        return len(self.pairs) - 1


def _signature(frame: Frame | None):
    if frame is None:
        return None
    return sorted((m.source, m.target, m.nbytes, m.op) for m in frame.messages)


def side_by_side(student_events, reference_events, first_step: int | None = None,
                 difference: str = "") -> SideBySide:
    """The model of two runs of one collective call (lists of trace event dicts).

    ``first_step``: the student's step the checker found first to differ (by
    the values sent too, which the trace does not hold), counted as every
    replay counts: step k is the state after the k-th exchange, pair k (the
    trace's :attr:`Frame.step` is k - 1). The pair marked is the first at or
    after that step. Without it, or if no frame has that step, the first
    pair whose messages differ is marked."""
    student, reference = _only_call(student_events, "student"), \
        _only_call(reference_events, "reference")
    count = max(len(student.frames), len(reference.frames))
    pairs = []
    for index in range(count):
        mine = student.frames[index] if index < len(student.frames) else None
        theirs = reference.frames[index] if index < len(reference.frames) else None
        pairs.append(Pair(index, mine, theirs, _signature(mine) != _signature(theirs)))
    marked = None
    if first_step is not None:
        # Step k: after the k-th exchange; a frame's ``step`` is the trace's, k - 1.
        marked = next((pair.index for pair in pairs
                       if (pair.student.step + 1 if pair.student else pair.index) >= first_step),
                      None)
    if marked is None:
        marked = next((pair.index for pair in pairs if pair.differs), None)
    return SideBySide(student, reference, tuple(pairs), marked, difference)


def _only_call(events, who: str) -> Replay:
    events = list(events)
    found = replays(events)
    if not found and any("ring_attention" in label_info(event.get("label") or "")
                         for event in events):
        # ring attention's messages are its own (isend / irecv), not a collective call
        from viz.ring_attention_replay import ring_attention_replay

        return ring_attention_replay(events)
    if not found:
        raise ValueError(f"the {who}'s run recorded no finished collective call to replay")
    return found[0]


def _step_words(model: SideBySide, index: int) -> str:
    """"step k of K" as every replay counts (step 0: before any message)."""
    words = f"step {index} of {model.steps}"
    return words + " (before any message)" if index == 0 else words


# --------------------------------------------------------------------------- terminal


def render_pair(model: SideBySide, index: int, *, color: bool = True, width: int = 160):
    """Pair ``index`` as a Rich renderable: the student's frame left, the
    reference's right, and the mark above when this is the first difference."""
    from viz.terminal import render_frame

    pair = model.pairs[index]
    half = max(width // 2 - 2, 40)
    table = Table(show_header=True, expand=True, box=None, padding=(0, 1))
    table.add_column("your algorithm", ratio=1)
    table.add_column("the reference", ratio=1)

    def one(replay, frame):
        if frame is None:
            return Text("(no more steps)")
        return render_frame(replay, frame.index, color=color, width=half)

    table.add_row(one(model.student, pair.student), one(model.reference, pair.reference))
    head = Text(_step_words(model, index))
    if index == model.marked:
        head.append(f"   {MARK}", style="bold red" if color else "")
        if model.difference:
            head.append(f"\n{model.difference}")
    elif pair.differs:
        head.append("   (messages differ)")
    return Group(head, table)


def step_through_side_by_side(model: SideBySide, console=None, keys=None, *,
                              color: bool = True) -> list[int]:
    """The keyboard step-through of :mod:`viz.terminal`, on the pairs."""
    from rich.console import Console

    from viz.terminal import step_through_frames

    console = console or Console()
    width = min(console.width, 200)
    return step_through_frames(lambda index: render_pair(model, index, color=color,
                                                         width=width),
                               model.frames, console, keys, color=color)


# --------------------------------------------------------------------------- matplotlib


class _SideBySidePainter:
    """Each half drawn by the replay's own painter on its own figure, then the
    two images set side by side under a banner (one image per pair)."""

    def __init__(self, model: SideBySide, dpi: int | None = None):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        from viz.animate import DPI, FIGURE_SIZE, _Painter

        self.model = model
        dpi = dpi or DPI
        width, height = FIGURE_SIZE
        self.left = _Painter(model.student, Figure(figsize=(width, height), dpi=dpi))
        self.right = _Painter(model.reference, Figure(figsize=(width, height), dpi=dpi))
        self.banner = Figure(figsize=(2 * width, 0.9), dpi=dpi)
        for figure in (self.left.figure, self.right.figure, self.banner):
            FigureCanvasAgg(figure)

    @staticmethod
    def _pixels(figure):
        import numpy as np

        figure.canvas.draw()
        return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()

    def image(self, index: int):
        """Pair ``index`` as an RGB array."""
        import numpy as np

        pair = self.model.pairs[index]
        halves = []
        for painter, frame in ((self.left, pair.student), (self.right, pair.reference)):
            if frame is not None:
                painter.draw(frame.index)
            else:
                painter.figure.clear()
                painter.figure.text(0.5, 0.5, "(no more steps)", ha="center", fontsize=14)
            halves.append(self._pixels(painter.figure))
        self.banner.clear()
        words = f"{_step_words(self.model, index)} · left: your algorithm · right: the reference"
        marked = index == self.model.marked
        if marked:
            # Not by colour alone: the words say it and the box is hatched.
            words += f"   {MARK}\n" + "\n".join(textwrap.wrap(self.model.difference,
                                                              BANNER_WIDTH)[:2])
        self.banner.text(0.01, 0.5, words, fontsize=11, va="center",
                         weight="bold" if marked else "normal",
                         bbox=dict(facecolor="#FF800E", hatch="//", alpha=0.5)
                         if marked else None)
        body = np.concatenate(halves, axis=1)
        banner = self._pixels(self.banner)[:, :body.shape[1]]
        if banner.shape[1] < body.shape[1]:
            banner = np.pad(banner, ((0, 0), (0, body.shape[1] - banner.shape[1]), (0, 0)),
                            constant_values=255)
        return np.concatenate([banner, body], axis=0)


def draw_pair(model: SideBySide, index: int):
    """Pair ``index`` as an RGB array (what one GIF frame shows)."""
    return _SideBySidePainter(model).image(index)


#: The replay's resolution: the drawing's smallest words (the legend, the
#: model line, 8 points) are 9 pixels high at 80 dots per inch; at 50 they
#: were 5 and could not be read.
REPLAY_DPI = 80


def _images(model: SideBySide, dpi: int) -> list:
    """Every pair as a Pillow image, drawn once for both files."""
    from PIL import Image

    painter = _SideBySidePainter(model, dpi)
    return [Image.fromarray(painter.image(index)) for index in range(model.frames)]


def save_side_by_side_gif(model: SideBySide, path, fps: float = 1.0, dpi: int = REPLAY_DPI,
                          images=None) -> str:
    """Every pair as one GIF frame (Pillow; no ffmpeg)."""
    images = images or _images(model, dpi)
    path = os.fspath(path)
    with atomic_path(path) as name:
        images[0].save(name, save_all=True, append_images=images[1:],
                       duration=int(1000 / fps), loop=0)
    return path


def save_side_by_side(model: SideBySide, gif_path, html_path, fps: float = 1.0,
                      dpi: int = REPLAY_DPI) -> tuple[str, str]:
    """The GIF and the page of one model."""
    return (save_side_by_side_gif(model, gif_path, fps, dpi),
            save_side_by_side_html(model, html_path, fps))


def save_side_by_side_html(model: SideBySide, path, fps: float = 1.0) -> str:
    """A page that opens in any browser, with no network: the two runs side by
    side, stepping together in the player of :mod:`viz.html_player` (buttons,
    slider, keys, a rank to follow), opened at the first difference, which
    is marked."""
    from viz.animate import player_panel
    from viz.html_player import save_player

    notes = {pair.index: "(the messages differ)" for pair in model.pairs if pair.differs}
    if model.marked is not None:
        notes[model.marked] = f"{MARK} {model.difference}".strip()
    marked = "" if model.marked is None else \
        f"The first difference is at step {model.marked}. "
    return save_player(
        path, f"{model.student.collective}: your algorithm and the reference",
        [player_panel(model.student, "your algorithm"),
         player_panel(model.reference, "the reference")],
        notes=notes, start=model.marked or 0, fps=fps,
        intro=marked + model.difference)
