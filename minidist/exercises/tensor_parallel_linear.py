"""Exercise: the column and row split of a dense layer (lesson 10).

y = x W^T + b with W of shape (out, in), on n ranks, Megatron's way
(:mod:`minidist.parallel.tensor.layers`):

* column split: rank r holds rows r of W (out / n output features) and the
  same slice of b, computes its slice of y from the whole x, and the slices
  are gathered along the last axis (all_gather);
* row split: rank r holds columns r of W (in / n input features) and gets
  the same slice of x's features, computes a partial y, the partials are
  summed (all_reduce), and b is added once, after the sum.

The checker runs the student's ``parallel_linear`` on real processes (one
launch per world size 1..4, all cases inside it: batch 1 and 3, features
n and 3n in, n and 2n out, both splits), each rank given only its shard,
and compares every rank's y with NumPy's x W^T + b. Feature counts are
multiples of n, as in :mod:`minidist.parallel.tensor.layers`.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist.exercises.exercise import CheckResult, Exercise, Failure
from minidist.exercises.process_check import launch_checked

WORLD_SIZES = (1, 2, 3, 4)


def parallel_linear(x, weight_shard, bias_shard, split):
    """This rank's part of y = x W^T + b, then the communication that gives
    every rank the whole y. Cost per rank: column, all_gather of y
    ((n-1)/n B out values sent); row, all_reduce of y (ring: 2 (n-1)/n B out)."""
    if split == "column":
        mine = x @ weight_shard.T + bias_shard
        pieces = np.empty((dist.get_world_size(),) + mine.shape, mine.dtype)
        dist.all_gather_into_tensor(pieces, np.ascontiguousarray(mine))
        return np.concatenate(list(pieces), axis=-1)
    partial = np.ascontiguousarray(x @ weight_shard.T)
    dist.all_reduce(partial)
    return partial + bias_shard  # after the sum: b once, not n times


def cases(n: int):
    return [(split, batch, inputs, outputs) for split in ("column", "row")
            for batch in (1, 3) for inputs in (n, 3 * n) for outputs in (n, 2 * n)]


def _data(batch, inputs, outputs, seed):
    generator = np.random.default_rng(seed)
    return (generator.standard_normal((batch, inputs)),
            generator.standard_normal((outputs, inputs)),
            generator.standard_normal(outputs))


def shard(split, x, weight, bias, rank, n):
    """What rank ``rank`` is given: (x, weight shard, bias shard)."""
    if split == "column":
        rows = np.split(np.arange(weight.shape[0]), n)[rank]
        return x, weight[rows].copy(), bias[rows].copy()
    columns = np.split(np.arange(weight.shape[1]), n)[rank]
    return x[:, columns].copy(), weight[:, columns].copy(), bias.copy()


def _worker(function, all_cases):
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for index, (split, batch, inputs, outputs) in enumerate(all_cases):
        x, weight, bias = _data(batch, inputs, outputs, index)
        results.append(function(*shard(split, x, weight, bias, rank, n), split))
    return results


def check(function, **options) -> CheckResult:
    report = CheckResult("tensor_parallel_linear")
    for n in WORLD_SIZES:
        all_cases = cases(n)
        results, failure = launch_checked(_worker, n, (function, all_cases), "parallel_linear")
        if failure is None:
            failure = _compare(n, all_cases, results)
        if failure is not None:
            report.failure = failure
            return report
    report.passed.append(f"real processes (pipe), world sizes 1-{WORLD_SIZES[-1]}: column "
                         "and row split, every rank's y equals x W^T + b")
    return report


def _compare(n, all_cases, results):
    for rank, answers in enumerate(results):
        for index, ((split, batch, inputs, outputs), got) in enumerate(zip(all_cases, answers)):
            x, weight, bias = _data(batch, inputs, outputs, index)
            want = x @ weight.T + bias
            case = (f"{split} split on {n} ranks, x of shape {x.shape}, W of shape "
                    f"{weight.shape}")
            got = np.asarray(got) if got is not None else None
            if got is None or got.shape != want.shape:
                shape = None if got is None else got.shape
                return Failure("wrong shape", (
                    f"{case}: rank {rank} returned {'None' if got is None else 'shape'} "
                    f"{'' if got is None else shape}, expected shape {want.shape}: every "
                    "rank returns the whole y" + (" (gather the slices along the last axis)"
                                                  if split == "column" else "")), rank=rank)
            wrong = np.flatnonzero(~np.isclose(got, want, rtol=1e-9, atol=1e-9))
            if wrong.size:
                element = int(wrong[0])
                hint = ""
                if split == "row" and np.allclose(got, want + (n - 1) * bias):
                    hint = ": the bias is added n times; add it once, after the all_reduce"
                return Failure("wrong result", (
                    f"{case}: rank {rank}, element {tuple(int(i) for i in np.unravel_index(element, want.shape))} is "
                    f"{got.flat[element]:.6g}, expected {want.flat[element]:.6g}{hint}"),
                    rank=rank, element=element)
    return None


EXERCISE = Exercise(
    name="tensor_parallel_linear", function="parallel_linear",
    summary="a dense layer split by columns (all_gather) and by rows (all_reduce)",
    lesson="lessons/10_model_parallel.py", reference=parallel_linear, check=check)
