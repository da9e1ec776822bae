"""Optimizers and LR schedules against hand-written NumPy references of their
formulas (float64, tight tolerance), plus the properties later strategies
rely on: in-place updates (views into flat buffers stay views), dtype kept,
state addressable by index and checkpointable."""

import math

import numpy as np
import pytest

from minidist import Tensor
from minidist.optim import (
    LARS,
    SGD,
    Adam,
    AdamW,
    BatchSizeSchedule,
    Optimizer,
    linear_scaling_rule,
    noise_scale,
)
from minidist.optim.lr_scheduler import (
    CosineAnnealingLR,
    LambdaLR,
    LinearWarmup,
    MultiStepLR,
    SequentialLR,
    StepLR,
    WarmupThen,
)

STEPS = 6
SHAPES = [(3, 4), (5,)]


def make_params(seed=0, dtype=np.float64, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)
            for shape in shapes]


def gradient_sequence(seed=1, steps=STEPS, dtype=np.float64, shapes=SHAPES):
    """Fixed gradients per step and parameter, independent of the weights,
    so the reference and the optimizer see exactly the same inputs."""
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(shape).astype(dtype) for shape in shapes] for _ in range(steps)]


def run(optimizer, params, grads):
    for step_grads in grads:
        for param, grad in zip(params, step_grads):
            param.grad = grad.copy()
        optimizer.step()
    return [p.data.copy() for p in params]


# --------------------------------------------------------------------------
# NumPy references, written from the formulas (textbook form where it differs
# in shape, not in value, from the implementation).


def reference_sgd(weights, grads, lr, momentum=0.0, dampening=0.0, nesterov=False,
                  weight_decay=0.0):
    weights = [w.copy() for w in weights]
    buffers = [None] * len(weights)
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            d = g + weight_decay * weights[i]
            if momentum != 0:
                if buffers[i] is None:
                    buffers[i] = d.copy()
                else:
                    buffers[i] = momentum * buffers[i] + (1 - dampening) * d
                d = d + momentum * buffers[i] if nesterov else buffers[i]
            weights[i] = weights[i] - lr * d
    return weights


def reference_adam(weights, grads, lr, betas, eps, weight_decay, amsgrad, decoupled):
    beta1, beta2 = betas
    weights = [w.copy() for w in weights]
    m = [np.zeros_like(w) for w in weights]
    v = [np.zeros_like(w) for w in weights]
    v_max = [np.zeros_like(w) for w in weights]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            if decoupled:
                weights[i] = weights[i] * (1 - lr * weight_decay)
            else:
                g = g + weight_decay * weights[i]
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            v_max[i] = np.maximum(v_max[i], v[i])
            second = v_max[i] if amsgrad else v[i]
            m_hat = m[i] / (1 - beta1**t)
            v_hat = second / (1 - beta2**t)
            # torch adds eps to sqrt(v)/sqrt(bias correction), i.e. to sqrt(v_hat)
            weights[i] = weights[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return weights


def reference_lars(weights, grads, lr, momentum, weight_decay, eta, exclude):
    weights = [w.copy() for w in weights]
    buffers = [None] * len(weights)
    ratios = [None] * len(weights)
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            w = weights[i]
            if exclude and w.ndim <= 1:
                wd, ratio = 0.0, 1.0
            else:
                wd = weight_decay
                w_norm, g_norm = np.sqrt(np.sum(w * w)), np.sqrt(np.sum(g * g))
                ratio = eta * w_norm / (g_norm + wd * w_norm) if w_norm > 0 and g_norm > 0 else 1.0
            ratios[i] = ratio
            d = ratio * (g + wd * w)
            if momentum != 0:
                buffers[i] = d.copy() if buffers[i] is None else momentum * buffers[i] + d
                d = buffers[i]
            weights[i] = w - lr * d
    return weights, ratios


# --------------------------------------------------------------------------
# The formulas


@pytest.mark.parametrize("momentum, dampening, nesterov, weight_decay", [
    (0.0, 0.0, False, 0.0),
    (0.0, 0.0, False, 0.01),
    (0.9, 0.0, False, 0.0),
    (0.9, 0.3, False, 0.01),
    (0.9, 0.0, True, 0.0),
    (0.8, 0.0, True, 0.05),
])
def test_sgd_matches_reference(momentum, dampening, nesterov, weight_decay):
    params, grads = make_params(), gradient_sequence()
    initial = [p.data.copy() for p in params]
    optimizer = SGD(params, lr=0.05, momentum=momentum, dampening=dampening,
                    nesterov=nesterov, weight_decay=weight_decay)
    got = run(optimizer, params, grads)
    expected = reference_sgd(initial, grads, 0.05, momentum, dampening, nesterov, weight_decay)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("cls", [Adam, AdamW])
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_and_adamw_match_reference(cls, amsgrad, weight_decay):
    params, grads = make_params(), gradient_sequence()
    initial = [p.data.copy() for p in params]
    kwargs = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay,
                  amsgrad=amsgrad)
    got = run(cls(params, **kwargs), params, grads)
    expected = reference_adam(initial, grads, decoupled=cls is AdamW, **kwargs)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-14)


