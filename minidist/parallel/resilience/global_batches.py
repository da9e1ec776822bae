"""The global batch of step ``s``, whatever the world size: a data order that resumes.

After a restart on fewer ranks, a resumed run must go on with the examples
the unbroken run would have used. torch's ``DistributedSampler`` cannot
promise that: each rank takes every ``world_size``-th example of the epoch's
order, so the examples a rank sees at a step, and which examples form a
step's batch, change with the world size. Here the order is fixed per
*global* batch, and only then split:

* the epoch's order is a permutation drawn from ``(seed, epoch)``, so any
  step's batch is computed from the step number alone, without having read
  the steps before it (nothing to save but the step: the data position is
  the step);
* global batch ``s`` is the slice ``s * B .. (s + 1) * B`` of its epoch's
  order (``B``, the global batch size, is the same for every world size);
* rank ``r`` of ``n`` takes the ``r``-th of ``n`` contiguous pieces
  (``numpy.array_split``: sizes differ by one at most when ``n`` does not
  divide ``B``).

With DDP (:class:`minidist.parallel.data.DistributedDataParallel`, which
weighs each rank's mean gradient by its number of examples) the summed
gradient is the mean over the global batch on every world size, so the
training is the same computation: **bit-equal on the same world size**
(same pieces, same sums in the same order), **equal up to float rounding on
another** (the same sum of per-example gradients, added in other groups:
float addition is not associative; float64 keeps the difference near 1e-15
relative per step). The same holds for FSDP and ZeRO over this sampler.
Local SGD, DiLoCo, Hogwild or an asynchronous parameter server cannot resume
exactly on another world size in general: what each rank learns depends on
how many replicas there are and, for the asynchronous ones, on the timing.

Cost: one permutation of the data set's indices per epoch per call, O(N);
cached per epoch.
"""

from __future__ import annotations

import numpy as np


class GlobalBatchSampler:
    """``GlobalBatchSampler(num_examples, global_batch, seed=0)``: the indices
    of every step's global batch, and each rank's piece of it."""

    def __init__(self, num_examples: int, global_batch: int, seed: int = 0):
        if not 1 <= global_batch <= num_examples:
            raise ValueError(f"global_batch must be between 1 and the {num_examples} examples, "
                             f"got {global_batch}")
        self.num_examples, self.global_batch, self.seed = num_examples, global_batch, seed
        self.batches_per_epoch = num_examples // global_batch  # the last partial batch dropped
        self._order = (None, None)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order[0] != epoch:
            rng = np.random.default_rng((self.seed, epoch))
            self._order = (epoch, rng.permutation(self.num_examples))
        return self._order[1]

    def global_indices(self, step: int) -> np.ndarray:
        """The examples of global batch ``step`` (counted from 0 over all epochs)."""
        epoch, within = divmod(step, self.batches_per_epoch)
        start = within * self.global_batch
        return self._epoch_order(epoch)[start:start + self.global_batch]

    def local_batch(self, step: int, rank: int, world_size: int) -> np.ndarray:
        """Rank ``rank``'s piece of global batch ``step`` on ``world_size`` ranks."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not a rank of a world of {world_size}")
        if world_size > self.global_batch:
            raise ValueError(f"{world_size} ranks cannot split a global batch of "
                             f"{self.global_batch}: some would have no example")
        return np.array_split(self.global_indices(step), world_size)[rank]

    def state_dict(self) -> dict:
        """What fixes the order (the position is the step, saved beside it)."""
        return {"num_examples": self.num_examples, "global_batch": self.global_batch,
                "seed": self.seed}


def local_batch(step: int, rank: int, world_size: int, *, num_examples: int,
                global_batch: int, seed: int = 0) -> np.ndarray:
    """One call of :meth:`GlobalBatchSampler.local_batch`."""
    return GlobalBatchSampler(num_examples, global_batch, seed).local_batch(step, rank, world_size)
