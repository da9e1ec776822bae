"""nn.distillation: the distillation loss against a NumPy formula and finite
differences, the T^2 scaling that keeps the soft gradients' size as T
changes, the clear errors, and FitNets' hint stage on shapes and gradients."""

import numpy as np
import pytest
from nn_reference import check_grad

from minidist import Tensor, nn, optim
from minidist.nn import distillation as D

rng = np.random.default_rng(15)


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def reference_loss(s, t, y, temperature, alpha):
    p, q = softmax(t / temperature), softmax(s / temperature)
    kl = (p * (np.log(p) - np.log(q))).sum(axis=1).mean()
    cross_entropy = -np.log(softmax(s)[np.arange(len(y)), y]).mean()
    return alpha * temperature**2 * kl + (1 - alpha) * cross_entropy


@pytest.mark.parametrize("temperature, alpha", [(1.0, 0.5), (4.0, 0.9), (20.0, 0.3), (2.5, 1.0), (3.0, 0.0)])
def test_distillation_loss_matches_the_formula_and_finite_differences(temperature, alpha):
    s, t, y = rng.standard_normal((5, 7)) * 3, rng.standard_normal((5, 7)) * 3, rng.integers(0, 7, 5)
    loss = D.distillation_loss(Tensor(s), Tensor(t), y, temperature, alpha)
    np.testing.assert_allclose(loss.item(), reference_loss(s, t, y, temperature, alpha), rtol=1e-12)
    check_grad(lambda z: D.distillation_loss(z, t, y, temperature, alpha), s)
    module = nn.DistillationLoss(temperature=temperature, alpha=alpha)
    np.testing.assert_allclose(module(Tensor(s), t, y).item(), loss.item(), rtol=1e-15)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_soft_target_loss_reductions_and_gradient(reduction):
    s, t = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    check_grad(lambda z: D.soft_target_loss(z, t, 3.0, reduction), s)
    per_sample = D.soft_target_loss(Tensor(s), t, 3.0, "none").data
    p, q = softmax(t / 3), softmax(s / 3)
    np.testing.assert_allclose(per_sample, 9 * (p * np.log(p / q)).sum(axis=1), rtol=1e-12)


def test_soft_loss_is_zero_when_the_student_matches_the_teacher_and_stable_for_huge_logits():
    t = rng.standard_normal((3, 4)) * 1e4
    assert abs(D.soft_target_loss(Tensor(t.copy()), t, 2.0).item()) < 1e-9
    loss = D.soft_target_loss(Tensor(-t, requires_grad=True), t, 2.0)
    assert np.isfinite(loss.item())


def soft_gradient(s, t, temperature, scaled=True):
    z = Tensor(s.copy(), requires_grad=True)
    loss = D.soft_target_loss(z, t, temperature)
    (loss if scaled else loss * (1 / temperature**2)).backward()
    return z.grad


def test_t_squared_keeps_the_soft_gradient_scale_as_the_temperature_changes():
    s, t = rng.standard_normal((6, 10)), rng.standard_normal((6, 10))
    temperatures = [4.0, 8.0, 16.0, 32.0]
    with_factor = [np.linalg.norm(soft_gradient(s, t, T)) for T in temperatures]
    without = [np.linalg.norm(soft_gradient(s, t, T, scaled=False)) for T in temperatures]
    # With T^2 the size stays put (within 15 % from T = 4 to 32) ...
    assert max(with_factor) / min(with_factor) < 1.15
    # ... without it, it falls as 1 / T^2: 64x from T = 4 to T = 32.
    assert without[0] / without[-1] == pytest.approx(64, rel=0.15)
    # The high-temperature limit is Hinton's logit matching: (s - t) centred, / C, / N.
    centred = (s - s.mean(axis=1, keepdims=True)) - (t - t.mean(axis=1, keepdims=True))
    np.testing.assert_allclose(soft_gradient(s, t, 1000.0), centred / 10 / 6, rtol=2e-3, atol=1e-7)


