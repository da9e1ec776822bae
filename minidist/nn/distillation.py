"""Knowledge distillation (Hinton et al. 2015) and FitNets hints (Romero et al. 2014).

    loss_fn = nn.DistillationLoss(temperature=4.0, alpha=0.9)
    with no_grad(): teacher_logits = teacher(x)
    loss = loss_fn(student(x), teacher_logits, labels); loss.backward()

**Distillation.** A trained teacher's softmax says more than the label: a
"2" that looks a bit like a "7" gets a little probability on 7. Those
relative probabilities of wrong classes ("dark knowledge") are nearly zero
at temperature 1, so both teacher and student logits are divided by a
temperature T > 1 to soften them, and the student matches the teacher's
soft distribution while still fitting the hard labels:

    loss = alpha * T^2 * KL( softmax(t / T) || softmax(s / T) )
         + (1 - alpha) * cross_entropy(s, y)

averaged over the batch. Why T^2: the gradient of the soft term with
respect to a student logit is (1/T) (softmax(s/T) - softmax(t/T)), and for
large T each softmax difference is itself about (s - t) / (C T) (C classes,
logits centred), so the gradient shrinks like 1/T^2. Multiplying by T^2
keeps the soft targets' share of the gradient the same whatever T is tried
(in the limit it becomes (s - t - mean) / C: Hinton's "matching logits"
regression), so alpha means the same at every temperature.

**FitNets.** A student *thinner and deeper* than its teacher is hard to
train from scratch, so Romero et al. first train its lower part alone to
predict an intermediate layer of the teacher: the teacher's *hint* layer
(output of its first few layers) against the student's *guided* layer,
through a small *regressor* r that maps the guided layer to the hint's
shape (the student is thinner, so the shapes differ):

    stage 1 (hints):       minimise  1/2 || hint(x) - r(guided(x)) ||^2  over guided's weights and r
    stage 2 (distillation): train the whole student with DistillationLoss

The regressor is thrown away after stage 1. :class:`HintRegressor` is a
Linear for dense features (N, F) or a convolution for (N, C, H, W) maps
(1x1 by default; the paper also uses a k x k conv without padding to shrink
the spatial size). :func:`hint_loss` is the mean of the squared error, not
the paper's half sum, so its scale does not grow with the feature size.
"""

from __future__ import annotations

import math

import numpy

from minidist import backend
from minidist.nn import functional as F
from minidist.nn.conv import Conv2d
from minidist.nn.linear import Linear
from minidist.nn.module import Module
from minidist.tensor import Tensor, _shape_str, no_grad


def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, numpy.floating, numpy.integer)):
        raise TypeError(f"temperature must be a number, got {temperature!r}")
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(
            f"temperature must be a finite number > 0, got {temperature!r}; T = 1 is the plain "
            "softmax, Hinton et al. use T between 2 and 20 to soften the teacher's outputs"
        )
    return float(temperature)


def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, numpy.floating, numpy.integer)):
        raise TypeError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(
            f"alpha must be in [0, 1] (the weight of the soft targets; 1 - alpha weights the hard "
            f"labels), got {alpha!r}"
        )
    return float(alpha)


def soft_target_loss(student_logits, teacher_logits, temperature: float, reduction: str = "mean") -> Tensor:
    """T^2 * KL( softmax(teacher / T) || softmax(student / T) ) per sample,
    averaged over the batch by default: the soft half of the distillation loss.

    One fused node. Forward: both log-softmaxes shifted by their row maximum
    (stable for any logits), KL_i = sum_c p_c (log p_c - log q_c) with p the
    teacher's and q the student's softened distribution. Backward, to the
    student logits only (the teacher is a fixed target, as in Hinton et al.):
    d/ds T^2 KL = T (q - p). Cost: a few passes over the (N, classes) logits.
    """
    F._check_reduction(reduction, "soft_target_loss")
    temperature = _check_temperature(temperature)
    student_logits = F._tensor(student_logits)
    s = student_logits.data
    t = teacher_logits.data if isinstance(teacher_logits, Tensor) else teacher_logits
    xp = backend.of(s)
    t = F._in_dtype(xp.asarray(t), s.dtype)
    if s.ndim != 2 or s.shape != t.shape:
        raise ValueError(
            f"soft_target_loss: student logits {_shape_str(s.shape)} and teacher logits "
            f"{_shape_str(t.shape)} must both be (batch, classes) of the same shape; the teacher and "
            "student must predict the same classes for the same batch"
        )

    def log_softmax(z):
        shifted = z / temperature
        shifted = shifted - shifted.max(axis=1, keepdims=True)
        return shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))

    log_q, log_p = log_softmax(s), log_softmax(t)
    p = xp.exp(log_p)
    losses = (temperature**2) * (p * (log_p - log_q)).sum(axis=1)
    out = F._reduce(losses, reduction)
    n = s.shape[0]

    def backward(g):
        grad = temperature * (xp.exp(log_q) - p)
        scale = F._loss_scale(g, reduction, n)
        grad *= scale[:, None] if reduction == "none" else scale
        return (grad,)

    return Tensor._make(out, (student_logits,), backward, "soft_target_loss")


