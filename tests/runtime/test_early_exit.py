"""A rank of ``minidist run`` whose process ends with status 0 in the middle of the run.

``os._exit(0)`` skips the exit work that tells the other ranks a script is
done. Before, the supervisor took the status 0 for a success: over shared
memory the others waited out their whole timeout and the error blamed rank
0, its report saying the dead rank was "running its own code"; over pipes
the error said the rank "returned from its function", two seconds late. Now
the rank is the cause as soon as another waits for it, and is named first,
on every transport and inside a strategy: the tensor-parallel GPT's
collectives, and a rank that leaves in the middle of a call of ring
attention, Ulysses, the expert dispatch, GPT3D or FSDP (between its
messages), all take the same path. A rank that leaves that way after its last
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

# Rank 1 leaves in the middle of a strategy's call of step 3: each source
# wraps a function the strategy calls between its messages.
INSIDE = PREAMBLE + """
step = 0


def leave_at_step_3():
    if rank == 1 and step == 3:
        os._exit(0)
"""

RING_ATTENTION = INSIDE + """
from minidist.parallel.context import merge, ring_attention
from minidist.parallel.context.split import shard_sequence


def merging_then_leaving(*args):  # between two blocks of the ring
    leave_at_step_3()
    merge(*args)


x = shard_sequence(np.random.default_rng(0).normal(size=(1, 4, 16, 2)), 16, 4, rank, axis=2)
for step in range(100_000):
    ring_attention(x, x, x, 16, is_causal=True, merge_block=merging_then_leaving)
"""

ULYSSES = INSIDE + """
from minidist.nn import functional as F
from minidist.parallel.context import ulysses_attention
from minidist.parallel.context.split import shard_sequence

attention = F.scaled_dot_product_attention


def attending_then_leaving(*args, **kwargs):  # between the all_to_alls there and back
    leave_at_step_3()
    return attention(*args, **kwargs)


F.scaled_dot_product_attention = attending_then_leaving
x = shard_sequence(np.random.default_rng(0).normal(size=(1, 4, 16, 2)), 16, 4, rank, axis=2)
for step in range(100_000):
    ulysses_attention(x, x, x, 16, is_causal=True)
"""

EXPERTS = INSIDE + """
from minidist.models.moe import MoEGPT, MoEGPTConfig
from minidist.parallel.expert import dispatch

experts = dispatch.run_experts


def running_experts_then_leaving(*args):  # between the dispatch and the combine
    leave_at_step_3()
    return experts(*args)


dispatch.run_experts = running_experts_then_leaving
config = MoEGPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, n_expert=4,
                      top_k=2, capacity_factor=1.0, aux_loss_coef=0.01)
model = dispatch.expert_parallel_gpt(MoEGPT(config, rng=0))
idx = np.random.default_rng(rank).integers(0, 11, (2, 8))
for step in range(100_000):
    model.loss(model(idx), idx).backward()
"""

# A block's forward, wrapped: in GPT3D between a stage's messages and its
# tensor-parallel all_reduces, in FSDP between two units' all_gathers.
BLOCKS = INSIDE + """
from minidist import nn, optim
from minidist.models import gpt

block_forward = gpt.Block.forward


def block_then_leaving(self, *args):
    leave_at_step_3()
    return block_forward(self, *args)


gpt.Block.forward = block_then_leaving
"""

GPT_3D = BLOCKS + """
from minidist.parallel.mesh import GPT3D

config = gpt.GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
mesh = dist.init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("pp", "dp", "tp"))
model = GPT3D(gpt.GPT(config, rng=0), mesh, "1f1b", microbatches=2)
optimizer = optim.SGD(model.parameters(), lr=0.1)
idx = np.random.default_rng(0).integers(0, 16, (4, 8))
for step in range(100_000):
    model.step(idx, idx, optimizer)
"""

FSDP = BLOCKS + """
from minidist.parallel.data import FullyShardedDataParallel

config = gpt.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)
model = FullyShardedDataParallel(gpt.GPT(config, rng=0))
optimizer = optim.SGD(model.parameters(), lr=0.1)
idx = np.random.default_rng(rank).integers(0, 11, (2, 8))
for step in range(100_000):
    loss = nn.CrossEntropyLoss()(model(idx).reshape(-1, 11), idx.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

STRATEGIES = {"ring attention": RING_ATTENTION, "Ulysses": ULYSSES, "expert dispatch": EXPERTS,
              "GPT3D": GPT_3D, "FSDP": FSDP}

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
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_rank_that_exits_0_inside_a_strategy_is_named_at_once(tmp_path, strategy):
    """One launch each: the first rank to leave ends the run."""
    code, _, stderr, elapsed = _minidist_run(tmp_path, STRATEGIES[strategy], 4, "shm")
    assert code == 1, stderr
    assert _first_line(stderr).startswith("minidist run: rank 1 exited (status 0) while rank"), \
        stderr
    assert elapsed < NAMED_WITHIN + 10, f"took {elapsed:.1f} s (the timeout is {TIMEOUT} s)"


@pytest.mark.timeout(TIMEOUT + 60)
def test_a_rank_that_exits_0_after_its_last_exchange_harms_nobody(tmp_path):
    code, stdout, stderr, _ = _minidist_run(tmp_path, AFTER_THE_LAST, 2, "shm")
    assert code == 0, stderr
    assert "rank 0 finished" in stdout, stdout + stderr
