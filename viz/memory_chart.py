"""Memory per rank over one training step, one panel per strategy, from a trace.

The data is the trace's ``memory`` events (written by
:meth:`minidist.memory.Ledger.sample`), read per rank with
:func:`minidist.memory.memory_timeline`. A strategy's step is the region
``memory step NAME`` (a ``compute`` event from :func:`minidist.trace.region`)
on each rank: the memory events inside it are that strategy's panel.
:func:`memory_panels` returns exactly what is drawn; :func:`draw_memory`
draws it, a grid of one row per rank and one column per strategy, each cell
the bytes held by category (stacked, as steps) against the time since the
region started. ``gathered`` events (:data:`GATHERED_KIND`, which
``minidist demo memory`` writes for ZeRO-3) at a memory sample's time say how
many of its activation bytes are gathered parameters: the layers' full
weights, gathered for forward and kept alive by the autograd graph until
each layer's backward; the chart draws them as a category of their own::

    from viz.memory_chart import save_memory
    save_memory("memory.trace.jsonl", "memory.png")
"""

from __future__ import annotations

import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minidist import trace as _trace
from minidist.atomic_file import atomic_path
from minidist.memory import CATEGORIES, memory_timeline

#: The region a strategy's measured step runs in: ``REGION_PREFIX + name``.
REGION_PREFIX = "memory step "
#: The kind of the trace event that says how many bytes of a memory sample's
#: activations are gathered parameters (its ``bytes``, at the sample's time).
GATHERED_KIND = "gathered"
GATHERED = "gathered_parameters"
#: What the chart stacks: the ledger's categories, the gathered parameters
#: apart from the activations that hold them.
CHART_CATEGORIES = CATEGORIES[:-1] + (GATHERED,) + CATEGORIES[-1:]
#: The palette of viz/timeline.py (Tableau's colour-blind ten), one per category.
COLORS = {"parameters": "#006BA4", "gradients": "#FF800E", "optimizer_state": "#5F9ED1",
          "buffers": "#ABABAB", GATHERED: "#595959", "activations": "#C85200"}


def _events_of(trace) -> list[dict]:
    if isinstance(trace, (str, os.PathLike)):
        trace = _trace.read_jsonl(trace)
    if isinstance(trace, _trace.Trace):
        return list(trace.events)
    return list(trace)


def memory_panels(trace) -> dict[str, dict[int, list[tuple[int, dict[str, int]]]]]:
    """``{strategy: {rank: [(nanoseconds since the region started, bytes by
    category), ...]}}``: for each ``memory step NAME`` region of each rank,
    the :func:`memory_timeline` entries of that rank inside it, in time
    order. Strategies keep the order of their first region in the trace.
    Where a ``gathered`` event marks a sample, its bytes move from
    ``activations`` to ``gathered_parameters``."""
    events = _events_of(trace)
    timeline = memory_timeline(events)
    gathered = {(event["rank"], event["start"]): int(event.get("bytes") or 0)
                for event in events if event.get("kind") == GATHERED_KIND}
    if gathered:
        timeline = {rank: [(time, _split(held, gathered.get((rank, time), 0)))
                           for time, held in samples] for rank, samples in timeline.items()}
    regions = sorted((event for event in events if event.get("kind") == "compute"
                      and (event.get("label") or "").startswith(REGION_PREFIX)),
                     key=lambda event: (event["start"], event["rank"]))
    panels: dict[str, dict[int, list]] = {}
    for region in regions:
        name = region["label"][len(REGION_PREFIX):]
        start, end, rank = region["start"], region["end"], region["rank"]
        inside = [(time - start, held) for time, held in timeline.get(rank, [])
                  if start <= time <= end]
        panels.setdefault(name, {})[rank] = inside
    return {name: dict(sorted(per_rank.items())) for name, per_rank in panels.items()}


def _split(held: dict[str, int], gathered: int) -> dict[str, int]:
    part = min(gathered, held.get("activations", 0))
    out = dict(held)
    out["activations"] = held.get("activations", 0) - part
    out[GATHERED] = part
    return out


def draw_memory(trace, title: str | None = None) -> Figure:
    """The figure: one row per rank, one column per strategy (see module doc)."""
    panels = memory_panels(trace)
    if not panels:
        raise ValueError("no 'memory step NAME' region with memory events in this trace")
    names = list(panels)
    ranks = sorted({rank for per_rank in panels.values() for rank in per_rank})
    figure = Figure(figsize=(3.2 * len(names) + 1.0, 2.2 * len(ranks) + 1.0), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(ranks), len(names), squeeze=False, sharey=True)
    top = max((sum(held.values()) for per_rank in panels.values()
               for series in per_rank.values() for _, held in series), default=1)
    for column, name in enumerate(names):
        for row, rank in enumerate(ranks):
            ax = axes[row][column]
            series = panels[name].get(rank, [])
            if series:
                times = [time / 1e6 for time, _ in series]
                # Hold the last sample a little so its step is visible.
                times.append(times[-1] + max(times[-1] * 0.05, 0.01))
                below = [0.0] * len(times)
                for category in CHART_CATEGORIES:
                    values = [held.get(category, 0) / 1e3 for _, held in series]
                    values.append(values[-1])
                    above = [low + value for low, value in zip(below, values)]
                    ax.fill_between(times, below, above, step="post", color=COLORS[category],
                                    linewidth=0)
                    below = above
            ax.set_ylim(0, top / 1e3 * 1.1)
            ax.grid(axis="y", color="#E0E0E0", linewidth=0.6)
            if row == 0:
                ax.set_title(name, fontsize=10)
            if row == len(ranks) - 1:
                ax.set_xlabel("ms into the step", fontsize=8)
            if column == 0:
                ax.set_ylabel(f"rank {rank}\nKB held", fontsize=8)
            ax.tick_params(labelsize=7)
    shown = [c for c in CHART_CATEGORIES if c != GATHERED or any(
        held.get(GATHERED) for per_rank in panels.values() for series in per_rank.values()
        for _, held in series)]
    figure.legend(handles=[Patch(color=COLORS[c], label=c.replace("_", " ")) for c in shown],
                  loc="lower center", ncol=len(shown), fontsize=8, frameon=False)
    figure.suptitle(title or "memory per rank over one training step", fontsize=11)
    figure.tight_layout(rect=(0, 0.06, 1, 0.96))
    return figure


def save_memory(trace, path, dpi: int = 100, **options) -> str:
    """Draw :func:`draw_memory` into ``path`` (a PNG); returns the path."""
    with atomic_path(path) as name:
        draw_memory(trace, **options).savefig(name, dpi=dpi)
    return str(path)
