"""Stochastic gradient descent, with momentum, Nesterov and weight decay.

The update, step by step, exactly as ``torch.optim.SGD`` writes it (for each
parameter ``w`` with gradient ``g``, learning rate ``lr``)::

    d = g + weight_decay * w                        # L2 penalty, folded into the gradient
    if momentum != 0:
        buf = d                                     # first step: no history yet
        buf = momentum * buf + (1 - dampening) * d  # later steps
        d = d + momentum * buf   if nesterov else   buf
    w = w - lr * d

``buf`` is the *momentum buffer*, an exponentially weighted sum of past
gradients; it is the optimizer's only per-parameter state
(``optimizer.state[index]["momentum_buffer"]``). Nesterov momentum looks one
step ahead: it applies the gradient once more on top of the buffer that
already contains it.

Note that PyTorch's momentum differs from the textbook ``v = m v - lr g``:
the learning rate multiplies the buffer at update time instead of being
folded into it. The two agree while ``lr`` is constant and differ once a
scheduler changes it.
"""

from __future__ import annotations

from minidist import backend
from minidist.optim.optimizer import Optimizer, check_momentum_group


class SGD(Optimizer):
    """``SGD(params, lr, momentum=0, dampening=0, nesterov=False, weight_decay=0)``.

    ``params`` is an iterable of Tensors or of param-group dicts.
    """

    def __init__(
        self,
        params,
        lr: float | None = None,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ):
        defaults = dict(
            lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
            weight_decay=weight_decay,
        )
        super().__init__(params, defaults)

    def _check_group(self, group, group_index):
        name = type(self).__name__
        check_momentum_group(name, group, group_index, {
            "lr": "the learning rate", "momentum": "momentum", "dampening": "dampening",
            "weight_decay": "weight decay"})
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(
                f"{name}: nesterov=True needs momentum > 0 and dampening == 0 (param group "
                f"{group_index} has momentum={group['momentum']}, dampening="
                f"{group['dampening']}); set momentum=0.9, say, or nesterov=False"
            )

    def step(self, closure=None):
        loss = self._evaluate(closure)
        for index, param, grad, group in self._params_with_grad():
            # Plain Python floats: NumPy keeps them "weak", so float32 stays float32.
            lr = float(group["lr"])
            momentum = float(group["momentum"])
            dampening = float(group["dampening"])
            weight_decay = float(group["weight_decay"])
            weights = param.data

            direction = grad
            # `owned` says whether `direction` is a temporary of ours that may be
            # overwritten; the gradient itself must be left as backward made it.
            owned = False
            if weight_decay != 0:
                direction = weights * weight_decay
                direction += grad
                owned = True

            if momentum != 0:
                state = self.state.setdefault(index, {})
                buffer = state.get("momentum_buffer")
                if buffer is None:
                    buffer = state["momentum_buffer"] = backend.of(weights).array(
                        direction, dtype=weights.dtype, copy=True
                    )
                else:
                    buffer *= momentum
                    if dampening == 0:
                        buffer += direction
                    else:
                        buffer += (1 - dampening) * direction
                if group["nesterov"]:
                    if owned:
                        direction += momentum * buffer
                    else:
                        direction = buffer * momentum
                        direction += grad
                        owned = True
                else:
                    direction, owned = buffer, False

            if owned:
                direction *= lr
                weights -= direction
            else:
                weights -= lr * direction
        return loss
