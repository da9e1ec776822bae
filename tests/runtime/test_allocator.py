"""minidist.runtime.allocator: with keep_freed_memory, a step-like cycle of
allocating, touching and freeing arrays pages nothing in after the first
cycles; without it, glibc hands the memory back and every cycle faults again.

Each case runs in a fresh interpreter: mallopt changes the whole process."""

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from minidist.runtime.allocator import MAX_MMAP_THRESHOLD, keep_freed_memory

ROOT = Path(__file__).resolve().parents[2]

CYCLE = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from minidist.runtime.allocator import keep_freed_memory
    assert keep_freed_memory()
# Float counts of a small CNN step's arrays: columns, activations, masks.
sizes = [2_000_000, 800_000, 800_000, 200_000, 1_800_000, 400_000] * 2
def cycle():
    arrays = [np.ones(n, np.float32) for n in sizes]
    del arrays
for _ in range(3):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", CYCLE, mode], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_kept_memory_is_not_paged_in_again():
    # 10 cycles of 38 MB (93,000 pages touched): by default about 40,000
    # faults were measured (glibc keeps some blocks, returns others); kept,
    # none.
    assert _faults("default") > 10_000
    assert _faults("keep") < 100


def test_bad_thresholds_are_clear_errors():
    with pytest.raises(ValueError, match="glibc's limit"):
        keep_freed_memory(mmap_threshold=MAX_MMAP_THRESHOLD + 1)
    with pytest.raises(ValueError, match="trim_threshold must be >= 0"):
        keep_freed_memory(trim_threshold=-1)