def test_amsgrad_differs_when_the_second_moment_falls():
    # Large gradients first, then small: v decays, v_max does not.
    grads = [[np.full(s, 10.0) for s in SHAPES]] + [[np.full(s, 0.1) for s in SHAPES]] * 4
    a, b = make_params(), make_params()
    run(Adam(a, lr=0.1), a, grads)
    run(Adam(b, lr=0.1, amsgrad=True), b, grads)
    assert not np.allclose(a[0].data, b[0].data)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("exclude", [True, False])
def test_lars_matches_reference(momentum, weight_decay, exclude):
    params, grads = make_params(), gradient_sequence()
    initial = [p.data.copy() for p in params]
    optimizer = LARS(params, lr=0.5, momentum=momentum, weight_decay=weight_decay,
                     trust_coefficient=0.02, exclude_bias_and_norm=exclude)
    got = run(optimizer, params, grads)
    expected, ratios = reference_lars(initial, grads, 0.5, momentum, weight_decay, 0.02, exclude)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-14)
    for index, ratio in enumerate(ratios):
        assert optimizer.state[index]["trust_ratio"] == pytest.approx(ratio, rel=1e-12)
    if exclude:
        assert optimizer.state[1]["trust_ratio"] == 1.0


def test_lars_step_is_a_fixed_fraction_of_the_weight_norm():
    # Without momentum and decay, ||lr * ratio * g|| = lr * eta * ||w||, whatever g's scale.
    for scale in (1e-4, 1.0, 1e4):
        (w,) = make_params(shapes=[(4, 4)])
        before = w.data.copy()
        w.grad = np.random.default_rng(3).standard_normal((4, 4)) * scale
        LARS([w], lr=1.0, momentum=0.0, trust_coefficient=0.01).step()
        assert np.linalg.norm(w.data - before) == pytest.approx(0.01 * np.linalg.norm(before))


def test_lars_zero_weights_take_the_plain_step():
    w = Tensor(np.zeros((2, 2)), requires_grad=True)
    w.grad = np.ones((2, 2))
    optimizer = LARS([w], lr=0.1, momentum=0.0, weight_decay=0.1)
    optimizer.step()
    assert optimizer.state[0]["trust_ratio"] == 1.0
    np.testing.assert_allclose(w.data, -0.1)


def test_against_pytorch_when_installed():
    torch = pytest.importorskip("torch")
    cases = [
        (SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=0.01)),
        (SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
        (Adam, torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.95), weight_decay=0.1)),
        (Adam, torch.optim.Adam, dict(lr=0.01, amsgrad=True)),
        (AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
    ]
    grads = gradient_sequence()
    for ours, theirs, kwargs in cases:
        params = make_params()
        torch_params = [torch.tensor(p.data.copy(), requires_grad=True) for p in params]
        torch_optimizer = theirs(torch_params, **kwargs)
        for step_grads in grads:
            for tp, g in zip(torch_params, step_grads):
                tp.grad = torch.tensor(g.copy())
            torch_optimizer.step()
        got = run(ours(params, **kwargs), params, grads)
        for g, tp in zip(got, torch_params):
            np.testing.assert_allclose(g, tp.detach().numpy(), rtol=1e-12, atol=1e-14,
                                       err_msg=f"{ours.__name__} {kwargs}")


