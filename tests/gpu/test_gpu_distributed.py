"""CuPy end to end across processes: collectives on GPU arrays
staged through host memory (pipe and shm, 2 and 3 ranks), and DDP training
of the digits CNN on the GPU, equal to the NumPy run. See gpu_ranks.py.

Skipped, saying why, on a machine without CuPy or a CUDA device (CI has
neither; benchmarks/results/gpu.md and results/gpu_h100.json record the
GPU backend measured on an H100)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _skip_reason() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install -e '.[gpu]' on a machine with an NVIDIA GPU)"
    # Asked in a child: CUDA initialized here would break the workers forked later.
    probe = subprocess.run([sys.executable, "-c", "import cupy; "
                            "print(cupy.cuda.runtime.getDeviceCount())"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0 or not probe.stdout.strip().isdigit() \
            or int(probe.stdout.strip()) < 1:
        return f"no usable CUDA device ({(probe.stderr or probe.stdout).strip()[-200:]})"
    return None


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_collectives_and_ddp_on_the_gpu():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                    os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(HERE / "gpu_ranks.py")], capture_output=True,
                            text=True, timeout=580, env=env, cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "collectives on CuPy arrays: 0 failures" in result.stdout, output[-3000:]
    assert "GPU END TO END: PASSED" in result.stdout, output[-3000:]
