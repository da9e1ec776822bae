"""The matplotlib renderers, headless (Agg): files produced with the expected
frame count, and the drawn content checked from the frame model, not pixels."""

import re

import pytest
import viz_samples
from PIL import Image

from viz import animate


def gif_frames(path) -> int:
    with Image.open(path) as image:
        return image.n_frames


def html_frames(path) -> int:
    """The steps the page's player holds (its slider's range: 0 to the last)."""
    text = path.read_text(encoding="utf-8")
    return int(re.search(r'class="slider" type="range" min="0" max="(\d+)"', text).group(1)) + 1


def test_ring_all_reduce_gif_has_one_frame_per_step(tmp_path):
    replay = viz_samples.ring_all_reduce(4)
    path = animate.save_gif(replay, tmp_path / "ring.gif", fps=2)
    # Step 0 (before any message), then the ring's 2 (n - 1) steps.
    assert gif_frames(path) == len(replay.frames) == 2 * (4 - 1) + 1


def test_binomial_broadcast_html_is_a_self_contained_player(tmp_path):
    replay = viz_samples.binomial_broadcast(8)
    path = tmp_path / "broadcast.html"
    animate.save_html(replay, path)
    assert html_frames(path) == len(replay.frames) == 3 + 1
    text = path.read_text(encoding="utf-8")
    # Everything is in the page: no address to fetch (a CDN's icons were
    # blank offline), no side files.
    assert "http" not in text and "<link" not in text
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:|\$\{)""", text)
    assert '"scene"' in text and "<svg" in text
    assert not (tmp_path / "broadcast_frames").exists()


def test_summary_view_above_16_ranks(tmp_path):
    replay = viz_samples.binomial_broadcast(32)
    assert replay.summary
    path = animate.save_gif(replay, tmp_path / "summary.gif")
    assert gif_frames(path) == len(replay.frames) == 5 + 1
    figure = animate.draw_frame(replay, 3)
    texts = " ".join(text.get_text() for text in figure.texts)
    assert "summary view" in texts and "step 3 of 5" in texts
    # In the browser the summary's charts are the painter's PNGs, with no rank to follow.
    page = animate.to_html(replay)
    assert page.count("data:image/png;base64") == len(replay.frames)
    assert '<select class="follow" disabled' in page


def test_messages_only_replay_draws(tmp_path):
    figure = animate.draw_frame(viz_samples.messages_only(4), 1)
    figure.savefig(tmp_path / "gather.png")
    assert (tmp_path / "gather.png").stat().st_size > 1000


def test_header_says_step_phase_and_times():
    replay = viz_samples.ring_all_reduce(4)
    lines = animate.header_lines(replay, replay.frames[4])
    assert lines[0].startswith("all_reduce · ring · 4 ranks")
    assert lines[1] == "step 4 of 6: allgather"
    assert animate.header_lines(replay, replay.frames[0])[1] == \
        "step 0 of 6 (before any message)"
    assert "alpha" in lines[2]
    assert "measured 4.0 µs so far of 6.0 µs" in lines[3] and "cost model" in lines[3]


def test_every_cell_shows_a_letter_or_number():
    n = 4
    assert animate.cell_text(frozenset(), n) == "·"
    assert animate.cell_text(frozenset({2}), n) == "2"
    assert animate.cell_text(frozenset({0, 3}), n) == "Σ2"
    assert animate.cell_text(frozenset(range(n)), n) == "A"


def test_drawn_cells_follow_the_ring(tmp_path):
    """The texts drawn in frame k's cells are those of the frame model's holdings."""
    n = 4
    replay = viz_samples.ring_all_reduce(n)
    for index in (0, 1, n - 1, len(replay.frames) - 1):
        figure = animate.draw_frame(replay, index)
        ranks_axis = figure.axes[1]
        drawn = [text.get_text() for text in ranks_axis.texts
                 if not text.get_text().startswith("rank") and "B" not in text.get_text()]
        expected = [animate.cell_text(cell, n) for rank in replay.frames[index].holdings
                    for cell in rank]
        assert drawn == expected
    assert set(drawn) == {"A"}  # after the last step every cell holds every rank


@pytest.mark.parametrize("layout", ["ring", "tree", "row"])
def test_layouts_place_every_rank_apart(layout):
    replay = viz_samples.binomial_broadcast(16)
    replay = type(replay)(**{**replay.__dict__, "layout": layout})
    where = animate.positions(replay)
    assert sorted(where) == list(range(16))
    assert len(set(where.values())) == 16


def test_binomial_tree_levels_follow_the_rounds():
    """The tree is grown from the messages: rank 2^k's subtree hangs under the root."""
    where = animate.positions(viz_samples.binomial_broadcast(8))
    level = {rank: round(-y / 1.3) for rank, (x, y) in where.items()}
    assert level == {0: 0, 1: 1, 2: 1, 4: 1, 3: 2, 5: 2, 6: 2, 7: 3}


def test_missing_frame_is_a_clear_error():
    with pytest.raises(IndexError, match="has steps 0 .before any message. to 6"):
        animate.draw_frame(viz_samples.ring_all_reduce(4), 7)
