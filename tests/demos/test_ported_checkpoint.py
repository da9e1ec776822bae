"""examples/ported_checkpoint.py, a torch.distributed.checkpoint script
ported line by line, runs under ``minidist run`` on 2 processes: saved in
row shards, loaded in column shards, every weight and Adam moment comes back
bit for bit. Turned back into torch's script (every ``# torch:`` line put
back), torch runs it on one process and says the same."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel.test_pipelining_torch_names import to_torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "ported_checkpoint.py"
LAST = ("Shard(0), loaded in ['(Replicate(),)', '(Shard(dim=1),)']: 12 arrays, "
        "bit for bit: True")


@pytest.mark.timeout(180)
def test_the_ported_checkpoint_script_reshards_under_minidist_run(tmp_path):
    done = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "2", str(SCRIPT),
                           "--folder", str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"saved on 2 ranks in {LAST}" in done.stdout, done.stdout
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    page = (ROOT / "docs" / "coming_from_torch.md").read_text()
    assert "examples/ported_checkpoint.py" in page


def test_every_marked_line_is_the_only_difference():
    ported = SCRIPT.read_text().splitlines()
    torch_lines = to_torch(SCRIPT.read_text()).splitlines()
    changed = [a for a, b in zip(ported, torch_lines) if a != b]
    assert len(ported) == len(torch_lines)
    assert all("# torch:" in line for line in changed) and len(changed) == 7
    assert "import torch.distributed.checkpoint as dcp" in torch_lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(300)
def test_torch_runs_the_script_it_came_from(tmp_path):
    pytest.importorskip("torch.distributed.checkpoint")
    script = tmp_path / "save_and_reshard.py"
    script.write_text(to_torch(SCRIPT.read_text()))
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    env.pop("PYTHONPATH", None)   # torch's script must not see minidist
    done = subprocess.run([sys.executable, str(script), "--folder", str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"saved on 1 ranks in {LAST}" in done.stdout, done.stdout
