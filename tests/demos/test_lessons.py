"""Every lesson runs to the end, headless, twice: as a plain script and as a
notebook (converted from its Jupytext percent format and executed by a real
Jupyter kernel, the way a student opens it).

Every picture a lesson writes is shown where the text points at it: named
in the script's output (``[picture: ...]``) and inline in the notebook (an
image, or for an animation its player), one shown for each file written.

Lessons look at ``MINIDIST_LESSON_QUICK``: set here, it selects the reduced
form of any long experiment, so the whole chapter still runs end to end in CI.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))


def lesson_env(tmp_path):
    env = dict(os.environ)
    env["MINIDIST_LESSON_QUICK"] = "1"
    env["MPLBACKEND"] = "Agg"
    env["MINIDIST_LESSON_OUTPUT"] = str(tmp_path)
    return env


PICTURES = (".png", ".gif", ".html")


def pictures_written(folder):
    """The picture files a lesson wrote under ``folder`` (not other ranks')."""
    return sorted(path for path in folder.rglob("*") if path.suffix in PICTURES
                  and not any(part.startswith("rank") for part in path.relative_to(folder).parts))


def shown_inline(notebook):
    """How many pictures the executed notebook shows: images, and players
    (HTML with an animation or a picture in it)."""
    count = 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if any(kind.startswith("image/") for kind in data):
                count += 1
            elif "text/html" in data and any(word in str(data["text/html"]) for word in
                                            ("<img", "Animation", "<svg", "<canvas", "<iframe")):
                count += 1
    return count


def check_glued_claims(lesson, glued_file):
    """What the lesson's prose said of the values it glued holds for them:
    glued_claims/<lesson>.py's check(glued), where there is one."""
    checker = Path(__file__).parent / "glued_claims" / f"{lesson.stem}.py"
    if not checker.exists():
        return
    assert glued_file.exists(), f"{lesson.name} glued nothing, and {checker.name} checks its values"
    spec = importlib.util.spec_from_file_location(f"glued_claims_{lesson.stem}", checker)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.check(json.loads(glued_file.read_text()))


def test_there_are_lessons():
    assert LESSONS, "no lessons found in lessons/"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_as_a_script(lesson, tmp_path):
    env = lesson_env(tmp_path)
    # Every picture the lesson saves is checked for overlapping or cut text
    # (picture_check/sitecustomize.py, with tests/viz/text_layout.py).
    pictures = tmp_path / "picture_problems.jsonl"
    env["MINIDIST_PICTURE_CHECK"] = str(pictures)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parent / "picture_check"), str(ROOT)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    result = subprocess.run(
        [sys.executable, str(lesson)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert result.returncode == 0, f"{lesson.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    # What a student must not meet: matplotlib's complaint about an animation
    # made and never shown, or a warning that names minidist's own file.
    assert "Animation was deleted without rendering" not in result.stderr
    assert "OversubscriptionWarning:" not in result.stderr, result.stderr[-2000:]
    problems = pictures.read_text().splitlines() if pictures.exists() else []
    assert not problems, "text that overlaps or leaves the picture:\n" + "\n".join(problems)
    check_glued_claims(lesson, tmp_path / lesson.stem / "glued.json")
    unnamed = [path.name for path in pictures_written(tmp_path) if path.name not in result.stdout]
    assert not unnamed, (f"{lesson.name} writes pictures its terminal output never names "
                         f"(show them with minidist.lesson.show_figure / show_file): {unnamed}")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_as_a_notebook(lesson, tmp_path, monkeypatch):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    for key, value in lesson_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    notebook = jupytext.read(lesson)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = nbclient.NotebookClient(
        notebook, timeout=560, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors, errors
    written = pictures_written(tmp_path)
    inline = shown_inline(notebook)
    assert inline >= len(written), (
        f"{lesson.name} writes {len(written)} pictures and its notebook shows {inline} inline "
        f"({[path.name for path in written]}): show each with minidist.lesson.show_figure / show_file")
