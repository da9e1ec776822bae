"""``minidist bench collectives`` in its smallest form: the right rows, tables and
JSON, with MPICH and gloo left out. Nothing here looks at how fast anything is."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from minidist import cli, costmodel
from minidist.bench import native as native_side
from minidist.bench import parse_sizes
from minidist.bench.cases import ORDER, bus_factor, case_bytes, layout
from minidist.bench.collectives import (
    CALLS,
    Options,
    goals,
    minidist_algorithms,
    plan,
    print_goals,
    print_report,
    run,
)
from minidist.bench.timing import Timing
from minidist.distributed.collectives.call import ALGORITHMS

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ("broadcast", "reduce", "all_reduce")
SIZES = (4096, 16384)


def test_every_registered_collective_has_a_way_to_be_called():
    for collective in ALGORITHMS:
        assert collective in CALLS, f"add {collective} to minidist.bench.collectives.CALLS"
    assert set(MEASURED) <= set(minidist_algorithms())


def test_sizes_layouts_and_bus_factors():
    assert parse_sizes("4KiB-256MiB") == [4096 << (2 * k) for k in range(9)]
    assert parse_sizes("4KiB-64KiB", factor=2) == [4096, 8192, 16384, 32768, 65536]
    assert parse_sizes("1MiB,4KiB") == [4096, 1 << 20]
    with pytest.raises(ValueError):
        parse_sizes("64KiB-4KiB")
    assert layout("all_reduce", 4, 4096) == (1024, 1024)
    assert layout("all_gather", 4, 4096) == (256, 1024)
    assert case_bytes("gather", 3, 4096) == 4092  # rounded to a multiple of the world
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_to_all", 4) == 0.75
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("barrier", 8) is None


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown collective"):
        plan(Options(collectives=["allreduce"]))
    with pytest.raises(ValueError, match="unknown algorithm"):
        plan(Options(collectives=["all_reduce"], algorithms=["rign"]))


@pytest.mark.timeout(120)
def test_command_prints_a_table_per_collective_and_writes_every_row(tmp_path, capsys):
    output = tmp_path / "collectives.json"
    code = cli.main(["bench", "collectives", "--collectives", ",".join(MEASURED),
                     "--sizes", "4KiB,16KiB", "--world-sizes", "2", "--iterations", "1",
                     "--warmup", "1", "--no-mpich", "--no-gloo", "--no-fit", "--json",
                     str(output)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads(output.read_text())

    expected = {(collective, algorithm, size) for collective in MEASURED
                for algorithm in ALGORITHMS[collective] for size in SIZES}
    rows = report["rows"]
    assert {(row["collective"], row["algorithm"], row["size"]) for row in rows} == expected
    assert len(rows) == len(expected)
    for row in rows:
        assert row["world_size"] == 2 and row["transport"] == "shm"
        assert row["bytes"] == row["size"] and row["iterations"] == 1
        assert row["seconds"] > 0
        assert row["busbw_GBps"] == pytest.approx(
            row["algbw_GBps"] * bus_factor(row["collective"], 2))
        assert row["predicted_seconds"] == pytest.approx(costmodel.predict(
            row["collective"], row["algorithm"], 2, row["bytes"], params=costmodel.PARAMS["shm"]))
        assert row["mpich_seconds"] is None and row["gloo_seconds"] is None
    assert report["machine"]["cores"] >= 1
    assert report["mpich"]["notes"] == {"all": "skipped (--no-mpich)"}
    assert [goal["met"] for goal in report["goals"]] == [None, None, None]

    for collective in MEASURED:
        assert f"{collective}, 2 ranks, shm" in printed
    for algorithm in {a for c in MEASURED for a in ALGORITHMS[c]}:
        assert algorithm in printed
    assert "MPICH: skipped (--no-mpich)" in printed
    assert "targets" in printed
    # Under each table, its largest measured / model gap and this run's why.
    flat = " ".join(printed.split())
    assert flat.count("largest gap, ") == len(MEASURED)
    assert "default shm alpha/beta" in flat or "the model holds here" in flat


@pytest.mark.timeout(120)
def test_a_missing_reference_library_is_a_note_not_a_failure(monkeypatch):
    monkeypatch.setattr(native_side, "missing", lambda kind: f"{kind} is not installed here")
    console = Console(record=True, width=200, color_system=None)
    options = Options(collectives=["all_reduce"], algorithms=["ring"], sizes=[4096],
                      world_sizes=[2], timing=Timing(iterations=1, warmup=1), fit=False)
    report = run(options, console)
    print_report(report, console)
    text = console.export_text()
    assert [(row["algorithm"], row["size"]) for row in report["rows"]] == [("ring", 4096)]
    assert report["mpich"] == {"seconds": {}, "notes": {"all": "mpich is not installed here"}}
    assert "MPICH: mpich is not installed here" in text
    assert "gloo: gloo is not installed here" in text
    assert "/MPICH" not in text  # no empty columns for what was not measured


def test_quick_is_a_stated_subset():
    import argparse

    from minidist.bench import add_collectives_arguments
    from minidist.bench.collectives import (
        QUICK_COLLECTIVES,
        QUICK_SIZES,
        QUICK_WORLD_SIZES,
        options_from_args,
    )

    parser = argparse.ArgumentParser()
    add_collectives_arguments(parser)
    quick = options_from_args(parser.parse_args(["--quick"]))
    assert (quick.collectives, quick.sizes, quick.world_sizes) == (
        QUICK_COLLECTIVES, QUICK_SIZES, QUICK_WORLD_SIZES)
    assert not quick.fit and quick.timing.blocks == 3 and quick.timing.target_seconds < 0.1
    # What the goals name is in it: 4 KiB and 64 MiB all_reduce on 2 and 4 ranks.
    assert {4096, 64 << 20} <= set(quick.sizes) and {2, 4} <= set(quick.world_sizes)
    chosen = options_from_args(parser.parse_args(["--quick", "--collectives", "broadcast",
                                                  "--world-sizes", "3"]))
    assert chosen.collectives == ["broadcast"] and chosen.world_sizes == [3]


@pytest.mark.timeout(120)
def test_quick_without_mpich_and_torch_names_their_install_and_judges_nothing(monkeypatch,
                                                                             capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name.split(".")[0] in ("mpi4py", "torch")
                        else real(name, *rest))
    code = cli.main(["bench", "collectives", "--quick", "--sizes", "4KiB", "--world-sizes", "2",
                     "--algorithms", "ring", "--iterations", "1", "--warmup", "1"])
    printed = " ".join(capsys.readouterr().out.split())  # Rich wraps long lines
    assert code == 0, printed
    assert "pip install -e '.[bench]'" in printed
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in printed
    assert "slower than the target" not in printed and "within the target" not in printed
    assert printed.count("not measured") >= 3  # each goal, without a verdict
    assert "MPICH not run: mpi4py is not installed" in printed


def test_goals_read_the_rows():
    def row(algorithm, world_size, size, seconds, mpich, predicted):
        return {"transport": "shm", "collective": "all_reduce", "algorithm": algorithm,
                "world_size": world_size, "size": size, "bytes": size, "seconds": seconds,
                "mpich_seconds": mpich, "over_mpich": seconds / mpich,
                "measured_over_predicted": seconds / predicted, "oversubscribed": False}

    mib = 1 << 20
    report = {"rows": [row("ring", 2, 64 * mib, 4e-3, 10e-3, 4.2e-3),
                       row("coordinator", 2, 64 * mib, 9e-3, 10e-3, 9e-3),
                       row("ring", 4, 64 * mib, 4.5e-3, 10e-3, 3e-3),
                       row("recursive_doubling", 2, 4096, 20e-6, 10e-6, 20e-6)]}
    first, second, third = goals(report)
    assert first["met"] is True
    assert first["values"]["2"]["algorithm"] == "ring"
    assert first["values"]["4"]["ratio"] == pytest.approx(0.45)
    assert second["met"] is True and second["values"]["2"]["ratio"] == pytest.approx(2.0)
    assert third["met"] is False  # n=4 ring is 1.5 x its prediction
    assert third["values"]["all_reduce shm n=4"]["worst"] == pytest.approx(1.5)

    # More ranks than cores: shown, but the model (a core per rank) is not judged on it.
    squeezed = row("ring", 8, 64 * mib, 9e-3, 10e-3, 3e-3)
    squeezed["oversubscribed"] = True
    report["rows"] = [report["rows"][0], squeezed]
    third = goals(report)[2]
    assert third["met"] is True
    assert "n=8: worst 3.00 (oversubscribed: shown, not judged)" in third["measured"]


def test_a_target_is_judged_on_the_ratio_as_printed():
    """0.504 prints "0.50 x" and so meets "<= 0.5"; 0.506 prints "0.51 x" and is
    slower than the target. The ring's 1.254 prints 1.25: within 0.75 .. 1.25."""
    def row(world_size, size, seconds, mpich, predicted):
        return {"transport": "shm", "collective": "all_reduce", "algorithm": "ring",
                "world_size": world_size, "size": size, "bytes": size, "seconds": seconds,
                "mpich_seconds": mpich, "over_mpich": seconds / mpich,
                "measured_over_predicted": seconds / predicted, "oversubscribed": False}

    mib = 1 << 20
    rows = [row(4, 64 * mib, 5.04e-3, 10e-3, 5.04e-3 / 1.254),
            row(2, 4096, 20e-6, 10e-6, 20e-6)]
    first, _, third = goals({"rows": [row(2, 64 * mib, 5.04e-3, 10e-3, 5.04e-3), *rows]})
    assert "= 0.50 x" in first["measured"] and first["met"] is True
    assert "worst 1.25" in third["measured"] and third["met"] is True
    first, _, _ = goals({"rows": [row(2, 64 * mib, 5.06e-3, 10e-3, 5.06e-3), *rows]})
    assert "= 0.51 x" in first["measured"] and first["met"] is False
    assert first["missed"] == "slower than the target"

    console = Console(record=True, width=300, color_system=None)
    print_goals({"goals": [first, third]}, console)
    text = console.export_text()
    assert "slower than the target  best shm all_reduce of 64 MiB <= 0.5 x MPICH" in text
    assert "within the target  ring measured / predicted" in text


