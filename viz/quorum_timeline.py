"""Fault-tolerant data parallel as a picture: replicas as rows, steps as columns.

Each cell says what a rank did in a step: trained in the committed quorum
(L, live), trained it again after the quorum lost a member in the first try
(R, recovering: the step redone), received the state and trained (J,
joining), gone (X, dead), or waited (S, spare). A lesson shows with it "the
group went on at 3 of 4 and took a replacement back". The letters carry the
meaning, the colours (tableau-colorblind10) only help.

:func:`quorum_cells` is pure (the results of ``minidist.launch`` of
:func:`minidist.parallel.resilience.train`, or any rank's
``ManagerResult.attempts``, to the grid); :func:`draw_quorum_timeline`
draws it on an Agg figure.
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minidist.atomic_file import atomic_path

LETTERS = {"live": "L", "recovering": "R", "joining": "J", "dead": "X", "spare": "S"}
COLOURS = {"live": "#006BA4", "recovering": "#FF800E", "joining": "#5F9ED1",
           "dead": "#595959", "spare": "#CFCFCF"}


def quorum_cells(attempts, world_size: int) -> list[list[str]]:
    """cells[rank][step]: "live", "recovering", "joining", "dead" or "spare",
    from one surviving rank's attempts (it took part in every quorum)."""
    steps = sorted({attempt.step for attempt in attempts if attempt.outcome == "committed"})
    cells = [["spare"] * len(steps) for _ in range(world_size)]
    ever_member: set = set()
    for column, step in enumerate(steps):
        tries = [a for a in attempts if a.step == step and a.outcome != "waited"]
        committed = [a for a in tries if a.outcome == "committed"][-1]
        redone = len(tries) > 1
        lost = set().union(*(set(a.members) for a in tries)) - set(committed.members)
        for rank in range(world_size):
            if rank in committed.members:
                if rank in committed.joining and committed.quorum_id > 1:
                    cells[rank][column] = "joining"
                else:
                    cells[rank][column] = "recovering" if redone else "live"
            elif rank in lost or rank in ever_member:
                cells[rank][column] = "dead"
        ever_member |= set(committed.members)
    return cells


def draw_quorum_timeline(cells, path=None, title="fault-tolerant data parallel: the quorums"):
    """The grid of :func:`quorum_cells` as a figure (written to ``path`` if given)."""
    ranks, steps = len(cells), len(cells[0]) if cells else 0
    # The key sits right of the grid, so that it can meet neither the steps' labels nor the cells.
    figure = Figure(figsize=(2.6 + 0.45 * steps, 1.0 + 0.45 * ranks))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for rank, row in enumerate(cells):
        for step, state in enumerate(row):
            axes.add_patch(_cell(step, rank, COLOURS[state]))
            axes.text(step + 0.5, rank + 0.5, LETTERS[state], ha="center", va="center",
                      fontsize=8, color="white" if state in ("live", "dead") else "black")
    axes.set_xlim(0, steps)
    axes.set_ylim(ranks, 0)
    axes.set_xticks([s + 0.5 for s in range(steps)], [str(s) for s in range(steps)])
    axes.set_yticks([r + 0.5 for r in range(ranks)], [f"rank {r}" for r in range(ranks)])
    axes.set_xlabel("step")
    axes.set_title(title, fontsize=9)
    from matplotlib.patches import Patch

    axes.legend(handles=[Patch(facecolor=COLOURS[state], label=f"{LETTERS[state]} {state}")
                         for state in LETTERS],
                loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    figure.tight_layout()
    if path is not None:
        with atomic_path(path) as temporary:
            figure.savefig(temporary, format="png")
    return figure


def _cell(step, rank, colour):
    from matplotlib.patches import Rectangle

    return Rectangle((step, rank), 1, 1, facecolor=colour, edgecolor="white")
