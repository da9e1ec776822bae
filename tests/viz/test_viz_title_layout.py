"""No rank's title is crossed by an arrow or hidden under a message's label,
and no message's label covers another's.

Measured on rendered Agg figures, in display coordinates: each title's text
extent, each arrow's path (matplotlib's own, transformed) and each label's
box. Every frame of simulated runs of the layouts the animation draws
(ring, tree, row), on several world sizes."""

import numpy as np
import pytest
from matplotlib.patches import FancyArrowPatch
from matplotlib.path import Path

from minidist.distributed import simulate
from viz import animate
from viz.replay import replays

CASES = [("all_reduce", "ring", n) for n in (2, 3, 4, 5, 8)] + \
        [("broadcast", "binomial", n) for n in (4, 8, 16)] + \
        [("reduce", "binomial", 8), ("all_reduce", "recursive_doubling", 4),
         ("all_reduce", "rabenseifner", 8), ("all_gather", "ring", 6),
         ("all_to_all", "pairwise", 4), ("all_reduce", "double_binary_tree", 8)]


def collisions(figure) -> list[str]:
    renderer = figure.canvas.get_renderer()
    axis = figure.axes[1]  # the ranks (axes[0] is the time bar)
    titles = [text for text in axis.texts if text.get_text().startswith("rank ")]
    labels = [text for text in axis.texts if text.get_bbox_patch() is not None]
    arrows = [patch for patch in axis.patches if isinstance(patch, FancyArrowPatch)]
    found = []
    for title in titles:
        box = title.get_window_extent(renderer)
        for arrow in arrows:
            # The arc and the head as polylines in display coordinates (each
            # sub-path on its own: a CLOSEPOLY's placeholder vertex is no point).
            lines = arrow.get_path().transformed(axis.transData).to_polygons(closed_only=False)
            if any(Path(line).intersects_bbox(box, filled=False) for line in lines):
                found.append(f"{title.get_text()} x arrow")
        for label in labels:
            if box.overlaps(label.get_bbox_patch().get_window_extent(renderer)):
                found.append(f"{title.get_text()} x label {label.get_text()!r}")
    boxes = [label.get_bbox_patch().get_window_extent(renderer) for label in labels]
    for i, box in enumerate(boxes):
        for j in range(i):
            if box.overlaps(boxes[j]):
                found.append(f"label {labels[i].get_text()!r} x label {labels[j].get_text()!r}")
    return found


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective, algorithm, n", CASES)
def test_titles_and_labels_stay_clear(collective, algorithm, n, tmp_path):
    path = tmp_path / "run.jsonl"
    simulate(collective, algorithm, world_size=n, nbytes=n * 32, dtype=np.int64, trace=path)
    replay = replays(path)[0]
    painter = animate._Painter(replay)
    bad = {}
    for index in range(len(replay.frames)):
        painter.draw(index)
        painter.figure.canvas.draw()
        found = collisions(painter.figure)
        if found:
            bad[index] = found
    assert not bad, f"{collective} {algorithm} n={n}: {bad}"
