"""What lessons 13 and 14 say, held where a test can hold it: the factors by
which each gradient compressor cuts the bytes (from the byte formulas, which
the lesson shows equal to its trace), and INT8's and MobileNet's savings."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from minidist.experiments import compression as experiment
from minidist.nn.mobile import compare_costs
from minidist.train import build_model

LESSONS = Path(__file__).resolve().parents[2] / "lessons"


def _ratios(world_size: int) -> dict[str, float]:
    shapes = experiment.parameter_shapes("mlp")
    dense = experiment.formula_bytes("none", shapes, world_size)
    return {name: dense / experiment.formula_bytes(name, shapes, world_size)
            for name in ("fp16", "bf16", "int8", "sign", "top-k 1%", "PowerSGD r2")}


def test_lesson13_each_compressor_cuts_the_bytes_by_the_factor_the_text_states():
    """The factors are glued from the formulas (glued_claims/13_communication_wall.py
    checks the run's); here, that the text cites them and what they are."""
    text = (LESSONS / "13_communication_wall.py").read_text()
    two, four = _ratios(2), _ratios(4)
    assert two["fp16"] == pytest.approx(2, rel=0.01) and two["bf16"] == pytest.approx(2, rel=0.01)
    assert two["int8"] == pytest.approx(4, rel=0.01) and four["int8"] == pytest.approx(2, rel=0.01)
    assert two["sign"] > 30, "one bit a value, plus a scale"
    assert two["top-k 1%"] > 40 and two["PowerSGD r2"] > 10
    for name in ("fp16_fewer", "int8_fewer", "int8_fewer_at_4", "topk_fewer", "powersgd_fewer"):
        assert f"{{glue}}`{name}`" in text
    assert not re.search(r"\d+x fewer", text), "a factor typed by hand"


def test_lesson13_follows_the_notation():
    """n ranks, N bytes (lessons/NOTATION.md): no "N ranks", no n values."""
    text = (LESSONS / "13_communication_wall.py").read_text()
    assert "n values, N ranks" not in text and "(Ψ values, n ranks)" in text
    assert "2 (n-1)/n · 4Ψ" in text and "(N-1)" not in text and "(N - 1)" not in text
    # PowerSGD's factors are not written P (the attention probabilities), the
    # matrix rank is not a process's rank, EF and QR are spelled out.
    assert "P = M Q" not in text and "`U = M Y`" in text and "*matrix rank* r" in text
    assert "'matrix rank ' + str(r)" in text
    assert '"EF" in the' in text and "*error feedback*" in text and "QR decomposition" in text
    assert "1/ratio" not in text and "1 % of the\ngradient's norm" not in text


def test_lesson14_int8_weights_are_four_times_smaller():
    from minidist.nn.quantization import model_size_bytes, quantize

    model = build_model("cnn", 0)
    calibration = np.random.default_rng(0).standard_normal((16, 1, 8, 8)).astype(np.float32)
    quantized = quantize(model, calibration)
    float_bytes, int8_bytes = model_size_bytes(model), model_size_bytes(quantized)
    assert 3 < float_bytes / int8_bytes <= 4, "weights at a quarter, biases and scales float32"
    assert "{glue}`weights_smaller` smaller weights" in (LESSONS / "14_faster_inference.py").read_text()


@pytest.mark.parametrize("c_in, c_out, k", [(32, 64, 3), (16, 16, 3), (64, 128, 5)])
def test_lesson14_the_separable_block_costs_one_over_c_out_plus_one_over_k_squared(c_in, c_out, k):
    costs = compare_costs(c_in, c_out, k, 14, 14)
    assert costs["multiply_add_ratio"] == pytest.approx(1 / c_out + 1 / k ** 2)
    text = (LESSONS / "14_faster_inference.py").read_text()
    assert "the\n# ratio is 1 / C_out + 1 / f^2" in text
    # the glossary's letters keep their meaning: no k x k kernel, no temperature T,
    # no s_x scales, no alpha weight (NOTATION.md: k top-k, T length, s bytes, α latency)
    for clash in ("k x k", "temperature T", "s_x", "weight alpha", "HxW", "K = 1040"):
        assert clash not in text, clash
    for method in ("`hard`", "`hinton`", "`fitnets`", "`fitnets_hard`", "`deep_hinton`"):
        assert method in text, method
    assert "benchmarks/bench_inference.py` shows" in text and "Vector Neural Network" in text
