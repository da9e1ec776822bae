"""Exercise: one step of data parallelism through a coordinator (lesson 5).

Every rank has computed the gradient of its own shard of the batch (a mean
over its ``batch_size`` examples). One step: rank 0, the coordinator,
gathers every rank's gradient and example count, averages the gradients
weighted by the counts (what one process would compute on the whole batch),
takes an SGD step, and sends the new weights back to everyone
(:class:`minidist.parallel.data.coordinator.CoordinatorDataParallel`, with the
model as one flat array).

Checked on real processes, world sizes 1..4, with uneven shards (one rank
with no examples at all): every rank's weights against NumPy's
``w - lr * sum_r b_r g_r / sum_r b_r``, and the bytes of the run (from its
trace) against gather + broadcast's (n - 1) (2 P + 1) values.
"""

from __future__ import annotations

from functools import partial

import numpy as np

import minidist.distributed as dist
from minidist.exercises.exercise import CheckResult, Exercise, Failure
from minidist.exercises.process_check import check_on_worlds, check_weights

WORLD_SIZES = (1, 2, 3, 4)
LR = 0.5


def coordinator_step(weights, gradient, batch_size, lr):
    """One coordinator step, weights updated in place on every rank. Per step the
    coordinator receives (n - 1) (P + 1) values and sends (n - 1) P: its link
    carries n times what a worker's does (linear gather and broadcast)."""
    message = np.append(gradient * batch_size, batch_size).astype(weights.dtype)
    received = [np.empty_like(message) for _ in range(dist.get_world_size())] \
        if dist.get_rank() == 0 else None
    dist.gather(message, received, dst=0, algorithm="linear")
    if dist.get_rank() == 0:
        total = sum(m[-1] for m in received)
        weights -= lr * sum(m[:-1] for m in received) / total
    dist.broadcast(weights, src=0, algorithm="linear")


def _shard_sizes(n):
    return [(3, 1, 0, 2)[rank % 4] if n > 1 else 4 for rank in range(n)]


def _data(n, size, case):
    generator = np.random.default_rng(100 * n + case)
    return generator.standard_normal(size), generator.standard_normal((n, size))


CASES = (1, 5, 12)  # parameters


def _worker(function):
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for case, size in enumerate(CASES):
        weights, gradients = _data(n, size, case)
        function(weights, gradients[rank].copy(), _shard_sizes(n)[rank], LR)
        results.append(weights)
    return results


def check(function, **options) -> CheckResult:
    report = CheckResult("coordinator_data_parallel")
    report.failure = check_on_worlds(_worker, function, WORLD_SIZES, "coordinator_step",
                                     _compare, lambda n, _messages, nbytes: _traffic(n, nbytes))
    if report.failure is not None:
        return report
    report.passed.append(f"real processes, world sizes 1-{WORLD_SIZES[-1]}, uneven shards "
                         "(one rank without examples): every rank holds w - lr * the "
                         "example-weighted average gradient")
    report.passed.append("bytes within the coordinator's: (n - 1) (P + 1) values in, "
                         "(n - 1) P out, from the trace")
    return report


def _traffic(n, nbytes):
    """The bytes against gather + broadcast: (n - 1) (P + 1) values in (the
    gradient and the example count) and (n - 1) P out, 8 bytes each."""
    want = sum(8 * (n - 1) * (2 * size + 1) for size in CASES)
    if nbytes > want:
        return Failure("wasteful", (
            f"correct, but on {n} ranks the steps sent {nbytes:,} bytes, "
            f"{nbytes / want:.1f} x the coordinator's {want:,}: (n - 1) (P + 1) values in "
            "(each gradient with its count) and (n - 1) P out (the new weights)"))
    return None


def _compare(n, results):
    counts = np.array(_shard_sizes(n), float)
    for case, size in enumerate(CASES):
        weights, gradients = _data(n, size, case)
        want = weights - LR * (counts @ gradients) / counts.sum()
        plain = weights - LR * gradients.mean(axis=0)
        failure = check_weights(n, results, case, want, f"{n} ranks, {size} parameters, "
                                f"shards of {_shard_sizes(n)} examples",
                                partial(_hint, n, weights, plain))
        if failure is not None:
            return failure
    return None


def _hint(n, weights, plain, rank, got):
    """The likely mistake behind rank ``rank``'s wrong weights ``got``, or ""."""
    if np.allclose(got, weights):
        return (": unchanged; only the coordinator updated? broadcast the new weights"
                if rank else ": unchanged")
    if n > 1 and np.allclose(got, plain):
        return (": that is the plain average over ranks; weight rank r's gradient by its "
                "batch_size b_r (sum b_r g_r / sum b_r)")
    return ""


EXERCISE = Exercise(
    name="coordinator_data_parallel", function="coordinator_step",
    summary="a data-parallel step through one coordinator: gather, average, broadcast",
    lesson="lessons/05_data_parallel.py", reference=coordinator_step, check=check)
