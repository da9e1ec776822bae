"""Failing cleanly: every way a run can go wrong ends fast, with one clear
error, and leaves no process and no shared-memory segment behind.

Each test counts the minidist segments in /dev/shm before and after (other
programs may be running minidist at the same time, so a segment counts as
leaked only if it is new and still there a moment later)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.runtime.segments import PREFIX

TRANSPORTS = ["shm", "pipe"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(PREFIX)}


def mapped_segments() -> set[str]:
    """Segments some live process has mapped: in use by a run, not leaked."""
    mapped = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue  # what this test process still maps after its run is a leak too
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    if "/dev/shm/" + PREFIX in line:
                        mapped.add(line.rsplit("/", 1)[-1].split()[0])
        except OSError:
            pass
    return mapped


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """A segment is leaked if it is new, still named after a short grace, and
    no process maps it (other test runs may be using minidist at the same time)."""
    before = segments()
    yield
    leaked = segments() - before
    deadline = time.monotonic() + 3.0
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked = (leaked & segments()) - mapped_segments()
    assert not leaked, f"shared-memory segments left behind: {sorted(leaked)}"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def launch_expecting_failure(fn, world_size=3, transport="shm", **kwargs):
    start = time.monotonic()
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(fn, world_size=world_size, transport=transport, **kwargs)
    return caught.value, time.monotonic() - start


# --------------------------------------------------------------------------- a worker raises


def raise_on_rank_1_while_others_wait_or_compute():
    rank = dist.get_rank()
    if rank == 1:
        time.sleep(0.2)
        raise ValueError("bad value on purpose")
    if rank == 2:
        end = time.monotonic() + 60
        while time.monotonic() < end:  # busy in its own code: never looks at the abort flag
            pass
    dist.recv(np.zeros(4), 1, timeout=60)  # rank 0: blocked on the rank that fails


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_worker_that_raises_stops_everyone(transport):
    error, elapsed = launch_expecting_failure(raise_on_rank_1_while_others_wait_or_compute,
                                              transport=transport)
    assert error.rank == 1 and error.kind == "exception"
    assert error.remote_type == "ValueError"
    assert "rank 1 failed with ValueError: bad value on purpose" in str(error)
    assert "raise ValueError" in error.remote_traceback  # the worker's own traceback
    assert "raise_on_rank_1_while_others_wait_or_compute" in str(error)
    others = dict(error.other_failures)
    # rank 0 was waiting for rank 1: it either saw rank 1 fail or was told to stop
    assert "AbortedError" in others[0] or "rank 1 failed" in others[0]
    assert "SIGTERM" in others[2]
    assert elapsed < 5.0


# --------------------------------------------------------------------------- a worker dies


def kill_myself_on_rank_2():
    if dist.get_rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.recv(np.zeros(1), 2, timeout=60)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_worker_killed_with_sigkill_stops_everyone(transport):
    error, elapsed = launch_expecting_failure(kill_myself_on_rank_2, transport=transport)
    assert error.rank == 2 and error.kind == "died"
    assert "rank 2 was killed by SIGKILL before returning a result" in str(error)
    assert elapsed < 5.0


def exit_early_on_rank_0():
    if dist.get_rank() == 0:
        os._exit(3)
    dist.barrier()


@pytest.mark.timeout(30)
def test_a_worker_that_exits_is_reported_with_its_code():
    error, elapsed = launch_expecting_failure(exit_early_on_rank_0, world_size=2)
    assert error.rank == 0 and "exited with code 3" in str(error)
    assert elapsed < 5.0


# --------------------------------------------------------------------------- timeouts


def everyone_stuck_somewhere():
    rank = dist.get_rank()
    if rank == 0:
        dist.recv(np.zeros(1), 1, tag=7, timeout=0.5)
    elif rank == 1:
        dist.recv(np.zeros(1), 2, tag=3)
    elif rank == 2:
        time.sleep(30)  # in its own code, not receiving what rank 3 sends
    else:
        dist.send(np.zeros(1 << 23), 2, tag=4)  # 64 MiB: more than any buffer, so it waits


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_timeout_reports_what_every_rank_was_doing(transport):
    error, elapsed = launch_expecting_failure(everyone_stuck_somewhere, world_size=4,
                                              transport=transport, timeout=20)
    assert error.rank == 0 and error.kind == "timeout"
    text = str(error)
    assert "rank 0 timed out after 0.5 s waiting in recv from 1, tag 7" in text
    assert "rank 0: waiting in recv from 1, tag 7" in text
    assert "rank 1: waiting in recv from 2, tag 3" in text
    assert "rank 2: running its own code" in text
    assert "rank 3: waiting in send to 2, tag 4" in text
    assert elapsed < 5.0


def mutual_recv():
    dist.recv(np.zeros(1), 1 - dist.get_rank(), tag=1, timeout=0.5 if dist.get_rank() else 5)


@pytest.mark.timeout(30)
def test_a_deadlock_is_named_in_the_report():
    error, _ = launch_expecting_failure(mutual_recv, world_size=2)
    assert error.rank == 1
    assert "ranks 1 and 0 each wait to receive from the other: a deadlock" in str(error)


def wrong_tag():
    if dist.get_rank() == 0:
        dist.send(np.zeros(2), 1, tag=3)
        dist.barrier()
    else:
        try:
            dist.recv(np.zeros(2), 0, tag=4, timeout=0.5)
        finally:
            dist.barrier()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_tag_mismatch_is_named_in_the_report(transport):
    error, _ = launch_expecting_failure(wrong_tag, world_size=2, transport=transport)
    assert error.rank == 1 and error.kind == "timeout"
    assert "from rank 0: tag 3, float64 array of shape (2,)" in str(error)
    assert "rank 0 sent tag 3, but rank 1 waits for tag 4" in str(error)


# --------------------------------------------------------------------------- mismatches


def one_rank_skips_the_barrier():
    if dist.get_rank() == 0:
        dist.barrier()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mismatched_calls_end_at_once_when_the_peer_finished(transport):
    error, elapsed = launch_expecting_failure(one_rank_skips_the_barrier, world_size=2,
                                              transport=transport, timeout=30)
    # The cause is the rank that skipped the barrier and returned, not the one left waiting.
    assert error.rank == 1 and error.kind == "returned" and error.noticed_by == 0
    assert error.remote_type == "PeerGoneError"
    assert str(error).startswith("rank 1 returned from its function while rank 0 still waited")
    assert elapsed < 5.0  # long before the 30 s timeout


def return_a_lock():
    import threading

    return threading.Lock()


@pytest.mark.timeout(30)
def test_an_unpicklable_result_is_reported():
    error, _ = launch_expecting_failure(return_a_lock, world_size=1)
    assert "cannot be pickled" in str(error)


@pytest.mark.timeout(10)
def test_calls_before_init_say_how_to_start():
    assert not dist.is_initialized()
    for call in (lambda: dist.get_rank(), lambda: dist.send(np.zeros(1), 1),
                 lambda: dist.recv(np.zeros(1), 0), lambda: dist.barrier(),
                 lambda: dist.new_group([0])):
        with pytest.raises(dist.NotInitializedError, match="minidist.launch"):
            call()


@pytest.mark.timeout(10)
def test_bad_launch_arguments():
    with pytest.raises(ValueError, match="world_size"):
        minidist.launch(print, world_size=0)
    with pytest.raises(ValueError, match="transport"):
        minidist.launch(print, world_size=2, transport="carrier-pigeon")
    with pytest.raises(TypeError, match="function"):
        minidist.launch("not a function", world_size=2)


# --------------------------------------------------------------------------- the parent is hit

PARENT_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import minidist, minidist.distributed as dist

    pid_dir, transport = sys.argv[1], sys.argv[2]

    def worker():
        open(os.path.join(pid_dir, str(os.getpid())), "w").close()
        if dist.get_rank() == 0:
            while True:  # busy in its own code
                pass
        dist.recv(np.zeros(1), 0, timeout=None)  # would wait forever

    minidist.launch(worker, world_size=3, transport=transport, timeout=None)
""")


