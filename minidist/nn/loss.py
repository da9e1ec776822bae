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


class CrossEntropyLoss(_Loss):
    """``CrossEntropyLoss(reduction="mean")``: logits (N, classes) and
    integer labels (N,) (Tensor, array or list) -> the mean of
    logsumexp(z_i) - z_i[y_i]. Log-softmax and NLL fused in one stable node;
    see :func:`functional.cross_entropy`."""

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.reduction)


class NLLLoss(_Loss):
    """``NLLLoss(reduction="mean")``: log-probabilities (N, classes) and
    integer labels (N,) -> the mean of -logp[i, y_i]."""

    def forward(self, input, target):
        return F.nll_loss(input, target, self.reduction)


class MSELoss(_Loss):
    """``MSELoss(reduction="mean")``: the mean of (input - target)^2 over all
    elements; the shapes must match."""

    def forward(self, input, target):
        return F.mse_loss(input, target, self.reduction)
