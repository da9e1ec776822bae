"""Pictures of a search: trials over time, one row per worker (a Gantt chart),
and the best value found against the time spent.

Colour is never the only signal: a pruned trial is hatched ``//``, a failed
one ``xx``, and each bar wide enough carries its trial number.
matplotlib is imported when a picture is drawn.
"""

from __future__ import annotations

STYLE = {  # state -> (colour from tableau-colorblind10, hatch)
    "complete": ("#006BA4", ""),
    "pruned": ("#FF800E", "//"),
    "failed": ("#C85200", "xx"),
    "running": ("#898989", ".."),
}


def plot_trials_over_time(result, ax=None, title: str | None = None):
    """Each trial of ``result`` (a SearchResult) as a bar from its start to its
    end on its worker's row. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 * max(result.n_workers, 2) + 1.4))
    span = max((trial.end for trial in result.trials), default=1.0) or 1.0
    # Every bar carries its trial's number: inside a wide bar on a white patch
    # (legible on hatching too); above or below a narrow one, in the lane
    # (above, below) where it lands nearest its bar without touching the
    # number before it: in a run of narrow bars a number may sit a little to
    # the right of its bar, never on another.
    gap = 0.028 * span
    last = {}   # (row, lane) -> where the lane's last number is
    for trial in sorted(result.trials, key=lambda t: t.start):
        colour, hatch = STYLE.get(trial.state, STYLE["running"])
        row = -1 if trial.worker is None else trial.worker
        ax.barh(row, trial.duration, left=trial.start, height=0.7, color=colour, hatch=hatch,
                edgecolor="white", linewidth=0.6)
        middle = trial.start + trial.duration / 2
        if trial.duration > 0.035 * span:
            ax.text(middle, row, str(trial.number), ha="center", va="center", fontsize=7,
                    color="black", bbox={"boxstyle": "round,pad=0.15", "facecolor": "white",
                                         "edgecolor": "none", "alpha": 0.85})
        else:
            where = {lane: max(middle, last.get((row, lane), -span) + gap)
                     for lane in ("above", "below")}
            lane = min(where, key=lambda lane: (where[lane] - middle, lane != "above"))
            last[(row, lane)] = where[lane]
            ax.text(where[lane], row + (-0.37 if lane == "above" else 0.37), str(trial.number),
                    ha="center", va="bottom" if lane == "above" else "top", fontsize=6,
                    color="black")
    for rank in result.lost_workers:
        ax.text(span, rank, "  lost", va="center", fontsize=8, color=STYLE["failed"][0])
    ax.set_yticks(range(result.n_workers))
    ax.set_yticklabels([f"worker {rank}" for rank in range(result.n_workers)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the search started")
    ax.set_title(title or f"{result.engine} search: {len(result.trials)} trials on "
                          f"{result.n_workers} workers, {result.wall_time:.1f} s")
    states = [state for state in STYLE if any(t.state == state for t in result.trials)]
    ax.legend(handles=[Patch(facecolor=STYLE[s][0], hatch=STYLE[s][1], label=s, edgecolor="white")
                       for s in states], loc="center left", bbox_to_anchor=(1.0, 0.5),
              frameon=False, fontsize=8)
    return ax


def best_so_far(result) -> list[tuple[float, float]]:
    """(time, best value so far) at each complete trial's end, in time order."""
    pick = max if result.direction == "maximize" else min
    points, best = [], None
    for trial in sorted(result.by_state("complete"), key=lambda t: t.end):
        best = trial.value if best is None else pick(best, trial.value)
        points.append((trial.end, best))
    return points


def plot_best_so_far(results, ax=None, labels=None):
    """The best value found against wall time, one line per search."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for index, result in enumerate(results):
        points = best_so_far(result)
        if not points:
            continue
        label = labels[index] if labels else f"{result.engine}, {result.n_workers} workers"
        times, values = zip(*points)
        ax.step(times, values, where="post", marker="o", markersize=3, label=label)
    ax.set_xlabel("seconds since the search started")
    ax.set_ylabel("best value so far")
    ax.legend(fontsize=8)
    return ax


__all__ = ["plot_trials_over_time", "plot_best_so_far", "best_so_far"]