def start_parent(tmp_path, transport):
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    parent = subprocess.Popen([sys.executable, str(script), str(pid_dir), transport],
                              cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while len(os.listdir(pid_dir)) < 3:
        assert time.monotonic() < deadline, "workers did not start"
        assert parent.poll() is None, parent.communicate()
        time.sleep(0.05)
    time.sleep(0.2)  # let the waiting ranks settle in their recv
    return parent, [int(name) for name in os.listdir(pid_dir)]


def assert_all_gone(pids, within=5.0):
    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"workers still running: {[p for p in pids if alive(p)]}"
        time.sleep(0.05)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupting_the_parent_stops_everything(tmp_path, transport, how):
    parent, pids = start_parent(tmp_path, transport)
    start = time.monotonic()
    if how == "ctrl-c":
        os.killpg(parent.pid, signal.SIGINT)  # a terminal sends it to the whole group
    else:
        parent.send_signal(signal.SIGTERM)
    try:
        parent.wait(timeout=5)
    except subprocess.TimeoutExpired:
        parent.kill()
        pytest.fail(f"the parent did not stop within 5 s of {how}")
    assert time.monotonic() - start < 5.0
    assert_all_gone(pids, within=0.5)
    _, stderr = parent.communicate()
    if how == "sigterm":
        assert parent.returncode == 143, stderr.decode()


@pytest.mark.timeout(60)
def test_killing_the_parent_takes_the_workers_with_it(tmp_path):
    parent, pids = start_parent(tmp_path, "shm")
    parent.kill()
    parent.wait(timeout=5)
    assert_all_gone(pids, within=5.0)
    # The segments go with the resource tracker when the last process using it is gone;
    # the autouse fixture checks that (it waits a little).
