"""Small conveniences shared by the lessons in ``lessons/``.

A lesson is a script (and, through Jupytext, a notebook). Two environment
variables let the test-suite run every lesson end to end in CI:

* ``MINIDIST_LESSON_QUICK=1`` selects the reduced form of long experiments;
* ``MINIDIST_LESSON_OUTPUT`` is where pictures are written, in a folder per
  lesson (default: ``lesson_output/<lesson>/`` in the current directory);
* ``MINIDIST_LESSON_QUIET=1``: outputs only, without the text between them
  (:mod:`minidist.narration`).

Prose that cites a number the lesson computed is not written by hand: the
value is *glued* once under a name (:func:`glue`, the idea of MyST-NB's
``glue``) and the sentence that cites it is shown by :func:`say`, as
rendered Markdown in the notebook and in the terminal narration alike, so
the text can never disagree with the run. Every glued value is also kept in
``glued.json`` in the lesson's output folder, where the claims tests read
what the lesson found. A picture is shown where the text points at it
(:func:`show_figure`, :func:`show_file`): inline in a notebook, its file
named in the terminal.

``minidist lesson`` lists the lessons and ``minidist lesson N`` runs one
(:func:`find_lessons`, :func:`lesson_command`).
"""

from __future__ import annotations

import json
import numbers
import os
import re
import subprocess
import sys
from pathlib import Path

from minidist.narration import QUIET, narrate, show_markdown, speaks  # noqa: F401 - the lessons' import


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
    script shows its pictures as files instead. (ipykernel imported is not
    enough: a test or a tool may import it without running in a kernel.)"""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def use_headless_matplotlib():
    """Select the Agg backend unless a notebook already chose an inline one."""
    import matplotlib

    if "inline" not in matplotlib.get_backend().lower():
        matplotlib.use("Agg")


# ----------------------------------------------------------- computed values in prose

#: name -> (the value as computed, its text as the prose shows it)
_GLUED: dict[str, tuple[object, str]] = {}
_REFERENCE = re.compile(r"\{glue\}`([A-Za-z_][A-Za-z0-9_]*)`")


def glue(name: str, value, spec: str = "") -> str:
    """Keep ``value`` under ``name`` for the prose, formatted once:
    ``format(value, spec)``, or ``spec.format(value)`` when ``spec`` holds
    ``{}`` ("{:.1f} ms"). Returns the text, so that a print can show the
    same characters the prose will. The value and its text are written to
    ``glued.json`` in the lesson's output folder."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
        raise ValueError(f"glue: the name {name!r} is not an identifier; name a value like "
                         "ring_ms or busiest_share")
    text = spec.format(value) if "{" in spec else format(value, spec)
    _GLUED[name] = (value, text)
    _write_glued()
    return text


def glued(name: str) -> str:
    """The text :func:`glue` made for ``name``."""
    if name not in _GLUED:
        known = ", ".join(sorted(_GLUED)) or "none yet"
        raise KeyError(f"no value is glued as {name!r}: glue(name, value, spec) it in a cell "
                       f"above the prose that cites it (glued so far: {known})")
    return _GLUED[name][1]


def fill(markdown: str) -> str:
    """``markdown`` with every ``{glue}`name``` replaced by the glued text."""
    return _REFERENCE.sub(lambda match: glued(match.group(1)), markdown)


def say(markdown: str) -> None:
    """Show prose that cites computed values: ``{glue}`name``` references
    (and any f-string's values) in Markdown, rendered inline in a notebook
    and printed like a Markdown cell in the terminal; nothing under
    ``--quiet`` or in an MPI rank other than 0. In the lesson's source the
    call sits in a code cell whose input a notebook keeps folded
    (``# %% jupyter={"source_hidden": true}``), so a student reads the
    rendered text, not the call."""
    import textwrap

    text = fill(textwrap.dedent(markdown).strip("\n"))
    if not speaks():
        return
    if in_notebook():
        from IPython.display import Markdown, display

        display(Markdown(text))
    else:
        show_markdown(text)


def _plain(value):
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):                  # keys as JSON keeps them: text
        return {str(key): _plain(item) for key, item in value.items()}
    return str(value)


def _write_glued() -> None:
    from minidist.atomic_file import atomic_path

    record = {name: {"value": _plain(value), "text": text} for name, (value, text) in _GLUED.items()}
    path = output_dir() / "glued.json"
    with atomic_path(path) as name:
        Path(name).write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")


# ------------------------------------------------------------ pictures where they are read

def _shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def show_file(path, caption: str = "") -> None:
    """Show a picture the lesson wrote (PNG or GIF): inline in a notebook;
    in the terminal one line naming the file, so that the text's "the
    picture below" has a place to look. (Returns nothing, so that a cell
    ending with it shows no stray value.)"""
    path = Path(path)
    if in_notebook():
        from IPython.display import Image, display

        display(Image(filename=str(path)))
        if caption and speaks():
            display(_markdown(f"*{caption}*"))
    elif _mpi_rank() == 0:
        line = f"[picture: {_shown_path(path)}]"
        print(f"{line} {caption}" if caption else line, flush=True)


def show_page(path, caption: str = "", height: int = 720) -> None:
    """Show an HTML page the lesson wrote (an offline page with its script
    inline, such as the planner's): in a notebook inside a frame, as it
    looks in a browser; in the terminal one line naming the file to open."""
    path = Path(path)
    if in_notebook():
        import html

        from IPython.display import HTML, display

        page = html.escape(path.read_text(encoding="utf-8"), quote=True)
        display(HTML(f'<iframe srcdoc="{page}" style="width:100%;height:{height}px;'
                     'border:1px solid #ccc"></iframe>'))
        if caption and speaks():
            display(_markdown(f"*{caption}*"))
    elif _mpi_rank() == 0:
        line = f"[page: {_shown_path(path)}: open it in a browser]"
        print(f"{line} {caption}" if caption else line, flush=True)


def _markdown(text):
    from IPython.display import Markdown

    return Markdown(text)


def show_figure(figure, name: str, caption: str = "", dpi: int = 100) -> None:
    """Save a pyplot ``figure`` as ``name`` in the lesson's output folder
    (whole or not at all), close it, and :func:`show_file` it there."""
    import matplotlib.pyplot as plt

    from minidist.atomic_file import atomic_path

    path = output_dir() / name
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    plt.close(figure)
    show_file(path, caption)


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
        import shutil
        import textwrap

        # Wrapped at the terminal's width (80 when it is not a terminal), a
        # file name never broken: the number is what `minidist lesson N` takes.
        width = max(shutil.get_terminal_size().columns, 40)
        for index, title, path in lessons:
            print(textwrap.fill(f"{index:3d}  {title}  ({path.name})", width,
                                subsequent_indent=" " * 5, break_long_words=False,
                                break_on_hyphens=False))
        print(textwrap.fill("Run one with `minidist lesson N` (--quick: the short form); open "
                            "one as a notebook in JupyterLab (pip install -e '.[notebook]', see "
                            "the README).", width, break_long_words=False,
                            break_on_hyphens=False))
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
