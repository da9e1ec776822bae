"""DistributedSampler: which samples each rank of a data-parallel job reads, torch's way.

In data parallelism every rank runs the same model on a different part of
each epoch's data. Every rank builds the same index list independently (no
communication), then keeps its own strided share::

    order    = permutation(n) with seed + epoch      (or 0..n-1 without shuffle)
    order    = pad or truncate order to a multiple of num_replicas
    my share = order[rank :: num_replicas]

Because all ranks use the same seed and epoch, they agree on ``order``
without talking, so the shares are disjoint and together cover the data.

The three ways to treat ``n`` not divisible by ``num_replicas``:

* ``pad=True`` (default, torch's behaviour): repeat the first
  ``total - n`` entries of ``order`` so every rank gets ``ceil(n / R)``
  samples. Every rank runs the same number of steps, which synchronous
  collectives need, at the cost of a few samples counted twice per epoch.
* ``drop_last=True``: cut ``order`` to ``floor(n / R) * R``; equal shares,
  a few samples skipped this epoch (different ones each epoch when shuffled).
* ``pad=False``: no padding, no dropping; the first ``n % R`` ranks get one
  sample more. Every sample is read exactly once, so gradients averaged with
  weights ``len(share) / n`` equal full-batch gradients exactly; but ranks
  then differ in their number of samples, and if a DataLoader turns those
  into different numbers of batches, a collective will wait forever on the
  rank that finished early. Use it with one batch per shard, or check the
  step counts.

Call ``set_epoch(epoch)`` at the start of every epoch, on every rank, as with
torch. The pitfall: without it the sampler stays at epoch 0, so every epoch
reads the *same* order and each rank sees the same samples in the same
batches every time, which is training without reshuffling (and it fails
silently: nothing errs, the loss just falls more slowly). With the same
``seed``, a run is reproducible epoch by epoch; resuming from a checkpoint
at epoch e, call ``set_epoch(e)`` to read the order the run would have read.

``DistributedSampler(dataset)`` without ``num_replicas`` and ``rank`` takes
them from the default process group, as torch does. This layer must not
import the processes above it, so it reads them from
:mod:`minidist.runtime.membership`, which ``minidist.distributed`` fills when
the process joins a run (the dependency turned around, not a hidden import).
"""

from __future__ import annotations

import numpy as np

from minidist.runtime import membership


def _dataset_size(dataset_size_or_dataset) -> int:
    if isinstance(dataset_size_or_dataset, (int, np.integer)) and not isinstance(
        dataset_size_or_dataset, bool
    ):
        size = int(dataset_size_or_dataset)
    elif isinstance(dataset_size_or_dataset, tuple) and dataset_size_or_dataset and all(
            hasattr(array, "shape") for array in dataset_size_or_dataset):
        # (x, y): the DataLoader's form of a data set, whose samples are rows;
        # its len() is the number of arrays, not of samples.
        lengths = {len(array) for array in dataset_size_or_dataset}
        if len(lengths) != 1:
            raise ValueError(f"DistributedSampler got arrays of different lengths "
                             f"{sorted(lengths)}; (x, y) must have one row per sample each")
        size = lengths.pop()
    elif hasattr(dataset_size_or_dataset, "__len__"):
        size = len(dataset_size_or_dataset)
    else:
        raise TypeError(
            "DistributedSampler needs a data set size (an int) or an object with len(), got "
            f"{type(dataset_size_or_dataset).__name__}"
        )
    if size < 0:
        raise ValueError(f"the data set size must be >= 0, got {size}")
    return size


class DistributedSampler:
    """This rank's share of the sample indices, reshuffled per epoch identically on all ranks.

    Args:
        dataset_size_or_dataset: the number of samples, a tuple of arrays
            ``(x, y)`` as the DataLoader takes (one sample per row), or anything
            with len().
        num_replicas: the number of ranks sharing the data; None: the world size.
        rank: this rank, 0 <= rank < num_replicas; None: this process's rank in
            the world (both None read the default process group, as torch).
        shuffle: permute the indices each epoch (with seed + epoch).
        seed: the same on all ranks; change it to get another sequence of orders.
        drop_last: cut the tail so shares are equal instead of padding.
        pad: when not dropping, repeat indices to make shares equal (True)
            or leave them uneven by one (False); see the module docstring.

    Iterating yields Python ints; :meth:`indices` returns the same as one
    NumPy array, which is what the DataLoader uses.
    """

    def __init__(
        self,
        dataset_size_or_dataset,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        pad: bool = True,
    ):
        if num_replicas is None or rank is None:
            place = membership.place()
            if place is None:
                raise RuntimeError(
                    "Default process group has not been initialized, please make sure to call "
                    "init_process_group. DistributedSampler reads num_replicas and rank from "
                    "it when they are not given: run under minidist.launch or `minidist run` "
                    "and call dist.init_process_group() first, or pass num_replicas= and "
                    "rank= to use it without processes."
                )
            rank = place[0] if rank is None else rank
            num_replicas = place[1] if num_replicas is None else num_replicas
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, (int, np.integer)):
            raise TypeError(f"num_replicas must be an int (the world size), got {num_replicas!r}")
        if num_replicas < 1:
            raise ValueError(
                f"num_replicas must be >= 1 (the number of ranks sharing the data), got {num_replicas}"
            )
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise TypeError(f"rank must be an int, got {rank!r}")
        if not 0 <= rank < num_replicas:
            raise ValueError(
                f"rank {rank} is out of range for num_replicas={num_replicas}; ranks are "
                f"0..{num_replicas - 1}. Pass this process's rank and the world size."
            )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(
                f"seed must be a non-negative int, the same on all ranks; got {seed!r}"
            )
        self.dataset_size = _dataset_size(dataset_size_or_dataset)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.pad = bool(pad)
        self.epoch = 0

        n, replicas = self.dataset_size, self.num_replicas
        if self.drop_last:
            self.total_size = (n // replicas) * replicas
        elif self.pad and n > 0:
            self.total_size = -(-n // replicas) * replicas
        else:
            # Unpadded, or nothing to pad with: every index exactly once.
            self.total_size = n
        self.num_samples = len(range(self.rank, self.total_size, replicas))

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch``; call it with the same number on every rank."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch, as an int64 array."""
        n = self.dataset_size
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            order = np.arange(n)
        if self.total_size > n:
            # np.resize repeats cyclically, so padding works even when it is
            # longer than the data itself (fewer samples than ranks).
            order = np.concatenate([order, np.resize(order, self.total_size - n)])
        else:
            order = order[: self.total_size]
        return order[self.rank :: self.num_replicas].astype(np.int64)

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (
            f"DistributedSampler(size={self.dataset_size}, num_replicas={self.num_replicas}, "
            f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}, "
            f"drop_last={self.drop_last}, pad={self.pad})"
        )
