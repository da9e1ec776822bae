"""Exercise: DDP's gradient buckets (lesson 5).

Averaging gradients with one all_reduce per parameter pays a latency per
parameter; DDP packs consecutive gradients (in the order backward produces
them) into flat buckets of at most ``bucket_bytes`` and all-reduces each
bucket once (:class:`minidist.parallel.data.ddp.DistributedDataParallel`).

Checked on real processes, world sizes 1..4: the averaged gradients on
every rank against NumPy, and every ``dist.all_reduce`` call the student
makes (counted in the worker): as many as the buckets, each no bigger than
``bucket_bytes`` unless it holds a single gradient that is.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist.exercises.exercise import CheckResult, Exercise, Failure
from minidist.exercises.process_check import launch_checked

WORLD_SIZES = (1, 2, 3, 4)
#: (gradient sizes in elements, in backward's order; bucket_bytes)
CASES = (((3, 5, 2, 7, 1), 64), ((10,), 40), ((1, 1, 1, 1), 16), ((4, 20, 4), 48))


def buckets_of(nbytes, bucket_bytes):
    """Indices of the gradients in each bucket: consecutive, a new bucket when
    the next gradient would overflow a non-empty one."""
    buckets, current, size = [], [], 0
    for index, count in enumerate(nbytes):
        if current and size + count > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(index)
        size += count
    if current:
        buckets.append(current)
    return buckets


def allreduce_gradients(gradients, bucket_bytes):
    """Average ``gradients`` over the ranks, in place: one all_reduce per bucket.
    Cost: (number of buckets) all-reduces of about bucket_bytes each, instead
    of one per gradient: the alpha terms shrink, the bytes stay."""
    n = dist.get_world_size()
    for bucket in buckets_of([g.nbytes for g in gradients], bucket_bytes):
        flat = np.concatenate([gradients[i].reshape(-1) for i in bucket])
        dist.all_reduce(flat)
        flat /= n
        offset = 0
        for i in bucket:
            gradients[i][...] = flat[offset:offset + gradients[i].size].reshape(
                gradients[i].shape)
            offset += gradients[i].size


def _data(n, case):
    generator = np.random.default_rng(10 * n + case)
    sizes, _ = CASES[case]
    return [[generator.standard_normal(size) for size in sizes] for _ in range(n)]


def _worker(function):
    rank = dist.get_rank()
    calls = []
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        calls[-1].append(int(np.asarray(tensor).nbytes))
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counted  # this worker process only: counts the student's calls
    results = []
    try:
        for case, (_, bucket_bytes) in enumerate(CASES):
            gradients = _data(dist.get_world_size(), case)[rank]
            calls.append([])
            function(gradients, bucket_bytes)
            results.append(gradients)
    finally:
        dist.all_reduce = real
    return results, calls


def check(function, **options) -> CheckResult:
    report = CheckResult("ddp_bucketing")
    for n in WORLD_SIZES:
        results, failure = launch_checked(_worker, n, (function,), "allreduce_gradients")
        if failure is None:
            failure = _compare(n, results)
        if failure is not None:
            report.failure = failure
            return report
    report.passed.append(f"real processes, world sizes 1-{WORLD_SIZES[-1]}: every rank holds "
                         "the averaged gradients")
    report.passed.append("one all_reduce per bucket, none bigger than bucket_bytes "
                         "(unless one gradient alone is)")
    return report


def _compare(n, results):
    for case, (sizes, bucket_bytes) in enumerate(CASES):
        data = _data(n, case)
        want = [np.mean([data[r][i] for r in range(n)], axis=0) for i in range(len(sizes))]
        for rank, (answers, calls) in enumerate(results):
            got = answers[case]
            for index, (mine, theirs) in enumerate(zip(got, want)):
                mine = np.asarray(mine)
                if mine.shape != theirs.shape:
                    return Failure("wrong shape", f"{n} ranks: rank {rank}'s gradient {index} "
                                   f"has shape {mine.shape}, expected {theirs.shape}: write the "
                                   "averages back into the gradient arrays", rank=rank)
                wrong = np.flatnonzero(~np.isclose(mine, theirs, rtol=1e-9, atol=1e-12))
                if wrong.size:
                    hint = ""
                    if np.allclose(mine, theirs * n):
                        hint = ": that is the sum; divide by the world size"
                    return Failure("wrong result", (
                        f"{n} ranks, gradients of {list(sizes)} elements, buckets of "
                        f"{bucket_bytes} bytes: rank {rank}, gradient {index}, element "
                        f"{int(wrong[0])} is {mine[wrong[0]]:.6g}, expected "
                        f"{theirs[wrong[0]]:.6g}{hint}"), rank=rank, element=int(wrong[0]))
            expected = buckets_of([8 * s for s in sizes], bucket_bytes)
            if n > 1 and len(calls[case]) > len(expected):
                return Failure("wasteful", (
                    f"correct, but {len(calls[case])} all_reduce calls for gradients of "
                    f"{list(sizes)} elements and buckets of {bucket_bytes} bytes, "
                    f"{len(calls[case]) / len(expected):.1f} x the {len(expected)} of "
                    f"bucketing ({expected}): each call pays its latency"))
            largest = max(8 * s for s in sizes)
            too_big = [c for c in calls[case] if c > max(bucket_bytes, largest)]
            if n > 1 and too_big:
                return Failure("bucket too big", (
                    f"an all_reduce of {too_big[0]} bytes with bucket_bytes={bucket_bytes}: "
                    "start a new bucket when the next gradient would overflow this one"))
    return None


EXERCISE = Exercise(
    name="ddp_bucketing", function="allreduce_gradients",
    summary="average gradients with one all_reduce per bucket, as DDP does",
    lesson="lessons/05_data_parallel.py", reference=allreduce_gradients, check=check)
