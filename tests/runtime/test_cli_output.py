"""What the `minidist` command prints, read at 80 columns.

* every command that prints a table (and the prose around it) fits in 80
  columns: no line is longer, and no cell is cut with an ellipsis; what a
  student types (an exercise's name) and the numbers a student checks
  (an algorithm's name, a count of messages) come out whole;
* `minidist simulate`'s progress bar knows its total from the start: the
  simulator counts the messages an algorithm will send before it sends
  the first, and reports from inside a symmetric run too.

The commands run in this process (``main(argv)``) with small sizes, in a
temporary folder (the demos write their traces where they run).
"""

from __future__ import annotations

import io
import re
import shlex
import shutil
from pathlib import Path

import pytest

from minidist.cli import main

HERE = Path(__file__).resolve().parent
WRONG_RING = HERE.parent / "exercises" / "wrong" / "ring_off_by_one.py"

#: Every command that prints a table, with sizes small enough to be quick.
TABLES = [
    "exercise list",
    "exercise show zb_h1",
    "lesson",
    "simulate all_reduce -n 64 --size 1MB",
    "simulate all_reduce --algorithm ring -n 65536 --size 100MB",
    "simulate all_to_all -n 16 --size 1KB --algorithm bruck --trace t.jsonl",
    "viz t.jsonl --play --speed 1000",  # the trace just written, replayed
    "profile t.jsonl --steps",  # and profiled
    "simulate broadcast -n 8 --size 4KB --algorithm all",
    "plan --ranks 16 --n-layer 4",
    "plan --mesh 2x2x4",
    "predict -n 2 --copies 1 --epochs 1 --no-progress",
    "train --epochs 1 --no-progress",
    "demo --epochs 1 --play --speed 1000",
    "demo ring-allreduce -n 4 --play --speed 1000",
    "demo broadcast --simulate -n 8 --play --speed 1000",
    "demo data-parallel -n 2 --epochs 1",
    "demo parameter-server -n 3 --epochs 1",
    "demo memory",
    "demo model-parallel --epochs 1 --play --speed 1000",
    "demo pipeline --epochs 1 --play --speed 1000",  # its chart wider than 80: scrolled, said
    "demo pipeline --simulate --play --speed 1000",
    "demo pipeline --schedule zbv --stages 2 --microbatches 4 --epochs 1 --play --speed 1000",
    "exercise check ring_allreduce wrong.py --no-processes --no-files",
    "bench collectives --quick --world-sizes 2 --sizes 4KiB",  # with MPICH, gloo if there
]

#: Each subcommand's --help, which argparse wraps at COLUMNS itself.
HELP = ["--help", "train --help", "demo --help", "viz --help", "run --help",
        "bench collectives --help", "simulate --help", "predict --help", "plan --help",
        "lesson --help", "exercise --help", "exercise check --help", "profile --help"]


def _at_80_columns(command: str, capsys) -> str:
    try:
        main(shlex.split(command))
    except SystemExit:  # --help
        pass
    return capsys.readouterr().out