# --------------------------------------------------------------------------
# In place, dtype, skipping, zero_grad

FACTORIES = {
    "sgd": lambda params: SGD(params, lr=0.1),
    "sgd-momentum-wd": lambda params: SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd-nesterov": lambda params: SGD(params, lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda params: Adam(params, lr=0.1, weight_decay=0.01),
    "adamw-amsgrad": lambda params: AdamW(params, lr=0.1, amsgrad=True),
    "lars": lambda params: LARS(params, lr=0.1, weight_decay=0.01, trust_coefficient=0.1),
}


@pytest.mark.parametrize("name", FACTORIES)
def test_updates_in_place_through_views_of_a_flat_buffer(name):
    flat = np.random.default_rng(0).standard_normal(20)
    weight = Tensor(flat[:12].reshape(3, 4), requires_grad=True)
    bias = Tensor(flat[12:17], requires_grad=True)
    assert np.shares_memory(weight.data, flat)
    objects = (weight.data, bias.data)
    untouched = flat[17:].copy()
    optimizer = FACTORIES[name]([weight, bias])
    for _ in range(3):
        weight.grad, bias.grad = np.ones((3, 4)), np.full(5, 0.5)
        grad_before = weight.grad.copy()
        optimizer.step()
        np.testing.assert_array_equal(weight.grad, grad_before)  # the gradient is read only
    assert weight.data is objects[0] and bias.data is objects[1]
    np.testing.assert_array_equal(flat[:12].reshape(3, 4), weight.data)
    np.testing.assert_array_equal(flat[12:17], bias.data)
    np.testing.assert_array_equal(flat[17:], untouched)
    assert not np.allclose(flat[:17], np.random.default_rng(0).standard_normal(20)[:17])


@pytest.mark.parametrize("name", FACTORIES)
def test_float32_stays_float32_and_agrees_with_float64(name):
    params32 = make_params(dtype=np.float32)
    params64 = make_params(dtype=np.float64)
    grads64 = gradient_sequence()
    grads32 = [[g.astype(np.float32) for g in step] for step in grads64]
    optimizer = FACTORIES[name](params32)
    got = run(optimizer, params32, grads32)
    expected = run(FACTORIES[name](params64), params64, grads64)
    for g, e in zip(got, expected):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    for entries in optimizer.state.values():
        for value in entries.values():
            if isinstance(value, np.ndarray):
                assert value.dtype == np.float32


@pytest.mark.parametrize("name", FACTORIES)
def test_parameters_without_gradient_are_skipped(name):
    used, unused = make_params()
    before = unused.data.copy()
    optimizer = FACTORIES[name]([used, unused])
    used.grad = np.ones_like(used.data)
    optimizer.step()
    np.testing.assert_array_equal(unused.data, before)
    assert 1 not in optimizer.state or not optimizer.state[1]


def test_zero_grad_to_none_and_in_place():
    flat_grads = np.ones(17)
    weight, bias = make_params()
    optimizer = SGD([weight, bias], lr=0.1)
    weight.grad, bias.grad = flat_grads[:12].reshape(3, 4), flat_grads[12:]
    grad_object = weight.grad
    optimizer.zero_grad(set_to_none=False)
    assert weight.grad is grad_object
    np.testing.assert_array_equal(flat_grads, 0.0)
    optimizer.zero_grad()
    assert weight.grad is None and bias.grad is None
    optimizer.zero_grad(set_to_none=False)  # no gradient at all: nothing to do
    assert weight.grad is None


# --------------------------------------------------------------------------
# Convergence, with the autograd in the loop


