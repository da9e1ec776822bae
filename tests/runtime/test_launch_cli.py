"""`minidist run -n N script.py`: the torchrun-style launcher."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from minidist import trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELLO = os.path.join(ROOT, "examples", "hello.py")


def minidist_run(*arguments, timeout=60, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "minidist.cli", "run", *arguments],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def segments():
    return {name for name in os.listdir("/dev/shm") if name.startswith("minidist_")}


def mapped_segments():
    """Segments a live process other than this one maps (a run in progress)."""
    mapped = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                mapped.update(line.rsplit("/", 1)[-1].split()[0] for line in maps
                              if "/dev/shm/minidist_" in line)
        except OSError:
            pass
    return mapped


def leaked_since(before):
    """New segments still named after a short grace and mapped by no process
    (other test runs may be using minidist at the same time)."""
    leaked = segments() - before
    deadline = time.monotonic() + 3.0
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked = (leaked & segments()) - mapped_segments()
    return leaked


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_hello_runs_on_four_ranks(transport, tmp_path):
    path = tmp_path / "hello.trace.jsonl"
    done = minidist_run("-n", "4", "--transport", transport, "--trace", str(path), HELLO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("the ring of 4 ranks added up to 6 (expected 6)") == 1
    logs = done.stdout + done.stderr
    for rank in range(4):
        assert f"[rank {rank}] hello from rank {rank} of 4" in logs
    assert "[rank 0] got the total 6 back from rank 3" in logs  # what rank 0 did, in its words
    recorded = trace.read_jsonl(path)
    assert recorded.header["world_size"] == 4
    pairs = list(trace.iter_messages(recorded.events))
    ring = [(send["rank"], send["peer"]) for send, _ in pairs if send["label"] == ""]
    assert sorted(ring) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert all(receive is not None for _, receive in pairs)


SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import minidist.distributed as dist

    dist.init_process_group()
    rank = dist.get_rank()
    assert os.environ["MINIDIST_WORLD_SIZE"] == "3"
    assert os.environ["MINIDIST_TRANSPORT"] in ("shm", "pipe")
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1" or os.cpu_count() >= 6
    if sys.argv[1:] == ["fail"] and rank == 2:
        raise RuntimeError("rank two gives up")
    if sys.argv[1:] == ["exit"] and rank == 1:
        sys.exit(4)
    if sys.argv[1:] == ["interrupt"] and rank == 1:
        raise KeyboardInterrupt  # reported as any exception (Python then ends by SIGINT)
    dist.barrier()
    sys.stdout.write(f"args {sys.argv[1:]} rank {rank}\\n")  # one write: no interleaving
    sys.stdout.flush()
""")


@pytest.mark.timeout(60)
def test_script_arguments_and_environment(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = minidist_run("-n", "3", str(script), "alpha", "--beta")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("args ['alpha', '--beta']") == 3


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_a_failing_rank_ends_the_run_with_its_traceback(tmp_path, transport):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    before = segments()
    start = time.monotonic()
    done = minidist_run("-n", "3", "--transport", transport, str(script), "fail")
    assert time.monotonic() - start < 10
    assert done.returncode == 1
    assert "rank 2 failed with RuntimeError: rank two gives up" in done.stderr
    assert 'raise RuntimeError("rank two gives up")' in done.stderr
    assert "program.py" not in done.stderr  # the traceback starts in the script
    assert not leaked_since(before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how, said", [("exit", "rank 1 exited with code 4"),
                                       ("interrupt", "rank 1 failed with KeyboardInterrupt")])
def test_an_exit_code_is_reported(tmp_path, how, said):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = minidist_run("-n", "3", str(script), how)
    assert done.returncode == 1
    assert said in done.stderr


# A rank is a fork of the launcher (minidist/runtime/program.py) that must
# look, to the script, like `python script.py`: each check is one line here.
AS_PYTHON = textwrap.dedent("""
    import atexit, logging, os, sys, threading, time
    open_fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:-1]  # not listdir's
    handlers = list(logging.getLogger().handlers)
    import neighbour  # next to the script: sys.path[0] is its folder
    import minidist.distributed as dist

    dist.init_process_group()
    rank = dist.get_rank()
    checks = {
        "__name__": __name__ == "__main__",
        "__file__": __file__ == os.path.abspath(sys.argv[0]) and os.path.isabs(__file__),
        "argv": sys.argv[1:] == ["one", "--two"] and sys.argv[0].endswith("as_python.py"),
        "path": sys.path[0] == os.path.dirname(__file__),
        "main module": sys.modules["__main__"].__dict__ is globals(),
        "fds": len(open_fds) == 5,  # stdin/out/err, its log pipe, its run's description
        "logging": handlers == [],
        "environment": os.environ["RANK"] == str(rank) and "MINIDIST_RUN" not in os.environ,
    }
    failed = [name for name, ok in checks.items() if not ok]
    assert not failed, (failed, open_fds, sys.argv, sys.path[:2], handlers)

    def late():
        time.sleep(0.2)
        sys.stdout.write(f"thread of rank {rank} ended\\n")
    threading.Thread(target=late).start()  # not a daemon: the exit waits for it
    atexit.register(lambda: sys.stdout.write(f"atexit of rank {rank}\\n"))
    sys.stdout.write(f"buffered, no newline, rank {rank};")  # flushed at the exit
""")


