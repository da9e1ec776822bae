"""What a rank pays to start: ``import minidist.distributed`` imports only what
a real run needs (every worker of ``minidist run`` imports it), and the names
imported lazily are still there."""

from __future__ import annotations

import ast
import importlib
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
assert dist.all_reduce is sys.modules["minidist.distributed.collectives"].all_reduce
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


def _type_checking_names() -> dict:
    """name -> (module, name there) of the ``if TYPE_CHECKING:`` imports of
    minidist/distributed/__init__.py (what an editor's go-to-definition reads)."""
    path = os.path.join(ROOT, "minidist", "distributed", "__init__.py")
    with open(path) as file:
        tree = ast.parse(file.read())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING")
    return {alias.asname or alias.name: (node.module, alias.name)
            for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}


def test_the_type_checking_names_are_the_lazy_names():
    """Every lazy name has its import for editors, and it is the same object
    (a shortcut installed over it names it as ``__wrapped__``)."""
    import minidist.distributed as dist

    written = _type_checking_names()
    assert set(written) == set(dist._LAZY)
    for name, (module, attribute) in written.items():
        function = getattr(importlib.import_module(module), attribute)
        value = getattr(dist, name)
        while value is not function and hasattr(value, "__wrapped__"):
            value = value.__wrapped__
        assert value is function, name


#: The calls of the face, each the function where it is written when nothing is
#: installed over it (the fast paths off, NumPy arrays).
IDENTITY_PROBE = """
import importlib, sys
sys.path.insert(0, {tests!r})
from test_lazy_imports import _type_checking_names
import minidist.distributed as dist
from minidist.distributed import fast_paths
assert not fast_paths.enabled()
names = _type_checking_names()
calls = [name for name, (module, _) in names.items()
         if module.startswith(("minidist.distributed.collectives.",
                               "minidist.distributed.point_to_point"))]
assert len(calls) > 30, calls
for name in calls:
    module, attribute = names[name]
    assert getattr(dist, name) is getattr(importlib.import_module(module), attribute), name
assert dist.all_reduce is sys.modules["minidist.distributed.collectives.all_reduce"].all_reduce
# What an algorithm's messages and a user's point-to-point calls go through:
# the plain methods, with no shortcut installed over them.
from minidist.distributed.collectives import comm
from minidist.distributed.process_group import ProcessGroup
for method in (comm.Comm.isend, comm.Comm.irecv, comm.Comm.irecv_reduce, ProcessGroup.isend,
               ProcessGroup.send, ProcessGroup.recv, ProcessGroup.recv_reduce):
    assert not hasattr(method, "__wrapped__"), method
    assert method.__code__.co_filename.endswith(("comm.py", "process_group.py")), method
assert comm._wait_step.__module__ == comm.__name__
print("identical", len(calls))
"""


@pytest.mark.timeout(60)
def test_with_the_shortcuts_off_every_call_is_the_function_it_names():
    env = dict(os.environ, PYTHONPATH=ROOT, MINIDIST_FAST_PATHS="0")
    code = IDENTITY_PROBE.format(tests=os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("identical")


def test_with_the_shortcuts_on_only_all_reduce_is_wrapped():
    """With the fast paths on, dist.all_reduce is the one-shot shortcut's
    wrapper (see collectives/one_shot_shortcut.py); every other call is the
    function it names."""
    import minidist.distributed as dist
    from minidist.distributed import fast_paths

    names = _type_checking_names()
    teaching = importlib.import_module(names["all_reduce"][0]).all_reduce
    if fast_paths.enabled():
        assert dist.all_reduce.__wrapped__ is teaching
        assert dist.all_reduce.__code__.co_filename.endswith("one_shot_shortcut.py")
    else:
        assert dist.all_reduce is teaching
    for name, (module, attribute) in names.items():
        if name != "all_reduce":
            assert getattr(dist, name) is getattr(importlib.import_module(module), attribute), name


def test_with_the_shortcuts_on_the_small_message_wrappers_name_the_plain_methods():
    """Comm's and ProcessGroup's send and receive methods are wrapped by the
    modules that say so, each wrapper naming the plain method it stands in
    front of (``__wrapped__``), defined in comm.py / process_group.py."""
    import minidist.distributed.collectives  # noqa: F401 - installs what the switch says
    from minidist.distributed import fast_paths
    from minidist.distributed.collectives import comm
    from minidist.distributed.process_group import ProcessGroup

    methods = {comm.Comm.isend: "small_message_shortcut.py",
               comm.Comm.irecv: "small_message_shortcut.py",
               comm.Comm.irecv_reduce: "small_message_shortcut.py",
               ProcessGroup.isend: "fast_paths.py", ProcessGroup.send: "fast_paths.py",
               ProcessGroup.recv: "fast_paths.py", ProcessGroup.recv_reduce: "fast_paths.py"}
    for method, where in methods.items():
        if not fast_paths.enabled():
            assert not hasattr(method, "__wrapped__"), method
            continue
        assert method.__code__.co_filename.endswith(where), method
        assert method.__wrapped__.__code__.co_filename.endswith(("comm.py", "process_group.py"))