def distillation_loss(student_logits, teacher_logits, labels, temperature: float = 4.0, alpha: float = 0.9,
                      reduction: str = "mean") -> Tensor:
    """alpha * T^2 KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * cross_entropy(s, y);
    see the module docstring. ``alpha=1`` is soft targets alone, ``alpha=0``
    plain training on the labels."""
    temperature, alpha = _check_temperature(temperature), _check_alpha(alpha)
    soft = soft_target_loss(student_logits, teacher_logits, temperature, reduction)
    if alpha == 1.0:
        return soft
    hard = F.cross_entropy(student_logits, labels, reduction)
    if alpha == 0.0:
        return hard
    return soft * alpha + hard * (1.0 - alpha)


class DistillationLoss(Module):
    """``DistillationLoss(temperature=4.0, alpha=0.9, reduction="mean")``,
    called as ``loss_fn(student_logits, teacher_logits, labels)``: Hinton et
    al.'s loss, :func:`distillation_loss`. The teacher's logits are a fixed
    target (pass them computed under ``no_grad``); T <= 0 or alpha outside
    [0, 1] raise ``ValueError``."""

    def __init__(self, temperature: float = 4.0, alpha: float = 0.9, reduction: str = "mean"):
        super().__init__()
        F._check_reduction(reduction, "DistillationLoss")
        self.temperature = _check_temperature(temperature)
        self.alpha = _check_alpha(alpha)
        self.reduction = reduction

    def forward(self, student_logits, teacher_logits, labels):
        return distillation_loss(student_logits, teacher_logits, labels, self.temperature, self.alpha,
                                 self.reduction)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, alpha={self.alpha}"


class HintRegressor(Module):
    """``HintRegressor(student_features, teacher_features, convolutional=False,
    kernel_size=1, rng=None, dtype=float32)``: FitNets' regressor r, mapping
    the student's guided layer to the teacher's hint layer's shape.

    Dense: a ``Linear(student_features, teacher_features)``, (N, F_s) -> (N, F_t).
    Convolutional: a ``Conv2d(student_features, teacher_features, kernel_size)``
    without padding, (N, C_s, H, W) -> (N, C_t, H - k + 1, W - k + 1); with
    the default 1x1 kernel the spatial size is kept.
    """

    def __init__(self, student_features: int, teacher_features: int, convolutional: bool = False,
                 kernel_size=1, rng=None, dtype=numpy.float32):
        super().__init__()
        self.convolutional = bool(convolutional)
        if self.convolutional:
            self.layer = Conv2d(student_features, teacher_features, kernel_size, rng=rng, dtype=dtype)
        else:
            if kernel_size != 1:
                raise ValueError("HintRegressor: kernel_size is for convolutional=True; a dense regressor is a Linear")
            self.layer = Linear(student_features, teacher_features, rng=rng, dtype=dtype)

    def forward(self, guided):
        return self.layer(guided)


def hint_loss(regressed, hint) -> Tensor:
    """FitNets' hint loss: mean((r(guided) - hint)^2) over all elements. The
    shapes must match; the hint is a fixed target."""
    hint_data = hint.data if isinstance(hint, Tensor) else hint
    regressed = F._tensor(regressed)
    if regressed.shape != tuple(hint_data.shape):
        raise ValueError(
            f"hint_loss: the regressor's output {_shape_str(regressed.shape)} and the teacher's hint "
            f"{_shape_str(hint_data.shape)} differ; build HintRegressor(student_features, "
            "teacher_features) from the guided and hint layers' sizes (and, for conv maps, choose the "
            "kernel so the spatial sizes agree)"
        )
    return F.mse_loss(regressed, hint_data)


def train_hint_stage(guided: Module, regressor: HintRegressor, hint: Module, batches, optimizer) -> float:
    """FitNets stage 1, one pass over ``batches``: train the student's lower
    part ``guided`` (x -> guided features) and the ``regressor`` so that
    ``regressor(guided(x))`` matches the teacher's lower part ``hint(x)``.

    ``batches`` yields inputs ``x`` (arrays or Tensors) or ``(x, labels)``
    pairs (labels are ignored: stage 1 uses no labels). ``optimizer`` must
    hold the parameters of ``guided`` and ``regressor`` (any minidist
    optimizer). The teacher runs in eval mode without a graph and is never
    updated. Returns the mean hint loss over the pass.
    """
    was_training = hint.training
    hint.eval()
    total = count = 0
    try:
        for batch in batches:
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            x = F._tensor(x)
            with no_grad():
                target = hint(x)
            loss = hint_loss(regressor(guided(x)), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(x)
            count += len(x)
    finally:
        hint.train(was_training)
    return total / max(count, 1)


__all__ = [
    "DistillationLoss", "distillation_loss", "soft_target_loss", "HintRegressor", "hint_loss",
    "train_hint_stage",
]