@pytest.fixture
def eighty(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(WRONG_RING, tmp_path / "wrong.py")


@pytest.mark.timeout(300)
def test_every_table_fits_in_80_columns_and_no_cell_is_cut(eighty, capsys):
    problems = []
    outputs = {}
    for command in TABLES + HELP:
        out = outputs[command] = _at_80_columns(command, capsys)
        assert out.strip(), f"`minidist {command}` printed nothing"
        for line in out.splitlines():
            if len(line) > 80:
                problems.append(f"`minidist {command}`: {len(line)} characters: {line!r}")
            if "…" in line:
                problems.append(f"`minidist {command}`: a cut cell: {line!r}")
    assert not problems, "\n".join(problems)

    from minidist.distributed.collectives import ALGORITHMS
    from minidist.exercises import all_exercises

    listing = outputs["exercise list"]
    for exercise in all_exercises():  # the names a student types, whole
        assert re.search(rf"\b{exercise.name}\b", listing), exercise.name
    table = outputs["simulate all_reduce -n 64 --size 1MB"]
    for algorithm in ALGORITHMS["all_reduce"]:
        assert re.search(rf"\b{algorithm}\b", table), algorithm
    assert "8,589,803,520" in outputs["simulate all_reduce --algorithm ring -n 65536 --size 100MB"]
    # A demo's commands to draw its trace come out whole, one a line; a
    # pipeline chart wider than the terminal says how to see all of it.
    for command, name in (("demo data-parallel -n 2 --epochs 1", "data_parallel"),
                          ("demo parameter-server -n 3 --epochs 1", "parameter_server"),
                          ("demo model-parallel --epochs 1 --play --speed 1000", "model_parallel"),
                          ("demo pipeline --epochs 1 --play --speed 1000", "pipeline")):
        assert f"\n  minidist viz {name}.trace.jsonl --timeline {name}.png\n" in outputs[command]
    for command in ("demo pipeline --epochs 1 --play --speed 1000",
                    "demo pipeline --simulate --play --speed 1000"):
        said = " ".join(outputs[command].split())
        assert re.search(r"the whole batch needs (\d+) columns \(a wider terminal, or "
                         r"COLUMNS=\1\), or --timeline OUT.png draws it", said), command


def test_the_simulators_progress_knows_its_total_before_the_first_message():
    from minidist.distributed.simulator import simulate

    for algorithm, world_size, symmetric in (("ring", 16384, True),
                                             ("double_binary_tree", 64, False)):
        reports: list = []
        result = simulate("all_reduce", algorithm, world_size, 100_000_000,
                          progress=lambda messages, total, reports=reports:
                          reports.append((messages, total)))
        assert result.symmetric is symmetric
        assert reports[0] == (0, result.messages), algorithm
        assert reports[-1] == (result.messages, result.messages), algorithm
        assert all(total == result.messages for _, total in reports)
        assert [messages for messages, _ in reports] == sorted(m for m, _ in reports)
    # A symmetric run is one test of its one rank's Work: it reports from
    # inside it (by the sends), not only at the end.
    reports = []
    simulate("all_reduce", "ring", 65536, 100_000_000,
             progress=lambda messages, total: reports.append(messages))
    assert any(0 < messages < reports[-1] for messages in reports), reports


@pytest.mark.timeout(120)
def test_simulates_bar_has_its_total_from_the_first_frame_at_80_columns(monkeypatch, capsys):
    """The bar as a terminal of 80 columns draws it: "M/N messages" from its
    first frame, with N whole."""
    from rich.console import Console

    from minidist import commands

    screen = io.StringIO()
    plain = commands._progress_bar
    monkeypatch.setattr(commands, "_progress_bar", lambda quiet: plain(
        quiet, console=Console(file=screen, force_terminal=True, width=80)))
    assert main(["simulate", "all_reduce", "--algorithm", "ring", "-n", "65536"]) == 0
    capsys.readouterr()
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # no escape codes
    lines = [line for line in re.split(r"[\r\n]", drawn) if "messages" in line]
    assert lines, screen.getvalue()[-2000:]
    assert all("…" not in line and len(line) <= 80 for line in lines), lines[:3]
    totals = {re.search(r"/(\S+) messages", line).group(1) for line in lines}
    assert totals == {"8,590M"}, totals  # 8,589,803,520, never "?"
    assert commands._counted(5_476, 778_260) == "5k/778k"
    assert commands._counted(7, 99_999) == "7/99,999"


def test_the_wait_simulate_announces_is_at_this_machines_pace(monkeypatch, capsys):
    """The estimate's constants were fitted on one idle machine (94 s said,
    2 min taken on a shared one): the warning scales them by a small
    simulation timed here, its CPU time (the machine's speed) and its wall
    time (how busy the machine is now)."""
    import types

    import numpy as np

    from minidist import commands
    from minidist.distributed.simulator import estimate

    cpu, wall = commands._machine_pace()
    assert 0.1 <= cpu <= wall
    args = types.SimpleNamespace(root=0, trace=None, nproc=1024)
    raw = estimate("all_reduce", "double_binary_tree", 1024, 100_000_000).seconds
    monkeypatch.setattr(commands, "_machine_pace", lambda: (0.5, 1.5))  # half the work, 3x busy
    commands._check_cost("all_reduce", ["double_binary_tree"], args, 100_000_000,
                         np.dtype("float32"))
    said = capsys.readouterr().err
    assert f"about {commands._format_duration(raw * 1.5)} here" in said, said
    assert "about 3.0 s for each second of work" in said, said


def test_the_pace_probe_predicts_a_bigger_simulations_cpu_time():
    """Within a factor of two, in CPU time (the wall clock of a shared machine
    is the warning's other factor)."""
    import time

    from minidist import commands
    from minidist.distributed.simulator import estimate, simulate

    cpu, _ = commands._machine_pace()
    case = ("all_reduce", "double_binary_tree", 128, 4 << 20)
    start = time.process_time()
    simulate(*case)
    took = time.process_time() - start
    assert 0.5 < took / (estimate(*case).seconds * cpu) < 2.0, (took, estimate(*case), cpu)