@pytest.mark.timeout(60)
def test_a_rank_runs_the_script_as_python_would(tmp_path):
    script = tmp_path / "as_python.py"
    script.write_text(AS_PYTHON)
    (tmp_path / "neighbour.py").write_text("")
    done = minidist_run("-n", "2", str(script), "one", "--two")
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert f"buffered, no newline, rank {rank};" in done.stdout
        assert f"thread of rank {rank} ended" in done.stdout
        assert f"atexit of rank {rank}" in done.stdout


@pytest.mark.timeout(60)
def test_a_script_run_without_the_launcher_explains_itself(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text("import minidist.distributed as dist\ndist.init_process_group()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items()
                                           if not k.startswith("MINIDIST_")})
    assert done.returncode != 0
    assert "minidist run -n 4 script.py" in done.stderr


@pytest.mark.timeout(60)
def test_a_world_of_one_without_a_launcher(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text(textwrap.dedent("""
        import minidist.distributed as dist
        dist.init_process_group(world_size=1)
        dist.barrier()
        print(dist.get_rank(), dist.get_world_size())
        dist.destroy_process_group()
        print(dist.is_initialized())
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1", "False"]


def test_a_missing_script_is_reported():
    done = minidist_run("-n", "2", "no_such_script.py")
    assert done.returncode != 0 and "no such script" in done.stderr


BLOCKING = textwrap.dedent("""
    import os, sys
    import numpy as np
    import minidist.distributed as dist

    dist.init_process_group()
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    dist.recv(np.zeros(1), (dist.get_rank() + 1) % 2, timeout=None)  # nobody sends
""")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigkill"])
def test_interrupting_minidist_run_stops_every_rank(tmp_path, how):
    import signal

    script = tmp_path / "blocking.py"
    script.write_text(BLOCKING)
    pids = tmp_path / "pids"
    pids.mkdir()
    before = segments()
    parent = subprocess.Popen([sys.executable, "-m", "minidist.cli", "run", "-n", "2",
                               str(script), str(pids)], cwd=ROOT, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(os.listdir(pids)) < 2:
        assert time.monotonic() < deadline and parent.poll() is None, parent.communicate()
        time.sleep(0.05)
    time.sleep(0.2)
    import glob
    import tempfile

    folders = os.path.join(tempfile.gettempdir(), f"minidist-run-{parent.pid}-*")
    named_after_the_launcher = bool(glob.glob(folders))  # asserted once the run is stopped
    start = time.monotonic()
    if how == "ctrl-c":
        os.killpg(parent.pid, signal.SIGINT)
    else:  # SIGKILL: no cleanup of its own; the ranks die with it, its reaper unlinks
        parent.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    _, stderr = parent.communicate(timeout=10)
    assert time.monotonic() - start < 5.0
    assert parent.returncode == {"ctrl-c": 130, "sigterm": 143, "sigkill": -9}[how], stderr
    if how != "sigkill":  # one line says why it ended
        said = {"ctrl-c": "interrupted", "sigterm": "terminated"}[how]
        assert [line for line in stderr.splitlines() if line.strip()][-1:] == [said], stderr
    # A stopped launcher reaped its ranks before it returned; a SIGKILLed one
    # did not: the kernel's death signal reaches them as it dies, and their
    # own exit takes a moment more.
    deadline = time.monotonic() + (2.0 if how == "sigkill" else 0.0)
    while [pid for pid in map(int, os.listdir(pids)) if alive(pid)] and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [pid for pid in map(int, os.listdir(pids)) if alive(pid)]
    assert not leaked_since(before)
    assert named_after_the_launcher, "the run's folder carries the launcher's pid"
    # The run's folder (errors, traces) goes too: after a SIGKILL, by the reaper.
    deadline = time.monotonic() + 2.0
    while glob.glob(folders) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not glob.glob(folders)


def test_the_launcher_starts_its_workers_before_importing_numpy():
    # Its imports and the workers' overlap only if it starts them first (run_script).
    done = subprocess.run([sys.executable, "-c",
                           "import sys, minidist.cli, minidist.run_script; "
                           "print(sorted(m for m in ('numpy', 'minidist.tensor', "
                           "'minidist.distributed') if m in sys.modules))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_worker_whose_launcher_ends_before_the_run_is_ready_says_so(monkeypatch):
    import minidist.distributed as dist

    read, write = os.pipe()
    os.close(write)  # the launcher is gone without writing the run's description
    monkeypatch.setenv("MINIDIST_RANK", "0")
    monkeypatch.setenv("MINIDIST_WORLD_SIZE", "2")
    monkeypatch.setenv("MINIDIST_TRANSPORT", "shm")
    monkeypatch.setenv("MINIDIST_RUN_FD", str(read))
    with pytest.raises(RuntimeError, match="stopped before this run was ready"):
        dist.init_process_group()
    assert not dist.is_initialized()
    with pytest.raises(OSError):
        os.fstat(read)  # read and closed


def test_a_rank_that_cannot_read_its_script_says_so_in_one_line(tmp_path, capsys):
    # The launcher checked the file; it can still vanish or be unreadable when
    # the rank opens it (not testable by permissions as root: a missing file).
    from minidist.runtime.program import _run_main

    assert _run_main(str(tmp_path / "gone.py")) == 2
    err = capsys.readouterr().err
    assert err.startswith("minidist run: can't open file") and "No such file" in err
    assert len(err.splitlines()) == 1