@pytest.mark.timeout(120)
def test_predictions_use_alpha_beta_gamma_fitted_in_the_same_run():
    report = run(Options(collectives=["all_reduce"], algorithms=["ring"], sizes=[1 << 20],
                         world_sizes=[2], timing=Timing(iterations=1, warmup=1), mpich=False,
                         gloo=False, quick=True),
                 Console(record=True, width=200, color_system=None))
    fitted = report["params"]["shm n=2"]
    assert fitted["fitted_in_this_run"]
    assert all(fitted[name] > 0 for name in ("alpha", "beta", "gamma", "exchange_beta"))
    points = report["fit_points"]["shm n=2"]
    assert set(points) == {"pingpong", "exchange", "combine"}
    assert "8" in points["pingpong"] and str(1 << 20) in points["exchange"]
    params = costmodel.Params(alpha=fitted["alpha"], beta=fitted["beta"],
                              gamma=fitted["gamma"], exchange_beta=fitted["exchange_beta"],
                              slots_alpha=fitted["slots_alpha"])
    (row,) = report["rows"]
    assert row["predicted_seconds"] == pytest.approx(
        costmodel.predict("all_reduce", "ring", 2, 1 << 20, params=params))


def test_the_script_is_a_thin_door_to_the_same_engine():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_collectives.py"),
                           "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--world-sizes" in done.stdout and "--no-gloo" in done.stdout


