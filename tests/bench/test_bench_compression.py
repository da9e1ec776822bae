"""benchmarks/bench_compression.py runs end to end (a tiny configuration)
and writes the fields the README describes. Speed itself is never asserted."""

import importlib.util
import json
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_compression.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_compression", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.timeout(120)
def test_compression_benchmark_writes_its_results(tmp_path):
    bench = _load()
    out = tmp_path / "compression.json"
    assert bench.main(["--quick", "--no-torch", "--models", "mlp", "--steps", "1",
                       "--windows", "1", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    mlp = saved["results"]["mlp"]
    assert set(mlp["compressors"]) == set(bench.NAMES)
    for name, row in mlp["compressors"].items():
        if row["formula_bytes"] is not None:      # threshold's bytes depend on the data
            assert row["bytes_per_step"] == row["formula_bytes"], name
        assert row["crossover"]["kind"] in ("below", "above", "always", "never")
    assert mlp["compressors"]["none"]["vs_none"] == 1.0
    assert set(mlp["overlap"]) == set(bench.OVERLAP_NAMES)
    assert saved["settings"]["blas_threads_per_worker"] == 1


def test_crossover_cases():
    crossover = _load().crossover
    # 1 ms slower, 1,000 bytes fewer: wins below 8,000 bit / 1 ms = 8 Mbit/s
    assert crossover(2e-3, 2, 0, 1e-3, 2, 1000, 0.0) == ("below", pytest.approx(8e6))
    assert crossover(0.5e-3, 2, 0, 1e-3, 2, 1000, 0.0) == ("always", None)
    assert crossover(2e-3, 2, 2000, 1e-3, 2, 1000, 0.0) == ("never", None)
