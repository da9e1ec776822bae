"""Grow the batch instead of decaying the learning rate (Smith, Kindermans,
Ying & Le, 2017, "Don't Decay the Learning Rate, Increase the Batch Size").

SGD's gradient is an average over ``B`` examples out of ``N``, so it is noisy,
and the noise is what a learning-rate decay turns down. Smith & Le measure it
with the *noise scale*::

    g = lr * (N / B - 1) / (1 - momentum)  ~=  lr * N / (B * (1 - momentum))   (B << N)

Dividing ``lr`` by 5 and multiplying ``B`` by 5 lower ``g`` alike, and
training curves follow ``g``: so at every epoch where a schedule would decay
the rate by ``gamma``, one may instead multiply the batch by ``1 / gamma``.
Same accuracy after the same number of epochs, but fewer, larger steps, which
is what data parallelism over many workers wants (more examples per worker
per step, fewer all-reduces).

:class:`BatchSizeSchedule` turns the milestones and ``gamma`` of a
:class:`~minidist.optim.lr_scheduler.MultiStepLR` into batch sizes. Past
``max_batch_size`` (memory, or the number of workers times what fits on
each) the remaining decays fall back to decaying the rate, as in the paper's
"hybrid" runs; ``lr_factor_at`` gives that leftover factor, ready for a
``LambdaLR`` stepped per epoch::

    schedule = BatchSizeSchedule(128, milestones=[60, 120, 160], gamma=0.2,
                                 max_batch_size=2048)
    scheduler = LambdaLR(optimizer, schedule.lr_factor_at)
    for epoch in range(200):
        loader = DataLoader(train, batch_size=schedule.batch_size_at(epoch), shuffle=True)
        ...
        scheduler.step()
"""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Sequence


def noise_scale(lr: float, dataset_size: int, batch_size: int, momentum: float = 0.0) -> float:
    """Smith & Le's SGD noise scale ``lr * (N / B - 1) / (1 - momentum)``."""
    if not 0 <= momentum < 1:
        raise ValueError(f"noise_scale: momentum must be in [0, 1), got {momentum!r}")
    if not 0 < batch_size <= dataset_size:
        raise ValueError(
            f"noise_scale: need 0 < batch_size <= dataset_size, got batch_size={batch_size!r}, "
            f"dataset_size={dataset_size!r}"
        )
    return lr * (dataset_size / batch_size - 1) / (1 - momentum)


class BatchSizeSchedule:
    """Batch size per epoch: ``initial_batch_size`` grown by ``1 / gamma`` at
    each milestone, as long as the result stays within ``max_batch_size``.

    ``batch_size_at(epoch) = round(initial_batch_size / gamma ** j)`` and
    ``lr_factor_at(epoch) = gamma ** (k - j)``, where ``k`` is the number of
    milestones ``<= epoch`` and ``j <= k`` the number of them the batch could
    absorb (the largest ``j`` with ``initial / gamma ** j <= max_batch_size``).
    Without a cap every decay becomes batch growth and the factor stays 1.
    """

    def __init__(self, initial_batch_size: int, milestones: Sequence[int], gamma: float = 0.1,
                 max_batch_size: int | None = None):
        if isinstance(initial_batch_size, bool) or not (
            isinstance(initial_batch_size, int) and initial_batch_size >= 1
        ):
            raise ValueError(
                f"BatchSizeSchedule: initial_batch_size must be an integer >= 1, got "
                f"{initial_batch_size!r}"
            )
        milestones = list(milestones)
        if any(not isinstance(m, int) or m < 0 for m in milestones) or milestones != sorted(
            milestones
        ):
            raise ValueError(
                f"BatchSizeSchedule: milestones must be increasing integers >= 0 (the epochs "
                f"where the rate would decay), got {milestones}"
            )
        if not (isinstance(gamma, numbers.Real) and 0 < gamma < 1):
            raise ValueError(
                f"BatchSizeSchedule: gamma must be in (0, 1), the learning-rate decay that the "
                f"batch growth replaces (the batch grows by 1/gamma), got {gamma!r}"
            )
        if max_batch_size is not None and max_batch_size < initial_batch_size:
            raise ValueError(
                f"BatchSizeSchedule: max_batch_size={max_batch_size} is below "
                f"initial_batch_size={initial_batch_size}"
            )
        self.initial_batch_size = initial_batch_size
        self.milestones = milestones
        self.gamma = gamma
        self.max_batch_size = max_batch_size

    def _decays(self, epoch: int) -> tuple[int, int]:
        """(decays so far, how many of them became batch growth)."""
        decays = bisect.bisect_right(self.milestones, epoch)
        grown = decays
        if self.max_batch_size is not None:
            while grown > 0 and self._grown_size(grown) > self.max_batch_size:
                grown -= 1
        return decays, grown

    def _grown_size(self, times: int) -> int:
        return round(self.initial_batch_size / self.gamma**times)

    def batch_size_at(self, epoch: int) -> int:
        """The batch size to use during ``epoch`` (counting from 0)."""
        return self._grown_size(self._decays(epoch)[1])

    def lr_factor_at(self, epoch: int) -> float:
        """The learning-rate factor left over once the batch stopped growing."""
        decays, grown = self._decays(epoch)
        return self.gamma ** (decays - grown)

    def __repr__(self):
        return (
            f"BatchSizeSchedule(initial_batch_size={self.initial_batch_size}, "
            f"milestones={self.milestones}, gamma={self.gamma}, "
            f"max_batch_size={self.max_batch_size})"
        )
