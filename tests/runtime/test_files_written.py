"""Every file minidist writes is written whole or not at all, replaces a link
at its path instead of writing through it, and leaves no temporary file
behind, even when its writer is killed outright (SIGKILL) in the middle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.atomic_file import atomic_path, atomic_write

ROOT = Path(__file__).resolve().parents[2]


def _leftovers(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if ".tmp" in name)


def test_a_writer_killed_mid_write_leaves_a_temporary_that_the_next_write_removes(tmp_path):
    target = tmp_path / "run.trace.jsonl"
    pid = os.fork()
    if pid == 0:  # the writer: SIGKILLed half-way through its file
        try:
            with atomic_write(target) as file:
                file.write("half a trace\n")
                file.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)
    assert not target.exists(), "the target is never seen half-written"
    stale = _leftovers(tmp_path)
    assert len(stale) == 1 and f".{pid}." in stale[0]
    # A live writer's temporary (ours, made by hand here) is not touched.
    alive = tmp_path / f".run.trace.jsonl.{os.getpid()}.abcd.tmp"
    alive.write_text("still being written")
    with atomic_write(target) as file:
        file.write("a whole trace\n")
    assert target.read_text() == "a whole trace\n"
    assert _leftovers(tmp_path) == [alive.name], "the dead writer's temporary is removed"


def test_atomic_path_replaces_a_link_and_keeps_the_extension(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    link = tmp_path / "out.png"
    link.symlink_to(victim)
    with atomic_path(link) as name:
        assert name.endswith(".png") and os.path.dirname(name) == str(tmp_path)
        Path(name).write_bytes(b"png bytes")
    assert not link.is_symlink() and link.read_bytes() == b"png bytes"
    assert victim.read_text() == "not yours"
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "failed.gif") as name:
        Path(name).write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert not (tmp_path / "failed.gif").exists() and _leftovers(tmp_path) == []


def _ring():
    x = np.full(8, float(dist.get_rank()), np.float32)
    dist.all_reduce(x, algorithm="ring")
    return float(x[0])


@pytest.mark.timeout(180)
def test_viz_outputs_replace_links_instead_of_writing_through_them(tmp_path):
    trace = tmp_path / "ring.jsonl"
    minidist.launch(_ring, world_size=2, transport="pipe", trace=str(trace))
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    outputs = {"--chrome": "out.json", "--timeline": "out.png", "--gif": "out.gif",
               "--html": "out.html"}
    for name in outputs.values():
        (tmp_path / name).symlink_to(victim)
    arguments = [item for option, name in outputs.items()
                 for item in (option, str(tmp_path / name))]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "minidist.cli", "viz", str(trace), *arguments],
                          capture_output=True, text=True, timeout=170, cwd=ROOT,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 170
    assert victim.read_text() == "not yours", "an output was written through a link"
    for name in outputs.values():
        path = tmp_path / name
        assert not path.is_symlink() and path.stat().st_size > 0, name
    assert _leftovers(tmp_path) == []

