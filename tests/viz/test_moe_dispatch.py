"""The dispatch picture of expert parallelism (viz/moe_dispatch.py): every
token's cell coloured by the rank of its expert or hatched when dropped,
the load per expert against the routings, readable text, and the terminal
view saying the same. The routings are those of a MoE GPT trained for a few
steps on one process, each "rank's" batch its own capacity group, which is
what each rank of expert parallelism computes (tests/parallel/test_expert_parallel.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from matplotlib.patches import Rectangle
from PIL import Image
from rich.console import Console

from minidist import optim
from minidist.models.moe import MoEGPT, MoEGPTConfig, moe_layers
from tests.viz.text_layout import text_problems
from viz.moe_dispatch import (
    DROPPED_HATCH,
    dispatch_figure,
    dispatch_panels,
    dispatch_text,
    save_dispatch_figure,
)

RANKS = 2


def _steps(top_k, steps=3, factor=0.75):
    """steps[s][r]: the first layer's Routing of rank r's batch at step s."""
    config = MoEGPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, n_expert=4,
                          top_k=top_k, capacity_factor=factor)
    model = MoEGPT(config, rng=0).to(np.float64)
    optimizer = optim.AdamW(model.parameters(), lr=3e-2)
    layer = moe_layers(model)[0]
    recorded = []
    for step in range(steps):
        optimizer.zero_grad()
        routings = []
        for rank in range(RANKS):
            rng = np.random.default_rng(10 * step + rank)
            idx, targets = rng.integers(0, 11, (1, 8)), rng.integers(0, 11, (1, 8))
            model.loss(model(idx), targets).backward()
            routings.append(layer.routing)
        optimizer.step()
        recorded.append(routings)
    return recorded


@pytest.mark.parametrize("top_k", [1, 2])
def test_panels_say_where_each_choice_went(top_k):
    steps = _steps(top_k)
    panels = dispatch_panels(steps)
    assert sum(int(p.dropped.sum()) for p in panels) > 0   # something to draw hatched
    for panel, routings in zip(panels, steps):
        for rank, routing in enumerate(routings):
            for token in range(routing.tokens):
                for which in range(top_k):
                    expected = routing.choices[token, which] // 2 if routing.kept[token, which] else -1
                    assert panel.destination[rank][which, token] == expected
            assert panel.kept[:, rank].tolist() == np.bincount(
                routing.choices[routing.kept], minlength=4).tolist()
        routed = sum(np.bincount(r.choices.ravel(), minlength=4) for r in routings)
        np.testing.assert_array_equal(panel.kept.sum(axis=1) + panel.dropped, routed)
        assert (panel.kept.sum(axis=1) <= panel.capacity).all()
        assert [panel.home(e) for e in range(4)] == [0, 0, 1, 1]


@pytest.mark.parametrize("top_k", [1, 2])
def test_figure_draws_a_cell_per_choice_hatched_when_dropped_with_readable_text(top_k, tmp_path):
    steps = _steps(top_k)
    figure = dispatch_figure(steps)
    assert text_problems(figure) == []
    panels = dispatch_panels(steps)
    token_axes = figure.axes[0::2]
    for axis, panel in zip(token_axes, panels):
        cells = [p for p in axis.patches if isinstance(p, Rectangle)]
        assert len(cells) == sum(dest.size for dest in panel.destination)
        hatched = [p for p in cells if p.get_hatch() == DROPPED_HATCH]
        assert len(hatched) == int(panel.dropped.sum())
    out = save_dispatch_figure(steps, tmp_path / "dispatch.png")
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > 300


def test_too_many_steps_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"steps\[:4\]"):
        dispatch_figure(_steps(1, steps=5))


@pytest.mark.parametrize("top_k", [1, 2])
def test_terminal_view_lists_each_tokens_rank_and_each_experts_load(top_k):
    steps = _steps(top_k)
    console = Console(width=120, record=True, no_color=True)
    console.print(dispatch_text(steps, color=False))
    lines = console.export_text().splitlines()
    panels = dispatch_panels(steps)
    token_lines = [line for line in lines if "->" in line]
    expected = [("".join("x" if t < 0 else str(t) for t in dest[which]))
                for panel in panels for dest in panel.destination for which in range(top_k)]
    assert [line.split("->")[1].strip() for line in token_lines] == expected
    loads = [re.search(r"expert (\d) \(rank (\d)\) [#. ]* (\d+)/(\d+)(?: \+(\d+) dropped)?", line)
             for line in lines if line.strip().startswith("expert")]
    assert all(loads) and len(loads) == 4 * len(panels)
    for index, match in enumerate(loads):
        panel = panels[index // 4]
        expert, home, taken, capacity, dropped = (int(g or 0) for g in match.groups())
        assert (home, taken, capacity, dropped) == (
            panel.home(expert), int(panel.kept[expert].sum()), int(panel.capacity[expert]),
            int(panel.dropped[expert]))
