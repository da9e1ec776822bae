"""Every lesson runs to the end, headless, twice: as a plain script and as a
notebook (converted from its Jupytext percent format and executed by a real
Jupyter kernel, the way a student opens it).

Lessons look at ``MINIDIST_LESSON_QUICK``: set here, it selects the reduced
form of any long experiment, so the whole chapter still runs end to end in CI.
"""

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
