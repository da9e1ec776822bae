"""A rank of ``minidist run`` whose process ends with status 0 in the middle of the run.

``os._exit(0)`` skips the exit work that tells the other ranks a script is
done. Before, the supervisor took the status 0 for a success: over shared
memory the others waited out their whole timeout and the error blamed rank
0, its report saying the dead rank was "running its own code"; over pipes
the error said the rank "returned from its function", two seconds late. Now
the rank is the cause as soon as another waits for it, and is named first,
on every transport and inside a strategy (the tensor-parallel GPT's
collectives take the same path). A rank that leaves that way after its last
exchange has done no harm: the run succeeds.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from tests.runtime.test_forking_rank import ROOT, assert_nothing_left

TIMEOUT = 60  # the run's: the fault must be named long before it
NAMED_WITHIN = 15.0  # seconds from the launcher's start to its end, imports included

PREAMBLE = """
import os, sys
import numpy as np
import minidist.distributed as dist

dist.init_process_group()
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
rank = dist.get_rank()
"""

LOOP = PREAMBLE + """
x = np.ones(1000, np.float32)
for step in range(100_000):
    if rank == 1 and step == 3:
        os._exit(0)
    dist.all_reduce(x)
"""

GPT = PREAMBLE + """
from minidist import optim
from minidist.models.gpt import GPT, GPTConfig
from minidist.parallel.tensor.gpt import tensor_parallel_gpt

config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16)
shard = tensor_parallel_gpt(GPT(config, rng=0))
optimizer = optim.SGD(shard.parameters(), lr=0.1)
tokens = np.random.default_rng(0).integers(0, 11, (2, 8))
for step in range(100_000):
    if rank == 1 and step == 3:
        os._exit(0)
    loss = shard.loss(shard(tokens), tokens)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

# Rank 1 leaves after the last collective; rank 0 still works on its own.
AFTER_THE_LAST = PREAMBLE + """
import time
dist.all_reduce(np.ones(4))
if rank == 1:
    os._exit(0)
time.sleep(1.0)
print("rank", rank, "finished", flush=True)
"""


def _minidist_run(tmp_path, source, ranks, transport):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    start = time.monotonic()
    run = subprocess.Popen([sys.executable, "-m", "minidist.cli", "run", "-n", str(ranks),
                            "--transport", transport, "--timeout", str(TIMEOUT), str(script),
                            str(pid_dir)], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    stdout, stderr = run.communicate(timeout=TIMEOUT + 30)
    elapsed = time.monotonic() - start
    assert len(os.listdir(pid_dir)) == ranks, stderr
    assert_nothing_left(pid_dir, [run.pid])
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"minidist-run-{run.pid}-*"))
    return run.returncode, stdout, stderr, elapsed


def _first_line(stderr: str) -> str:
    return next((line for line in stderr.splitlines() if line.startswith("minidist run:")), "")


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_a_rank_that_exits_0_mid_loop_is_named_at_once(tmp_path, transport):
    code, _, stderr, elapsed = _minidist_run(tmp_path, LOOP, 2, transport)
    assert code == 1, stderr
    first = _first_line(stderr)
    assert first.startswith("minidist run: rank 1 exited (status 0) while rank 0 waited for "
                            "it in "), stderr
    assert "Traceback from rank 0:" in stderr and "dist.all_reduce(x)" in stderr, stderr
    assert elapsed < NAMED_WITHIN, f"took {elapsed:.1f} s (the timeout is {TIMEOUT} s)"


@pytest.mark.timeout(TIMEOUT + 60)
def test_a_rank_that_exits_0_inside_the_tensor_parallel_gpt_is_named_at_once(tmp_path):
    code, _, stderr, elapsed = _minidist_run(tmp_path, GPT, 4, "shm")
    assert code == 1, stderr
    assert _first_line(stderr).startswith("minidist run: rank 1 exited (status 0) while rank"), \
        stderr
    assert elapsed < NAMED_WITHIN + 10, f"took {elapsed:.1f} s (the timeout is {TIMEOUT} s)"


@pytest.mark.timeout(TIMEOUT + 60)
def test_a_rank_that_exits_0_after_its_last_exchange_harms_nobody(tmp_path):
    code, stdout, stderr, _ = _minidist_run(tmp_path, AFTER_THE_LAST, 2, "shm")
    assert code == 0, stderr
    assert "rank 0 finished" in stdout, stdout + stderr
