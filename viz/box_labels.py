"""Labels inside the boxes of a chart (a Gantt row, a timeline lane), kept
only where they can be read: a label wider than its box, or one that would
cover a label already kept, is hidden (the box's colour and the legend still
say what it is; the step-through and ``--chrome`` name every box).

Matplotlib knows a text's width only once it is laid out, so this runs after
the axis's limits are set, measuring in display pixels on the figure's own
renderer."""

from __future__ import annotations

#: Pixels a label keeps clear of its box's edges, so neighbours never touch.
PADDING_PX = 2.0


def fit_box_labels(axis, labels) -> int:
    """``labels``: (text, left, right) with the box's edges in data
    coordinates, most important first. Hides every text that does not fit
    inside its box or overlaps a text kept before it; returns how many were
    hidden. Without a renderer (a canvas that cannot lay out text), keeps all."""
    get_renderer = getattr(axis.figure.canvas, "get_renderer", None)
    if get_renderer is None:
        return 0
    renderer = get_renderer()
    kept, hidden = [], 0
    for text, left, right in labels:
        box = text.get_window_extent(renderer)
        x0, x1 = sorted(axis.transData.transform([(left, 0), (right, 0)])[:, 0])
        fits = box.width + 2 * PADDING_PX <= x1 - x0
        if not fits or any(box.overlaps(other) for other in kept):
            text.set_visible(False)
            hidden += 1
        else:
            kept.append(box)
    return hidden


__all__ = ["fit_box_labels"]
