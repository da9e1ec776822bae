"""One server's key range and its consistency rule: when a push is applied.

Consistency, chosen by name (``mode=``):

* ``"bsp"``, bulk synchronous: a server waits for the pushes of all W workers
  for step t, averages them weighted by their number of examples (exact with
  uneven data), and applies one update. A worker's pull for step t + 1 is
  answered only then, so workers idle while the slowest one computes; the
  idle time is the long ``recv`` of the pull reply in the trace. Equals
  single-process SGD on the whole batch.
* ``"ssp"``, stale synchronous (bounded delay) with ``tau``: updates are
  still the averaged steps of BSP, but a worker may start step t once step
  ``t - tau - 1`` is applied, that is run at most ``tau`` steps ahead of the
  slowest worker, on weights at most ``tau`` versions old. ``tau=0`` is BSP,
  bit for bit.
* ``"async"``, Downpour (DistBelief): every push is applied the moment it
  arrives, ``w -= lr * g``, whatever weights it was computed on.
  ``warmup_steps`` synchronous (BSP) steps may come first: DistBelief only
  went asynchronous after a first synchronous epoch, because stale
  gradients on the rough start diverge.
* ``"drop"``: as async, but a push computed on weights more than ``tau``
  versions old is dropped (counted, never applied): "throw away the
  gradients that lag behind".

Versions and staleness. Each server's version counts the updates it applied
to its range (one per step in BSP and SSP, one per accepted push in async).
A pull returns the weights with their version; a push carries the version it
was computed on. At apply time, ``staleness = version now - version computed
on``: 0 in BSP, at most ``tau`` in SSP, W - 1 for async workers served in
turn. Every push, applied or dropped, is logged (:class:`PushRecord`) and
traced, the update's region labelled with ``staleness`` and ``accepted``.

What a fault-tolerance layer hooks into (:mod:`.replicated_shard` does):
:meth:`ServerShard.apply_update` is the one place weights change; every push
has the identity ``(worker, step)`` and :attr:`ServerShard.clock` holds, per
worker, the last step pushed; :meth:`ServerShard.step_is_complete` says when a
synchronous step has all the pushes it waits for.

Cost per update: one optimizer step on the range's P / S values; a
synchronous step also sums the W pushes, weighted, in worker order (so the
bits do not depend on the order they arrived in). Read after
:mod:`.messages`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist import Tensor, optim, trace
from minidist.parallel.parameter_server.messages import NO_STEP, Push
from minidist.tensor import no_grad

MODES = ("bsp", "ssp", "async", "drop")


def _synchronous(mode: str, warmup_steps: int, step: int) -> bool:
    """Is ``step`` a synchronous one: every step of BSP and SSP, and the
    warm-up of the asynchronous modes."""
    return mode in ("bsp", "ssp") or step < warmup_steps


@dataclass(frozen=True)
class PushRecord:
    """What a server did with one push."""

    worker: int
    step: int
    base_version: int
    version: int          # the server's version when the push was applied or dropped
    staleness: int        # version - base_version
    accepted: bool
    examples: int


class ServerShard:
    """One server's key range: its weights, optimizer, version and log.

    ``receive_push`` decides what a push does (wait for the rest of its step,
    be applied, or be dropped); ``apply_update`` is the only place the
    weights change."""

    def __init__(self, weights: np.ndarray, key_range: tuple[int, int], *, workers: int,
                 mode: str, tau: int, warmup_steps: int, lr: float, momentum: float,
                 keep_gradients: bool):
        self.key_range = key_range
        self.parameter = Tensor(np.array(weights[key_range[0]:key_range[1]], copy=True),
                                requires_grad=True)
        self.optimizer = optim.SGD([self.parameter], lr=lr, momentum=momentum)
        self.workers = workers
        self.mode = mode
        self.tau = tau
        self.warmup_steps = warmup_steps
        self.version = 0
        self.completed_steps = 0   # synchronous steps applied
        self.clock = {worker: NO_STEP for worker in range(workers)}
        self.pending: dict[int, dict[int, Push]] = {}   # step -> worker -> push
        self.pushes: list[PushRecord] = []
        self.keep_gradients = keep_gradients
        self.applied_gradients: list[np.ndarray] = []

    @property
    def weights(self) -> np.ndarray:
        return self.parameter.data

    def synchronous(self, step: int) -> bool:
        return _synchronous(self.mode, self.warmup_steps, step)

    def can_answer_pull(self, step: int) -> bool:
        """A worker may compute ``step`` once the synchronous steps it depends
        on are applied: ``step - tau`` of them in SSP (tau = 0: BSP and the
        warm-up); after the warm-up, all of the warm-up."""
        if self.synchronous(step):
            bound = self.tau if self.mode == "ssp" else 0
            return self.completed_steps >= step - bound
        return self.completed_steps >= self.warmup_steps

    def receive_push(self, push: Push) -> None:
        self.clock[push.worker] = push.step
        if self.synchronous(push.step):
            self.pending.setdefault(push.step, {})[push.worker] = push
            self.apply_complete_steps()
            return
        staleness = self.version - push.base_version
        if self.mode == "drop" and staleness > self.tau:
            self._log(push, accepted=False)
            moment = trace.now()
            trace.record("compute", moment, moment, label=_update_label(
                push.worker, push.step, self.version, staleness, accepted=False))
            return
        self.apply_update(push.gradient, [push])

    def apply_complete_steps(self) -> None:
        """Apply the synchronous steps whose pushes are all in, in step order."""
        while self.step_is_complete(self.completed_steps):
            self._apply_synchronous_step(self.pending.pop(self.completed_steps))

    def step_is_complete(self, step: int) -> bool:
        return len(self.pending.get(step, ())) == self.workers

    def _apply_synchronous_step(self, pushes: dict[int, Push]) -> None:
        """Average the step's gradients weighted by examples: the gradient of
        the mean loss over all the step's examples, in worker order so the
        sum is the same whatever order the pushes arrived in."""
        ordered = [pushes[worker] for worker in sorted(pushes)]
        total = sum(push.examples for push in ordered)
        if total == 0:
            raise ValueError(f"parameter server: no worker had any example in step "
                             f"{ordered[0].step}; at least one needs examples to average over")
        dtype = self.weights.dtype.type
        average = np.zeros_like(self.weights)
        for push in ordered:
            average += push.gradient * dtype(push.examples)
        average /= dtype(total)
        self.apply_update(average, ordered)
        self.completed_steps += 1

    def apply_update(self, gradient: np.ndarray, pushes: list[Push]) -> None:
        """One optimizer step on this range with ``gradient``, made of
        ``pushes``; the version moves on by one."""
        label = _update_label(pushes[0].worker if len(pushes) == 1 else "all", pushes[0].step,
                              self.version, max(self.version - p.base_version for p in pushes),
                              accepted=True)
        with trace.region(label):
            for push in pushes:
                self._log(push, accepted=True)
            self.parameter.grad = gradient
            with no_grad():
                self.optimizer.step()
            self.parameter.grad = None
            if self.keep_gradients:
                self.applied_gradients.append(np.array(gradient, copy=True))
            self.version += 1

    def _log(self, push: Push, accepted: bool) -> None:
        self.pushes.append(PushRecord(push.worker, push.step, push.base_version, self.version,
                                      self.version - push.base_version, accepted, push.examples))


def _update_label(worker, step, version, staleness, accepted) -> str:
    return trace.with_info("update", kind="update", worker=worker, step=step, version=version,
                           staleness=staleness, accepted=int(accepted))
