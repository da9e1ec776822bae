"""benchmarks/bench_fsdp2.py runs end to end (its quick mode, without torch) and
writes the fields it describes; its FSDP2 bytes equal the formula (the
benchmark itself raises otherwise). Speed itself is never asserted."""

import importlib.util
import json
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fsdp2.py"


@pytest.mark.timeout(240)
def test_fsdp2_benchmark_quick_mode_writes_its_results(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_fsdp2", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "fsdp2.json"
    assert bench.main(["--quick", "--no-torch", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    rows = {row["flavour"]: row for row in saved["results"]}
    assert sorted(rows) == ["FSDP1", "FSDP2"]
    assert rows["FSDP2"]["over_fsdp2"] == 1.0
    assert rows["FSDP2"]["all_gather_bytes"] > 0 and rows["FSDP2"]["all_reduce_bytes"] == 0
    assert rows["FSDP1"]["reduce_scatter_bytes"] > 0
    # The shards of both hold the model once between them (FSDP1 padded flat).
    model = bench.config(True)
    from minidist.models.gpt import GPT

    numel = GPT(model, rng=0).num_parameters()
    assert sum(rows["FSDP2"]["shard_bytes"]) == 4 * numel
    assert sum(rows["FSDP1"]["shard_bytes"]) >= 4 * numel
