"""examples/ported_fsdp2.py and examples/ported_tensor_parallel_dtensor.py,
torch scripts (init_device_mesh, fully_shard or parallelize_module with
ColwiseParallel / RowwiseParallel, clip_grad_norm_ and its norm's
full_tensor(), torch.distributed.checkpoint) ported line by line, run under
``minidist run`` on 1 and 2 processes: the losses and the clipped gradients'
norms are the same on both, the checkpoint loads back bit for bit, and one
more step after the load gives the unbroken model's norm. Turned back into
torch's scripts (every ``# torch:`` line put back), torch runs them on 2
processes (gloo, CPU) and prints the same numbers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.parallel.test_pipelining_torch_names import to_torch

ROOT = Path(__file__).resolve().parents[2]
#: script -> (its changed lines, the torch import that is its subject)
SCRIPTS = {"ported_fsdp2.py": (6, "from torch.distributed.fsdp import fully_shard"),
           "ported_tensor_parallel_dtensor.py": (
               6, "from torch.distributed.tensor.parallel import (")}
EACH = pytest.mark.parametrize("name", sorted(SCRIPTS))
NUMBER = r"[-+0-9.e]+"


def _numbers(stdout: str) -> list[float]:
    lines = [line for line in stdout.splitlines()
             if line.startswith("step ") or line.startswith("loaded ")]
    assert len(lines) == 4, stdout
    assert "loaded bit for bit: True" in lines[-1], stdout
    return [float(x) for line in lines for x in re.findall(rf"(?:loss|norm|loaded) ({NUMBER})",
                                                           line)]


def _minidist(name, world, folder):
    done = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", str(world),
                           str(ROOT / "examples" / name), "--folder", str(folder)],
                          capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return _numbers(done.stdout)


@EACH
@pytest.mark.timeout(300)
def test_the_ported_script_trains_saves_and_reloads_under_minidist_run(tmp_path, name):
    one, two = _minidist(name, 1, tmp_path / "one"), _minidist(name, 2, tmp_path / "two")
    assert len(two) == 3 * 2 + 2
    np.testing.assert_allclose(two, one, rtol=1e-12)
    assert two[-1] == two[-2]                      # the loaded model's step: the unbroken one's
    assert all(n > 1.0 for n in two[1:6:2])        # every step clipped (max_norm 1)
    assert sorted(os.listdir(tmp_path / "two")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    page = (ROOT / "docs" / "coming_from_torch.md").read_text()
    assert f"examples/{name}" in page


@EACH
def test_every_marked_line_is_the_only_difference(name):
    text = (ROOT / "examples" / name).read_text()
    ported, torch_lines = text.splitlines(), to_torch(text).splitlines()
    changed = [a for a, b in zip(ported, torch_lines) if a != b]
    count, subject = SCRIPTS[name]
    assert len(ported) == len(torch_lines)
    assert all("# torch:" in line for line in changed) and len(changed) == count
    assert subject in torch_lines
    # torch's own lines, kept: the clip and the norm's full_tensor()
    assert any("nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)" in line
               and "# torch:" not in line for line in ported)
    assert any("norm.full_tensor().item()" in line and "# torch:" not in line
               for line in ported)


@EACH
@pytest.mark.timeout(300)
def test_torch_runs_the_script_it_came_from_on_two_processes(tmp_path, name):
    pytest.importorskip("torch.distributed.fsdp")
    pytest.importorskip("torch.distributed.tensor.parallel")
    pytest.importorskip("torch.distributed.checkpoint")
    script = tmp_path / "train.py"
    script.write_text(to_torch((ROOT / "examples" / name).read_text()))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)   # torch's script must not see minidist
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script), "--folder",
                           str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = _numbers(done.stdout)
    ours = _minidist(name, 2, tmp_path / "ours")
    np.testing.assert_allclose(ours, theirs, rtol=1e-10)
