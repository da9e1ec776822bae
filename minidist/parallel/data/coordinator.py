"""Data parallelism through one coordinator: the course's *before*.

Every rank holds the whole model and trains on its own shard of each batch.
After each backward the ranks must agree on one gradient, the one a single
process would have computed on the whole batch, and apply the same update,
so that the replicas never drift apart. The first way to agree is the
parameter-server idea, synchronous: every worker sends its gradient to one
coordinator, which averages, updates, and sends the new weights back.

Cost, with P the model's size in bytes and N ranks, per step:

    coordinator receives (N - 1) P and sends (N - 1) P      alpha: 2 (N - 1) messages
    every other worker sends P and receives P

The coordinator's link carries N times what a worker's does: it is the
bottleneck as N grows. :mod:`.ddp` (read next) removes it with an
all-reduce, about 2 P per rank whatever N is.

Exact averaging with uneven shards: each rank's loss is a mean over its own
``b_r`` examples, so its gradient is ``g_r = (1 / b_r) sum of its examples'
gradients``. The full batch's mean gradient is ``sum_r b_r g_r / sum_r b_r``:
every rank sends its count ``b_r`` with its gradient, and the coordinator
weights rank r by ``b_r / sum b``. A plain average over ranks would give the
last, smaller shard too much weight.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import nn
from minidist.parallel.data.checks import _check_model, _local_count
from minidist.parallel.replicas import broadcast_module
from minidist.tensor import no_grad


def _pack(arrays, out: np.ndarray) -> np.ndarray:
    """Copy ``arrays`` one after the other into the flat ``out``."""
    offset = 0
    for array in arrays:
        out[offset:offset + array.size] = array.reshape(-1)
        offset += array.size
    return out


def _unpack(flat: np.ndarray, arrays) -> None:
    """Copy consecutive pieces of ``flat`` back into ``arrays``, in place."""
    offset = 0
    for array in arrays:
        array[...] = flat[offset:offset + array.size].reshape(array.shape)
        offset += array.size


class CoordinatorDataParallel:
    """Data parallelism through one coordinator (the parameter-server idea,
    synchronous): after every rank's backward,

    1. every rank packs its gradient and its number of examples ``b_r`` into
       one flat array, and the coordinator gathers them (``dist.gather``);
    2. the coordinator averages, weighting rank r by ``b_r / sum b``, and
       runs ``optimizer.step()``;
    3. the coordinator broadcasts the new weights (``dist.broadcast``), which
       every rank copies into its model.

    Usage, the same code on every rank::

        model = build_model()
        optimizer = optim.SGD(model.parameters(), lr=0.1)
        coordinated = CoordinatorDataParallel(model, optimizer)
        for x, y in my_shard_batches:
            optimizer.zero_grad()
            loss_fn(model(Tensor(x)), y).backward()
            coordinated.step(batch_size=len(x))

    ``coordinator`` is a rank of ``group`` (0..size-1; the group's own
    numbering, as a torch strategy's ranks are). Only the coordinator's
    optimizer updates anything (its state, e.g. Adam's moments, lives there
    alone). The defaults, ``linear`` gather and
    broadcast, are the textbook picture: the coordinator talks to every
    worker itself, (N - 1) P in and (N - 1) P out per step.
    """

    def __init__(self, model: nn.Module, optimizer, coordinator: int = 0, group=None,
                 gather_algorithm: str = "linear", broadcast_algorithm: str = "linear"):
        self.parameters = _check_model(model, "CoordinatorDataParallel")
        self.model = model
        self.optimizer = optimizer
        self.group = group
        self.coordinator = coordinator
        self.gather_algorithm = gather_algorithm
        self.broadcast_algorithm = broadcast_algorithm
        self.rank = dist.get_rank() if group is None else group.rank
        self.world_size = dist.get_world_size() if group is None else group.size
        self.dtype = self.parameters[0].data.dtype
        self.size = sum(p.data.size for p in self.parameters)
        broadcast_module(model, group=group, group_src=coordinator)

    @property
    def is_coordinator(self) -> bool:
        return self.rank == self.coordinator

    def step(self, batch_size: int) -> None:
        """Send this rank's gradients (from a loss that is a mean over its
        ``batch_size`` examples) to the coordinator; return once this rank's
        model holds the updated weights."""
        count = _local_count(batch_size, self.rank, "CoordinatorDataParallel.step")
        message = np.zeros(self.size + 1, self.dtype)
        for param in self.parameters:
            if param.grad is None and count > 0:
                raise RuntimeError(
                    f"rank {self.rank}: a parameter of shape {param.data.shape} has no gradient; "
                    "call loss.backward() before step(), and use every parameter in forward")
        _pack([p.grad if p.grad is not None else np.zeros_like(p.data)
               for p in self.parameters], message[:-1])
        message[-1] = count
        received = ([np.empty_like(message) for _ in range(self.world_size)]
                    if self.is_coordinator else None)
        dist.gather(message, received, group=self.group, group_dst=self.coordinator,
                    algorithm=self.gather_algorithm)

        weights = np.empty(self.size, self.dtype)
        if self.is_coordinator:
            total = sum(int(m[-1]) for m in received)
            if total == 0:
                raise ValueError("CoordinatorDataParallel.step: every rank passed batch_size=0; "
                                 "at least one rank needs examples to average over")
            average = sum(m[:-1] * m[-1] for m in received) / self.dtype.type(total)
            offset = 0
            for param in self.parameters:
                param.grad = average[offset:offset + param.data.size].reshape(param.data.shape)
                offset += param.data.size
            with no_grad():
                self.optimizer.step()
            _pack([p.data for p in self.parameters], weights)
        dist.broadcast(weights, group=self.group, group_src=self.coordinator,
                       algorithm=self.broadcast_algorithm)
        if not self.is_coordinator:
            _unpack(weights, [p.data for p in self.parameters])
