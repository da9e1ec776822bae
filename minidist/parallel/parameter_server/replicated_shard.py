"""One key range's copy on a fault-tolerant server: every push applied exactly once.

Read after :mod:`.shard`, whose :class:`ServerShard` this extends. With two
copies of every range and workers that send a request again when a server
fails, three things change:

* **duplicates**. A request sent again may hold a push the server already
  has (forwarded before the crash, or simply sent twice). Each range keeps a
  *vector clock*, per worker the last step received
  (:attr:`ServerShard.clock`), and a push not newer than it is a duplicate,
  ignored and counted. On a primary the clock moves as pushes arrive; on a
  backup it moves with the updates forwarded to it. So every push is
  applied exactly once, and a BSP run with a server killed ends with the
  same weights as the run without.
* **gone workers**. A worker that dies is left out of the synchronous
  barrier from its first missing step on; each later step averages the
  pushes of the remaining workers, weighted by their examples.
* **forwarding**. Each update the primary applies is kept until the server
  has forwarded it to the backup, which applies the same gradient with the
  same optimizer (:meth:`ReplicatedShard.apply_forwarded`): its weights,
  momentum and version stay the primary's, bit for bit.

:class:`RangeCopy` is what one server holds of one range and its role for
it (primary or backup); :class:`RangeReport`, that copy at the end.

Cost: a server holds two ranges, so memory and update work double; a
duplicate costs one comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minidist.parallel.parameter_server.failures import _fault_event
from minidist.parallel.parameter_server.messages import Push
from minidist.parallel.parameter_server.shard import PushRecord, ServerShard


class ReplicatedShard(ServerShard):
    """A :class:`ServerShard` that ignores duplicate pushes, leaves gone
    workers out of the barrier, and keeps each update it applies until the
    server has forwarded it to the backup.

    On a primary the clock moves as pushes arrive; on a backup it moves with
    the updates forwarded to it, so it holds, per worker, the last step
    applied: what a push sent again after a takeover is compared with."""

    def __init__(self, *args, index: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.index = index
        self.gone: set[int] = set()
        self.duplicates: list[tuple[int, int]] = []
        self.unforwarded: list[tuple[np.ndarray, list[Push]]] = []

    def receive_push(self, push: Push) -> bool:
        """Apply (or hold for its step) a new push; ignore and count a
        duplicate. True if the push was new."""
        if push.step <= self.clock[push.worker]:
            self.duplicates.append(push.identity)
            _fault_event("duplicate push ignored", kind="duplicate", range=self.index,
                         worker=push.worker, step=push.step, clock=self.clock[push.worker])
            return False
        super().receive_push(push)
        return True

    def step_is_complete(self, step: int) -> bool:
        pushes = self.pending.get(step, {})
        return bool(pushes) and all(worker in pushes for worker in range(self.workers)
                                    if worker not in self.gone)

    def drop_worker(self, worker: int) -> None:
        """Leave ``worker`` out of every step it has not pushed yet."""
        self.gone.add(worker)
        self.apply_complete_steps()

    def apply_update(self, gradient: np.ndarray, pushes: list[Push]) -> None:
        super().apply_update(gradient, pushes)
        self.unforwarded.append((np.array(gradient, copy=True), pushes))

    def apply_forwarded(self, gradient: np.ndarray, pushes: list[Push]) -> None:
        """The backup's side: the primary's update, applied the same way."""
        ServerShard.apply_update(self, gradient, pushes)
        for push in pushes:
            self.clock[push.worker] = max(self.clock[push.worker], push.step)
        if self.synchronous(pushes[0].step):
            self.completed_steps += 1


@dataclass
class RangeCopy:
    """What one server holds of one key range, and its role for it."""

    shard: ReplicatedShard
    primary: int                  # the server that answers the workers for this range
    backup: int | None            # the server with the second copy; None: there is none
    acknowledged: int = 0         # the last version the backup acknowledged
    waiting_pulls: dict[int, int] = field(default_factory=dict)   # worker -> step
    deferred: list[tuple[int, np.ndarray, np.ndarray | None]] = field(default_factory=list)

    @property
    def index(self) -> int:
        return self.shard.index


@dataclass
class RangeReport:
    """A server's copy of one range at the end."""

    index: int
    key_range: tuple[int, int]
    role: str                     # "primary" or "backup"
    weights: np.ndarray
    version: int
    pushes: list[PushRecord]
    duplicates: list[tuple[int, int]]
    applied_gradients: list[np.ndarray]

