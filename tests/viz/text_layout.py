"""Text that a reader cannot read: two labels on top of each other, or one
cut by the figure's edge.

:func:`text_problems` draws a matplotlib figure on its own canvas, records
every text matplotlib actually renders (titles, axis labels, tick labels,
legend entries, annotations, labels inside bars; empty and invisible ones are
never rendered), and compares their boxes in display pixels. A text clipped
to its axes (``clip_on``) counts only inside its clip box, as drawn. Two
boxes that share less than :data:`TOLERANCE_PX` pixels either way touch and
do not overlap.

    from tests.viz.text_layout import text_problems
    assert text_problems(figure) == []
"""

from __future__ import annotations

from contextlib import contextmanager

from matplotlib.text import Text
from matplotlib.transforms import Bbox

#: Pixels two boxes may share, or a box may reach past the edge, before it counts.
TOLERANCE_PX = 1.0


@contextmanager
def _recording(drawn: list):
    """Record (text, box) for every Text drawn while inside."""
    original = Text.draw

    def draw(self, renderer):
        original(self, renderer)
        if not self.get_visible() or not self.get_text().strip():
            return
        box = self.get_window_extent(renderer)
        if self.get_clip_on() and self.get_clip_box() is not None:
            box = Bbox.intersection(box, self.get_clip_box())
            if box is None:
                return  # clipped away entirely: nothing shows
        drawn.append((self, box))

    Text.draw = draw
    try:
        yield drawn
    finally:
        Text.draw = original


def _shrunk(box: Bbox) -> Bbox:
    return Bbox.from_extents(box.x0 + TOLERANCE_PX, box.y0 + TOLERANCE_PX,
                             box.x1 - TOLERANCE_PX, box.y1 - TOLERANCE_PX)


def _name(text: Text) -> str:
    words = " ".join(text.get_text().split())
    return repr(words if len(words) <= 40 else words[:37] + "...")


def text_problems(figure) -> list[str]:
    """Every pair of rendered texts that overlap and every text that leaves
    the figure, as readable lines (empty: the figure's text is all clear)."""
    if figure.canvas is None or not hasattr(figure.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(figure)
    with _recording([]) as drawn:
        figure.canvas.draw()
    found = []
    edge = figure.bbox
    for text, box in drawn:
        if (box.x0 < edge.x0 - TOLERANCE_PX or box.y0 < edge.y0 - TOLERANCE_PX
                or box.x1 > edge.x1 + TOLERANCE_PX or box.y1 > edge.y1 + TOLERANCE_PX):
            found.append(f"{_name(text)} leaves the figure ({box.x0:.0f}..{box.x1:.0f} x "
                         f"{box.y0:.0f}..{box.y1:.0f} px in {edge.width:.0f} x "
                         f"{edge.height:.0f})")
    for index, (text, box) in enumerate(drawn):
        inner = _shrunk(box)
        for other, other_box in drawn[:index]:
            if other is text:
                continue
            if inner.overlaps(_shrunk(other_box)):
                found.append(f"{_name(text)} overlaps {_name(other)}")
    return found
