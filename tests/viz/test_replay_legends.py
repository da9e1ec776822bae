"""The replays' legends: the GIF's side panel, the browser player's line and
the terminal's "cells:" line name every symbol the cells show, in the same
words, and the terminal and the picture name the ranks alike ("rank 2") and
draw the same symbol in every cell."""

from __future__ import annotations

import viz_samples
from legends import check_replay

from viz import animate
from viz.replay import cell_symbol

SAMPLES = {"ring all_reduce, 4 ranks": lambda: viz_samples.ring_all_reduce(4),
           "binomial broadcast, 8 ranks": lambda: viz_samples.binomial_broadcast(8),
           "gather, messages only": lambda: viz_samples.messages_only(4),
           "ring all_reduce, 12 ranks": lambda: viz_samples.ring_all_reduce(12)}


def test_every_replay_legend_names_what_its_cells_show():
    for name, make in SAMPLES.items():
        replay = make()
        # Before any message, a step with partial results, the end.
        frames = sorted({0, min(2, replay.steps), replay.steps})
        assert check_replay(replay, frames) == [], name


def test_the_legend_names_only_what_the_replay_draws():
    ring = [entry["symbol"] for entry in animate.legend_entries(viz_samples.ring_all_reduce(4))]
    assert ring == ["0", "1", "2", "3", "Σk", "A", "outlined", "arrow"]  # no "·": none is empty
    broadcast = [entry["symbol"]
                 for entry in animate.legend_entries(viz_samples.binomial_broadcast(4))]
    # Only the root's data travels: no other rank's number, no Σk, no A; the
    # ranks that pass it on are named by their arrows' colour.
    assert broadcast == ["0", "·", "outlined", "rank 1", "arrow"]
    gather = animate.legend_entries(viz_samples.messages_only(4))
    assert [entry["label"] for entry in gather] == [f"{rank}: rank {rank}'s buffer"
                                                   for rank in range(4)] + [
        "arrow: a message (its sender's colour)"]


def test_one_symbol_per_cell_everywhere():
    n = 4
    assert [cell_symbol(frozenset(cell), n) for cell in ((), {2}, {0, 3}, range(n))] == \
        ["·", "2", "Σ2", "A"]
    assert animate.cell_text(frozenset({2}), n) == "2"
