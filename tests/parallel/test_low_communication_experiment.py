"""The low-communication experiment (minidist.experiments.low_communication),
quick form on 2 real processes: the bytes read from the trace are DDP's
divided by H, to the byte, as the ring's formula says; the crossover
bandwidths are the solutions of a1 + b1 / B = a2 + b2 / B written out here
from the alpha-beta formula; the fastest bands agree with the modeled
times; the picture is written."""

from __future__ import annotations

import math

import pytest

from minidist.alpha_beta import params_for
from minidist.experiments import low_communication as lc


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return lc.run(quick=True, world_size=2, output=tmp_path_factory.mktemp("picture"))


@pytest.mark.timeout(300)
def test_the_quick_form_trains_every_method_on_both_models(result):
    assert result.quick and set(result.models) == {"gpt", "cnn"}
    for model in result.models.values():
        assert list(model.runs) == ["ddp", "local_sgd every 4", "local_sgd every 16",
                                    "diloco every 4", "diloco every 16"]
        for run in model.runs.values():
            assert run.steps[0] == 0 and len(run.steps) == len(run.loss)
            assert run.loss[-1] < run.loss[0]               # every method trains
            assert run.seconds_per_step > run.comm_seconds_per_step >= 0
        # The default target is one every method reaches.
        assert all(run.steps_to_target is not None for run in model.runs.values())
        assert model.runs["ddp"].loss[-1] < 0.9 * model.runs["ddp"].loss[0]


def test_bytes_from_the_trace_are_ddps_divided_by_h(result):
    n = 2
    for model in result.models.values():
        ring = 2 * (n - 1) / n * model.parameter_bytes      # one all_reduce on the ring
        ddp = model.runs["ddp"]
        assert ddp.ring_bytes_per_step == ring
        # DDP's only other message: the example count, 8 bytes to the other rank.
        assert 0 <= ddp.bytes_per_step - ddp.ring_bytes_per_step <= 8 * (n - 1)
        for run in model.runs.values():
            if run.kind == "ddp":
                continue
            assert run.bytes_per_step == run.ring_bytes_per_step     # nothing else sent
            assert run.bytes_per_step * run.sync_every == ddp.ring_bytes_per_step
            assert run.bytes_per_step == run.formula_bytes_per_step
        assert model.bytes_ratio_to_ddp["local_sgd every 16"] == pytest.approx(1 / 16, rel=1e-3)


def _terms(model, run):
    """a and b of T(B) = a + b / B, from the ring's formula written out."""
    n, size, link = model.world_size, model.parameter_bytes, model.link
    syncs = run.steps_to_target / run.sync_every
    fixed = 2 * (n - 1) * link.alpha + (n - 1) / n * size * link.gamma
    return (run.steps_to_target * model.compute_seconds_per_step + syncs * fixed,
            syncs * 2 * (n - 1) / n * size)


def test_the_crossovers_solve_the_formula(result):
    checked = 0
    for model in result.models.values():
        assert model.link.alpha == params_for("shm").alpha
        for c in model.crossovers:
            (a1, b1), (a2, b2) = _terms(model, model.runs[c.below]), \
                _terms(model, model.runs[c.above])
            assert c.bandwidth == pytest.approx((b1 - b2) / (a2 - a1), rel=1e-9)
            assert b1 < b2                       # below it, the one that sends less wins
            assert model.seconds_to_target(c.below, c.bandwidth) == \
                pytest.approx(model.seconds_to_target(c.above, c.bandwidth), rel=1e-9)
            assert model.seconds_to_target(c.below, c.bandwidth / 2) < \
                model.seconds_to_target(c.above, c.bandwidth / 2)
            checked += 1
        for name, below in model.beats_ddp_below.items():
            if below is not None and math.isfinite(below):
                assert any(c.below == name and c.above == "ddp" and c.bandwidth == below
                           for c in model.crossovers)
        # Each band's method is the fastest at both its ends' geometric middle.
        for low, high, name in model.fastest:
            middle = math.sqrt(low * high)
            assert name == min((n for n in model.runs),
                               key=lambda n: model.seconds_to_target(n, middle))
        assert model.fastest[0][0] == 1e3 and model.fastest[-1][1] == 1e13
    assert checked          # the runs do cross somewhere


def test_crossover_on_numbers():
    # 1 + 4 / B = 2 + 2 / B at B = 2; parallel lines and a crossing at B < 0 are none.
    assert lc.crossover((1.0, 4.0), (2.0, 2.0)) == 2.0
    assert lc.crossover((1.0, 4.0), (1.0, 2.0)) is None
    assert lc.crossover((2.0, 4.0), (1.0, 2.0)) is None
    assert lc.crossover((math.inf, 0.0), (1.0, 2.0)) is None
    fixed, per_byte = lc.allreduce_terms(1000.0, 4, params_for("shm"))
    link = params_for("shm")
    assert fixed == pytest.approx(6 * link.alpha + 0.75 * 1000 * link.gamma)
    assert per_byte == pytest.approx(1500.0)


def test_the_picture_and_the_table(result):
    assert result.picture is not None and result.picture.stat().st_size > 10_000
    text = lc.format_table(result)
    for name in ("ddp", "diloco every 16", "beats DDP below", "fastest to the target"):
        assert name in text


def test_bad_model():
    with pytest.raises(ValueError, match="unknown model"):
        lc.configuration("mlp", True)
