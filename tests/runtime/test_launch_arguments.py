"""launch checks what it is given before any process starts, and says in
one line what was wrong: a timeout that is not a positive number of seconds,
args / kwargs of the wrong kind, a trace in a folder that does not exist, a
world the machine cannot hold; a fork the system refuses half-way is the
same kind of line, and leaves no rank and no segment behind."""

from __future__ import annotations

import multiprocessing.context
import os
import resource

import pytest

import minidist
from minidist.distributed import launch as launch_module


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"minidist_{os.getpid()}_")}


def _children() -> list[int]:
    """Live (not zombie) children of this process, but its segment reaper
    (which lives as long as this process does)."""
    from minidist.runtime import segment_reaper

    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" \
                and int(pid) != segment_reaper.reaper_pid():
            found.append(int(pid))
    return found


def _marker(path):
    def fn():
        open(path, "w").close()
        return 1
    return fn


@pytest.mark.parametrize("timeout, error, words", [
    (-1, ValueError, "launch(timeout=-1): the timeout bounds every wait in seconds, so it "
                     "must be a positive number; pass None for no limit."),
    (0, ValueError, "launch(timeout=0): "),
    (float("nan"), ValueError, "launch(timeout=nan): "),
    (float("inf"), ValueError, "launch(timeout=inf): pass timeout=None for no limit."),
    ("5", TypeError, "a number of seconds or None (no limit), got str"),
    (True, TypeError, "got bool"),
])
def test_a_timeout_is_a_positive_number_of_seconds(tmp_path, timeout, error, words):
    marker = tmp_path / "ran"
    with pytest.raises(error) as caught:
        minidist.launch(_marker(marker), world_size=2, timeout=timeout)
    assert words in str(caught.value)
    assert not marker.exists(), "nothing may run with a refused timeout"


@pytest.mark.parametrize("keywords, words", [
    (dict(kwargs=[1, 2]), "launch(kwargs=...) is a dict of fn's keyword arguments, got list"),
    (dict(args=5), "launch(args=...) is a tuple of fn's positional arguments, got int"),
    (dict(trace=5), "launch(trace=...) is a file path, got int"),
])
def test_args_and_kwargs_of_the_wrong_kind(tmp_path, keywords, words):
    with pytest.raises(TypeError, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        minidist.launch(_marker(tmp_path / "ran"), world_size=2, **keywords)
    assert not (tmp_path / "ran").exists()


def test_a_trace_in_a_missing_folder_is_refused_before_the_run(tmp_path):
    marker = tmp_path / "ran"
    missing = tmp_path / "missing" / "dir" / "t.jsonl"
    with pytest.raises(FileNotFoundError) as caught:
        minidist.launch(_marker(marker), world_size=2, trace=str(missing))
    assert f"the folder '{missing.parent}' does not exist" in str(caught.value)
    assert ".tmp" not in str(caught.value)
    assert not marker.exists(), "the run must not happen when its trace cannot be written"
    with pytest.raises(ValueError, match="is a folder; name a file in it"):
        minidist.launch(_marker(marker), world_size=2, trace=str(tmp_path))


def test_a_world_too_big_for_the_open_file_limit_is_refused(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        with pytest.raises(OSError) as caught:
            minidist.launch(_marker(tmp_path / "ran"), world_size=100, transport="shm")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    message = str(caught.value)
    assert "launch(world_size=100, transport='shm') is too big for this process" in message
    assert "may open 256" in message and "ulimit -n" in message
    assert "simulate" in message
    assert not (tmp_path / "ran").exists() and not _children()


def test_a_world_too_big_for_the_memory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(launch_module, "_available_memory", lambda: 20 << 20)
    with pytest.raises(OSError) as caught:
        minidist.launch(_marker(tmp_path / "ran"), world_size=3)
    assert "launch(world_size=3) is too big for this machine: each rank costs at least 8 MiB" \
        in str(caught.value)
    assert "24 MiB in all, and 20 MiB are available" in str(caught.value)


def test_a_fork_refused_half_way_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    started = []
    real_start = multiprocessing.context.ForkProcess.start

    def start(process):
        if len(started) == 2:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        started.append(process)
        real_start(process)

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", start)
    before = _segments()
    with pytest.raises(OSError) as caught:
        minidist.launch(_marker(tmp_path / "ran"), world_size=4, timeout=20)
    message = str(caught.value)
    assert message.startswith("[Errno 11] launch(world_size=4): the machine refused to start "
                              "rank 2 (ranks 0..1 had started) (BlockingIOError:"), message
    assert "Use fewer ranks" in message
    assert len(started) == 2 and not _children()
    assert _segments() <= before, "every segment of the refused launch is unlinked"
