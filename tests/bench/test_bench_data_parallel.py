"""benchmarks/bench_data_parallel.py runs end to end (a tiny configuration)
and writes the fields the README describes. Speed itself is never asserted."""

import importlib.util
import json
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_data_parallel.py"


@pytest.mark.timeout(120)
def test_weak_scaling_benchmark_writes_its_results(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_data_parallel", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "dp.json"
    assert bench.main(["--quick", "--no-torch", "--models", "mlp", "--workers", "2",
                       "--steps", "1", "--windows", "1", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert [row["workers"] for row in saved["results"]] == [1, 2]
    single, double = saved["results"]
    for flavour in ("ddp", "coordinator"):
        assert single[f"{flavour}_efficiency"] == 1.0
        assert double[f"{flavour}_samples_per_s"] == pytest.approx(
            2 * 128 / (double[f"{flavour}_step_ms"] / 1e3))
    assert saved["settings"]["blas_threads_per_worker"] == 1


def test_digits_upscaled_to_28x28_keep_their_pixels():
    spec = importlib.util.spec_from_file_location("bench_data_parallel", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from minidist.data import load_digits

    small = load_digits(flatten=False)[0]
    big, _ = bench.digits_28x28(flat=False)
    assert big.shape == (len(small), 1, 28, 28)
    assert (big[:, :, ::7, ::7] == small[:, :, ::2, ::2]).all()
    assert bench.digits_28x28(flat=True)[0].shape == (len(small), 784)
