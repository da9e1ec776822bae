"""benchmarks/bench_gpt_parallel.py and bench_context_expert.py count each
configuration's bytes from a trace and set them against the formulas; each
exits with an error when a count differs. Run on shapes small enough for
the suite (2 ranks, one step, one round), they must exit cleanly: the
counting and the formulas agree, and neither script has rotted. The
cost-model side of bench_context_expert is checked against the formulas it
stands for."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from minidist import costmodel
from minidist.alpha_beta import PARAMS

ROOT = Path(__file__).resolve().parents[2]


def _run(script, *args):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=540, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_gpt_parallel_bytes_equal_the_formulas():
    out = _run("bench_gpt_parallel.py", "--worlds", "2", "--steps", "1", "--windows", "1",
               "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "8")
    rows = [line for line in out.splitlines() if line.startswith(("DP 2", "TP 2", "TP+SP 2", "PP 2"))]
    assert len(rows) == 5 and all("!=" not in row for row in rows), out


@pytest.mark.timeout(600)
def test_context_expert_bytes_equal_the_formulas():
    out = _run("bench_context_expert.py", "--rounds", "1", "--reps", "1", "--heads", "2",
               "--seq-len", "12", "--head-dim", "4", "--experts", "4", "--width", "8",
               "--tokens", "16", "--sim-heads", "8", "--sim-seq-len", "1024",
               "--sim-width", "16", "--sim-tokens", "64")
    rows = [line for line in out.splitlines() if line.startswith(("ring ", "ulysses ", "moe "))]
    assert len(rows) == 8 and all("!=" not in row for row in rows), out


@pytest.mark.parametrize("world", [2, 8, 64])
def test_the_model_times_are_the_cost_models(world):
    bench = _load("bench_context_expert")
    params, block = PARAMS["shm"], 3 << 20
    forward, backward = bench.ring_seconds(block, world, params)
    assert forward == pytest.approx((world - 1) * params.message(block), rel=1e-3)
    assert backward == pytest.approx((2 * world - 1) * params.message(block), rel=1e-3)
    nbytes = world * (1 << 16)
    assert bench.all_to_all_seconds(nbytes, world, params) == pytest.approx(
        costmodel.predict("all_to_all", "pairwise", world, nbytes, params), rel=1e-3)
