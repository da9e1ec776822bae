"""Parallel batch inference: split a data set across N processes, predict, gather in order.

Inference has no gradients and no optimizer, so there is nothing to keep in
step: data parallelism with no communication at all until the end. The
algorithm, in :func:`parallel_predict`:

1. **Split.** The M examples are cut into batches of ``batch_size`` (the
   last may be short), and the batches are dealt to the N ranks in order,
   as contiguous runs whose lengths differ by at most one batch
   (:func:`shard_bounds`): every shard starts on a batch boundary. Contiguous
   shards make the gather a concatenation in rank order, so the predictions
   come back in the input's order.
2. **Predict.** Every rank runs the model on its shard in batches, in eval
   mode and under ``no_grad`` (no graph is recorded, nothing is kept for a
   backward), with one BLAS thread (why one: below).
3. **Gather.** Each rank returns its predictions as the return value of its
   function; ``minidist.launch`` hands the parent the list by rank, which it
   concatenates. Why not a ``gather`` collective: the parent is not a rank,
   the results must end up in the parent anyway, and the return values
   travel through the result pipe each worker already has. Why no shared
   input array: ``launch`` forks, so every worker already sees the parent's
   model and data through copy-on-write pages, without a copy or a pickle
   (a ``launch(shared_arrays=...)`` segment would cost one extra copy of the
   input for nothing here; it is for arrays ranks *write*).

Cost: one fork per rank (milliseconds each, the model and data are not
copied), about M/N examples of forward compute per rank (whole batches: a
rank has at most one batch more than another), and M * classes * 4 bytes
of results pickled once through the pipes. The speed-up is bounded by the
cores: N ranks on fewer than N cores take turns (``os.cpu_count()``).

**Exactly the single-process predictions, on every BLAS kernel.** A matrix
product's rounding is not a property of the numbers alone. OpenBLAS picks a
kernel set by CPU (SkylakeX on AVX-512 Xeons, Haswell on many laptops;
``OPENBLAS_CORETYPE`` forces one), and on Haswell kernels the last bits of a
row of ``x @ w`` depend on the row's position in the batch (the kernel
works on blocks of rows, and a row's rounding depends on its place in its
block and on whether the block is full), on the batch's size, and on how
many threads share the product (each thread takes a block of rows). So
:func:`predict` and every rank compute each row in the same geometry:

* the same batch: shards start on batch boundaries, so batch b of the data
  is the same ``batch_size`` rows, at the same positions, in one process
  and on whichever rank has it;
* the same shape: a short last batch is padded with zero rows to the full
  ``batch_size``, in both (a batch of 3 rows rounds differently from the
  same rows in a batch of 256, even on SkylakeX);
* the same thread count: one BLAS thread, in both
  (:func:`minidist.runtime.blas_threads.limit`); the parallelism is the
  processes.

In eval mode each layer is a function of its batch alone (BatchNorm uses
its running statistics, Dropout is off), so equal batches give equal bits.
What is *not* promised: equality across different ``batch_size``
(different shapes, so different roundings in the last bits), across
machines or kernel sets (one process on SkylakeX against one on Haswell),
or for a model whose eval-mode forward mixes the rows of a batch. The
price: the padding of the last batch, ranks that differ by up to one whole
batch of work, and, in one process, the BLAS threads it does not use. (An
int8 model from :func:`minidist.nn.quantization.quantize` takes the same
path; its products are integers, exact in any order.)

Progress: the parent cannot run code inside ``launch`` while it waits, so
the workers count the examples they have done in an anonymous shared memory
map the parent made before forking (one int64 per rank, written by its rank
only), and a thread of the parent reads the counters ten times a second into
a Rich progress bar.

Usage::

    logits = parallel_predict(model, x_test, world_size=4, batch_size=256)
    labels = parallel_predict(model, x_test, world_size=4, output="labels")
    assert (labels == predict(model, x_test, output="labels")).all()
"""

from __future__ import annotations

import mmap
import threading
import time

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import backend, nn
from minidist.runtime import blas_threads
from minidist.tensor import Tensor, no_grad

OUTPUTS = ("logits", "labels")


