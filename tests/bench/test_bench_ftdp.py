"""benchmarks/bench_ftdp.py runs end to end (its quick mode) and writes its
tables; the bytes it reads from the trace are the formulas': the ring's
gradient on both sides, plain DDP's example count, and the quorum's one
all_reduce of 6 W int64 rows on the fault-tolerant side. Speed itself is
never asserted."""

import importlib.util
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ftdp.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_ftdp", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.timeout(240)
def test_ftdp_benchmark_quick_mode_writes_its_tables(tmp_path):
    bench = _bench()
    out = tmp_path / "ftdp.md"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    for row in ("| plain DDP |", "| fault-tolerant DDP |", "the group goes on at 3 of 4",
                "| restart of the whole job (at least) |", "## Latest results"):
        assert row in text, text


@pytest.mark.timeout(120)
def test_the_traced_bytes_are_the_formulas():
    bench = _bench()
    sent = bench.measure_steps(rounds=1, steps=2)["sent"]
    world, parameters = bench.WORLD, 64 * 16 + 16
    ring = 2 * (world - 1) * (parameters * 8) // world        # 8 B a float64
    for rank in range(world):
        assert sent["plain"][rank][0] == ring + 24                # and the example count
        quorum = 2 * (world - 1) * (6 * world * 8) // world  # the agreement's rows
        assert sent["tolerant"][rank] == (ring + quorum, 12)
