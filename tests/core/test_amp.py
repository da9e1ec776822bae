"""minidist.amp and Module.half/float/double: mixed precision.

The GradScaler is checked step by step against torch.amp.GradScaler's run
recorded in tests/data/torch_reference/grad_scaler.npz (by
scripts/record_torch_amp.py), and against torch live when it imports."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from minidist import Tensor, amp, nn, optim
from minidist.experiments.mixed_precision import gradient_underflow, loss_curves

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "data" / "torch_reference" / "grad_scaler.npz"


def _recorder():
    """scripts/record_torch_amp.py as a module: the cases and torch's runner."""
    spec = importlib.util.spec_from_file_location(
        "record_torch_amp", ROOT / "scripts" / "record_torch_amp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDER = _recorder()


# -- Module.half(), .float(), .double(), .bfloat16() --------------------------------

def test_half_float_double_cast_floating_parameters_and_buffers_in_place():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    model.register_buffer("steps", np.zeros(2, dtype=np.int64))
    params = list(model.parameters())
    model(Tensor(np.ones((5, 3), np.float32))).sum().backward()
    for method, dtype in (("half", np.float16), ("double", np.float64), ("float", np.float32)):
        assert getattr(model, method)() is model
        assert list(model.parameters()) == params  # the same Parameter objects
        assert all(p.data.dtype == dtype and p.grad.dtype == dtype for p in params)
        assert model[1].running_mean.dtype == dtype
        assert model.steps.dtype == np.int64  # an integer buffer keeps its dtype
    # torch casts the same way: float32 -> float16 rounds to nearest
    weight = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    linear = nn.Linear(3, 4)
    linear.weight.data[...] = weight
    assert np.array_equal(linear.half().weight.data, weight.astype(np.float16))


def test_a_half_model_computes_in_float16():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).half()
    out = model(Tensor(np.ones((5, 3), np.float32)))
    assert out.dtype == np.float16
    out.sum().backward()
    assert all(p.grad.dtype == np.float16 for p in model.parameters())


def test_bfloat16_is_refused_with_the_reason():
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="ml_dtypes.*round_to_bfloat16"):
        model.bfloat16()
    with pytest.raises(TypeError, match="no bfloat16"):
        model.to("bfloat16")
    assert model.weight.dtype == np.float32


def test_bfloat16_from_ml_dtypes_is_refused_too():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises(TypeError, match="no bfloat16"):
        nn.Linear(2, 2).to(ml_dtypes.bfloat16)


# -- round_to_bfloat16 -------------------------------------------------------------

def _bfloat16_inputs():
    rng = np.random.default_rng(0)
    values = rng.standard_normal(20000) * 10.0 ** rng.integers(-40, 38, 20000)
    special = [np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 0.0, -0.0, 1e-45, 1 + 2**-8,
               1 + 3 * 2**-8]
    return np.concatenate([values, special]).astype(np.float32)


def test_round_to_bfloat16_rounds_half_to_even_and_keeps_float32_range():
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1e-30, 3.4e38, np.nan], np.float32)
    out = amp.round_to_bfloat16(x)
    assert out.dtype == np.float32
    assert out[0] == 1.0  # halfway between 1 and 1 + 2^-7: to the even one
    assert out[1] == 1 + 2**-6  # halfway between 1 + 2^-7 and 1 + 2^-6: to the even one
    assert 0.9e-30 < out[2] < 1.1e-30 and np.float16(1e-30) == 0  # float16 has no such range
    assert np.isinf(out[3]) and np.isnan(out[4])


def test_round_to_bfloat16_equals_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = _bfloat16_inputs()
    with np.errstate(over="ignore"):
        expected = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(amp.round_to_bfloat16(x), expected, equal_nan=True)


def test_round_to_bfloat16_equals_torch():
    torch = pytest.importorskip("torch")
    x = _bfloat16_inputs()
    expected = torch.from_numpy(x).bfloat16().float().numpy()
    assert np.array_equal(amp.round_to_bfloat16(x), expected, equal_nan=True)


# -- GradScaler against torch's ------------------------------------------------------

