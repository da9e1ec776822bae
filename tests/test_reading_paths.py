"""The paths a reader follows stay short, and docs/ARCHITECTURE.md says how short.

``scripts/count_paths.py`` traces each path (the shortcuts off, 2 ranks on
the pipe) and counts the files, functions and lines it runs up to the path's
door: the transport's isend/irecv/wait for the ring and 1F1B, the collective
call for DDP's and FSDP's hooks. These counts do not depend on timing (what
lies behind the door, the engine, does: a wait sleeps or not). The table in
ARCHITECTURE states, for each path, the files and lines a reading is held
within: a path that grows past them fails here (say why in the table when
you raise one); a docstring line more on a path within them does not. No
bound is over the 400 lines the project set for a reading.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: path name in count_paths.py -> (the reading to hold, the row of ARCHITECTURE's table)
READINGS = {
    "ring": ("to the transport's isend / irecv / wait", '`dist.all_reduce(x, algorithm="ring")`'),
    "ddp": ("the gradient hook to the bucket's all_reduce", "DDP `loss.backward()`"),
    "fsdp": ("the hooks that gather and free the weights, to the all_gather",
             "FSDP (ZeRO-3) forward"),
    "1f1b": ("to the transport's isend", "1F1B, a stage's send of its activation"),
}
COUNTS = re.compile(r"(\d+) files, (\d+) functions, ([\d,]+) lines")
BOUND = re.compile(r"at most (\d+) files, ([\d,]+) lines")


def _measured(path: str) -> dict[str, tuple[int, int, int]]:
    env = dict(os.environ, MINIDIST_FAST_PATHS="0", COUNT_TRANSPORT="pipe")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "count_paths.py"), str(ROOT),
                           path], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    readings = {}
    for line in done.stdout.splitlines():
        if line.startswith(f"{path}, "):
            reading = line[len(path) + 2:line.index(" (pipe)")]
            found = COUNTS.search(line)
            readings[reading] = tuple(int(part.replace(",", "")) for part in found.groups())
    return readings


def _documented() -> dict[str, tuple[int, int]]:
    """path -> (files, lines) of the last cell of its row: the bound."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    rows = {}
    for line in text.splitlines():
        for path, (_, row) in READINGS.items():
            if line.startswith(f"| {row} |"):
                bound = line.rstrip(" |").rsplit("|", 1)[1]
                found = BOUND.search(bound)
                assert found, f"ARCHITECTURE's row for {path} has no bound in its last cell"
                rows[path] = tuple(int(part.replace(",", "")) for part in found.groups())
    return rows


@pytest.mark.timeout(300)
def test_each_path_to_its_door_is_within_its_documented_bound():
    documented = _documented()
    assert set(documented) == set(READINGS), "a path is missing from ARCHITECTURE's table"
    for path, (reading, _) in READINGS.items():
        measured = _measured(path)
        assert reading in measured, (path, sorted(measured))
        files, functions, lines = measured[reading]
        most_files, most_lines = documented[path]
        assert most_lines <= 400, f"{path}: the bound of {most_lines} lines is over a reading's 400"
        assert files <= most_files and lines <= most_lines, (
            f"{path}, {reading}: count_paths measures {files} files, {functions} functions, "
            f"{lines} lines; docs/ARCHITECTURE.md holds it within {most_files} files and "
            f"{most_lines} lines. Shorten the path, or raise the bound and say why the path grew.")


def test_the_bound_is_read_from_the_last_cell():
    """The test can fail: a row's bound is found, and a row without one is not."""
    assert BOUND.search("at most 7 files, 1,340 lines").groups() == ("7", "1,340")
    assert BOUND.search("7 files, 28 functions, 317 lines") is None
