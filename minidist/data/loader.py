"""DataLoader: cut a data set into batches, in order, shuffled, or as a sampler says.

Each epoch the loader decides an order of sample indices once, then walks it
``batch_size`` at a time and gathers each batch with one fancy-indexing call
(``x[indices]``), so the cost per batch is one NumPy copy, never a Python
loop over samples.

The order:

* no sampler, ``shuffle=False``: 0, 1, ..., n-1 every epoch;
* no sampler, ``shuffle=True``: ``default_rng(seed + epoch).permutation(n)``,
  where the epoch counts the loader's passes (0 for the first ``for`` loop,
  then 1, ...) unless :meth:`DataLoader.set_epoch` sets it; the same seed
  gives the same sequence of orders in every run;
* ``sampler=``: the sampler's indices, e.g. a
  :class:`~minidist.data.sampler.DistributedSampler` for this rank's share.
  As in torch, a sampler's epoch is the sampler's business: call
  ``sampler.set_epoch(epoch)`` (or ``loader.set_epoch(epoch)``, which passes
  it on) before each epoch.
"""

from __future__ import annotations

import numpy as np

from minidist.data.dataset import ArrayDataset


class DataLoader:
    """Iterate a data set in batches of NumPy arrays.

    Args:
        dataset_or_arrays: a tuple ``(x, y)`` (or any number of arrays with
            the same first dimension), yielding tuples ``(x_batch, y_batch)``;
            a single array, yielding single batches; or any data set with
            ``len()`` whose ``[indices]`` accepts an integer array and returns
            a batch (like :class:`ArrayDataset`).
        batch_size: samples per batch; the last batch may be smaller.
        shuffle: a new order each epoch, deterministic from ``seed``.
        seed: for ``shuffle``; None draws one at random (kept in ``.seed``, so
            a run can still be repeated).
        drop_last: drop the last batch when it is smaller than ``batch_size``.
        sampler: an object with ``len()`` giving the indices to read, in
            order, either as ``sampler.indices()`` (an array) or by iterating.
            Cannot be combined with ``shuffle``; the sampler shuffles.

    ``len(loader)`` is the number of batches per epoch.
    """

    def __init__(
        self,
        dataset_or_arrays,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
        sampler=None,
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int, got {batch_size!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if sampler is not None and shuffle:
            raise ValueError(
                "shuffle=True cannot be combined with a sampler: the sampler decides the order. "
                "Use DistributedSampler(..., shuffle=True) and leave the loader's shuffle off."
            )
        self._single_array = isinstance(dataset_or_arrays, np.ndarray)
        if self._single_array:
            self.dataset = ArrayDataset(dataset_or_arrays)
        elif isinstance(dataset_or_arrays, (tuple, list)):
            self.dataset = ArrayDataset(*dataset_or_arrays)
        elif hasattr(dataset_or_arrays, "__len__") and hasattr(dataset_or_arrays, "__getitem__"):
            self.dataset = dataset_or_arrays
        else:
            raise TypeError(
                f"DataLoader cannot read a {type(dataset_or_arrays).__name__}: pass a tuple of "
                "arrays (x, y), a single array, or a data set with len() and [indices]."
            )
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.sampler = sampler
        if seed is None:
            seed = int(np.random.SeedSequence().entropy)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass use the order of ``epoch`` (and tell the sampler, if it listens)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self.epoch = int(epoch)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def _num_samples(self) -> int:
        return len(self.sampler) if self.sampler is not None else len(self.dataset)

    def __len__(self) -> int:
        n = self._num_samples()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def epoch_order(self) -> np.ndarray:
        """The sample indices the current epoch reads, in order (before batching)."""
        if self.sampler is not None:
            if hasattr(self.sampler, "indices"):
                return np.asarray(self.sampler.indices(), dtype=np.int64)
            return np.fromiter(iter(self.sampler), dtype=np.int64, count=len(self.sampler))
        n = len(self.dataset)
        if self.shuffle:
            return np.random.default_rng(self.seed + self.epoch).permutation(n)
        return np.arange(n)

    def __iter__(self):
        order = self.epoch_order()
        # The order is fixed now, so the next pass (even one started before
        # this one ends) reshuffles with the next epoch's seed.
        if self.sampler is None:
            self.epoch += 1
        return self._batches(order)

    def _batches(self, order):
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        for start in range(0, stop, self.batch_size):
            batch = self.dataset[order[start : start + self.batch_size]]
            yield batch[0] if self._single_array else batch

    def __repr__(self) -> str:
        return (
            f"DataLoader({self.dataset!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"seed={self.seed}, drop_last={self.drop_last}, sampler={self.sampler!r})"
        )