def _run_minidist(name: str, inputs: dict) -> dict:
    """The same steps as scripts/record_torch_amp.py's run_torch, in minidist
    (the overflows are injected: NumPy need not warn of them)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _steps(name, inputs)


def _steps(name: str, inputs: dict) -> dict:
    kwargs, steps, _ = RECORDER.CASES[name]
    w = nn.Parameter(inputs["w0"].copy())
    v = nn.Parameter(inputs["v0"].copy())
    optimizer = optim.SGD([w, v], lr=RECORDER.LR, momentum=RECORDER.MOMENTUM)
    stepped = []
    original_step = optimizer.step

    def counting_step(*args, **kw):
        stepped[-1] = True
        return original_step(*args, **kw)

    optimizer.step = counting_step
    scaler = amp.GradScaler(**kwargs)
    records = {key: [] for key in ("scale_before", "scale_after", "growth_tracker", "stepped",
                                   "grad_w", "grad_v", "w", "v")}
    for step in range(steps):
        optimizer.zero_grad()
        stepped.append(False)
        loss = (w * Tensor(inputs["c"][step])).sum() + (v * Tensor(inputs["d"][step])).sum()
        records["scale_before"].append(scaler.get_scale())
        scaler.scale(loss).backward()
        if inputs["explicit_unscale"][step]:
            scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        records["scale_after"].append(scaler.get_scale())
        records["growth_tracker"].append(scaler.state_dict()["_growth_tracker"])
        records["stepped"].append(stepped[-1])
        records["grad_w"].append(w.grad.copy())
        records["grad_v"].append(v.grad.copy())
        records["w"].append(w.data.copy())
        records["v"].append(v.data.copy())
    return {key: np.asarray(value) for key, value in records.items()}


def _assert_same_run(ours: dict, torch_run: dict):
    # The scale, the growth tracker and the skipped steps: exactly torch's.
    for key in ("scale_before", "scale_after", "growth_tracker", "stepped"):
        assert np.array_equal(ours[key], torch_run[key]), key
    # Unscaling is one float32 multiply by the same float32 1/S: the same bits.
    for key in ("grad_w", "grad_v"):
        assert np.array_equal(ours[key], torch_run[key], equal_nan=True), key
    # The weights went through SGD's arithmetic: float32 rounding apart at most.
    for key in ("w", "v"):
        np.testing.assert_allclose(ours[key], torch_run[key], rtol=1e-6, atol=1e-7, err_msg=key)


def _recorded(name: str) -> dict:
    with np.load(REFERENCE) as archive:
        return {key.split("/", 1)[1]: archive[key] for key in archive.files
                if key.startswith(name + "/")}


@pytest.mark.parametrize("name", sorted(RECORDER.CASES))
def test_grad_scaler_follows_torchs_recorded_run_step_by_step(name):
    recorded = _recorded(name)
    ours = _run_minidist(name, recorded)
    _assert_same_run(ours, recorded)
    # the run is not trivial: steps were skipped, and (but for the ceiling) the scale moved both ways
    if name != "ceiling":
        assert not recorded["stepped"].all() and recorded["stepped"].any()
        assert (np.diff(recorded["scale_after"]) > 0).any()
        assert (np.diff(recorded["scale_after"]) < 0).any()


@pytest.mark.parametrize("name", sorted(RECORDER.CASES))
def test_grad_scaler_follows_torch_live(name):
    pytest.importorskip("torch")
    inputs = RECORDER.case_inputs(name)
    _assert_same_run(_run_minidist(name, inputs), RECORDER.run_torch(name, inputs))


def test_the_scale_never_grows_to_inf():
    recorded = _recorded("ceiling")
    assert recorded["scale_after"].max() == 2.0**127  # 2^128 is beyond float32


def test_a_state_dict_saved_mid_run_continues_the_same_run():
    inputs = RECORDER.case_inputs("default")
    kwargs = RECORDER.CASES["default"][0]
    first = amp.GradScaler(**kwargs)
    param = nn.Parameter(inputs["w0"].copy())
    optimizer = optim.SGD([param], lr=0.1)

    def one_step(scaler, step):
        optimizer.zero_grad()
        scaler.scale((param * Tensor(inputs["c"][step])).sum()).backward()
        scaler.step(optimizer)
        scaler.update()

    for step in range(4):
        one_step(first, step)
    saved = first.state_dict()
    assert set(saved) == {"scale", "growth_factor", "backoff_factor", "growth_interval",
                          "_growth_tracker"}
    second = amp.GradScaler()
    second.load_state_dict(saved)
    assert second.state_dict() == saved
    for step in range(4, 9):
        one_step(first, step)
        one_step(second, step)
        assert first.state_dict() == second.state_dict()


def test_grad_scaler_misuse_raises_as_torchs_does():
    param = nn.Parameter(np.ones(3, np.float32))
    optimizer = optim.SGD([param], lr=0.1)
    scaler = amp.GradScaler()
    with pytest.raises(RuntimeError, match="before any scaler.scale"):
        scaler.step(optimizer)
    scaler.scale(param.sum()).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(optimizer)
    scaler.update()
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(optimizer, closure=lambda: None)
    for bad in (dict(growth_factor=1.0), dict(backoff_factor=1.0), dict(growth_interval=0)):
        with pytest.raises(ValueError):
            amp.GradScaler(**bad)


@pytest.mark.parametrize(("bad", "words"), [
    (dict(init_scale=0.0), "init_scale must be a positive finite number"),
    (dict(init_scale=-2.0), "init_scale must be a positive finite number"),
    (dict(init_scale=float("nan")), "init_scale must be a positive finite number"),
    (dict(init_scale=float("inf")), "init_scale must be a positive finite number"),
    (dict(growth_factor=float("inf")), "growth_factor must be a finite number > 1.0"),
    (dict(growth_factor=float("nan")), "growth_factor must be a finite number > 1.0"),
    (dict(backoff_factor=0.0), r"backoff_factor must be in \(0, 1\)"),
    (dict(backoff_factor=float("nan")), r"backoff_factor must be in \(0, 1\)"),
    (dict(growth_interval=2.5), "growth_interval must be an int >= 1"),
])
def test_grad_scaler_refuses_settings_that_cannot_train(bad, words):
    """torch takes these (all but growth_factor <= 1 and backoff_factor >= 1);
    a scale of 0 makes NaN weights after one step and a NaN or infinite one
    skips every step, so they are refused in one line that names the setting."""
    with pytest.raises(ValueError, match=words) as caught:
        amp.GradScaler(**bad)
    assert "\n" not in str(caught.value)
    amp.GradScaler(enabled=False, **bad)   # a disabled scaler reads none of them, as torch's


def test_grad_scaler_refuses_float16_gradients():
    half = nn.Parameter(np.ones(3, np.float16))
    optimizer = optim.SGD([half], lr=0.1)
    scaler = amp.GradScaler()
    with np.errstate(over="ignore"):  # 2^16 is beyond float16: the gradient is inf
        scaler.scale(half.sum()).backward()
    with pytest.raises(ValueError, match="FP16 gradients.*MasterWeights"):
        scaler.step(optimizer)


def test_update_new_scale_and_a_disabled_scaler():
    param = nn.Parameter(np.ones(2, np.float32))
    optimizer = optim.SGD([param], lr=0.5)
    scaler = amp.GradScaler(init_scale=8.0)
    loss = param.sum()
    assert float(scaler.scale(loss).data) == 16.0
    scaler.update(new_scale=3.0)
    assert scaler.get_scale() == 3.0
    scaler.update(new_scale=np.array([5.0]))
    assert scaler.get_scale() == 5.0

    off = amp.GradScaler(enabled=False)
    assert not off.is_enabled() and off.get_scale() == 1.0 and off.state_dict() == {}
    assert off.scale(loss) is loss
    loss.backward()
    off.unscale_(optimizer)
    off.step(optimizer)
    off.update()
    assert np.array_equal(param.data, [0.5, 0.5])  # a plain step, gradient 1 untouched


# -- MasterWeights -----------------------------------------------------------------------

def test_master_weights_are_float32_copies_and_a_float32_parameter_is_its_own():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model[0].half()
    masters = amp.MasterWeights(model)
    pairs = list(zip(model.parameters(), masters.parameters()))
    assert [m.dtype for _, m in pairs] == [np.float32] * 4
    assert pairs[0][1] is not pairs[0][0] and pairs[2][1] is pairs[2][0]
    assert np.array_equal(pairs[0][1].data, pairs[0][0].data.astype(np.float32))


def test_masters_keep_the_small_updates_float16_weights_round_away():
    # A float16 weight of 1.0 ignores an update below 2^-12 (half its spacing 2^-11).
    lr_times_grad = 1e-4
    assert np.float16(1.0) - np.float16(lr_times_grad) == np.float16(1.0)
    alone = nn.Parameter(np.ones(4, np.float16))
    model = nn.Linear(4, 1, bias=False).half()
    model.weight.data[...] = 1.0
    masters = amp.MasterWeights(model)
    sgd_alone = optim.SGD([alone], lr=1.0)
    sgd_master = optim.SGD(masters.parameters(), lr=1.0)
    for _ in range(100):
        alone.grad = np.full(4, lr_times_grad, np.float16)
        sgd_alone.step()
        model.weight.grad = np.full((1, 4), lr_times_grad, np.float16)
        masters.copy_grads_to_masters()
        sgd_master.step()
        masters.copy_masters_to_model()
    assert np.all(alone.data == 1.0)  # float16 alone: nothing learned
    expected = np.float32(1.0)
    for _ in range(100):
        expected -= np.float32(np.float16(lr_times_grad))
    assert np.all(next(masters.parameters()).data == expected)  # 0.99: every step counted
    assert np.all(model.weight.data == np.float16(expected))


def test_copying_gradients_keeps_an_overflow_visible_and_a_missing_gradient_missing():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)).half()
    masters = amp.MasterWeights(model)
    params, master_params = list(model.parameters()), list(masters.parameters())
    params[0].grad = np.array([[np.inf, 1], [2, 3]], np.float16)
    params[1].grad = np.array([np.nan, 1], np.float16)
    masters.copy_grads_to_masters()
    assert np.isinf(master_params[0].grad[0, 0]) and np.isnan(master_params[1].grad[0])
    assert master_params[2].grad is None
    held = master_params[0].grad
    params[0].grad = np.ones((2, 2), np.float16)
    params[1].grad = None
    masters.copy_grads_to_masters()
    assert master_params[0].grad is held and np.all(held == 1)  # cast in place
    assert master_params[1].grad is None


def _mixed_run(state=None, steps=3):
    """A float16 MLP with float32 masters, SGD with momentum and a GradScaler,
    ``steps`` steps on fixed batches; started from ``state`` (the four
    state_dicts) if given. Returns the final masters and the four states."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8)).astype(np.float16)
    y = rng.integers(0, 3, size=16)
    nn.init.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).half()
    masters = amp.MasterWeights(model)
    optimizer = optim.SGD(masters.parameters(), lr=0.05, momentum=0.9)
    scaler = amp.GradScaler(init_scale=2.0**10)
    if state is not None:
        model.load_state_dict(state["model"])
        masters.load_state_dict(state["masters"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
    for _ in range(steps):
        model.zero_grad()
        logits = model(Tensor(x)).astype(np.float32)
        scaler.scale(nn.functional.cross_entropy(logits, y)).backward()
        masters.copy_grads_to_masters()
        scaler.step(optimizer)
        scaler.update()
        masters.copy_masters_to_model()
    state = {"model": model.state_dict(), "masters": masters.state_dict(),
             "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}
    return [p.data.copy() for p in masters.parameters()], state


def test_master_weights_saved_mid_run_continue_the_same_run():
    straight, _ = _mixed_run(steps=6)
    _, halfway = _mixed_run(steps=3)
    resumed, _ = _mixed_run(state=halfway, steps=3)
    for a, b in zip(straight, resumed):
        assert np.array_equal(a, b)
    # Without the masters' state the run goes on from the float16 weights,
    # rounded: not the same run.
    rounded = dict(halfway, masters={"dtype": "float32", "masters": {
        index: array.astype(np.float16).astype(np.float32)
        for index, array in halfway["masters"]["masters"].items()}})
    drifted, _ = _mixed_run(state=rounded, steps=3)
    assert any(not np.array_equal(a, b) for a, b in zip(straight, drifted))


def test_master_weights_refuse_a_state_of_another_model():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).half()
    masters = amp.MasterWeights(model)
    state = masters.state_dict()
    assert sorted(state["masters"]) == [0, 1, 2, 3] and state["dtype"] == "float32"
    other = amp.MasterWeights(nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2)).half())
    with pytest.raises(ValueError, match=r"parameter 0 is \(5, 3\) here, \(4, 3\) in the state"):
        other.load_state_dict(state)
    partly = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    partly[0].half()
    with pytest.raises(ValueError, match=r"masters for parameters \[0, 1, 2, 3\], this model "
                                         r"copies parameters \[0, 1\]"):
        amp.MasterWeights(partly).load_state_dict(state)
    with pytest.raises(ValueError, match=r"holds float32 masters, these are float64; make "
                                         r"MasterWeights\(model, dtype=float32\)"):
        amp.MasterWeights(model, dtype=np.float64).load_state_dict(state)


