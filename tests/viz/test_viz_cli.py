"""``minidist viz`` and ``minidist demo COLLECTIVE``, called through minidist.cli.main."""

import json
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
        assert image.n_frames == 7  # step 0 (before any message) to step 6
    html = outputs["a.html"].read_text()
    assert re.search(r'type="range" min="0" max="6"', html) and "http" not in html
    with Image.open(outputs["t.png"]) as image:
        assert image.size[0] > 500
    assert outputs["c.json"].stat().st_size > 0
    out = " ".join(capsys.readouterr().out.split())
    assert "steps 0 to 6: 7 frames" in out and "it needs no network" in out


def test_viz_without_outputs_prints_every_frame_when_not_a_terminal(ring_trace, capsys):
    assert main(["viz", str(ring_trace), "--no-color"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "step 0 of 6 (before any message)" in out
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
    # An output option named is written or refused, never replaced by another.
    for option in ("--html", "--gif"):
        target = tmp_path / f"p2p{option.replace('--', '.')}"
        assert main(["viz", str(path), option, str(target)]) == 2
        error = _one_line_error(capsys, "viz")
        assert "has no collective calls to animate" in error and "--timeline" in error
        assert not target.exists()


@pytest.mark.parametrize("argv, refused", [
    (["demo", "pipeline", "--html", "pipe.html"], "--html: `minidist demo pipeline` has no"),
    (["demo", "data-parallel", "--gif", "dp.gif"], "--gif: `minidist demo data-parallel`"),
    (["demo", "memory", "--timeline", "t.png"], "it writes --plot"),
    (["demo", "ring-allreduce", "--plot", "p.png"], "it writes --gif, --html, --timeline"),
    (["demo", "--html", "tour.html"], "the tour (`minidist demo`) has no such output"),
])
def test_demo_refuses_an_output_it_does_not_write(argv, refused, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert refused in _one_line_error(capsys, "demo")
    assert not any(tmp_path.iterdir())


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
    assert "no collective calls" not in out
    assert "step 6 of 6" in out


@pytest.mark.timeout(120)
def test_demo_simulated_broadcast_writes_a_gif(tmp_path, capsys):
    gif = tmp_path / "broadcast.gif"
    assert main(["demo", "broadcast", "--algorithm", "binomial", "-n", "8", "--simulate",
                 "--gif", str(gif), "--trace", str(tmp_path / "b.jsonl")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no collective calls" not in out
    with Image.open(gif) as image:
        assert image.n_frames == 3 + 1  # log2(8) rounds after step 0


def _one_line_error(capsys, command: str) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"minidist {command}: ") and "\n" not in err, err
    assert "Traceback" not in captured.err
    return err


@pytest.mark.parametrize("n", ["1", "0", "-2"])
@pytest.mark.parametrize("simulate", [["--simulate"], []])
def test_demo_rejects_fewer_than_two_ranks_up_front(n, simulate, capsys):
    assert main(["demo", "all_reduce", "-n", n, *simulate]) == 2
    assert "at least 2 ranks" in _one_line_error(capsys, "demo")


def test_demo_prints_nothing_before_rejecting_one_rank(capsys):
    assert main(["demo", "all_reduce", "-n", "1", "--simulate"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "nobody to send to" in captured.err


@pytest.mark.parametrize("simulate", [["--simulate"], []])
@pytest.mark.parametrize("root", ["9", "3", "-1"])
def test_demo_rejects_a_root_outside_the_world(root, simulate, capsys):
    assert main(["demo", "broadcast", "--root", root, "-n", "3", *simulate]) == 2
    assert f"--root {root} is not a rank of the 3-rank world" in _one_line_error(capsys, "demo")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("option, name", [("--chrome", "c.json"), ("--html", "a.html"),
                                          ("--timeline", "t.png"), ("--gif", "a.gif")])
def test_viz_rejects_outputs_in_missing_folders(ring_trace, tmp_path, option, name, capsys):
    target = tmp_path / "missing" / name
    assert main(["viz", str(ring_trace), option, str(target)]) == 2
    assert "does not exist" in _one_line_error(capsys, "viz")
    assert not target.parent.exists()


@pytest.mark.parametrize("option, name", [("--chrome", "c.jsonl"), ("--html", "a.gif"),
                                          ("--timeline", "t.gif"), ("--gif", "a.png")])
def test_viz_rejects_outputs_with_the_wrong_extension(ring_trace, tmp_path, option, name,
                                                      capsys):
    assert main(["viz", str(ring_trace), option, str(tmp_path / name),
                 "--chrome" if option != "--chrome" else "--html",
                 str(tmp_path / ("c.json" if option != "--chrome" else "a.html"))]) == 2
    assert "must end in" in _one_line_error(capsys, "viz")
    assert list(tmp_path.iterdir()) == [ring_trace]  # checked before any work


@pytest.mark.parametrize("option, name", [("--trace", "t.jsonl"), ("--gif", "a.gif"),
                                          ("--html", "a.html"), ("--timeline", "t.png")])
def test_demo_rejects_outputs_in_missing_folders(tmp_path, option, name, capsys):
    assert main(["demo", "all_reduce", "-n", "2", "--simulate",
                 option, str(tmp_path / "missing" / name)]) == 2
    assert "does not exist" in _one_line_error(capsys, "demo")
    assert capsys.readouterr().out == ""


def test_demo_rejects_a_trace_that_is_not_jsonl(tmp_path, capsys):
    assert main(["demo", "all_reduce", "-n", "2", "--simulate",
                 "--trace", str(tmp_path / "t.json")]) == 2
    assert "must end in .jsonl" in _one_line_error(capsys, "demo")


def test_viz_reports_a_failed_write_in_one_line(ring_trace, tmp_path, monkeypatch, capsys):
    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(trace, "write_chrome", refuse)
    target = tmp_path / "c.json"
    assert main(["viz", str(ring_trace), "--chrome", str(target)]) == 2
    assert f"cannot write {target}: Permission denied" in _one_line_error(capsys, "viz")


@pytest.mark.parametrize("speed", ["0", "-1", "-0.5"])
def test_viz_rejects_a_speed_that_is_not_positive(ring_trace, speed, capsys):
    assert main(["viz", str(ring_trace), "--play", "--speed", speed]) == 2
    assert "--speed" in _one_line_error(capsys, "viz")


def test_demo_rejects_a_speed_that_is_not_positive(capsys):
    assert main(["demo", "all_reduce", "-n", "2", "--simulate", "--play", "--speed", "0"]) == 2
    assert "--speed 0" in _one_line_error(capsys, "demo")


def _header_line() -> str:
    return json.dumps(trace.make_header(2))


@pytest.mark.parametrize("content", [
    "[1,2]\n",
    "{{not json at all\n",
    "\x00\x01garbage\n",
    "42\n",
    "",
    '{"schema": "something.else"}\n',
    "HEADER\n5\n",
    "HEADER\n[1, 2]\n",
    'HEADER\n{"rank": 0}\n',
    "HEADER\n{{broken\n",
], ids=["list", "garbage", "binary", "number", "empty", "other-schema", "int-event",
        "list-event", "event-without-keys", "broken-event"])
def test_viz_of_a_file_that_is_not_a_trace(tmp_path, content, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(content.replace("HEADER", _header_line()))
    assert main(["viz", str(path)]) == 2
    assert f"{path} is not a minidist trace: " in _one_line_error(capsys, "viz")
    assert main(["viz", str(path), "--chrome", str(tmp_path / "c.json")]) == 2
    _one_line_error(capsys, "viz")
    assert not (tmp_path / "c.json").exists()


def _linear():
    from minidist import nn

    return nn.Linear(4, 2)


def _ddp_two_steps():
    import numpy as np

    from minidist import Tensor, optim
    from minidist.parallel.data.ddp import DistributedDataParallel

    ddp = DistributedDataParallel(_linear(), algorithm="ring")
    optimizer = optim.SGD(ddp.parameters(), lr=0.1)
    x = np.ones((3, 4), np.float32)
    for _ in range(2):
        optimizer.zero_grad()
        ddp(Tensor(x)).sum().backward()
        optimizer.step()


@pytest.mark.timeout(120)
def test_viz_of_a_ddp_trace_animates_the_first_gradient_all_reduce(tmp_path, capsys):
    import minidist
    from viz.commands import default_call
    from viz.replay import replays

    path = tmp_path / "ddp.jsonl"
    minidist.launch(_ddp_two_steps, world_size=2, trace=str(path))
    calls = replays(trace.read_jsonl(path))
    # The run starts with the weights' broadcast, and each step with the
    # all_reduce of the example count (one element): calls viz must skip.
    assert calls[0].collective == "broadcast"
    assert any(call.collective == "all_reduce" and call.count == 1 for call in calls)
    first = default_call(calls)
    gradients = sum(parameter.data.size for parameter in _linear().parameters())
    assert calls[first].collective == "all_reduce" and calls[first].count == gradients
    assert all(call.collective != "all_reduce" or call.count == 1 for call in calls[:first])
    gif = tmp_path / "ddp.gif"
    assert main(["viz", str(path), "--gif", str(gif)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"showing call {first}: all_reduce ring, the first all_reduce of more than one " \
        "element" in out
    with Image.open(gif) as image:
        assert image.n_frames == len(calls[first].frames)
    assert main(["viz", str(path), "--call", "0", "--gif", str(gif)]) == 0
    assert "showing call 0: broadcast" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("content,why", [
    (b"", "it is empty"),
    (b'{"loss": 0.5}\n', "it does not start with a minidist trace header (schema None, "
                         "expected 'minidist.trace')"),
    (b"\x7fELF\x02\x01\xd0\xff\x00\x00\n", "it is not text (byte 0xd0 is not UTF-8)"),
    (b"hello\n", "its first line is not JSON (Expecting value)"),
], ids=["empty", "json-not-a-trace", "binary", "text"])
def test_viz_says_not_a_trace_once(tmp_path, content, why, capsys):
    """Before the fix the message said "is not a minidist trace: is not a minidist
    trace": the reason once, not twice."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    assert main(["viz", str(path)]) == 2
    assert _one_line_error(capsys, "viz") == f"minidist viz: {path} is not a minidist trace: {why}"


def _damaged(lines: list[str], damage: str) -> list[str]:
    """The lines of a whole trace, damaged one way."""
    if damage == "cut":
        return lines[:30]  # at a line's end: every line left is whole
    if damage == "header only":
        return lines[:1]
    if damage == "no events":
        return [json.dumps({**json.loads(lines[0]), "events": 0})]
    first_send = next(number for number, line in enumerate(lines)
                      if json.loads(line).get("kind") == "send")
    event = json.loads(lines[first_send])
    event.update({"peer": 99} if damage == "peer 99" else {"bytes": -64})
    return lines[:first_send] + [json.dumps(event)] + lines[first_send + 1:]


@pytest.mark.parametrize("damage, words", [
    ("cut", ["looks truncated: its header counts 52 events, the file holds 29 (23 missing); "
             "incomplete: call 0 (all_reduce ring: messages of rank 0 without their other "
             "end)", "Nothing is drawn from it"]),
    ("header only", ["looks truncated: its header counts 52 events, the file holds 0"]),
    ("no events", ["holds no events, only its header: nothing to draw"]),
    ("peer 99", ["damaged.jsonl, line 3: peer 99 is not a rank of this 4-rank trace (ranks 0 to 3)"]),
    ("bytes -64", ["damaged.jsonl, line 3: bytes -64: a message's size is a whole number of bytes"]),
])
def test_viz_of_a_damaged_trace_says_what_is_wrong_and_draws_nothing(ring_trace, tmp_path,
                                                                       damage, words, capsys):
    path = tmp_path / "damaged.jsonl"
    path.write_text("\n".join(_damaged(ring_trace.read_text().splitlines(), damage)) + "\n")
    outputs = ["--gif", str(tmp_path / "a.gif"), "--timeline", str(tmp_path / "t.png"),
               "--chrome", str(tmp_path / "c.json")]
    for options in ([], ["--no-color"], outputs):
        assert main(["viz", str(path), *options]) == 2
        error = _one_line_error(capsys, "viz")
        for word in words:
            assert word in error, error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged.jsonl", "ring.jsonl"]
