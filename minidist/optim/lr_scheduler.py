"""Learning-rate schedules, and the linear scaling rule for large batches.

Every schedule here is a *pure function* of a step count ``t`` and a group's
base learning rate: ``lr_at(t, base_lr)``. A scheduler object only counts its
``step()`` calls and writes ``lr_at(t, base_lr)`` into every param group of
its optimizer. So a schedule can be tested, plotted or composed without
training anything, and resuming from a checkpoint is restoring one integer.

What ``t`` counts is up to you: call ``scheduler.step()`` once per epoch
(the classic StepLR recipe) or once per iteration (warm-up, cosine for
transformers); set the schedule's lengths in the same unit. The usual loop::

    scheduler = WarmupThen(optimizer, warmup_steps=500,
                           then=CosineAnnealingLR(optimizer, T_max=total - 500))
    for batch in loader:
        loss = ...; loss.backward()
        optimizer.step(); optimizer.zero_grad()
        scheduler.step()                  # after optimizer.step(), as in PyTorch

As in PyTorch, building a scheduler applies ``lr_at(0)`` at once, records
each group's starting rate as ``group["initial_lr"]`` (the base rate every
later scheduler on that optimizer starts from too), and ``last_epoch`` is the
number of ``step()`` calls so far. Names and arguments follow
``torch.optim.lr_scheduler``.

Schedules: :class:`StepLR`, :class:`MultiStepLR`, :class:`CosineAnnealingLR`,
:class:`LinearWarmup`, :class:`LambdaLR`, :class:`SequentialLR` (one schedule
after another) and :class:`WarmupThen` (linear warm-up, then any schedule).
Helpers: :func:`linear_scaling_rule`, and :class:`BatchSizeSchedule` (grow
the batch instead of decaying the rate; defined in ``batch_size_schedule``).
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Callable, Sequence

from minidist.optim.batch_size_schedule import BatchSizeSchedule, noise_scale
from minidist.optim.optimizer import Optimizer

__all__ = [
    "LRScheduler", "StepLR", "MultiStepLR", "CosineAnnealingLR", "LinearWarmup", "LambdaLR",
    "SequentialLR", "WarmupThen", "linear_scaling_rule", "BatchSizeSchedule", "noise_scale",
]


def linear_scaling_rule(base_lr: float, base_batch: int, batch: int) -> float:
    """The learning rate for ``batch`` examples per step, given one that works
    for ``base_batch``: ``base_lr * batch / base_batch``.

    Goyal et al., 2017 ("Accurate, Large Minibatch SGD: Training ImageNet in
    1 Hour"): "when the minibatch size is multiplied by k, multiply the
    learning rate by k". Reason: k small-batch SGD steps with rate ``lr`` move
    the weights by about ``lr`` times the sum of k gradients; one step on the
    k-times larger batch averages those k gradients, so it needs ``k * lr`` to
    move as far. The approximation fails early in training, while the
    gradients change quickly; hence their *gradual warm-up*: start at
    ``base_lr`` and ramp linearly to the scaled rate over the first 5 epochs::

        lr = linear_scaling_rule(0.1, base_batch=256, batch=8192)   # 3.2
        scheduler = WarmupThen(optimizer, warmup_steps=5 * iterations_per_epoch,
                               start_factor=256 / 8192,              # from 0.1
                               then=MultiStepLR(optimizer, [30 * ipe, 60 * ipe, 80 * ipe]))
    """
    for name, value in (("base_batch", base_batch), ("batch", batch)):
        if not (isinstance(value, numbers.Real) and value > 0):
            raise ValueError(f"linear_scaling_rule: {name} must be a positive number, got {value!r}")
    if not (isinstance(base_lr, numbers.Real) and base_lr >= 0):
        raise ValueError(f"linear_scaling_rule: base_lr must be a number >= 0, got {base_lr!r}")
    return base_lr * batch / base_batch


def _check_count(scheduler: str, name: str, value, minimum: int):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{scheduler}: {name} must be an integer >= {minimum}, got {value!r}")


class LRScheduler:
    """Base class: subclasses define ``lr_at(t, base_lr)`` (or ``lrs_at(t)``
    for all groups at once)."""

    def __init__(self, optimizer: Optimizer):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"{type(self).__name__} schedules an optimizer's learning rate; got "
                f"{type(optimizer).__name__}. Pass the optimizer, e.g. "
                f"{type(self).__name__}(optimizer, ...)"
            )
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = -1
        self.step()

    def lr_at(self, t: int, base_lr: float) -> float:
        raise NotImplementedError(f"{type(self).__name__} does not define lr_at")

    def lrs_at(self, t: int) -> list[float]:
        """The learning rate of every param group after ``t`` calls of step()."""
        return [self.lr_at(t, base_lr) for base_lr in self.base_lrs]

    def step(self):
        """Advance one step (epoch or iteration) and set the groups' rates."""
        self.last_epoch += 1
        self._apply(self.lrs_at(self.last_epoch))

    def _apply(self, lrs):
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = list(lrs)

    def get_last_lr(self) -> list[float]:
        """The rates the last step() set, one per param group."""
        return list(self._last_lr)

    def state_dict(self) -> dict:
        """The step count and base rates (functions such as a LambdaLR's
        lambda are code, not state: rebuild the scheduler, then load)."""
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state_dict: dict):
        self.last_epoch = state_dict["last_epoch"]
        self.base_lrs = list(state_dict["base_lrs"])
        self._apply(self.lrs_at(self.last_epoch))


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (t // step_size)``: decay by ``gamma`` every
    ``step_size`` steps (the ResNet recipe: 0.1 every 30 epochs)."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1):
        _check_count("StepLR", "step_size", step_size, 1)
        if not (isinstance(gamma, numbers.Real) and gamma >= 0):
            raise ValueError(f"StepLR: gamma must be a number >= 0, got {gamma!r}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def lr_at(self, t, base_lr):
        return base_lr * self.gamma ** (t // self.step_size)


class MultiStepLR(LRScheduler):
    """``lr = base_lr * gamma ** (number of milestones <= t)``: decay by
    ``gamma`` at each milestone (Goyal et al.: epochs 30, 60, 80)."""

    def __init__(self, optimizer, milestones: Sequence[int], gamma: float = 0.1):
        milestones = list(milestones)
        for milestone in milestones:
            _check_count("MultiStepLR", "each milestone", milestone, 0)
        if milestones != sorted(milestones):
            raise ValueError(f"MultiStepLR: milestones must be increasing, got {milestones}")
        if not (isinstance(gamma, numbers.Real) and gamma >= 0):
            raise ValueError(f"MultiStepLR: gamma must be a number >= 0, got {gamma!r}")
        self.milestones, self.gamma = milestones, gamma
        super().__init__(optimizer)

    def lr_at(self, t, base_lr):
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, t)


class CosineAnnealingLR(LRScheduler):
    """Half a cosine from ``base_lr`` down to ``eta_min`` over ``T_max`` steps
    (Loshchilov & Hutter, 2017, without restarts)::

        lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2   for t <= T_max
        lr = eta_min                                                          for t >  T_max

    Up to ``T_max`` this is PyTorch's closed form; PyTorch's curve then rises
    again, this one stays at ``eta_min``, which is what a run that goes on
    a little longer than planned wants.
    """

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0):
        _check_count("CosineAnnealingLR", "T_max", T_max, 1)
        if not (isinstance(eta_min, numbers.Real) and eta_min >= 0):
            raise ValueError(f"CosineAnnealingLR: eta_min must be a number >= 0, got {eta_min!r}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def lr_at(self, t, base_lr):
        if t >= self.T_max:
            return self.eta_min
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2


class LinearWarmup(LRScheduler):
    """Ramp linearly from ``start_factor * base_lr`` to ``base_lr`` over
    ``warmup_steps`` steps, then stay at ``base_lr``::

        lr = base_lr * (start_factor + (1 - start_factor) * t / warmup_steps)   for t < warmup_steps
        lr = base_lr                                                            for t >= warmup_steps

    With the default ``start_factor=0`` the very first step has rate 0, the
    common convention when stepping per iteration; when stepping per epoch,
    or to follow Goyal et al., start above 0 (e.g. ``base_batch / batch``).
    This is PyTorch's ``LinearLR(start_factor, end_factor=1, total_iters=warmup_steps)``.
    To continue with another schedule use :class:`WarmupThen`.
    """

    def __init__(self, optimizer, warmup_steps: int, start_factor: float = 0.0):
        _check_count("LinearWarmup", "warmup_steps", warmup_steps, 0)
        if not (isinstance(start_factor, numbers.Real) and 0 <= start_factor <= 1):
            raise ValueError(
                f"LinearWarmup: start_factor must be in [0, 1] (the first step's fraction "
                f"of the base rate), got {start_factor!r}"
            )
        self.warmup_steps, self.start_factor = warmup_steps, start_factor
        super().__init__(optimizer)

    def lr_at(self, t, base_lr):
        if t >= self.warmup_steps:
            return base_lr
        return base_lr * (self.start_factor + (1 - self.start_factor) * t / self.warmup_steps)


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(t)``, any function of the step count; or one
    function per param group (a list)."""

    def __init__(self, optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable]):
        groups = len(optimizer.param_groups) if isinstance(optimizer, Optimizer) else 0
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != groups:
                raise ValueError(
                    f"LambdaLR: got {len(lr_lambda)} lr_lambdas for {groups} param groups; "
                    "pass one function, or one per group"
                )
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * groups
        for function in self.lr_lambdas:
            if not callable(function):
                raise TypeError(
                    f"LambdaLR: lr_lambda must be a function of the step count, got "
                    f"{type(function).__name__}"
                )
        super().__init__(optimizer)

    def lrs_at(self, t):
        return [base_lr * function(t) for base_lr, function in zip(self.base_lrs, self.lr_lambdas)]


class SequentialLR(LRScheduler):
    """Run ``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]``
    (its own step count starting again at 0) until ``milestones[1]``, ...

    ``lrs_at(t) = schedulers[i].lrs_at(t - milestones[i - 1])`` where ``i`` is
    the number of milestones ``<= t``. The inner schedulers serve as pure
    functions: step only this one.
    """

    def __init__(self, optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int]):
        schedulers, milestones = list(schedulers), list(milestones)
        if not schedulers:
            raise ValueError("SequentialLR: give at least one scheduler")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} "
                f"milestones (where each one after the first takes over), got {len(milestones)}"
            )
        for milestone in milestones:
            _check_count("SequentialLR", "each milestone", milestone, 0)
        if milestones != sorted(milestones):
            raise ValueError(f"SequentialLR: milestones must be increasing, got {milestones}")
        for position, scheduler in enumerate(schedulers):
            if not isinstance(scheduler, LRScheduler):
                raise TypeError(
                    f"SequentialLR: entry {position} is a {type(scheduler).__name__}, not a "
                    "scheduler; pass schedulers such as CosineAnnealingLR(optimizer, T_max=...)"
                )
            if scheduler.optimizer is not optimizer:
                raise ValueError(
                    f"SequentialLR: scheduler {position} ({type(scheduler).__name__}) belongs "
                    "to another optimizer; build every scheduler on the optimizer given here"
                )
        self.schedulers, self.milestones = schedulers, milestones
        super().__init__(optimizer)

    def lrs_at(self, t):
        phase = bisect.bisect_right(self.milestones, t)
        start = self.milestones[phase - 1] if phase > 0 else 0
        return self.schedulers[phase].lrs_at(t - start)


class WarmupThen(SequentialLR):
    """Linear warm-up over ``warmup_steps`` (see :class:`LinearWarmup`), then
    the schedule ``then``, whose step count starts at 0 when the warm-up
    ends (so a cosine after 500 warm-up steps of a 10,000-step run takes
    ``T_max=9500``)."""

    def __init__(self, optimizer, warmup_steps: int, then: LRScheduler,
                 start_factor: float = 0.0):
        warmup = LinearWarmup(optimizer, warmup_steps, start_factor)
        super().__init__(optimizer, [warmup, then], [warmup_steps])
