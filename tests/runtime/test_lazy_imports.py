"""What a rank pays to start: ``import minidist.distributed`` imports only what
a real run needs (every worker of ``minidist run`` imports it), and the names
imported lazily are still there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Imported by nothing a rank of a real run does: the simulator, and standard
#: modules whose import was a few milliseconds of each worker's start.
NOT_AT_IMPORT = ("minidist.distributed.simulator", "multiprocessing", "secrets", "tempfile",
                 "shutil")

PROBE = f"""
import sys
import minidist.distributed as dist
print(sorted(name for name in {NOT_AT_IMPORT!r} if name in sys.modules))
from minidist.distributed import SimulationResult, simulate
assert dist.simulate is simulate and SimulationResult.__name__ == "SimulationResult"
assert "simulate" in dist.__all__ and "minidist.distributed.simulator" in sys.modules
print("names ok")
"""


@pytest.mark.timeout(60)
def test_import_minidist_distributed_leaves_out_what_a_rank_does_not_need():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    imported, names = done.stdout.strip().splitlines()
    assert imported == "[]", f"imported at `import minidist.distributed`: {imported}"
    assert names == "names ok"


def test_unknown_names_still_raise_attribute_error():
    import minidist.distributed as dist

    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        dist.not_a_name  # noqa: B018


#: What `minidist run`'s launching process does without until its workers are
#: started: each of these delayed every worker's start (by 21 ms together here).
NOT_BEFORE_THE_WORKERS = ("numpy", "minidist.distributed", "minidist.runtime.supervisor",
                          "minidist.runtime.control", "tempfile", "shutil", "rich")

RUN_PROBE = f"""
import sys
import minidist.cli, minidist.run_script
print(sorted(name for name in {NOT_BEFORE_THE_WORKERS!r} if name in sys.modules))
"""


@pytest.mark.timeout(60)
def test_minidist_run_starts_its_workers_before_importing_the_rest():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", RUN_PROBE], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"imported before the workers start: {done.stdout}"