def shard_bounds(count: int, world_size: int, batch_size: int = 1) -> list[tuple[int, int]]:
    """``[(start, stop)]`` by rank: the ``ceil(count / batch_size)`` batches of
    ``batch_size`` examples (the last may be short) dealt in order as
    contiguous runs, the first ``batches % world_size`` ranks one batch
    more. Every ``start`` is a multiple of ``batch_size``. A rank may get an
    empty shard when there are fewer batches than ranks. With the default
    ``batch_size=1``: shards of examples whose sizes differ by at most one."""
    batches = -(-count // batch_size)
    base, extra = divmod(batches, world_size)
    bounds, start = [], 0
    for rank in range(world_size):
        stop = min(count, start + (base + (1 if rank < extra else 0)) * batch_size)
        bounds.append((start, stop))
        start = stop
    return bounds


def _check(model, x, batch_size, output):
    if not isinstance(model, nn.Module):
        raise TypeError(f"predict needs a minidist.nn.Module, got {type(model).__name__}")
    data = x.data if isinstance(x, Tensor) else x
    if not hasattr(data, "shape") or data.ndim < 1:
        raise TypeError(f"predict needs an array of examples (first axis: examples), got "
                        f"{type(x).__name__}")
    if len(data) == 0:
        raise ValueError("predict needs at least one example, got an empty array")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    return data


def _predict_batches(model, data, batch_size: int, output: str, on_batch=None):
    """The model on ``data`` in batches padded to ``batch_size`` rows."""
    xp = backend.of(data)
    results = []
    was_training = model.training
    model.eval()
    try:
        with no_grad(), blas_threads.limit(1):  # one thread count everywhere: module docstring
            for start in range(0, len(data), batch_size):
                batch = data[start : start + batch_size]
                rows = len(batch)
                if rows < batch_size:  # one GEMM shape for every batch: see the module docstring
                    padded = xp.zeros((batch_size,) + batch.shape[1:], dtype=batch.dtype)
                    padded[:rows] = batch
                    batch = padded
                logits = backend.to_numpy(model(Tensor(batch)).data)[:rows]
                results.append(logits.argmax(axis=-1) if output == "labels" else logits.copy())
                if on_batch is not None:
                    on_batch(start + rows)
    finally:
        model.train(was_training)
    return np.concatenate(results)


def predict(model: nn.Module, x, batch_size: int = 256, output: str = "logits") -> np.ndarray:
    """The single-process reference: ``model`` on ``x`` in batches of
    ``batch_size`` (the last padded to full size), eval mode, no graph, one
    BLAS thread (so that :func:`parallel_predict` can equal it bit for bit:
    see the module docstring).
    ``output``: "logits" (the model's outputs, (M, classes)) or "labels"
    (their argmax, (M,) int64). The model's training flag is restored."""
    data = _check(model, x, batch_size, output)
    return _predict_batches(model, data, int(batch_size), output)


def _predict_shard(model, data, bounds, batch_size, output, counters):
    rank = dist.get_rank()
    start, stop = bounds[rank]
    if start == stop:
        return None

    def done(count):
        counters[rank] = count

    return _predict_batches(model, data[start:stop], batch_size, output, done)


def parallel_predict(model: nn.Module, x, world_size: int = 2, batch_size: int = 256,
                     transport: str = "shm", output: str = "logits", progress: bool = True,
                     console=None) -> np.ndarray:
    """Predict ``x`` on ``world_size`` worker processes; the same array, bit
    for bit, as ``predict(model, x, batch_size, output)`` with the same
    ``batch_size``, on any BLAS kernel (each rank gets whole batches, in
    order; see the module docstring for why and for what is not promised).

    ``x``: an array (or Tensor) of examples, first axis the examples.
    ``output``: "logits" or "labels" (argmax). ``progress``: a Rich progress
    bar of examples done (on ``console``, default a new one). ``transport``
    is passed to ``minidist.launch`` (no messages are sent between ranks;
    the results come back as return values). The model is not changed.
    """
    data = _check(model, x, batch_size, output)
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    world_size, batch_size = int(world_size), int(batch_size)
    bounds = shard_bounds(len(data), world_size, batch_size)
    # MAP_SHARED and anonymous: the forked workers write into the parent's pages.
    shared = mmap.mmap(-1, 8 * world_size)
    counters = np.frombuffer(shared, dtype=np.int64)
    stop = threading.Event()
    bar = watcher = None
    try:
        if progress:
            bar, watcher = _start_progress(counters, len(data), world_size, stop, console)
        results = minidist.launch(_predict_shard, world_size=world_size, transport=transport,
                                  args=(model, data, bounds, batch_size, output, counters))
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
            bar.stop()
        del counters
        shared.close()
    return np.concatenate([result for result in results if result is not None])


def _start_progress(counters, total: int, world_size: int, stop: threading.Event, console):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn(f"predict on {world_size} rank{'s' if world_size > 1 else ''}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:,.0f} examples/s"),
        TimeRemainingColumn(),
    )
    bar = Progress(*columns, console=console or Console(), transient=False)
    task = bar.add_task("predict", total=total, rate=0.0)
    bar.start()
    started = time.perf_counter()

    def watch():
        while True:
            finished = stop.wait(0.1)
            done = int(counters.sum())
            bar.update(task, completed=done, rate=done / max(time.perf_counter() - started, 1e-9))
            if finished:
                return

    watcher = threading.Thread(target=watch, name="minidist-predict-progress", daemon=True)
    watcher.start()
    return bar, watcher


__all__ = ["parallel_predict", "predict", "shard_bounds", "OUTPUTS"]
