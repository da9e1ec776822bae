"""The profile of a trace as one stacked bar per rank: where its span went.

Each bar is a rank's span (first event to last), cut into the classes of
:mod:`minidist.profile.breakdown`, left to right: compute alone, compute
with communication in flight (overlapped), exposed communication, waiting
for a peer, unmarked time. The bars add up to the span by construction, so
a rank whose bar is shorter began later or ended sooner (above 64 ranks,
the first 64 are drawn, and the title says so). Each class has a
hatch as well as a colour (colour is never the only signal), and the
legend sits below the axis, where no bar can be::

    from viz.profile_bars import save_profile_bars
    save_profile_bars("ddp.jsonl", "ddp-profile.png")
"""

from __future__ import annotations

import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minidist.atomic_file import atomic_path
from minidist.profile import Profile, profile

#: Bars drawn at most: the first ranks, the title says how many of how many.
MAX_RANKS = 64
#: (class, legend text, colour, hatch), in the order of the bar.
SEGMENTS = (
    ("compute alone", "compute, nothing in flight", "#006BA4", None),
    ("overlapped", "compute with communication in flight (overlapped)", "#5F9ED1", "//"),
    ("exposed", "exposed communication", "#FF800E", None),
    ("waiting", "waiting for a peer", "#C85200", "xx"),
    ("unmarked", "unmarked (no event)", "#CFCFCF", ".."),
)


def segment_lengths(breakdown) -> dict[str, int]:
    """The bar's pieces in ns: compute split into its part alone and its
    overlapped part; they add up to the span."""
    return {"compute alone": breakdown.ns("compute") - breakdown.ns("overlapped"),
            "overlapped": breakdown.ns("overlapped"), "exposed": breakdown.ns("exposed"),
            "waiting": breakdown.ns("waiting"), "unmarked": breakdown.ns("unmarked")}


def draw_profile_bars(found: Profile, ranks=None, title: str | None = None) -> Figure:
    """A figure of one bar per rank (``ranks``: which, default all)."""
    shown = sorted(found.ranks if ranks is None else ranks)
    if len(shown) > MAX_RANKS:
        title = (title or "where each rank's time went") + \
            f" (the first {MAX_RANKS} of {len(shown)} ranks)"
        shown = shown[:MAX_RANKS]
    longest = max((found.ranks[r].ns("span") for r in shown), default=0)
    unit, scale = ("s", 1e9) if longest >= 1e9 else ("ms", 1e6) if longest >= 1e6 else ("us", 1e3)
    height = 1.6 + 0.45 * len(shown)
    figure = Figure(figsize=(8.5, height))
    FigureCanvasAgg(figure)
    axis = figure.add_subplot(1, 1, 1)
    for row, rank in enumerate(shown):
        left = 0.0
        for name, _, colour, hatch in SEGMENTS:
            width = segment_lengths(found.ranks[rank])[name] / scale
            axis.barh(row, width, left=left, height=0.6, color=colour, hatch=hatch,
                      edgecolor="#333333" if hatch else colour, linewidth=0.4)
            left += width
        percent = found.ranks[rank].overlap_percent
        axis.text(left, row, f"  {percent:.0f}% overlapped" if percent is not None else "",
                  va="center", fontsize=8)
    axis.set_yticks(range(len(shown)))
    axis.set_yticklabels([f"rank {rank}" for rank in shown], fontsize=9)
    axis.set_ylim(len(shown) - 0.5, -0.5)
    axis.set_xlim(0, longest / scale * 1.2 if longest else 1)
    axis.set_xlabel(f"time ({unit}): each rank's span, first event to last")
    axis.grid(axis="x", alpha=0.3)
    axis.set_title(title or "where each rank's time went", fontsize=10)
    handles = [Patch(facecolor=colour, hatch=hatch, edgecolor="#333333", label=text)
               for _, text, colour, hatch in SEGMENTS]
    # Below the axis and its label, in its own strip of the figure: the
    # legend never covers a bar, however long.
    figure.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    figure.subplots_adjust(left=0.1, right=0.97, top=1 - 0.45 / height,
                           bottom=(0.95 + 0.1) / height)
    return figure


def save_profile_bars(trace, path, dpi: int = 100, found: Profile | None = None,
                      ranks=None) -> str:
    """Draw the bars of ``trace`` (or of ``found``, its profile) into a PNG; returns the path."""
    path = os.fspath(path)
    figure = draw_profile_bars(found if found is not None else profile(trace), ranks)
    with atomic_path(path) as name:
        figure.savefig(name, dpi=dpi)
    return path


__all__ = ["draw_profile_bars", "save_profile_bars", "segment_lengths", "SEGMENTS"]