def quadratic_gradient(w, curvature, target):
    return curvature * (w - target)


@pytest.mark.parametrize("name, factory, steps", [
    ("sgd", lambda p: SGD(p, lr=0.1), 200),
    ("sgd-momentum", lambda p: SGD(p, lr=0.05, momentum=0.9), 200),
    ("sgd-nesterov", lambda p: SGD(p, lr=0.05, momentum=0.9, nesterov=True), 200),
    ("adam", lambda p: Adam(p, lr=0.05), 600),
    ("adamw", lambda p: AdamW(p, lr=0.05, weight_decay=0.0), 600),
    ("lars", lambda p: LARS(p, lr=1.0, momentum=0.9, trust_coefficient=0.01,
                            exclude_bias_and_norm=False), 600),
])
def test_minimises_a_quadratic(name, factory, steps):
    curvature = np.array([[1.0, 3.0], [0.5, 2.0]])
    target = np.array([[1.0, -2.0], [0.5, 3.0]])
    w = Tensor(np.zeros((2, 2)) + 4.0, requires_grad=True)
    optimizer = factory([w])
    if name == "lars":
        # LARS takes normalised steps: it needs a decaying rate to settle.
        scheduler = CosineAnnealingLR(optimizer, T_max=steps)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (((w - target) ** 2) * curvature).sum() * 0.5
        loss.backward()
        np.testing.assert_allclose(w.grad, quadratic_gradient(w.data, curvature, target))
        optimizer.step()
        if name == "lars":
            scheduler.step()
    np.testing.assert_allclose(w.data, target, atol=1e-2)


def test_step_with_closure_returns_the_loss():
    w = Tensor(np.array([3.0]), requires_grad=True)
    optimizer = SGD([w], lr=0.25)

    def closure():
        optimizer.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert loss.item() == 9.0
    np.testing.assert_allclose(w.data, [1.5])


# --------------------------------------------------------------------------
# Param groups


def test_param_groups_take_defaults_and_their_own_values():
    weight, bias = make_params()
    optimizer = SGD([{"params": [weight], "weight_decay": 0.1}, {"params": bias, "lr": 1.0}],
                    lr=0.5, momentum=0.9)
    first, second = optimizer.param_groups
    assert first["lr"] == 0.5 and first["weight_decay"] == 0.1 and first["momentum"] == 0.9
    assert second["lr"] == 1.0 and second["weight_decay"] == 0.0 and second["params"] == [bias]
    weight.grad, bias.grad = np.ones((3, 4)), np.ones(5)
    w0, b0 = weight.data.copy(), bias.data.copy()
    optimizer.step()
    np.testing.assert_allclose(weight.data, w0 - 0.5 * (1 + 0.1 * w0))
    np.testing.assert_allclose(bias.data, b0 - 1.0)
    assert set(optimizer.state) == {0, 1}  # indexed across groups in order


def test_add_param_group_gives_the_next_index():
    a, b = make_params()
    optimizer = Adam([a], lr=0.1)
    optimizer.add_param_group({"params": [b], "lr": 0.01})
    a.grad, b.grad = np.ones((3, 4)), np.ones(5)
    optimizer.step()
    assert optimizer.state[1]["exp_avg"].shape == (5,)
    assert optimizer.param_groups[1]["betas"] == (0.9, 0.999)


def test_accepts_a_generator_of_parameters():
    params = make_params()
    optimizer = SGD((p for p in params), lr=0.1)
    assert optimizer.param_groups[0]["params"] == params


# --------------------------------------------------------------------------
# Checkpoints


def drive(optimizer, params, seed, steps=3):
    for step_grads in gradient_sequence(seed=seed, steps=steps):
        for p, g in zip(params, step_grads):
            p.grad = g
        optimizer.step()


