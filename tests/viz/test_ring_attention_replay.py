"""Ring attention's replay (lesson 18), frame-tested as the ring all_reduce's
is: one traced run of ring attention on 4 ranks (causal, zig-zag split, and
one without the mask), replayed from the trace, and its terminal frames, GIF
and browser player checked against what the algorithm does."""

from __future__ import annotations

import re

import numpy as np
import pytest
from legends import check_replay
from PIL import Image
from rich.console import Console

import minidist
import minidist.distributed as dist
from minidist import trace
from minidist.parallel.context.ring_attention import ring_attention
from minidist.parallel.context.split import shard_sequence
from minidist.tensor import Tensor
from viz import animate
from viz.ring_attention_replay import ring_attention_calls, ring_attention_replay
from viz.terminal import render_frame

WORLD, SEQ, B, H, D = 4, 16, 1, 2, 4   # 2n = 8 chunks of 2 positions


def _worker():
    world, rank = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(0)
    q, k, v = (Tensor(shard_sequence(rng.standard_normal((B, H, SEQ, D)), SEQ, world, rank, axis=2),
                      requires_grad=True) for _ in range(3))
    ring_attention(q, k, v, SEQ, is_causal=True).sum().backward()
    ring_attention(q, k, v, SEQ, is_causal=False)
    return True


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("ring_attention") / "ring.jsonl"
    minidist.launch(_worker, world_size=WORLD, transport="shm", trace=str(path), timeout=120)
    return path


@pytest.fixture(scope="module")
def events(trace_path):
    return trace.read_jsonl(trace_path)


def _text(renderable, width=100) -> str:
    console = Console(record=True, width=width, color_system=None, file=_Discard())
    console.print(renderable)
    return console.export_text()


class _Discard:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def test_frames_follow_the_k_v_blocks_round_the_ring(events):
    assert ring_attention_calls(events) == [0, 1]
    ring = ring_attention_replay(events)
    assert ring.steps == WORLD - 1 and ring.cells == 2 and ring.layout == "ring"
    # Before any message each rank has attended to its own block, in both chunks.
    assert ring.frames[0].holdings == tuple((frozenset({r}), frozenset({r})) for r in range(WORLD))
    block = 2 * B * H * (SEQ // WORLD) * D * 8   # K and V of 4 positions, float64
    for frame in ring.frames[1:]:
        step = frame.index
        # Every rank sends to its right neighbour the block it held, rank r - step + 1's.
        assert [(m.source, m.target) for m in frame.messages] == \
            [(r, (r + 1) % WORLD) for r in range(WORLD)]
        for message in frame.messages:
            owner = (message.source - step + 1) % WORLD
            assert message.text == f"K,V of rank {owner}" and message.nbytes == block
    final = ring.frames[-1].holdings
    for rank in range(WORLD):
        early, late = final[rank]
        # Causal, zig-zag: the early chunk r sees the blocks of ranks 0..r (their
        # early chunks), the late chunk 2n-1-r every rank's block.
        assert early == frozenset(range(rank + 1)) and late == frozenset(range(WORLD))


def test_without_the_mask_every_chunk_merges_every_block(events):
    ring = ring_attention_replay(events, call=1)
    assert all(cell == frozenset(range(WORLD)) for row in ring.frames[-1].holdings for cell in row)
    backward = ring_attention_replay(events, call=0, phase="backward")
    assert backward.steps == WORLD - 1 and backward.frames[0].phase == "backward"


def test_terminal_frames(events):
    ring = ring_attention_replay(events)
    before = _text(render_frame(ring, 0, color=False))
    assert "ring_attention · ring · 4 ranks" in before and "step 0 of 3 (before any message)" in before
    # Each rank has attended to its own block: its number in both cells, as the GIF draws it.
    assert all(f"rank {rank} │ {rank} {rank}│" in before for rank in range(WORLD))
    first = _text(render_frame(ring, 1, color=False))
    # Rank 1 merged rank 0's block into both chunks; rank 0 got rank 3's: only its late chunk sees it.
    assert "rank 1 │Σ2Σ2│" in first and "rank 0 │ 0Σ2│" in first
    assert "0 -> 1" in first and "merge" in first and "K,V of rank 0" in first
    assert "(n - 1) (α + 2 B H (T/n) D s β)" in first
    last = _text(render_frame(ring, 3, color=False))
    assert "rank 3 │ A A│" in last and "rank 0 │ 0 A│" in last
    # The legend names every symbol, in ring attention's words.
    assert "0..3: that rank's own K, V block only" in last
    assert "Σk: k ranks' K, V blocks merged so far" in " ".join(first.split())
    assert "A: every rank's K, V block merged" in " ".join(last.split())


def test_gif_and_player_have_one_frame_per_step(events, tmp_path):
    ring = ring_attention_replay(events)
    path = animate.save_gif(ring, tmp_path / "ring_attention.gif", fps=2)
    with Image.open(path) as image:
        assert image.n_frames == len(ring.frames) == WORLD
    page = tmp_path / "ring_attention.html"
    animate.save_html(ring, page)
    text = page.read_text(encoding="utf-8")
    steps = int(re.search(r'class="slider" type="range" min="0" max="(\d+)"', text).group(1)) + 1
    assert steps == WORLD and "<svg" in text and "K,V of rank" in text


def test_minidist_viz_replays_the_ring_of_a_ring_attention_trace(trace_path, tmp_path):
    """``minidist viz TRACE`` on a trace with no collective call but a ring
    attention steps through its K, V ring (and writes its GIF), where it
    used to fall back to the timeline."""
    from viz.commands import show

    console = Console(record=True, width=120, color_system=None, file=_Discard())
    assert show(trace_path, console=console) == 0
    text = console.export_text()
    assert "no collective calls to replay" not in text
    assert "2 collective calls; showing call 0" in text, text[:400]
    gif = tmp_path / "ring.gif"
    assert show(trace_path, gif=str(gif), call=1, console=console) == 0
    assert Image.open(gif).n_frames == len(ring_attention_replay(trace_path, 1).frames)


def test_legends_name_every_symbol_and_ranks_alike(events):
    """The GIF's legend names the "A" it draws, the cells show the terminal's
    symbols, and both call a rank "rank r" (the picture drew "r0" where the
    terminal printed "1")."""
    ring = ring_attention_replay(events)
    assert check_replay(ring, range(len(ring.frames))) == []
    assert [entry["symbol"] for entry in animate.legend_entries(ring)] == \
        ["0", "1", "2", "3", "Σk", "A", "outlined", "arrow"]
