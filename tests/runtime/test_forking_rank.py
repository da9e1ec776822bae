"""A rank that forked a child and then died.

The child inherits the worker's pipes (its result, log and transport
pipes). Before the fix, ``launch`` watched the worker through a pipe the
child kept open, so the death was never seen: the run ended at its timeout,
blaming a waiting rank, and the child lived on; ``minidist run`` named the
rank but the child outlived it, holding the launcher's output open. Now the
death is seen at once through the process itself, and the worker's process
group (the child in it) is killed with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.runtime.segments import creator_prefix

TRANSPORTS = ["shm", "pipe"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 20  # the run's: a death not seen would take this long
FAST = 8.0  # seconds from start to error, a `minidist run`'s start included


def alive(pid: int) -> bool:
    """Running or stopped (a zombie is dead: nobody may reap it in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_nothing_left(pid_dir, creators, within=2.0):
    """No process whose pid is in ``pid_dir`` is alive, no segment of ``creators`` remains."""
    pids = [int(name) for name in os.listdir(pid_dir)]
    deadline = time.monotonic() + within
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)], "processes of the run outlived it"
    creators = list(creators) + pids
    assert not [name for name in os.listdir("/dev/shm")
                if any(name.startswith(creator_prefix(pid)) for pid in creators)]


def fork_then_die_on_rank_1(pid_dir):
    """Every rank records its pid; rank 1, in the fourth all_reduce, forks a
    sleeping child (recorded too) and SIGKILLs itself."""
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    for step in range(100):
        if dist.get_rank() == 1 and step == 3:
            child = os.fork()
            if child == 0:
                time.sleep(30)
                os._exit(0)
            open(os.path.join(pid_dir, str(child)), "w").close()
            os.kill(os.getpid(), 9)
        dist.all_reduce(np.ones(4))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_launch_sees_a_rank_that_forked_die_and_ends_its_child(tmp_path, transport):
    start = time.monotonic()
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(fork_then_die_on_rank_1, world_size=3, transport=transport,
                        args=(str(tmp_path),), timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    first = str(caught.value).splitlines()[0]
    assert first == "rank 1 was killed by SIGKILL before returning a result", first
    assert caught.value.rank == 1 and caught.value.kind == "died"
    assert elapsed < FAST, f"took {elapsed:.1f} s"
    assert len(os.listdir(tmp_path)) == 4  # three ranks and the child
    assert_nothing_left(tmp_path, [os.getpid()])


SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import minidist.distributed as dist

    dist.init_process_group()
    pid_dir = sys.argv[1]
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    for step in range(100):
        if dist.get_rank() == 1 and step == 3:
            child = os.fork()
            if child == 0:
                time.sleep(30)
                os._exit(0)
            open(os.path.join(pid_dir, str(child)), "w").close()
            os.kill(os.getpid(), 9)
        dist.all_reduce(np.ones(4))
""")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_minidist_run_ends_with_a_rank_that_forked_and_died(tmp_path, transport):
    script = tmp_path / "fork_then_die.py"
    script.write_text(SCRIPT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    start = time.monotonic()
    # Output through pipes, as a test runner or `| tee` reads it: a child left
    # holding them kept this waiting until the child ended.
    run = subprocess.Popen([sys.executable, "-m", "minidist.cli", "run", "-n", "3",
                            "--transport", transport, "--timeout", str(TIMEOUT), str(script),
                            str(pid_dir)], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    _, stderr = run.communicate(timeout=60)
    elapsed = time.monotonic() - start
    assert run.returncode == 1, stderr
    assert "minidist run: rank 1 was killed by SIGKILL before returning a result" in stderr
    assert elapsed < FAST, f"took {elapsed:.1f} s"
    assert len(os.listdir(pid_dir)) == 4
    assert_nothing_left(pid_dir, [run.pid])
