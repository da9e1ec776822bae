"""DistributedDataParallel: every rank all-reduces the gradients and takes the same step.

Every rank holds the whole model and trains on its own shard of each batch;
after backward the ranks agree on one gradient, the one a single process
would have computed on the whole batch, and every rank applies the same
update itself. Read after :mod:`.coordinator`, which sends every gradient
to one rank: here no rank is special. A bandwidth-optimal all-reduce (the
ring) sends and receives 2 (N - 1) / N P per rank, P the model's bytes and
N the ranks, about 2P whatever N is. Two refinements make it fast:

* *buckets* (:mod:`.buckets`): gradients are packed into flat buffers of
  about ``bucket_cap_mb`` megabytes, one all-reduce per bucket instead of
  one per parameter (fewer alpha terms), grouped in the order backward
  produces them;
* *overlap*: backward produces the last layer's gradients first, so a
  bucket is full long before backward ends. Its all-reduce starts at once
  (``async_op=True``) and is advanced with ``Work.test()`` each time another
  gradient is ready, while backward computes the earlier layers. Nothing runs
  in the background, so communication moves only at those moments; the
  all-reduces run one after the other, in bucket order.

Exact averaging with uneven shards, as the coordinator's: each rank's
gradient ``g_r`` is a mean over its own ``b_r`` examples, so every rank
multiplies its buckets by ``b_r``, the ranks sum, and divide by the summed
count (one more all-reduce, of one integer, ahead of the first bucket's).
The result is the full batch's mean gradient ``sum_r b_r g_r / sum_r b_r``,
bit-identical on every rank.
"""

from __future__ import annotations

import collections

import numpy as np

import minidist.distributed as dist
from minidist import nn
from minidist.distributed.device_mesh import as_group
from minidist.parallel.data.buckets import GradBucket, _Bucket, _make_buckets
from minidist.parallel.data.checks import _check_model, _examples_in
from minidist.parallel.replicas import broadcast_module