def test_collective_order_covers_the_fingerprint_list():
    from minidist.distributed.collectives.fingerprints import COLLECTIVES

    assert set(COLLECTIVES) == set(ORDER)


@pytest.mark.timeout(240)
def test_every_registered_collective_and_algorithm_is_measured():
    collectives = [name for name in ORDER if name in ALGORITHMS]
    report = run(Options(collectives=collectives, sizes=[4096], world_sizes=[2, 3],
                         timing=Timing(iterations=1, warmup=1), mpich=False, gloo=False,
                         fit=False),
                 Console(record=True, width=200, color_system=None))
    measured = {(row["collective"], row["algorithm"], row["world_size"])
                for row in report["rows"]}
    assert measured == {(collective, algorithm, n) for collective in collectives
                        for algorithm in ALGORITHMS[collective] for n in (2, 3)}
    for row in report["rows"]:
        if row["collective"] == "barrier":
            assert row["algbw_GBps"] is None
        else:
            factor = bus_factor(row["collective"], row["world_size"])
            assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factor)


def test_timing_reports_the_fastest_block_of_the_slowest_rank():
    from minidist.bench.timing import Timing, fastest_block, time_collective

    calls = []
    means, per_block = time_collective(lambda: calls.append(1), 1024,
                                       Timing(iterations=4, warmup=2, blocks=3),
                                       barrier=lambda: None, agree=lambda count: count)
    assert per_block == 4 and len(means) == 3 and len(calls) == 2 + 3 * 4
    # blocks (rows: ranks): each block is as slow as its slowest rank -> 3, 4, 2
    assert fastest_block([[3.0, 1.0, 2.0], [1.0, 4.0, 1.0]]) == 2.0