# -- the demonstration and training ----------------------------------------------------------

def test_float16_gradients_underflow_without_loss_scaling_and_survive_with_it():
    rows = {row["scale"]: row for row in gradient_underflow(epochs=5, scales=(1.0, 2.0**16))}
    plain, scaled = rows[1.0], rows[2.0**16]
    # Without scaling a large share of the activation gradients flush to zero ...
    assert plain["activation_underflowed"] > 0.05 * plain["activation_entries"]
    assert plain["weight_underflowed"] > 0.005 * plain["weight_entries"]
    # ... and with 2^16 almost none: fewer than a tenth as many.
    assert scaled["activation_underflowed"] < 0.1 * plain["activation_underflowed"]
    assert scaled["weight_underflowed"] < 0.1 * plain["weight_underflowed"]
    assert scaled["activation_underflowed"] < 0.01 * scaled["activation_entries"]


def test_mixed_precision_follows_the_float32_loss_curve():
    curves = loss_curves(epochs=5)
    full, mixed = np.array(curves["float32"]), np.array(curves["mixed"])
    assert full[-1] < 0.2 * full[0]  # it learned
    # float16 rounding moves each epoch's mean loss by well under a percent here
    np.testing.assert_allclose(mixed, full, rtol=0.02, atol=0.005)
