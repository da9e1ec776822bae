"""A rank stopped by SIGSTOP while the others wait for it.

Before the fix the run ended only at the timeout, and its first line named
a rank that had waited; the stopped one came later in a hint. Now the
supervisor sees the stopped process (state T in /proc): after
``stopped_ranks.STOPPED_SECONDS`` it names that rank first and ends the run,
long before the timeout; with a timeout shorter than that, the timeout ends
the run and the stopped rank is still named first. The stopped process is
killed (SIGKILL: a SIGTERM would stay pending), nothing is left behind.
"""

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
from minidist import Tensor, nn, optim
from minidist.runtime.stopped_ranks import STOPPED_SECONDS
from tests.runtime.test_forking_rank import ROOT, assert_nothing_left

TRANSPORTS = ["shm", "pipe"]
TIMEOUT = 30  # the run's: an early end is far under it
EARLY = STOPPED_SECONDS + 5.0  # seconds from start to error when the stop is seen early


def note_pid(pid_dir):
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()


def stop_myself():
    os.kill(os.getpid(), signal.SIGSTOP)


def all_reduce_loop_rank_2_stops(pid_dir):
    note_pid(pid_dir)
    for step in range(100_000):
        if dist.get_rank() == 2 and step == 3:
            stop_myself()
        dist.all_reduce(np.ones(4))


def failing(fn, pid_dir, world_size, transport="shm", timeout=TIMEOUT):
    start = time.monotonic()
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(fn, world_size=world_size, transport=transport, args=(str(pid_dir),),
                        timeout=timeout)
    return caught.value, time.monotonic() - start


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stopped_rank_is_named_and_the_run_ends_early(tmp_path, transport):
    error, elapsed = failing(all_reduce_loop_rank_2_stops, tmp_path, 3, transport)
    first = str(error).splitlines()[0]
    assert first.startswith("rank 2 is stopped (SIGSTOP, process state T): it made no "
                            "progress for "), first
    assert "while ranks 0 and 1 waited for it" in first
    assert error.rank == 2 and error.kind == "frozen"
    assert elapsed < EARLY, f"took {elapsed:.1f} s"
    assert_nothing_left(tmp_path, [os.getpid()])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_at_a_timeout_the_stopped_rank_is_named_first(tmp_path, transport):
    # The timeout (1.5 s) comes before the supervisor's own verdict (3 s).
    error, elapsed = failing(all_reduce_loop_rank_2_stops, tmp_path, 3, transport, timeout=1.5)
    first = str(error).splitlines()[0]
    assert first.startswith("rank 2 is stopped (SIGSTOP, process state T)"), first
    assert error.rank == 2 and error.kind == "frozen"
    assert "CommTimeoutError" in str(error)  # the others' timeouts, below
    assert elapsed < STOPPED_SECONDS + 1.5
    assert_nothing_left(tmp_path, [os.getpid()])


# ------------------------------------------------------------- inside the strategies


def _model():
    nn.init.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 3)).to(np.float64)


def _batch(step):
    rng = np.random.default_rng(step)
    return rng.normal(size=(8, 6)), rng.integers(0, 3, 8)


def train_and_stop_rank_1(pid_dir, strategy):
    """Train with ``strategy``; rank 1 stops at its third step, after the
    forward pass, so the others wait in the strategy's own communication."""
    from minidist.parallel.data.ddp import DistributedDataParallel
    from minidist.parallel.data.fsdp import FullyShardedDataParallel
    from minidist.parallel.pipeline.executor import Pipeline

    note_pid(pid_dir)
    loss_fn = nn.CrossEntropyLoss()
    if strategy == "pipeline":
        pipe = Pipeline(_model(), "1f1b", 2)
        optimizer = optim.SGD(pipe.parameters(), lr=0.1)
        for step in range(1000):
            if dist.get_rank() == 1 and step == 2:
                stop_myself()
            x, y = _batch(step)
            pipe.step(x, y if pipe.is_last else None, loss_fn, optimizer)
        return
    if strategy == "ddp":
        model = DistributedDataParallel(_model())
    else:
        model = FullyShardedDataParallel(_model(), sharding_strategy="FULL_SHARD")
    optimizer = optim.SGD(model.parameters(), lr=0.1)
    for step in range(1000):
        x, y = _batch(step)
        optimizer.zero_grad()
        loss = loss_fn(model(Tensor(x)), y)
        if dist.get_rank() == 1 and step == 2:
            stop_myself()
        loss.backward()
        optimizer.step()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["ddp", "pipeline", "fsdp_full_shard"])
def test_a_stopped_rank_inside_a_strategy_is_named_early(tmp_path, strategy):
    start = time.monotonic()
    with pytest.raises(dist.WorkerError) as caught:
        minidist.launch(train_and_stop_rank_1, world_size=2, args=(str(tmp_path), strategy),
                        timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    first = str(caught.value).splitlines()[0]
    assert first.startswith("rank 1 is stopped (SIGSTOP, process state T)"), first
    assert "while rank 0 waited for it" in first
    assert elapsed < EARLY, f"took {elapsed:.1f} s"
    assert_nothing_left(tmp_path, [os.getpid()])


# ------------------------------------------------------------- minidist run

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import minidist.distributed as dist

    dist.init_process_group()
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    for step in range(100_000):
        if dist.get_rank() == 2 and step == 3:
            os.kill(os.getpid(), signal.SIGSTOP)
        dist.all_reduce(np.ones(4))
""")


@pytest.mark.timeout(90)
def test_minidist_run_names_a_stopped_rank_early(tmp_path):
    script = tmp_path / "stop.py"
    script.write_text(SCRIPT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "3", "--transport",
                          "pipe", "--timeout", str(TIMEOUT), str(script), str(pid_dir)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert run.returncode == 1, run.stderr
    assert "minidist run: rank 2 is stopped (SIGSTOP, process state T)" in run.stderr
    assert elapsed < EARLY + 2.0, f"took {elapsed:.1f} s"  # + the launcher's start
    assert_nothing_left(pid_dir, [])
