"""The segment reaper: a creator's segments are unlinked however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CREATOR = textwrap.dedent("""
    import sys
    from minidist.runtime import segment_reaper
    from minidist.runtime.segments import Segment

    kept = [Segment.create(4096, "kept"), Segment.create(1 << 20, "kept")]
    gone = Segment.create(4096, "unlinked")
    gone.unlink()
    gone.unlink()  # twice: harmless
    print(segment_reaper.reaper_pid(), *(segment.name for segment in kept), flush=True)
    sys.stdin.readline()  # the test looks, then kills this process or lets it end
    for segment in kept:
        segment.unlink()
        segment.close()
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["kill", "clean"])
def test_segments_are_unlinked_however_their_creator_ends(tmp_path, how):
    script = tmp_path / "creator.py"
    script.write_text(CREATOR)
    creator = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    reaper, *names = creator.stdout.readline().split()
    reaper = int(reaper)
    assert reaper != creator.pid and alive(reaper)
    assert all(os.path.exists(f"/dev/shm/{name}") for name in names)
    if how == "kill":
        creator.send_signal(signal.SIGKILL)  # no cleanup code of its own runs
    creator.communicate("go\n", timeout=30)
    assert creator.returncode == (-9 if how == "kill" else 0)
    assert wait_until(lambda: not any(os.path.exists(f"/dev/shm/{name}") for name in names))
    assert wait_until(lambda: not alive(reaper)), "the reaper outlived its creator"


def test_a_fork_of_the_creator_gets_a_reaper_of_its_own():
    from minidist.runtime import segment_reaper
    from minidist.runtime.segments import Segment

    segment = Segment.create(64, "parent")
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: no reaper until it creates a segment
            try:
                own = segment_reaper.reaper_pid()
                child_segment = Segment.create(64, "child")
                child_segment.unlink()
                child_segment.close()
                os.write(write, f"{own} {segment_reaper.reaper_pid()}".encode())
            finally:
                os._exit(0)
        os.close(write)
        before, after = os.read(read, 100).decode().split()
        os.close(read)
        os.waitpid(pid, 0)
        assert before == "None"
        assert after not in ("None", str(segment_reaper.reaper_pid()))
    finally:
        segment.unlink()
        segment.close()
