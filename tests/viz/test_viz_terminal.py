"""The Rich step-through, rendered to text (no terminal needed)."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from tests.viz.viz_reference import ring_all_reduce_events
from viz.replay import replay
from viz.terminal import cell_char, move, play, render_frame, step_through


def _text(renderable, width: int = 80) -> str:
    console = Console(record=True, width=width, color_system=None, file=_Discard())
    console.print(renderable)
    return console.export_text()


class _Discard:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


@pytest.fixture(scope="module")
def ring4():
    return replay(ring_all_reduce_events(4, 256, itemsize=4))


@pytest.fixture(scope="module")
def ring8():
    return replay(ring_all_reduce_events(8, 1024, itemsize=4))


def test_the_shared_slots_latency_is_a_symbol_with_its_meaning(ring4):
    """The one-shot all_reduce's cost names the shared slots' latency: a
    replay shows it as αₛ, said in words under the formula, never as the
    code's name slots_alpha (terminal, and the GIF's and player's header)."""
    import dataclasses

    from viz import animate
    from viz.replay import formula_of

    formula = formula_of("all_reduce", "one_shot")
    assert formula.startswith("αₛ + N β") and "slots_alpha" not in formula
    one_shot = dataclasses.replace(ring4, formula=formula)
    text = _text(render_frame(one_shot, 1))
    assert "slots_alpha" not in text and "αₛ + N β" in text
    assert "αₛ: the latency of the shared slots" in " ".join(text.split())
    header = animate.header_lines(one_shot, one_shot.frames[1])
    assert header[2] == f"cost: {formula}   (αₛ: the shared slots' latency)"


def test_header_phase_messages_and_formula(ring4):
    text = _text(render_frame(ring4, 3))
    assert "all_reduce · ring" in text
    assert "step 3 of 6" in text
    assert "reduce-scatter" in text
    assert "0 -> 1" in text and "256 B" in text and "combine" in text
    assert "2 (n - 1) α" in text and "βₓ: β of a step in which a rank sends and receives" in text
    assert "measured" in text and "vs model" in text
    # Beside the two numbers, their ratio and why they differ in this run.
    assert re.search(r"vs model [\d.]+ .?s \([\d.,]+x: ", " ".join(text.split()))
    allgather = _text(render_frame(ring4, 4))
    assert "step 4 of 6 · allgather" in allgather and "copy" in allgather


def test_cells_show_ranks_sums_and_all(ring4):
    before = _text(render_frame(ring4, 0, color=False))
    assert "step 0 of 6 (before any message)" in before
    # Each rank its own data: its number in every cell, the rank named as in the GIF.
    assert all(f"rank {rank} │{f' {rank}' * 4}│" in before for rank in range(4))
    assert "nothing sent yet" in before
    first = _text(render_frame(ring4, 1, color=False))
    assert "rank 1 │Σ2 1 1 1│" in first  # rank 1 combined rank 0's chunk 0
    last = _text(render_frame(ring4, 6, color=False))
    for rank in range(4):
        assert f"rank {rank} │ A A A A│" in last
    assert cell_char(frozenset(), 4) == "·"
    assert cell_char(frozenset({1, 2}), 4) == "Σ2"
    assert cell_char(frozenset({3}), 4) == "3"


def test_eight_ranks_fit_in_80_columns(ring8):
    for index in (0, 6, 13):
        text = _text(render_frame(ring8, index, width=80))
        assert max(len(line) for line in text.splitlines()) <= 80
        # In 120 columns (the most the step-through uses) the ring is drawn,
        # not the fallback list: four ranks on the top row.
        wide = _text(render_frame(ring8, index, width=120), width=120)
        assert max(len(line) for line in wide.splitlines()) <= 120
        assert any(line.count("│") == 8 for line in wide.splitlines())


def test_color_and_no_color_say_the_same(ring8):
    plain = _text(render_frame(ring8, 4, color=False))
    coloured = _text(render_frame(ring8, 4, color=True))
    # Only the legend's line about colours is the coloured frame's own.
    assert [line for line in coloured.splitlines()
            if not line.strip().startswith("colour:")] == plain.splitlines()


def test_64_ranks_render_the_summary_view():
    big = replay(ring_all_reduce_events(64, 64 * 4, itemsize=4))
    assert big.summary and big.steps == 126
    text = _text(render_frame(big, 71))
    assert "summary view" in text and "step 71 of 126" in text
    assert "complete" in text and "messages" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert _text(render_frame(big, 126)).count("100%") >= 1


def test_keys_move_next_back_start_end_quit(ring4):
    console = Console(record=True, width=80, color_system=None, file=_Discard())
    shown = step_through(ring4, console, keys=["n", " ", "b", "G", "n", "g", "x", "b", "q"])
    assert shown == [0, 1, 2, 1, 6, 0]
    text = console.export_text()
    assert "step 0 of 6 (before any message)" in text and "step 6 of 6" in text


def test_keys_end_when_they_run_out(ring4):
    console = Console(record=True, width=80, color_system=None, file=_Discard())
    assert step_through(ring4, console, keys=["n"]) == [0, 1]


def test_move_rules():
    assert move(0, "b", 6) == 0 and move(5, "n", 6) == 5
    assert move(2, "\x1b[C", 6) == 3 and move(2, "\x1b[D", 6) == 1
    assert move(3, "q", 6) is None and move(3, "?", 6) == 3


def test_without_a_terminal_every_frame_is_printed(ring4):
    console = Console(record=True, width=80, color_system=None, file=_Discard())
    assert step_through(ring4, console) == list(range(7))
    text = console.export_text()
    assert all(f"step {k} of 6" in text for k in range(0, 7))


def test_play_shows_every_frame_without_waiting(ring4):
    console = Console(record=True, width=80, color_system=None, file=_Discard())
    waits = []
    play(ring4, console, speed=4, sleep=waits.append)
    assert waits == [0.25] * 7
    assert "step 6 of 6" in console.export_text()
