"""benchmarks/bench_pipeline.py runs end to end (a tiny configuration) and
writes the fields the README describes; its predicted bubble is the
schedule's on the virtual clock. Speed itself is never asserted."""

import importlib.util
import json
import pathlib
from fractions import Fraction

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_pipeline.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_pipeline", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.timeout(300)
def test_pipeline_benchmark_writes_every_schedule(tmp_path):
    bench = _bench()
    out = tmp_path / "pipeline.json"
    assert bench.main(["--no-torch", "--rounds", "1", "--steps", "1", "--width", "32",
                       "--batch", "16", "--microbatches", "4", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    rows = {row["schedule"]: row for row in saved["rows"]}
    assert set(rows) == set(bench.SCHEDULES)
    p, m = 2, 4
    for name, row in rows.items():
        assert len(row["minidist_ms"]) == 1 and row["minidist_ms"][0] > 0
        assert all(0 <= b < 1 for b in row["bubble_measured"]), (name, row)
        letters = set(row["mean_region_ms"])
        split = name.startswith(("zb", "dual"))
        assert "F" in letters and (({"I", "W"} <= letters) if split else letters == {"F", "B"})
    # GPipe and 1F1B on equal stages: (p - 1) / (m + p - 1) whatever the costs.
    for name in ("gpipe", "1f1b"):
        assert rows[name]["bubble_predicted"] == pytest.approx(
            float(Fraction(p - 1, m + p - 1)), abs=1e-9)


def test_each_rank_holds_the_stages_of_its_placement():
    bench = _bench()
    assert bench.my_stages("1f1b", 1, 2) == [1]
    assert bench.my_stages("interleaved_1f1b", 1, 2) == [1, 3]
    assert bench.my_stages("zbv", 0, 2) == [0, 3]
    assert bench.my_stages("dualpipev", 1, 2) == [1, 2]
    assert bench.stage_layers(4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