@pytest.mark.parametrize("name", FACTORIES)
def test_state_dict_roundtrip_reproduces_the_next_steps_exactly(name):
    original = make_params()
    optimizer = FACTORIES[name](original)
    drive(optimizer, original, seed=1)
    snapshot = optimizer.state_dict()
    saved_state = {i: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
                   for i, s in snapshot["state"].items()}
    clone = [Tensor(p.data.copy(), requires_grad=True) for p in original]

    drive(optimizer, original, seed=2)
    # The snapshot is a copy: the steps above did not change it.
    for index, entries in saved_state.items():
        for key, value in entries.items():
            np.testing.assert_array_equal(snapshot["state"][index][key], value)

    restored = FACTORIES[name](clone)
    restored.load_state_dict(snapshot)
    drive(restored, clone, seed=2)
    for a, b in zip(original, clone):
        np.testing.assert_array_equal(a.data, b.data)


def test_state_dict_format_and_hyper_parameters():
    weight, bias = make_params()
    optimizer = SGD([{"params": [weight]}, {"params": [bias], "lr": 0.2}], lr=0.1, momentum=0.9)
    weight.grad, bias.grad = np.ones((3, 4)), np.ones(5)
    optimizer.step()
    snapshot = optimizer.state_dict()
    assert [g["params"] for g in snapshot["param_groups"]] == [[0], [1]]
    assert set(snapshot["state"]) == {0, 1}
    assert set(snapshot["state"][0]) == {"momentum_buffer"}

    other = SGD([{"params": make_params(5)[:1]}, {"params": make_params(5)[1:]}], lr=9.0)
    other.load_state_dict(snapshot)
    assert [g["lr"] for g in other.param_groups] == [0.1, 0.2]
    assert other.param_groups[0]["momentum"] == 0.9
    assert other.state[0]["momentum_buffer"] is not snapshot["state"][0]["momentum_buffer"]


def test_load_state_dict_casts_to_the_parameters_dtype():
    params = make_params()
    optimizer = Adam(params)
    drive(optimizer, params, seed=1)
    params32 = make_params(dtype=np.float32)
    optimizer32 = Adam(params32)
    optimizer32.load_state_dict(optimizer.state_dict())
    assert optimizer32.state[0]["exp_avg"].dtype == np.float32
    assert optimizer32.state[0]["step"] == 3


def test_load_state_dict_rejects_a_different_layout():
    params = make_params()
    optimizer = SGD(params, lr=0.1, momentum=0.9)
    drive(optimizer, params, seed=1)
    snapshot = optimizer.state_dict()
    with pytest.raises(ValueError, match="1 parameters here but 2"):
        SGD(make_params()[:1], lr=0.1).load_state_dict(snapshot)
    with pytest.raises(ValueError, match="has 1 param groups, this optimizer has 2"):
        a, b = make_params()
        SGD([{"params": [a]}, {"params": [b]}], lr=0.1).load_state_dict(snapshot)
    with pytest.raises(ValueError, match=r"shape \(3, 4\).*shape \(4, 3\)"):
        SGD(make_params(shapes=[(4, 3), (5,)]), lr=0.1).load_state_dict(snapshot)


# --------------------------------------------------------------------------
# Errors say what was wrong


