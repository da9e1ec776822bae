"""Expert parallelism's dispatch drawn: which tokens go to which rank's experts,
the load per expert against its capacity, and the dropped tokens, step by
step, as a PNG and in the terminal.

The data is what every rank's MoE layer keeps after a forward, its
:class:`~minidist.models.moe.Routing` (the experts of each token's choices,
and which found a place); a step is the list of the ranks' routings, rank
order, for one layer (:mod:`minidist.parallel.expert.dispatch`: expert e on
rank e // (E / n)). :func:`dispatch_panels` computes what is drawn;
:func:`dispatch_figure` draws one column per step:

* top, the tokens: a row per source rank and choice (1st, 2nd), a cell per
  token, coloured by the rank its expert is on; a hatched white cell is a
  dropped choice (its expert was full);
* bottom, the load: per expert (e, on rank r), the kept choices stacked by source rank,
  the dropped ones hatched on top, and a black tick at the expert's
  capacity (the sum of the ranks' capacities: each rank's tokens are one
  capacity group).

:func:`dispatch_text` is the same for the terminal (Rich): each source
rank's tokens as the digits of their destination rank (``x`` dropped), and
a bar per expert. Drawing is free of processes: the routings are arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator
from rich.console import Group
from rich.text import Text

from minidist.atomic_file import atomic_path
from viz.terminal import PALETTE, rank_colour

#: A dropped choice: a white cell with this hatch, in the figure.
DROPPED_HATCH = "xxx"
#: Steps drawn side by side at most (more would make the cells unreadable).
MOST_STEPS = 4
#: The terminal's mark for a dropped choice.
DROPPED_CHAR = "x"


@dataclass(frozen=True)
class DispatchPanel:
    """What one step's column shows. ``destination[r]`` (k, N_r): the rank
    of the expert of each choice of source rank r's tokens, -1 where the
    choice was dropped; ``kept`` (E, n): the choices each expert took from
    each source rank; ``dropped`` (E,): the choices each expert refused;
    ``capacity`` (E,): its places, summed over the source ranks; ``ranks``:
    the expert-parallel group's size."""

    destination: list
    kept: np.ndarray
    dropped: np.ndarray
    capacity: np.ndarray
    ranks: int

    @property
    def n_expert(self) -> int:
        return int(self.kept.shape[0])

    def home(self, expert: int) -> int:
        """The rank that holds ``expert``."""
        return expert // (self.n_expert // self.ranks)


