"""The paths a reader follows stay short, and docs/ARCHITECTURE.md says how short.

``scripts/count_paths.py`` traces each path (the shortcuts off, 2 ranks on
the pipe) and counts the files, functions and lines it runs up to the path's
door: the transport's isend/irecv/wait for the ring and 1F1B, the collective
call for DDP's and FSDP's hooks. These counts do not depend on timing (what
lies behind the door, the engine, does: a wait sleeps or not), so the table
in ARCHITECTURE must carry them exactly, and each must stay within the 400
lines the project set for a reading.
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


def _documented() -> dict[str, tuple[int, int, int]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    rows = {}
    for line in text.splitlines():
        for path, (_, row) in READINGS.items():
            if line.startswith(f"| {row} |"):
                now = line.rstrip(" |").rsplit("|", 1)[1]
                found = COUNTS.search(now)
                assert found, f"ARCHITECTURE's row for {path} has no counts in its last cell"
                rows[path] = tuple(int(part.replace(",", "")) for part in found.groups())
    return rows


@pytest.mark.timeout(300)
def test_each_path_to_its_door_is_as_documented_and_within_400_lines():
    documented = _documented()
    assert set(documented) == set(READINGS), "a path is missing from ARCHITECTURE's table"
    for path, (reading, _) in READINGS.items():
        measured = _measured(path)
        assert reading in measured, (path, sorted(measured))
        files, functions, lines = measured[reading]
        assert (files, functions, lines) == documented[path], (
            f"{path}, {reading}: count_paths measures {files} files, {functions} functions, "
            f"{lines} lines; docs/ARCHITECTURE.md says {documented[path]}. Update the table "
            "(and say why the path grew).")
        assert lines <= 400, f"{path}, {reading}: {lines} lines, more than a reading's 400"