def test_bad_temperature_and_alpha_are_clear_errors():
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            nn.DistillationLoss(temperature=bad)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
            nn.DistillationLoss(alpha=bad)
    with pytest.raises(TypeError, match="temperature must be a number"):
        nn.DistillationLoss(temperature="4")
    with pytest.raises(ValueError, match="must both be \\(batch, classes\\) of the same shape"):
        D.distillation_loss(Tensor(np.zeros((2, 3))), np.zeros((2, 4)), [0, 1])


def test_hint_regressor_shapes_dense_and_convolutional():
    nn.init.manual_seed(0)
    dense = nn.HintRegressor(16, 64)
    assert dense(Tensor(np.zeros((5, 16), np.float32))).shape == (5, 64)
    conv = nn.HintRegressor(4, 12, convolutional=True)
    assert conv(Tensor(np.zeros((2, 4, 6, 6), np.float32))).shape == (2, 12, 6, 6)
    shrinking = nn.HintRegressor(4, 12, convolutional=True, kernel_size=3)
    assert shrinking(Tensor(np.zeros((2, 4, 6, 6), np.float32))).shape == (2, 12, 4, 4)
    with pytest.raises(ValueError, match="regressor's output \\(2, 12, 4, 4\\) and the teacher's hint"):
        D.hint_loss(shrinking(Tensor(np.zeros((2, 4, 6, 6), np.float32))), np.zeros((2, 12, 6, 6)))


@pytest.mark.parametrize("convolutional", [False, True])
def test_hint_loss_gradients_reach_the_guided_layers_and_the_regressor(convolutional):
    nn.init.manual_seed(1)
    if convolutional:
        guided = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU()).to(np.float64)
        regressor = nn.HintRegressor(3, 5, convolutional=True).to(np.float64)
        x, hint = rng.standard_normal((2, 1, 4, 4)), rng.standard_normal((2, 5, 4, 4))
        first, second = guided[0], regressor.layer
        forward = lambda a, w1, b1, w2, b2: D.hint_loss(  # noqa: E731
            nn.functional.conv2d(nn.functional.relu(nn.functional.conv2d(a, w1, b1, 1, 1)), w2, b2), hint)
    else:
        guided = nn.Sequential(nn.Linear(6, 3), nn.ReLU()).to(np.float64)
        regressor = nn.HintRegressor(3, 8).to(np.float64)
        x, hint = rng.standard_normal((4, 6)), rng.standard_normal((4, 8))
        first, second = guided[0], regressor.layer
        forward = lambda a, w1, b1, w2, b2: D.hint_loss(  # noqa: E731
            nn.functional.linear(nn.functional.relu(nn.functional.linear(a, w1, b1)), w2, b2), hint)
    loss = D.hint_loss(regressor(guided(Tensor(x))), hint)
    expected = ((regressor(guided(Tensor(x))).data - hint) ** 2).mean()
    np.testing.assert_allclose(loss.item(), expected, rtol=1e-12)
    # every parameter of the guided layers and of the regressor, by finite differences
    check_grad(forward, x, first.weight.data, first.bias.data, second.weight.data, second.bias.data)


def test_hint_stage_trains_only_the_student_and_regressor_and_lowers_the_loss():
    nn.init.manual_seed(2)
    teacher = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    hint = teacher[:2]
    student = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 4))
    guided = student[:4]
    regressor = nn.HintRegressor(6, 32)
    teacher_before = [p.data.copy() for p in teacher.parameters()]
    head_before = student[4].weight.data.copy()
    parameters = list(guided.parameters()) + list(regressor.parameters())
    optimizer = optim.SGD(parameters, lr=0.1, momentum=0.9)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    batches = [(x[i : i + 16], None) for i in range(0, 64, 16)]
    first = D.train_hint_stage(guided, regressor, hint, batches, optimizer)
    for _ in range(30):
        last = D.train_hint_stage(guided, regressor, hint, batches, optimizer)
    assert last < 0.5 * first
    for before, parameter in zip(teacher_before, teacher.parameters()):
        np.testing.assert_array_equal(before, parameter.data)
        assert parameter.grad is None
    np.testing.assert_array_equal(head_before, student[4].weight.data)
    assert teacher.training