@pytest.mark.parametrize("build, message", [
    (lambda p: SGD(p, lr=-0.1), r"SGD: invalid lr=-0.1 .*>= 0"),
    (lambda p: SGD(p), "SGD needs a learning rate"),
    (lambda p: SGD(p, lr=float("nan")), "invalid lr=nan"),
    (lambda p: SGD(p, lr=0.1, momentum=-0.5), "invalid momentum=-0.5"),
    (lambda p: SGD(p, lr=0.1, weight_decay=-1), "invalid weight_decay=-1"),
    (lambda p: SGD(p, lr=0.1, nesterov=True), "nesterov=True needs momentum > 0"),
    (lambda p: SGD(p, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "dampening == 0"),
    (lambda p: SGD([{"params": p[:1]}, {"params": p[1:], "lr": -1}], lr=0.1),
     "in param group 1"),
    (lambda p: Adam(p, lr=-1e-3), r"Adam: invalid lr=-0.001"),
    (lambda p: Adam(p, betas=(1.0, 0.999)), r"invalid beta1=1.0 .*\[0, 1\)"),
    (lambda p: AdamW(p, betas=(0.9, -0.1)), r"AdamW: invalid beta2=-0.1"),
    (lambda p: Adam(p, betas=0.9), "betas must be a pair"),
    (lambda p: Adam(p, eps=-1e-8), "invalid eps"),
    (lambda p: LARS(p, lr=0.1, trust_coefficient=-1), "invalid trust_coefficient"),
    (lambda p: LARS(p), "LARS needs a learning rate"),
])
def test_bad_hyper_parameters_are_named(build, message):
    with pytest.raises(ValueError, match=message):
        build(make_params())


def test_bad_params_are_explained():
    weight, bias = make_params()
    with pytest.raises(TypeError, match="single Tensor"):
        SGD(weight, lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([], lr=0.1)
    with pytest.raises(TypeError, match="entry 1: optimizers update minidist Tensors"):
        SGD([weight, np.ones(3)], lr=0.1)
    with pytest.raises(ValueError, match="already given to the optimizer"):
        SGD([{"params": [weight, bias]}, {"params": [bias]}], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        SGD([weight * 2], lr=0.1)
    with pytest.raises(ValueError, match="no 'params' key"):
        SGD([{"lr": 0.1}], lr=0.1)
    with pytest.raises(NotImplementedError):
        Optimizer([weight], {}).step()


# --------------------------------------------------------------------------
# Schedules: exact sequences


def optimizer_with_lrs(*lrs):
    params = make_params(shapes=[(2,)] * len(lrs))
    return SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)], lr=0.1)


def sequence(scheduler, steps):
    lrs = [scheduler.get_last_lr()]
    for _ in range(steps):
        scheduler.step()
        lrs.append(scheduler.get_last_lr())
    return lrs


def test_step_lr():
    optimizer = optimizer_with_lrs(1.0, 0.5)
    got = sequence(StepLR(optimizer, step_size=2, gamma=0.5), 6)
    assert got == [[1, .5], [1, .5], [.5, .25], [.5, .25], [.25, .125], [.25, .125],
                   [.125, .0625]]
    assert [g["lr"] for g in optimizer.param_groups] == [.125, .0625]


def test_multi_step_lr():
    got = sequence(MultiStepLR(optimizer_with_lrs(2.0), milestones=[2, 5], gamma=0.1), 6)
    assert [lr for (lr,) in got] == pytest.approx([2, 2, .2, .2, .2, .02, .02], rel=1e-15)


def test_cosine_annealing_lr():
    got = sequence(CosineAnnealingLR(optimizer_with_lrs(1.1), T_max=4, eta_min=0.1), 6)
    half = (1 + math.sqrt(0.5)) / 2
    expected = [1.1, 0.1 + half, 0.6, 0.1 + (1 - half), 0.1, 0.1, 0.1]
    assert [lr for (lr,) in got] == pytest.approx(expected, rel=1e-15)


def test_linear_warmup():
    got = sequence(LinearWarmup(optimizer_with_lrs(0.8), warmup_steps=4), 6)
    assert [lr for (lr,) in got] == pytest.approx([0, .2, .4, .6, .8, .8, .8], rel=1e-15)
    got = sequence(LinearWarmup(optimizer_with_lrs(1.0), warmup_steps=2, start_factor=0.5), 3)
    assert [lr for (lr,) in got] == [.5, .75, 1, 1]


def test_warmup_then_another_schedule():
    optimizer = optimizer_with_lrs(1.0)
    scheduler = WarmupThen(optimizer, warmup_steps=2, start_factor=0.5,
                           then=StepLR(optimizer, step_size=2, gamma=0.5))
    assert [lr for (lr,) in sequence(scheduler, 6)] == [.5, .75, 1, 1, .5, .5, .25]
    assert optimizer.param_groups[0]["lr"] == .25