class DistributedDataParallel(nn.Module):
    """Wrap ``module`` so that backward leaves on every rank the gradient of
    the whole (global) batch's mean loss, averaged with all-reduce.

    * On construction, rank 0's parameters and buffers are broadcast, so
      every replica starts from the same weights.
    * ``ddp(x)`` runs ``module(x)`` and notes this rank's number of examples,
      ``len(x)`` (or ``batch_size=`` when the first argument is not the batch).
    * During ``loss.backward()``, each parameter's gradient is copied into its
      bucket as soon as the autograd has completed it (the tensor's
      post-accumulate hook). When a bucket is full, it is scaled by this
      rank's example count and all-reduced (SUM), ``algorithm`` choosing the
      all-reduce. With ``overlap=True`` the all-reduce starts non-blocking
      (queued behind the previous bucket's, if that is still running) and is
      advanced (``Work.test()``) whenever another gradient arrives; with
      ``overlap=False`` every bucket is all-reduced after backward, one after
      the other. Once the last bucket has arrived, the summed example count
      divides the gradients, and backward returns with ``.grad`` holding the
      global mean gradient, bit-identical on every rank.
    * ``with ddp.no_sync():`` forward and backward accumulate gradients
      locally; the next backward outside it synchronizes the sum. As with
      PyTorch, divide each micro-batch's loss by the number of micro-batches
      (exact when each rank's micro-batches are of one size).

    Buckets follow the reverse of ``module.parameters()``, the order in which
    a sequential model's backward completes the gradients; the gradients are
    views into the buckets (keep them so with ``zero_grad(set_to_none=False)``;
    with ``set_to_none=True`` they are copied in and rebound).

    Every parameter must receive a gradient in every backward: a bucket
    missing one never starts, and the next forward says which.

    torch's keywords: ``process_group`` (None: the world) or ``device_mesh``
    (a 1-D :class:`~minidist.distributed.device_mesh.DeviceMesh`, such as
    ``mesh["dp"]``; ``process_group`` takes one too), ``bucket_cap_mb``
    (default 25), ``broadcast_buffers``. minidist's own: ``algorithm`` (the
    all-reduce's), ``overlap``. torch's GPU placement (``device_ids``,
    ``output_device``) has no meaning here and is not taken.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float | None = None,
                 algorithm: str = "auto", overlap: bool = True, process_group=None,
                 broadcast_buffers: bool = True, device_mesh=None):
        super().__init__()
        parameters = _check_model(module, "DistributedDataParallel")
        if bucket_cap_mb is None:
            bucket_cap_mb = 25.0  # torch's default
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be positive (megabytes per all-reduce), "
                             f"got {bucket_cap_mb!r}")
        group = as_group(process_group, "DistributedDataParallel", device_mesh=device_mesh)
        self.module = module
        self._group = group
        self._algorithm = algorithm
        self._overlap = bool(overlap)
        self._rank = dist.get_rank() if group is None else group.rank
        self._world_size = dist.get_world_size() if group is None else group.size
        self._dtype = parameters[0].data.dtype
        self._buckets = _make_buckets(parameters[::-1], int(bucket_cap_mb * 2**20), self._dtype)
        self._bucket_of = {id(p): bucket for bucket in self._buckets for p in bucket.parameters}
        self._syncing = True
        self._examples = 0          # this rank's examples since the last synchronization
        self._arrived = 0           # buckets complete in the running backward
        self._count = None          # [sum of the ranks' examples], once queued
        self._queue = collections.deque()  # (array, algorithm, bucket) not yet started
        self._in_flight = None      # the Work of the all-reduce now running
        self._comm_hook = None      # (state, hook) from register_comm_hook
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._gradient_ready)
                              for p in parameters]
        if broadcast_buffers:
            broadcast_module(module, group=group, group_src=0)
        else:
            for param in parameters:
                dist.broadcast(param.data, group=group, group_src=0)

    def track_memory(self, ledger):
        """Register the buckets with a :class:`minidist.memory.Ledger` as
        ``buffers``. The gradients are views into them, so they are already
        counted as ``gradients`` and add no byte (each byte counts once):
        DDP's buckets *are* its full gradients, nothing beside them."""
        for bucket in self._buckets:
            ledger.track("buffers", bucket.flat)
        return ledger

    def register_comm_hook(self, state, hook) -> None:
        """Replace each bucket's all-reduce with ``hook(state, bucket)``, as
        ``torch``'s ``DistributedDataParallel.register_comm_hook``.

        ``bucket`` is a :class:`GradBucket`; the hook communicates (any
        collectives of ``bucket.group``, the same sequence on every rank) and
        returns the averaged gradient, ``sum_r buffer_r / bucket.divisor()``
        or an approximation of it (compression), a NumPy array of the
        buffer's shape and dtype that DDP writes back into the gradients.
        The hooks of :mod:`minidist.parallel.data.compression` and
        :mod:`minidist.parallel.data.powersgd` are examples.

        It runs where the bucket's all-reduce would start: with
        ``overlap=True`` as soon as the bucket is full, during backward (the
        hook itself blocks until its collectives are done); with
        ``overlap=False`` after backward. Register once, before the first
        backward; without a hook DDP's path is unchanged.
        """
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook: a communication hook is already registered "
                               "on this DistributedDataParallel (register it once)")
        if not callable(hook):
            raise TypeError(f"register_comm_hook needs a callable hook(state, bucket), "
                            f"got {type(hook).__name__}")
        self._comm_hook = (state, hook)

    def _run_hook(self, bucket: _Bucket) -> None:
        state, hook = self._comm_hook
        index = self._buckets.index(bucket)
        if int(self._count[0]) == 0:
            raise ValueError("DistributedDataParallel: no rank had any example in this step; "
                             "at least one rank needs examples to average over")
        grad_bucket = GradBucket(bucket, index, int(self._count[0]),
                                 last=index == len(self._buckets) - 1, group=self._group,
                                 world_size=self._world_size, rank=self._rank,
                                 algorithm=self._algorithm)
        name = getattr(hook, "__qualname__", None) or type(hook).__name__
        out = hook(state, grad_bucket)
        if not isinstance(out, np.ndarray) or out.shape != bucket.flat.shape \
                or out.dtype != bucket.flat.dtype:
            got = (f"shape {out.shape}, dtype {out.dtype}" if isinstance(out, np.ndarray)
                   else type(out).__name__)
            raise ValueError(
                f"rank {self._rank}: communication hook {name} returned {got} for bucket "
                f"{index}; it must return a NumPy array of the bucket's shape "
                f"{bucket.flat.shape} and dtype {bucket.flat.dtype} (the averaged gradient)")
        if out is not bucket.flat:
            bucket.flat[...] = out
        bucket.hooked = True

    @property
    def buckets(self) -> list[list]:
        """The parameters of every bucket, in the order they are all-reduced."""
        return [list(bucket.parameters) for bucket in self._buckets]

    # -- forward --------------------------------------------------------
    def forward(self, *args, batch_size: int | None = None, **kwargs):
        self._check_previous_backward()
        self._examples += _examples_in(args, batch_size, self._rank, "DistributedDataParallel")
        return self.module(*args, **kwargs)

    def _check_previous_backward(self) -> None:
        waiting = [b for b in self._buckets if b.pending != len(b.parameters)]
        if waiting:
            in_waiting = {id(p) for bucket in waiting for p in bucket.parameters}
            names = [name for name, p in self.module.named_parameters() if id(p) in in_waiting]
            raise RuntimeError(
                f"rank {self._rank}: the previous backward did not give every parameter a "
                f"gradient, so its buckets never synchronized (parameters in unfinished "
                f"buckets: {', '.join(names)}). Use every parameter in forward, or leave the "
                "unused ones out of the model.")

    # -- gradient accumulation -----------------------------------------
    class _NoSync:
        def __init__(self, ddp):
            self.ddp = ddp

        def __enter__(self):
            self.previous = self.ddp._syncing
            self.ddp._syncing = False
            return self

        def __exit__(self, *exc):
            self.ddp._syncing = self.previous
            return False

    def no_sync(self):
        """Context manager: backward inside it accumulates gradients locally
        and communicates nothing (gradient accumulation)."""
        return DistributedDataParallel._NoSync(self)

    # -- backward -------------------------------------------------------
    def _gradient_ready(self, param) -> None:
        bucket = self._bucket_of[id(param)]
        view = bucket.views[id(param)]
        if param.grad is not view:
            # A fresh array (zero_grad set .grad to None): its values move into the bucket.
            view[...] = param.grad
            param.grad = view
        bucket.pending -= 1
        if not self._syncing:
            if bucket.pending == 0:
                bucket.pending = len(bucket.parameters)
            return
        if bucket.pending == 0:
            self._arrived += 1
        if self._world_size > 1:
            if self._overlap and bucket.pending == 0:
                self._start(bucket)
            else:
                self._advance()
        if self._arrived == len(self._buckets):
            self._finish()

    def _start(self, bucket: _Bucket) -> None:
        """Queue ``bucket``'s all-reduce (after the example count's, on the first
        bucket of a step) and start what the queue allows."""
        if self._count is None:
            self._count = np.array([self._examples], dtype=np.int64)
            self._queue.append((self._count, "auto", None))
        bucket.flat *= self._dtype.type(self._examples)
        bucket.queued = True
        self._queue.append((bucket.flat, self._algorithm, bucket))
        self._advance()

    def _advance(self) -> None:
        """Move the running all-reduce on as far as it goes without waiting; when
        it is done, start the next queued one.

        One all-reduce at a time, in bucket order (as NCCL runs them, one
        after another on one stream): each already keeps every link busy, and
        one at a time keeps the trace readable. Nothing runs in the
        background, so this is called whenever backward hands over a gradient."""
        while True:
            if self._in_flight is not None:
                if not self._in_flight.test():
                    return
                self._in_flight = None
            if not self._queue:
                return
            array, algorithm, bucket = self._queue.popleft()
            if bucket is not None and self._comm_hook is not None:
                # The example count's all-reduce, queued first, is done: the hook
                # runs (and communicates) now, where the all-reduce would start.
                self._run_hook(bucket)
                continue
            self._in_flight = dist.all_reduce(array, group=self._group, async_op=True,
                                              algorithm=algorithm)

    def _finish(self) -> None:
        """Every bucket has its gradients: run the remaining all-reduces to the
        end, then divide by the examples of all ranks."""
        if self._world_size > 1:
            for bucket in self._buckets:
                if not bucket.queued:
                    self._start(bucket)
            while self._in_flight is not None:
                self._in_flight.wait()
                self._in_flight = None
                self._advance()
            total = int(self._count[0])
            self._count = None
            if total == 0:
                raise ValueError("DistributedDataParallel: no rank had any example in this step; "
                                 "at least one rank needs examples to average over")
            for bucket in self._buckets:
                if not bucket.hooked:
                    bucket.flat /= self._dtype.type(total)
                bucket.queued = False
                bucket.hooked = False
        for bucket in self._buckets:
            bucket.pending = len(bucket.parameters)
        self._arrived = 0
        self._examples = 0
