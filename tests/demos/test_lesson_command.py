"""`minidist lesson`: lists every lesson by number and title; `minidist lesson N`
runs lesson N as a script (``--quick``: its reduced form)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minidist.cli import main
from minidist.lesson import lesson_command

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))


def test_the_list_names_every_lesson_with_its_number_and_title(capsys):
    assert main(["lesson"]) == 0
    out = capsys.readouterr().out
    words = " ".join(out.split())  # the lines wrap at the terminal's width
    for path in LESSONS:
        heading = next(line for line in path.read_text().splitlines() if line.startswith("# # "))
        title = re.sub(r"^# #\s+Lesson \d+:\s*", "", heading)
        assert f"{int(path.name[:2])} {' '.join(title.split())} ({path.name})" in words
        assert re.search(rf"^ *{int(path.name[:2])}  ", out, re.M)  # each number first on its line


def test_a_lesson_runs_with_this_python_and_quick_reaches_it(tmp_path, capfd):
    folder = tmp_path / "lessons"
    folder.mkdir()
    (folder / "07_probe.py").write_text(
        "# # Lesson 7: a probe\nimport os, sys\n"
        "print('quick', os.environ.get('MINIDIST_LESSON_QUICK'), sys.executable)\n"
        "sys.exit(3)\n")
    assert lesson_command(7, quick=True, folder=folder) == 3  # the lesson's own status
    assert capfd.readouterr().out.strip() == f"quick 1 {sys.executable}"
    assert lesson_command(7, quick=False, folder=folder) == 3
    assert capfd.readouterr().out.strip() == f"quick None {sys.executable}"
    assert lesson_command(None, folder=folder) == 0
    assert "  7  a probe  (07_probe.py)" in capfd.readouterr().out


@pytest.mark.timeout(120)
def test_lesson_1_runs_to_the_end_in_quick_mode(tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg", MINIDIST_LESSON_OUTPUT=str(tmp_path),
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "minidist.cli", "lesson", "1", "--quick"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip(), "lesson 1 printed nothing"


def test_each_lesson_writes_into_its_own_folder(tmp_path, capfd, monkeypatch):
    """output_dir() is lesson_output/<lesson>/ (under MINIDIST_LESSON_OUTPUT when
    set), the lesson's name read from the script it runs in."""
    folder = tmp_path / "lessons"
    folder.mkdir()
    (folder / "07_probe.py").write_text(
        "from minidist.lesson import output_dir\nprint(output_dir())\n")
    monkeypatch.setenv("MINIDIST_LESSON_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    assert lesson_command(7, folder=folder) == 0
    assert capfd.readouterr().out.strip() == str(tmp_path / "out" / "07_probe")
    assert (tmp_path / "out" / "07_probe").is_dir()
    from minidist.lesson import output_dir

    assert output_dir("03_collectives") == tmp_path / "out" / "03_collectives"
    monkeypatch.setenv("PMI_RANK", "1")  # under mpiexec, rank 1 draws beside rank 0
    assert output_dir("03_collectives") == tmp_path / "out" / "03_collectives" / "rank1"