def test_warmup_then_cosine_per_iteration():
    optimizer = optimizer_with_lrs(0.4)
    scheduler = WarmupThen(optimizer, warmup_steps=4,
                           then=CosineAnnealingLR(optimizer, T_max=2))
    assert [lr for (lr,) in sequence(scheduler, 7)] == pytest.approx(
        [0, .1, .2, .3, .4, .2, 0, 0], abs=1e-15)


def test_sequential_lr_restarts_each_schedule_at_zero():
    optimizer = optimizer_with_lrs(1.0)
    scheduler = SequentialLR(
        optimizer,
        [LambdaLR(optimizer, lambda t: 0.1), StepLR(optimizer, step_size=1, gamma=0.5),
         LambdaLR(optimizer, lambda t: 0.01 * (t + 1))],
        milestones=[2, 4],
    )
    assert [lr for (lr,) in sequence(scheduler, 5)] == pytest.approx(
        [.1, .1, 1, .5, .01, .02], rel=1e-15)


def test_lambda_lr_one_function_per_group():
    optimizer = optimizer_with_lrs(1.0, 2.0)
    scheduler = LambdaLR(optimizer, [lambda t: 0.5**t, lambda t: t + 1])
    assert sequence(scheduler, 2) == [[1, 2], [.5, 4], [.25, 6]]


def test_schedulers_share_the_initial_lr():
    optimizer = optimizer_with_lrs(1.0)
    StepLR(optimizer, step_size=1, gamma=0.5).step()
    assert optimizer.param_groups[0]["lr"] == 0.5
    later = LinearWarmup(optimizer, warmup_steps=2)
    assert later.base_lrs == [1.0] and optimizer.param_groups[0]["initial_lr"] == 1.0


def test_scheduler_state_dict_resumes():
    optimizer = optimizer_with_lrs(1.0)
    scheduler = CosineAnnealingLR(optimizer, T_max=10)
    for _ in range(3):
        scheduler.step()
    snapshot = scheduler.state_dict()
    other_optimizer = optimizer_with_lrs(1.0)
    resumed = CosineAnnealingLR(other_optimizer, T_max=10)
    resumed.load_state_dict(snapshot)
    assert resumed.get_last_lr() == scheduler.get_last_lr()
    assert other_optimizer.param_groups[0]["lr"] == scheduler.get_last_lr()[0]
    scheduler.step()
    resumed.step()
    assert resumed.get_last_lr() == scheduler.get_last_lr()


