"""Loss modules: thin wrappers of the functional losses, called as
``loss_fn(prediction, target)``."""

from __future__ import annotations

from minidist.nn import functional as F
from minidist.nn.module import Module


class _Loss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        F._check_reduction(reduction, type(self).__name__)
        self.reduction = reduction

    def extra_repr(self) -> str:
        return "" if self.reduction == "mean" else f"reduction={self.reduction!r}"


class _ClassLoss(_Loss):
    def __init__(self, reduction: str = "mean", ignore_index: int = -100):
        super().__init__(reduction)
        self.ignore_index = int(ignore_index)

    def extra_repr(self) -> str:
        parts = [super().extra_repr(), "" if self.ignore_index == -100 else f"ignore_index={self.ignore_index}"]
        return ", ".join(part for part in parts if part)


class CrossEntropyLoss(_ClassLoss):
    """``CrossEntropyLoss(reduction="mean", ignore_index=-100)``: logits
    (N, classes) and integer labels (N,) (Tensor, array or list), or
    (N, classes, d1, ...) and (N, d1, ...) as torch -> the mean of
    logsumexp(z_i) - z_i[y_i] over the labels that are not ``ignore_index``.
    Log-softmax and NLL fused in one stable node; see
    :func:`functional.cross_entropy`."""

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.reduction, self.ignore_index)


class NLLLoss(_ClassLoss):
    """``NLLLoss(reduction="mean", ignore_index=-100)``: log-probabilities
    (N, classes) and integer labels (N,) -> the mean of -logp[i, y_i] over
    the labels that are not ``ignore_index``."""

    def forward(self, input, target):
        return F.nll_loss(input, target, self.reduction, self.ignore_index)


class MSELoss(_Loss):
    """``MSELoss(reduction="mean")``: the mean of (input - target)^2 over all
    elements; the shapes must match."""

    def forward(self, input, target):
        return F.mse_loss(input, target, self.reduction)
