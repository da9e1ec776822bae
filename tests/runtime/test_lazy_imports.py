"""What a rank pays to start: ``import minidist.distributed`` imports only what
a real run needs (every worker of ``minidist run`` imports it), and the names
imported lazily are still there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_fresh(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter (nothing imported yet)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout

#: Imported at `import minidist.distributed` no more: NumPy, the messages and the
#: collectives come with the first name that needs them, the simulator is never
#: needed by a rank, and these standard modules were a few milliseconds of each
#: worker's start.
NOT_AT_IMPORT = ("numpy", "minidist.distributed.collectives", "minidist.distributed.simulator",
                 "multiprocessing", "secrets", "tempfile", "shutil")

PROBE = f"""
import sys
import minidist.distributed as dist
print(sorted(name for name in {NOT_AT_IMPORT!r} if name in sys.modules))
from minidist.distributed import SimulationResult, simulate
assert dist.simulate is simulate and SimulationResult.__name__ == "SimulationResult"
assert "simulate" in dist.__all__ and "minidist.distributed.simulator" in sys.modules
import minidist.distributed.shared_array  # the submodule of the same name as the function
assert callable(dist.shared_array) and dist.shared_array.__module__.endswith("shared_array")
missing = [name for name in dist.__all__ if not hasattr(dist, name)]
assert not missing, missing
assert dist.all_reduce.__wrapped__ is sys.modules["minidist.distributed.collectives"].all_reduce
assert dist.Work is sys.modules["minidist.distributed.transport.base"].Request
print("names ok")
"""


@pytest.mark.timeout(60)
def test_import_minidist_distributed_leaves_out_what_a_rank_does_not_need():
    imported, names = _run_fresh(PROBE).strip().splitlines()
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
    imported = _run_fresh(RUN_PROBE).strip()
    assert imported == "[]", f"imported before the workers start: {imported}"


#: What `minidist run`'s launching process imports once its workers are started
#: and it makes the run: no NumPy (it took the cores from the workers' imports).
MAKE_RUN_PROBE = """
import sys
import minidist.cli, minidist.run_script
from minidist.distributed import world
from minidist.runtime import console
from minidist.runtime.oversubscription import warn_if_oversubscribed
from minidist.runtime.supervisor import Supervisor
from minidist.runtime.segments import release_run
control, resources = minidist.run_script._make_run("shm", 2)
release_run(resources, control)
print(world.DEFAULT_TIMEOUT, "numpy" in sys.modules)
"""


@pytest.mark.timeout(60)
def test_minidist_run_makes_its_run_without_numpy():
    assert _run_fresh(MAKE_RUN_PROBE).split() == ["120.0", "False"]
