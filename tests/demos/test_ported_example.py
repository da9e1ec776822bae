"""examples/ported_from_torch.py, the torch DDP script that
docs/coming_from_torch.md ports line by line, runs under `minidist run` and
trains: the replicas end identical and the digits are learned."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_the_ported_torch_script_trains_under_minidist_run():
    done = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "2",
                           str(ROOT / "examples" / "ported_from_torch.py")],
                          capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    found = re.search(r"test accuracy ([0-9.]+); replicas identical: (\w+)", done.stdout)
    assert found, done.stdout
    assert found.group(2) == "True"
    assert float(found.group(1)) > 0.9, done.stdout   # a sampler that read len((x, y)) == 2: ~0.2
    page = (ROOT / "docs" / "coming_from_torch.md").read_text()
    assert "examples/ported_from_torch.py" in page
