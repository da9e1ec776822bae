"""Adam (Kingma & Ba, 2015) and AdamW (Loshchilov & Hutter, 2019).

Adam keeps two running averages per parameter, of the gradient (the first
moment ``m``) and of its square (the second moment ``v``), and divides one by
the square root of the other: every coordinate gets its own step size, large
where gradients are small and steady, small where they are large or noisy.

The update, exactly as ``torch.optim.Adam`` writes it (step ``t`` counts from
1; ``beta1, beta2 = betas``)::

    g = g + weight_decay * w                  # Adam only: L2 penalty in the gradient
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    v_max = max(v_max, v)                     # amsgrad only; then v_max replaces v below
    step_size = lr / (1 - beta1 ** t)         # bias corrections: m and v start at 0,
    denom = sqrt(v) / sqrt(1 - beta2 ** t) + eps   # so early averages are too small
    w = w - step_size * m / denom

AdamW differs in one line. It does not add the penalty to the gradient,
where Adam's division by ``sqrt(v)`` would shrink it for parameters with
large gradients; it *decouples* the decay and shrinks the weights directly,
before the Adam step::

    w = w * (1 - lr * weight_decay)

State per parameter, under PyTorch's names: ``step`` (an int), ``exp_avg``
(m), ``exp_avg_sq`` (v) and, with amsgrad, ``max_exp_avg_sq`` (v_max). All
arrays are in the parameter's dtype.
"""

from __future__ import annotations

import math
import numbers

from minidist import backend
from minidist.optim.optimizer import Optimizer, check_non_negative


class Adam(Optimizer):
    """``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False)``."""

    # AdamW sets this: how the weight decay is applied (see the module docstring).
    decoupled_weight_decay = False

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
    ):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(params, defaults)

    def _check_group(self, group, group_index):
        name = type(self).__name__
        check_non_negative(name, "lr", group["lr"], group_index, "the learning rate")
        check_non_negative(name, "eps", group["eps"], group_index, "eps")
        check_non_negative(
            name, "weight_decay", group["weight_decay"], group_index, "weight decay"
        )
        betas = group["betas"]
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(
                f"{name}: betas must be a pair (beta1, beta2) such as (0.9, 0.999), got "
                f"{betas!r} in param group {group_index}"
            )
        for which, beta in enumerate(betas):
            if not (isinstance(beta, numbers.Real) and 0.0 <= beta < 1.0):
                raise ValueError(
                    f"{name}: invalid beta{which + 1}={beta!r} in param group {group_index}; "
                    "each beta is the decay of a running average and must be in [0, 1) "
                    "(typical: betas=(0.9, 0.999))"
                )

    def step(self, closure=None):
        loss = self._evaluate(closure)
        for index, param, grad, group in self._params_with_grad():
            lr = float(group["lr"])
            beta1, beta2 = (float(beta) for beta in group["betas"])
            eps = float(group["eps"])
            weight_decay = float(group["weight_decay"])
            weights = param.data
            xp = backend.of(weights)

            state = self.state.setdefault(index, {})
            if not state:
                state["step"] = 0
                state["exp_avg"] = xp.zeros_like(weights)
                state["exp_avg_sq"] = xp.zeros_like(weights)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = xp.zeros_like(weights)
            state["step"] += 1
            step = state["step"]
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]

            if weight_decay != 0:
                if self.decoupled_weight_decay:
                    weights *= 1 - lr * weight_decay
                else:
                    grad = weights * weight_decay
                    grad += param.grad

            # One scratch array per parameter per step: every intermediate is
            # written into it in turn (the benchmark compares with PyTorch).
            scratch = xp.multiply(grad, 1 - beta1)
            exp_avg *= beta1
            exp_avg += scratch
            xp.multiply(grad, grad, out=scratch)
            scratch *= 1 - beta2
            exp_avg_sq *= beta2
            exp_avg_sq += scratch

            if group["amsgrad"]:
                # A run started without amsgrad has no such buffer yet.
                if "max_exp_avg_sq" not in state:
                    state["max_exp_avg_sq"] = xp.zeros_like(weights)
                second_moment = state["max_exp_avg_sq"]
                xp.maximum(second_moment, exp_avg_sq, out=second_moment)
            else:
                second_moment = exp_avg_sq

            step_size = lr / (1 - beta1**step)
            bias_correction2_sqrt = math.sqrt(1 - beta2**step)
            denominator = xp.sqrt(second_moment, out=scratch)
            denominator /= bias_correction2_sqrt
            denominator += eps
            update = xp.divide(exp_avg, denominator, out=scratch)
            update *= step_size
            weights -= update
        return loss


class AdamW(Adam):
    """``AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False)``:
    Adam with decoupled weight decay, ``w = w * (1 - lr * weight_decay)``
    before the Adam step. The default decay is PyTorch's, 0.01."""

    decoupled_weight_decay = True

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad)
