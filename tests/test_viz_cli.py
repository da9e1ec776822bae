"""``minidist viz`` and ``minidist demo COLLECTIVE``, called through minidist.cli.main."""

import re

import pytest
from PIL import Image
from viz_reference import ring_all_reduce_events

from minidist import trace
from minidist.cli import main


@pytest.fixture
def ring_trace(tmp_path):
    path = tmp_path / "ring.jsonl"
    trace.write_jsonl(path, ring_all_reduce_events(4, count=16),
                      trace.make_header(4, transport="shm"))
    return path


def test_viz_writes_gif_html_timeline_and_chrome(ring_trace, tmp_path, capsys):
    outputs = {name: tmp_path / name for name in ("a.gif", "a.html", "t.png", "c.json")}
    assert main(["viz", str(ring_trace), "--gif", str(outputs["a.gif"]),
                 "--html", str(outputs["a.html"]), "--timeline", str(outputs["t.png"]),
                 "--chrome", str(outputs["c.json"])]) == 0
    with Image.open(outputs["a.gif"]) as image:
        assert image.n_frames == 6
    html = outputs["a.html"].read_text()
    assert re.search(r"new Array\(6\)", html)
    with Image.open(outputs["t.png"]) as image:
        assert image.size[0] > 500
    assert outputs["c.json"].stat().st_size > 0
    assert "6 frames" in capsys.readouterr().out


def test_viz_without_outputs_prints_every_frame_when_not_a_terminal(ring_trace, capsys):
    assert main(["viz", str(ring_trace), "--no-color"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for step in range(1, 7):
        assert f"step {step} of 6" in out


def test_viz_errors_are_clear(ring_trace, tmp_path, capsys):
    assert main(["viz", str(tmp_path / "missing.jsonl")]) == 2
    assert "no trace at" in capsys.readouterr().err
    assert main(["viz", str(ring_trace), "--call", "3"]) == 2
    assert "numbered 0 to 0" in capsys.readouterr().err


def test_viz_of_a_trace_without_collectives_falls_back_to_the_timeline(tmp_path, capsys):
    path = tmp_path / "p2p.jsonl"
    events = [{"rank": 0, "kind": "send", "peer": 1, "bytes": 8, "tag": 1, "label": "",
               "start": 0, "end": 10, "seq": 0, "group": 0, "channel": 0},
              {"rank": 1, "kind": "recv", "peer": 0, "bytes": 8, "tag": 1, "label": "",
               "start": 0, "end": 20, "seq": 0, "group": 0, "channel": 0}]
    trace.write_jsonl(path, events, trace.make_header(2))
    assert main(["viz", str(path)]) == 0
    assert "timeline instead" in " ".join(capsys.readouterr().out.split())
    assert (tmp_path / "p2p.timeline.png").exists()


def test_demo_rejects_unknown_names(capsys):
    assert main(["demo", "allreduse"]) == 2
    assert "no collective called 'allreduse'" in capsys.readouterr().err
    assert main(["demo", "broadcast", "--algorithm", "ring"]) == 2
    assert "its algorithms are" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_demo_ring_allreduce_on_four_processes(tmp_path, capsys):
    kept = tmp_path / "ring.jsonl"
    assert main(["demo", "ring-allreduce", "-n", "4", "--no-color", "--trace", str(kept)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "all_reduce with the ring algorithm on 4 processes" in out
    assert kept.exists()
    if "no collective calls" not in out:  # traces with collective labels (schema 2)
        assert "step 6 of 6" in out


@pytest.mark.timeout(120)
def test_demo_simulated_broadcast_writes_a_gif(tmp_path, capsys):
    gif = tmp_path / "broadcast.gif"
    assert main(["demo", "broadcast", "--algorithm", "binomial", "-n", "8", "--simulate",
                 "--gif", str(gif), "--trace", str(tmp_path / "b.jsonl")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    if "no collective calls" not in out:
        with Image.open(gif) as image:
            assert image.n_frames == 3