def test_schedules_match_pytorch_when_installed():
    torch = pytest.importorskip("torch")

    def torch_lrs(make, steps):
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
        scheduler = make(optimizer)
        lrs = [scheduler.get_last_lr()[0]]
        for _ in range(steps):
            optimizer.step()
            scheduler.step()
            lrs.append(scheduler.get_last_lr()[0])
        return lrs

    def ours(make, steps):
        return [lr for (lr,) in sequence(make(optimizer_with_lrs(0.3)), steps)]

    lr_scheduler = torch.optim.lr_scheduler
    pairs = [
        (lambda o: StepLR(o, 3, 0.5), lambda o: lr_scheduler.StepLR(o, 3, 0.5)),
        (lambda o: MultiStepLR(o, [2, 7], 0.2), lambda o: lr_scheduler.MultiStepLR(o, [2, 7], 0.2)),
        (lambda o: CosineAnnealingLR(o, 10, 0.01),
         lambda o: lr_scheduler.CosineAnnealingLR(o, 10, 0.01)),
        (lambda o: LinearWarmup(o, 5, 0.25),
         lambda o: lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=5)),
    ]
    for mine, theirs in pairs:
        assert ours(mine, 10) == pytest.approx(torch_lrs(theirs, 10), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("build, error, message", [
    (lambda o: StepLR(o, step_size=0), ValueError, "step_size must be an integer >= 1"),
    (lambda o: StepLR(o, step_size=2, gamma=-1), ValueError, "gamma must be a number >= 0"),
    (lambda o: MultiStepLR(o, [5, 2]), ValueError, "milestones must be increasing"),
    (lambda o: CosineAnnealingLR(o, T_max=0), ValueError, "T_max must be an integer >= 1"),
    (lambda o: LinearWarmup(o, 5, start_factor=2), ValueError, r"start_factor must be in \[0, 1\]"),
    (lambda o: LambdaLR(o, [lambda t: 1, lambda t: 1]), ValueError, "2 lr_lambdas for 1"),
    (lambda o: LambdaLR(o, 0.5), TypeError, "must be a function"),
    (lambda o: SequentialLR(o, [StepLR(o, 1)], [3]), ValueError, "1 schedulers need 0"),
    (lambda o: WarmupThen(o, 3, then=0.1), TypeError, "not a scheduler"),
    (lambda o: SequentialLR(o, [StepLR(o, 1), StepLR(optimizer_with_lrs(1.0), 1)], [2]),
     ValueError, "another optimizer"),
    (lambda o: StepLR([o], 1), TypeError, "Pass the optimizer"),
])
def test_bad_schedules_are_explained(build, error, message):
    with pytest.raises(error, match=message):
        build(optimizer_with_lrs(1.0))


# --------------------------------------------------------------------------
# Large-batch helpers


def test_linear_scaling_rule():
    assert linear_scaling_rule(0.1, base_batch=256, batch=8192) == pytest.approx(3.2)
    assert linear_scaling_rule(0.1, 256, 256) == 0.1
    with pytest.raises(ValueError, match="batch must be a positive number"):
        linear_scaling_rule(0.1, 256, 0)


def test_batch_size_schedule_replaces_decays_by_growth():
    schedule = BatchSizeSchedule(128, milestones=[2, 4, 6], gamma=0.2)
    assert [schedule.batch_size_at(e) for e in range(8)] == [128, 128, 640, 640, 3200, 3200,
                                                             16000, 16000]
    assert all(schedule.lr_factor_at(e) == 1.0 for e in range(8))


def test_batch_size_schedule_falls_back_to_lr_decay_at_the_cap():
    schedule = BatchSizeSchedule(256, milestones=[1, 2, 3], gamma=0.1, max_batch_size=30000)
    assert [schedule.batch_size_at(e) for e in range(5)] == [256, 2560, 25600, 25600, 25600]
    assert [schedule.lr_factor_at(e) for e in range(5)] == pytest.approx([1, 1, 1, .1, .1])
    # The noise scale lr * N / B falls by the same factor 10 at every milestone.
    noise = [noise_scale(schedule.lr_factor_at(e), 10**7, schedule.batch_size_at(e))
             for e in range(4)]
    for before, after in zip(noise, noise[1:]):
        assert after / before == pytest.approx(0.1, rel=1e-2)


def test_batch_size_schedule_drives_a_lambda_lr():
    schedule = BatchSizeSchedule(32, milestones=[1], gamma=0.5, max_batch_size=32)
    scheduler = LambdaLR(optimizer_with_lrs(0.4), schedule.lr_factor_at)
    assert sequence(scheduler, 2) == [[0.4], [0.2], [0.2]]


def test_batch_size_schedule_errors():
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\)"):
        BatchSizeSchedule(32, [1], gamma=5)
    with pytest.raises(ValueError, match="below initial_batch_size"):
        BatchSizeSchedule(32, [1], max_batch_size=16)
    with pytest.raises(ValueError, match="increasing integers"):
        BatchSizeSchedule(32, [3, 1])
    with pytest.raises(ValueError, match="momentum must be in"):
        noise_scale(0.1, 100, 10, momentum=1.0)


def test_numpy_scalar_hyper_parameters_keep_float32():
    # NumPy scalars are "strong" under NumPy 2: the optimizers convert them
    # to Python floats so that they cannot promote a float32 update.
    (w,) = make_params(dtype=np.float32, shapes=[(4,)])
    optimizer = Adam([w], lr=np.float64(0.1), betas=(np.float32(0.9), np.float64(0.99)))
    for _ in range(2):
        w.grad = np.ones(4, np.float32)
        optimizer.step()
    assert w.data.dtype == np.float32
    assert optimizer.state[0]["exp_avg"].dtype == np.float32
