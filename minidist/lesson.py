"""Small conveniences shared by the lessons in ``lessons/``.

A lesson is a script (and, through Jupytext, a notebook). Two environment
variables let the test-suite run every lesson end to end in CI:

* ``MINIDIST_LESSON_QUICK=1`` selects the reduced form of long experiments;
* ``MINIDIST_LESSON_OUTPUT`` is where pictures are written, in a folder per
  lesson (default: ``lesson_output/<lesson>/`` in the current directory);
* ``MINIDIST_LESSON_QUIET=1``: outputs only, without the text between them
  (:mod:`minidist.narration`).

``minidist lesson`` lists the lessons and ``minidist lesson N`` runs one
(:func:`find_lessons`, :func:`lesson_command`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from minidist.narration import QUIET, narrate  # noqa: F401 - the lessons' import


def quick() -> bool:
    """True when the lesson should run its reduced (CI) form."""
    return os.environ.get("MINIDIST_LESSON_QUICK", "") not in ("", "0")


def output_dir(lesson: str | None = None) -> Path:
    """The folder for pictures and files a lesson writes (created if needed):
    ``lesson_output/<lesson>/`` in the current directory, or under
    ``MINIDIST_LESSON_OUTPUT`` when set, one folder per lesson so that a
    student finds a lesson's pictures together. ``lesson``: its name, e.g.
    "01_autograd_and_training" (default: :func:`lesson_name`; the root itself
    when there is none)."""
    where = os.environ.get("MINIDIST_LESSON_OUTPUT")
    path = Path(where) if where else Path.cwd() / "lesson_output"
    lesson = lesson or lesson_name()
    if lesson:
        path = path / lesson
    rank = _mpi_rank()
    if rank:
        # Under mpiexec every rank runs the lesson (SPMD) and draws the same
        # pictures: the others draw into rank<r>/, never over rank 0's files.
        path = path / f"rank{rank}"
    path.mkdir(parents=True, exist_ok=True)
    return path


_NAME = re.compile(r"^\d\d_\w+$")


def lesson_name() -> str | None:
    """The running lesson's name ("01_autograd_and_training"): the stem of the
    script run as ``__main__``, else of the notebook Jupyter serves
    (``JPY_SESSION_NAME``), else of ``sys.argv[0]``; None when none of them
    is a lesson's (NN_topic)."""
    main = sys.modules.get("__main__")
    candidates = (getattr(main, "__file__", None), os.environ.get("JPY_SESSION_NAME"),
                  sys.argv[0] if sys.argv else None)
    for candidate in candidates:
        if candidate and _NAME.match(Path(candidate).stem):
            return Path(candidate).stem
    return None


def _mpi_rank() -> int:
    """This process's MPI rank when mpiexec started it (from the environment), else 0."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def in_notebook() -> bool:
    """True inside a Jupyter kernel, where a cell's value is displayed; a
    script shows its pictures as files instead."""
    return "ipykernel" in sys.modules


def use_headless_matplotlib():
    """Select the Agg backend unless a notebook already chose an inline one."""
    import matplotlib

    if "inline" not in matplotlib.get_backend().lower():
        matplotlib.use("Agg")


# ----------------------------------------------------------------- minidist lesson

_FILE = re.compile(r"^(\d\d)_\w+\.py$")
_HEADING = re.compile(r"^# #\s+(?:Lesson\s+\d+\s*:\s*)?(.+?)\s*$")


def lessons_folder() -> Path | None:
    """``lessons/`` of the source checkout minidist runs from (next to the
    package), else ``./lessons``; None when there is neither."""
    for folder in (Path(__file__).resolve().parents[1] / "lessons", Path.cwd() / "lessons"):
        if folder.is_dir():
            return folder
    return None


def find_lessons(folder: Path) -> list[tuple[int, str, Path]]:
    """(number, title, path) of every ``NN_topic.py`` in ``folder``, in order;
    the title is the file's first Markdown heading, without "Lesson N:"."""
    found = []
    for path in sorted(folder.iterdir()):
        match = _FILE.match(path.name)
        if not match:
            continue
        title = path.stem[3:].replace("_", " ")
        with open(path, encoding="utf-8") as file:
            for line in file:
                heading = _HEADING.match(line)
                if heading:
                    title = heading.group(1)
                    break
        found.append((int(match.group(1)), title, path))
    return found


def lesson_command(number: int | None, quick: bool = False, folder: Path | None = None,
                   quiet: bool = False) -> int:
    """``minidist lesson``: list the lessons; ``minidist lesson N [--quick]``:
    run lesson N as a script, in a new process with this Python (``--quick``
    sets MINIDIST_LESSON_QUICK=1: the reduced form of long experiments). The
    lesson prints its text between its outputs (:mod:`minidist.narration`);
    ``quiet`` (``--quiet``) prints the outputs only.
    Returns the exit status; a mistake is one line on stderr and status 2."""
    folder = folder or lessons_folder()
    if folder is None:
        print("minidist lesson: error: no lessons/ folder here or next to the minidist package; "
              "the lessons come with the source checkout (git clone, then pip install -e .)",
              file=sys.stderr)
        return 2
    lessons = find_lessons(folder)
    if number is None:
        for index, title, path in lessons:
            print(f"{index:3d}  {title}  ({path.name})")
        print("Run one with `minidist lesson N` (--quick: the short form); open one as a "
              "notebook in JupyterLab (pip install -e '.[notebook]', see the README).")
        return 0
    chosen = [path for index, _, path in lessons if index == number]
    if not chosen:
        known = ", ".join(str(index) for index, _, _ in lessons)
        print(f"minidist lesson: error: there is no lesson {number}; the lessons are {known} "
              "(`minidist lesson` lists them)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if quick:
        env["MINIDIST_LESSON_QUICK"] = "1"
    if quiet:
        env[QUIET] = "1"
    return subprocess.run([sys.executable, str(chosen[0])], env=env).returncode
