"""Optimizers and learning-rate schedules.

* :class:`Optimizer`: param groups, per-parameter state by index, checkpoints.
* :class:`SGD` (momentum, Nesterov, weight decay), :class:`Adam`,
  :class:`AdamW`: PyTorch's update formulas, in place, in the parameters' dtype.
* :class:`LARS`: layer-wise trust ratios for very large batches.
* :mod:`minidist.optim.lr_scheduler`: StepLR, MultiStepLR, CosineAnnealingLR,
  LinearWarmup, LambdaLR, SequentialLR, WarmupThen, the linear scaling rule,
  and BatchSizeSchedule (grow the batch instead of decaying the rate).
"""

from minidist.optim import lr_scheduler
from minidist.optim.adam import Adam, AdamW
from minidist.optim.batch_size_schedule import BatchSizeSchedule, noise_scale
from minidist.optim.lars import LARS
from minidist.optim.lr_scheduler import linear_scaling_rule
from minidist.optim.optimizer import Optimizer
from minidist.optim.sgd import SGD

__all__ = [
    "Optimizer", "SGD", "Adam", "AdamW", "LARS", "lr_scheduler", "linear_scaling_rule",
    "BatchSizeSchedule", "noise_scale",
]
