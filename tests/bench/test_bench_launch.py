"""benchmarks/bench_launch.py runs end to end (a tiny configuration) and its
summary is the medians and ratios of what it measured. Speed is never asserted."""

import importlib.util
import json
import pathlib
import statistics

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_launch.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_launch", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.timeout(120)
def test_launch_against_fork_and_join_before_and_after(tmp_path):
    out = tmp_path / "launch.json"
    assert _bench().main(["--before", "HEAD", "--world-sizes", "2", "--blocks", "1",
                          "--rounds", "2", "--no-commands", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    rows = saved["summary"]["launch"]
    assert [(row["world_size"], row["minidist"]) for row in rows] == [(2, "before"),
                                                                       (2, "after")]
    for row in rows:
        samples = saved["samples"]["launch"]
        launch = samples[f"launch {row['minidist']} n=2"]
        bare = samples[f"bare {row['minidist']} n=2"]
        loaded = samples[f"bare-loaded {row['minidist']} n=2"]
        assert len(launch) == len(bare) == len(loaded) == 2 and min(launch + bare + loaded) > 0
        assert row["launch_over_bare_loaded"] == pytest.approx(
            statistics.median(launch) / statistics.median(loaded))
        assert row["launch_ms"] == pytest.approx(statistics.median(launch) * 1e3)
        assert row["launch_over_bare"] == pytest.approx(
            statistics.median(launch) / statistics.median(bare))
    assert saved["summary"]["commands"] == []


def test_summary_is_medians_and_their_ratios():
    bench = _bench()
    measured = {"launch": {"launch after n=2": [3.0, 1.0, 2.0], "bare after n=2": [1.0, 1.0, 4.0]},
                "commands": {"minidist run after": [0.5, 0.3, 0.4], "mpiexec": [0.2, 0.2, 0.1],
                             "mpiexec numpy": [0.3, 0.1, 0.4], "python -c pass": [0.02],
                             "import numpy": [0.1, 0.12, 0.11],
                             "import minidist.distributed after": [0.13]},
                "commands_note": None}
    summary = bench.summarize(measured, ["after"], [2])
    (row,) = summary["launch"]
    assert (row["launch_ms"], row["bare_ms"], row["launch_over_bare"]) == (2000.0, 1000.0, 2.0)
    (command,) = summary["commands"]
    assert command["run_over_mpiexec"] == pytest.approx(0.4 / 0.2)
    assert command["run_over_mpiexec_numpy"] == pytest.approx(0.4 / 0.3)
    assert summary["floors"] == pytest.approx({"python_ms": 20.0, "import_numpy_ms": 110.0,
                                               "import_minidist_distributed_barrier_after_ms":
                                                   130.0})
