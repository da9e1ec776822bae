"""Local SGD: every rank steps on its own, and the weights are averaged every H steps.

Data parallel (:mod:`.ddp`) all-reduces the gradients after every backward,
so that every replica takes the same step. Local SGD lets the replicas drift:

1. every rank runs its own optimizer on its own batches, ``sync_every``
   (H) steps, talking to no one;
2. then the parameters are averaged over the ranks (one all_reduce) and
   written back, every replica ending equal;
3. and again from 1.

With H = 1 and plain SGD this is data parallel written differently: the
mean of the n weights after one step from the same start is the step with
the mean gradient. With H > 1 the replicas follow their own batches for a
while; the average still trains the model (Stich, "Local SGD Converges Fast
and Communicates Little", ICLR 2019; Lin et al., "Don't Use Large
Mini-Batches, Use Local SGD", ICLR 2020) for H times fewer messages.

torchft's names and meaning (``torchft.local_sgd.LocalSGD``): a context
manager around the training loop; inside it, every ``optimizer.step()``
counts, and the H-th one averages the parameters (not the buffers: a
BatchNorm's running statistics stay each rank's own, as in torchft).
Dropped: torchft's first argument, the ``Manager`` that forms a quorum of
live replicas and lets a failed sync be discarded; minidist has no quorum
here, so every rank of ``group`` takes part in every sync and a failure
ends the launch. Added: the replicas start equal (rank 0's weights are
broadcast on construction, as DDP does; torchft's Manager does it when a
replica joins), and the parameters travel as one flat all_reduce instead of
one per parameter (the same bytes, one alpha instead of one per tensor).

torch's optimizers have ``register_step_post_hook``; minidist's do not, so
inside the ``with`` block this optimizer's ``step`` is replaced by one that
calls it and then counts (the class's own is back on leaving the block).

Cost, P parameter values of s bytes, n ranks, the ring: one all_reduce of P
values every H steps, 2 (n - 1) / n P s bytes sent per rank per sync, so
DDP's bytes per step divided by H, and 2 (n - 1) alpha per sync. Memory:
one flat copy of the parameters during a sync.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend, nn
from minidist.distributed.device_mesh import as_group
from minidist.parallel.replicas import broadcast_module


def average_arrays(arrays, group=None, algorithm: str = "auto") -> list[np.ndarray]:
    """The mean over ``group``'s ranks of each array in ``arrays`` (host
    arrays of one dtype), in one all_reduce of their concatenation; new
    arrays of the same shapes. On one rank: copies, nothing sent."""
    arrays = [np.asarray(a) for a in arrays]
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    world = dist.get_world_size(group)
    if world > 1:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, algorithm=algorithm)
        flat /= world
    out, offset = [], 0
    for a in arrays:
        out.append(flat[offset:offset + a.size].reshape(a.shape))
        offset += a.size
    return out


def check_sync_every(owner: str, sync_every) -> int:
    """``sync_every`` as a positive int, or a clear error."""
    if isinstance(sync_every, bool) or not isinstance(sync_every, (int, np.integer)) \
            or sync_every < 1:
        raise ValueError(f"{owner}: sync_every={sync_every!r}; give the number of optimizer "
                         "steps between syncs, an int >= 1 (1: every step)")
    return int(sync_every)


def check_no_manager(owner: str, first, usage: str, extra=()) -> None:
    """Refuse torchft's Manager passed as the first argument (``extra``: the
    positional arguments beyond the signature's, which it shifts)."""
    if not isinstance(first, nn.Module) and not (
            isinstance(first, (list, tuple)) and first
            and all(isinstance(m, nn.Module) for m in first)):
        raise TypeError(f"{owner} got {type(first).__name__} where the model goes; minidist's "
                        f"{owner} has no torchft Manager (no quorum): drop that argument and "
                        f"call {usage}")
    if extra:
        raise TypeError(f"{owner} got {len(extra)} positional argument(s) too many; call "
                        f"{usage}, the rest as keywords")


class _CountedSteps:
    """The context manager both wrappers are: inside ``with``, every call of
    the optimizer's ``step`` is followed by ``self._after_step()``."""

    def _install(self, optimizer) -> None:
        self._optimizer = optimizer
        self._installed = False

    def __enter__(self):
        if self._installed:
            raise RuntimeError(f"{type(self).__name__} is already entered; use one `with` "
                               "block at a time")
        optimizer = self._optimizer
        self._previous = optimizer.__dict__.get("step")   # None: the class's own
        inner = optimizer.step

        def step(*args, **kwargs):
            result = inner(*args, **kwargs)
            self._after_step()
            return result

        optimizer.step = step
        self._installed = True
        return self

    def __exit__(self, *exc) -> bool:
        if self._previous is None:
            del self._optimizer.step
        else:
            self._optimizer.step = self._previous
        self._installed = False
        return False


class LocalSGD(_CountedSteps):
    """``with LocalSGD(model, optimizer, sync_every): ... optimizer.step()``:
    every ``sync_every``-th step of ``optimizer`` inside the block averages
    ``model``'s parameters over ``group`` (None: the world), ``algorithm``
    choosing the all_reduce. :meth:`sync` averages at once."""

    def __init__(self, model, optimizer, sync_every, *extra, group=None,
                 algorithm: str = "auto"):
        check_no_manager("LocalSGD", model, "LocalSGD(model, optimizer, sync_every)", extra)
        self._model = model
        self._sync_every = check_sync_every("LocalSGD", sync_every)
        self._group = as_group(group, "LocalSGD")
        self._algorithm = algorithm
        self._local_step = 0
        self._install(optimizer)
        broadcast_module(model, group=self._group)

    def _after_step(self) -> None:
        self._local_step += 1
        if self._local_step >= self._sync_every:
            self.sync()

    def sync(self) -> None:
        """Average the parameters over the group now, and start counting again."""
        params = list(self._model.parameters())
        if params:
            averaged = average_arrays([backend.to_numpy(p.data) for p in params],
                                      self._group, self._algorithm)
            for param, mean in zip(params, averaged):
                param.data[...] = backend.from_numpy(mean)   # in place: views stay views
        self._local_step = 0