def dispatch_panels(steps) -> list[DispatchPanel]:
    """One :class:`DispatchPanel` per step; ``steps[s][r]`` is rank r's
    Routing at step s (every rank the same number of experts, split evenly
    over the ranks)."""
    panels = []
    for routings in steps:
        ranks = len(routings)
        n_expert = routings[0].n_expert
        if n_expert % ranks:
            raise ValueError(f"dispatch_panels: {n_expert} experts do not split over {ranks} "
                             "ranks; pass one Routing per rank of the expert-parallel group")
        per_rank = n_expert // ranks
        destination = [np.where(r.kept, r.choices // per_rank, -1).T for r in routings]
        kept = np.stack([r.load for r in routings], axis=1)
        dropped = sum(r.routed - r.load for r in routings)
        capacity = np.full(n_expert, sum(r.capacity for r in routings))
        panels.append(DispatchPanel(destination, kept, dropped, capacity, ranks))
    return panels


def _ordinal(which: int) -> str:
    return {0: "1st", 1: "2nd", 2: "3rd"}.get(which, f"{which + 1}th")


def _draw_tokens(axis, panel: DispatchPanel) -> None:
    rows = [(rank, which) for rank, dest in enumerate(panel.destination)
            for which in range(dest.shape[0])]
    width = max(dest.shape[1] for dest in panel.destination)
    for row, (rank, which) in enumerate(rows):
        y = len(rows) - 1 - row
        for token, target in enumerate(panel.destination[rank][which]):
            if target < 0:
                axis.add_patch(Rectangle((token, y), 0.9, 0.9, facecolor="white",
                                         edgecolor="#1B1B1B", hatch=DROPPED_HATCH, lw=0.6))
            else:
                axis.add_patch(Rectangle((token, y), 0.9, 0.9, facecolor=PALETTE[target % len(PALETTE)],
                                         edgecolor="none"))
    axis.set_xlim(-0.2, width + 0.1)
    axis.set_ylim(-0.2, len(rows))
    axis.set_yticks([len(rows) - 1 - row + 0.45 for row in range(len(rows))])
    k = panel.destination[0].shape[0]
    axis.set_yticklabels([f"rank {rank}" + (f" {_ordinal(which)}" if k > 1 else "")
                          for rank, which in rows], fontsize=8)
    axis.set_xticks([])
    axis.set_xlabel("tokens, coloured by their expert's rank", fontsize=8)
    for spine in axis.spines.values():
        spine.set_visible(False)


def _draw_load(axis, panel: DispatchPanel) -> None:
    experts = np.arange(panel.n_expert)
    bottom = np.zeros(panel.n_expert)
    for source in range(panel.ranks):
        axis.bar(experts, panel.kept[:, source], bottom=bottom, width=0.7,
                 color=PALETTE[source % len(PALETTE)], edgecolor="white", lw=0.5)
        bottom += panel.kept[:, source]
    axis.bar(experts, panel.dropped, bottom=bottom, width=0.7, color="white",
             edgecolor="#1B1B1B", hatch=DROPPED_HATCH, lw=0.6)
    axis.hlines(panel.capacity, experts - 0.42, experts + 0.42, color="black", lw=2)
    axis.set_xticks(experts)
    axis.set_xticklabels([f"e{e}\nr{panel.home(e)}" for e in experts], fontsize=7)
    axis.tick_params(axis="y", labelsize=7)
    axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_ylim(0, max(1, float((bottom + panel.dropped).max()), float(panel.capacity.max())) * 1.15)
    axis.set_xlabel("expert e, on rank r", fontsize=8)
    axis.set_ylabel("choices, coloured by source rank", fontsize=8)
    axis.spines[["top", "right"]].set_visible(False)


def dispatch_figure(steps, labels=None) -> Figure:
    """The dispatch of up to :data:`MOST_STEPS` steps (``steps[s][r]``: rank
    r's Routing at step s), one column each, titled by ``labels`` (default
    "step s"); a matplotlib Figure (see the module docstring)."""
    panels = dispatch_panels(steps)
    if not 1 <= len(panels) <= MOST_STEPS:
        raise ValueError(f"dispatch_figure draws 1 to {MOST_STEPS} steps side by side, got "
                         f"{len(panels)}; pass a slice of them, e.g. steps[:{MOST_STEPS}]")
    labels = list(labels) if labels is not None else [f"step {s}" for s in range(len(panels))]
    rows = sum(dest.shape[0] for dest in panels[0].destination)
    figure = Figure(figsize=(3.4 * len(panels) + 0.8, 1.9 + 0.28 * rows + 2.2))
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, len(panels), height_ratios=[0.3 * rows + 0.6, 2.0],
                               hspace=0.55, wspace=0.45, left=0.12, right=0.97, top=0.82,
                               bottom=0.12)
    for column, (panel, label) in enumerate(zip(panels, labels)):
        tokens = figure.add_subplot(grid[0, column])
        _draw_tokens(tokens, panel)
        dropped = int(panel.dropped.sum())
        tokens.set_title(f"{label}: {dropped} dropped", fontsize=9)
        load = figure.add_subplot(grid[1, column])
        _draw_load(load, panel)
        load.set_title("load per expert (and its rank)", fontsize=8)
    ranks = panels[0].ranks
    handles = [Patch(facecolor=PALETTE[r % len(PALETTE)], label=f"rank {r}") for r in range(ranks)]
    handles.append(Patch(facecolor="white", edgecolor="#1B1B1B", hatch=DROPPED_HATCH,
                         label="dropped: its expert was full"))
    handles.append(Line2D([], [], color="black", lw=2, label="capacity: an expert's places"))
    figure.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
                  frameon=False, bbox_to_anchor=(0.5, 0.93))
    figure.suptitle(f"expert parallelism, {ranks} ranks, {panels[0].n_expert} experts: each "
                    f"token coloured by the rank of its expert", fontsize=11)
    return figure


def save_dispatch_figure(steps, path, labels=None) -> str:
    """Write :func:`dispatch_figure` as a PNG at ``path``; returns the path."""
    figure = dispatch_figure(steps, labels)
    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png", dpi=110)
    return str(path)


def dispatch_text(steps, labels=None, *, color: bool = True) -> Group:
    """The same for the terminal: per step, each source rank's tokens as the
    digit of their destination rank (``x`` dropped), then per expert a bar
    of its kept choices, its capacity and what it dropped."""
    panels = dispatch_panels(steps)
    labels = list(labels) if labels is not None else [f"step {s}" for s in range(len(panels))]
    parts = []
    for panel, label in zip(panels, labels):
        dropped = int(panel.dropped.sum())
        parts.append(Text(f"{label}: {dropped} choices dropped", style="bold" if color else ""))
        k = panel.destination[0].shape[0]
        for rank, dest in enumerate(panel.destination):
            for which in range(k):
                line = Text(f"  rank {rank}" + (f" {_ordinal(which)}" if k > 1 else "") + " -> ")
                for target in dest[which]:
                    if target < 0:
                        line.append(DROPPED_CHAR, style="bold red" if color else "")
                    else:
                        line.append(str(int(target)), style=rank_colour(int(target)) if color else "")
                parts.append(line)
        top = int(panel.capacity.max())
        for expert in range(panel.n_expert):
            line = Text(f"  expert {expert} (rank {panel.home(expert)}) ")
            for source in range(panel.ranks):
                line.append("#" * int(panel.kept[expert, source]),
                            style=rank_colour(source) if color else "")
            taken = int(panel.kept[expert].sum())
            line.append("." * max(0, int(panel.capacity[expert]) - taken))
            line.append(" " * max(0, top - max(taken, int(panel.capacity[expert]))))
            line.append(f" {taken}/{int(panel.capacity[expert])}")
            if panel.dropped[expert]:
                line.append(f" +{int(panel.dropped[expert])} dropped",
                            style="bold red" if color else "")
            parts.append(line)
        parts.append(Text(""))
    return Group(*parts)


__all__ = ["DispatchPanel", "dispatch_panels", "dispatch_figure", "save_dispatch_figure",
           "dispatch_text"]
