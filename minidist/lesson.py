"""Small conveniences shared by the lessons in ``lessons/``.

A lesson is a script (and, through Jupytext, a notebook). Two environment
variables let the test-suite run every lesson end to end in CI:

* ``MINIDIST_LESSON_QUICK=1`` selects the reduced form of long experiments;
* ``MINIDIST_LESSON_OUTPUT`` is where pictures are written (default:
  ``lessons/output`` next to the lessons, or the current directory).
"""

from __future__ import annotations

import os
from pathlib import Path


def quick() -> bool:
    """True when the lesson should run its reduced (CI) form."""
    return os.environ.get("MINIDIST_LESSON_QUICK", "") not in ("", "0")


def output_dir() -> Path:
    """The folder for pictures and files a lesson writes (created if needed)."""
    where = os.environ.get("MINIDIST_LESSON_OUTPUT")
    path = Path(where) if where else Path.cwd() / "lesson_output"
    rank = _mpi_rank()
    if rank:
        # Under mpiexec every rank runs the lesson (SPMD) and draws the same
        # pictures: the others draw into rank<r>/, never over rank 0's files.
        path = path / f"rank{rank}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _mpi_rank() -> int:
    """This process's MPI rank when mpiexec started it (from the environment), else 0."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def use_headless_matplotlib():
    """Select the Agg backend unless a notebook already chose an inline one."""
    import matplotlib

    if "inline" not in matplotlib.get_backend().lower():
        matplotlib.use("Agg")
