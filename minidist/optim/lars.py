"""LARS: layer-wise adaptive rate scaling (You, Gitman & Ginsburg, 2017,
"Large Batch Training of Convolutional Networks", arXiv:1708.03888, the
"scaling SGD batch size to 32K" report).

Why: with a very large batch one wants a large learning rate, but the ratio
``||w|| / ||g||`` differs by orders of magnitude between layers, so a rate
that suits one layer makes another diverge. LARS gives every layer (every
parameter tensor) its own *trust ratio*, so that each layer's step is a fixed
fraction ``eta`` of its weights' norm, whatever the gradient's scale.

The update for a parameter ``w`` with gradient ``g`` (``eta`` is
``trust_coefficient``, ``lr`` the global, scheduled learning rate)::

    trust_ratio = eta * ||w|| / (||g|| + weight_decay * ||w||)
                  (1 if ||w|| == 0 or ||g|| == 0: a fresh zero-initialised
                   layer, or one without gradient, keeps the plain step)
    d   = trust_ratio * (g + weight_decay * w)
    buf = d                           # first step
    buf = momentum * buf + d          # later steps
    w   = w - lr * buf

This is momentum SGD (PyTorch's form, no dampening) applied to the rescaled
gradient ``d``. The norms are Euclidean norms of the whole tensor, and the
denominator uses the norm of the raw gradient ``g``, as in the paper.
The paper's Algorithm 1 puts ``lr`` inside the buffer (``buf = m buf + lr d``,
``w = w - buf``); the two are the same while ``lr`` is constant.

Biases and batch-norm scales and shifts (the 1-D parameters) are small and
their norms are poor guides, so large-batch recipes (LARS for ResNet-50,
SimCLR, BYOL) leave them out: with ``exclude_bias_and_norm=True`` (the
default) a parameter with ``ndim <= 1`` gets neither the trust ratio nor the
weight decay, i.e. plain momentum SGD with ``lr``. Set it to False to apply
LARS to every tensor, as the paper's formula does.

State per parameter: ``momentum_buffer`` and ``trust_ratio`` (the last ratio
used, a float: worth plotting per layer in the large-batch lesson).
"""

from __future__ import annotations

from minidist import backend
from minidist.optim.optimizer import Optimizer, check_momentum_group


class LARS(Optimizer):
    """``LARS(params, lr, momentum=0.9, weight_decay=0, trust_coefficient=0.001,
    exclude_bias_and_norm=True)``."""

    def __init__(
        self,
        params,
        lr: float | None = None,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        exclude_bias_and_norm: bool = True,
    ):
        defaults = dict(
            lr=lr, momentum=momentum, weight_decay=weight_decay,
            trust_coefficient=trust_coefficient, exclude_bias_and_norm=exclude_bias_and_norm,
        )
        super().__init__(params, defaults)

    def _check_group(self, group, group_index):
        check_momentum_group(type(self).__name__, group, group_index, {
            "lr": "the learning rate", "momentum": "momentum", "weight_decay": "weight decay",
            "trust_coefficient": "the trust coefficient eta (typical: 0.001)"})

    def step(self, closure=None):
        loss = self._evaluate(closure)
        for index, param, grad, group in self._params_with_grad():
            lr = float(group["lr"])
            momentum = float(group["momentum"])
            weights = param.data
            xp = backend.of(weights)
            state = self.state.setdefault(index, {})

            excluded = group["exclude_bias_and_norm"] and weights.ndim <= 1
            if excluded:
                weight_decay, trust_ratio = 0.0, 1.0
            else:
                weight_decay = float(group["weight_decay"])
                # float(): a host number for the branch below (on a GPU, one
                # small device-to-host copy per tensor per step).
                weight_norm = float(xp.linalg.norm(weights))
                grad_norm = float(xp.linalg.norm(grad))
                if weight_norm > 0 and grad_norm > 0:
                    trust_ratio = (
                        float(group["trust_coefficient"]) * weight_norm
                        / (grad_norm + weight_decay * weight_norm)
                    )
                else:
                    trust_ratio = 1.0
            state["trust_ratio"] = trust_ratio

            # A fresh array either way: the gradient itself stays as backward made it.
            if weight_decay != 0:
                direction = weights * weight_decay
                direction += grad
                direction *= trust_ratio
            else:
                direction = grad * trust_ratio

            if momentum != 0:
                buffer = state.get("momentum_buffer")
                if buffer is None:
                    buffer = state["momentum_buffer"] = direction.copy()
                else:
                    buffer *= momentum
                    buffer += direction
                xp.multiply(buffer, lr, out=direction)
            else:
                direction *= lr
            weights -= direction
        return loss
