"""The strategy demos' live tables (drawn on a terminal, so not in the
80-column test of what the commands print): each fits the terminal's width,
80 or 120 columns, and no cell is cut with an ellipsis."""

from __future__ import annotations

import io

import pytest
from rich.console import Console


def _drawn(renderable, width: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue().splitlines()


def _fits(lines: list[str], width: int) -> None:
    assert lines and max(map(len, lines)) <= width, "\n".join(lines)
    assert not any("…" in line for line in lines), "\n".join(lines)


@pytest.mark.parametrize("width", [80, 120])
def test_data_parallel_table_fits(width):
    from viz.demo_data_parallel import _table

    row = {"rank": 0, "epoch": 10, "epochs": 10, "step": 120, "steps": 120, "loss": 1.2345,
           "sent": 9_999_999, "seconds": 0.01}
    _fits(_drawn(_table({0: row, 11: dict(row, rank=11)}, 12, width), width), width)


@pytest.mark.parametrize("width", [80, 120])
def test_parameter_server_tables_fit(width):
    from minidist.parallel.parameter_server.layout import Layout
    from viz.demo_parameter_server import _View

    view = _View(Layout(2, 10), [(0, 1000), (1000, 2218)], 150, "parameter server, ssp(tau=2)")
    lines = _drawn(view.table(width), width)
    _fits(lines, width)
    assert any("9 (straggler)" in line for line in lines)


@pytest.mark.parametrize("width, tables", [(80, 2), (120, 1)])
def test_memory_table_fits_in_one_or_two_parts(width, tables):
    from viz.demo_memory import TABLE_COLUMNS, _table

    held = {"parameters": 38_440, "gradients": 38_440, "optimizer_state": 76_880,
            "buffers": 19_220, "activations": 86_700}
    latest = {(rank, name): {"rank": rank, "strategy": name, "step": 3, "steps": 3,
                             "bytes": held, "peak": 202_052}
              for rank in (0, 1) for name in ("DDP", "ZeRO-1")}
    lines = _drawn(_table(latest, 2, width), width)
    _fits(lines, width)
    assert sum("memory ledger per rank" in line for line in lines) == tables
    text = "\n".join(lines)
    assert all(column in text for column in TABLE_COLUMNS)  # every column, whole
