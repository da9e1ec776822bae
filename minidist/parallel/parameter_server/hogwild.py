"""Hogwild!: SGD whose weights sit in one shared array that every worker updates without locks.

The zhihu article on distributed training ("深度模型常见加速训练策略架构篇(一)")
lists, among the troubles of asynchronous updates, that "reading the
parameters takes no lock, so a worker may read parameters that are half
updated". Hogwild (Niu, Recht, Re and Wright, 2011) turns that into the
method: no server, no messages, no locks.

The algorithm, step by step:

1. the weights live in one array that every worker process maps
   (``dist.shared_array``, declared at launch by :func:`shared_arrays`);
2. the workers start together (a barrier), then each repeats, on examples
   drawn at random from the whole data set (the paper's "sample e uniformly
   at random from E"; see below why not a shard of its own):
   read the weights of the example's nonzero features (no lock: another
   worker may be halfway through writing them), compute the gradient of
   the example's logistic loss, subtract ``learning_rate * gradient`` from
   those weights in place (no lock);
3. the step size shrinks by a factor ``backoff`` after each of the worker's
   passes, a pass being its share of one epoch (``len(data) / world_size``
   examples, distinct within the pass), so that every worker's step size
   follows serial SGD's epoch by epoch (the paper's schedule);
4. after its share of the updates, a worker waits at a barrier; the weights
   in shared memory are the result.

Why it works: with sparse examples an update touches only the ``s`` weights
of the example's nonzero features. Two concurrent updates collide only if
their examples share a feature, with probability about ``s * s / d`` for
``d`` features, and a collision costs at most one lost or stale term of a
sum of many. The run converges like serial SGD.

Why every worker samples from all the data. An earlier version gave each
worker a shard (examples ``rank::world_size``). Workers do not run in
lockstep (four workers on two cores take turns), and whichever finished
last made the final updates on its quarter of the data alone, pulling the
weights towards it. On the test problem (tests/parallel/test_hogwild.py), in three
sets of 20 runs with 4 workers, the loss ended 0.08-1.34 % above serial
SGD's, and 1 to 3 runs of each 20 were past 1 %. Sampled from all the data,
a worker running alone still takes unbiased steps: 0.32-0.56 % in every
run of three sets, one of them with another core kept busy (with 2 workers
0.13-0.29 %, against -0.01-0.95 % with shards). The spread, not the mean,
is what changed.

Lost updates, measured. ``w[j] -= step`` is a read, a subtraction and a
write; if two workers both read ``w[j]`` before either writes, one step is
overwritten and lost. Weights are floats, so a lost step cannot be seen in
them afterwards. Next to each weight update we therefore increment a
per-coordinate counter in shared memory, ``writes[j] += 1``, read-modified-
written without a lock exactly like the weight, while each worker also
counts, privately, how many increments it made. The intended total minus
the counters' sum is the number of increments lost to races: the same race
on the neighbouring array, a measurement of how often it strikes.

Cost per update: ``s`` shared reads and ``s`` shared writes (plus the
counter's ``s``), about ``4 s`` flops; no message, so no alpha and no beta
term. What replaces communication is cache coherence: a written line is
invalidated in the other cores' caches, so workers that write the same
lines (dense data, or few features) slow each other down and lose updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import trace

WEIGHTS = "hogwild-weights"
WRITES = "hogwild-writes"


@dataclass
class SparseRows:
    """Examples in compressed-row form: example ``i`` has nonzero features
    ``columns[starts[i]:starts[i + 1]]`` with values ``values[...]``."""

    starts: np.ndarray
    columns: np.ndarray
    values: np.ndarray

    @classmethod
    def from_dense(cls, features: np.ndarray) -> SparseRows:
        rows, columns = np.nonzero(features)
        starts = np.zeros(features.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=features.shape[0]), out=starts[1:])
        return cls(starts, columns, np.asarray(features[rows, columns], np.float64))

    def row(self, i: int):
        begin, end = self.starts[i], self.starts[i + 1]
        return self.columns[begin:end], self.values[begin:end]


def logistic_loss(weights: np.ndarray, features: np.ndarray, labels: np.ndarray) -> float:
    """Mean logistic loss over all examples, labels in {0, 1}:
    mean of log(1 + exp(m)) - y m with margin m = x . w."""
    margins = features @ weights
    return float(np.mean(np.logaddexp(0.0, margins) - labels * margins))


def sgd_update(weights, writes, columns, values, label, learning_rate) -> None:
    """One example's SGD step on ``weights`` in place, and the counter's increments.

    The same code runs on a private array (serial SGD) and on the shared one
    (Hogwild); only in the second can another process interleave with it.
    """
    current = weights[columns]  # unlocked read: may mix old and new values of another write
    error = 1.0 / (1.0 + np.exp(-(current @ values))) - label
    weights[columns] -= learning_rate * error * values  # read-modify-write, no lock
    writes[columns] += 1  # the same race, on a counter that shows when it struck


def example_order(n_examples: int, updates: int, pass_length: int,
                  rng: np.random.Generator) -> np.ndarray:
    """``updates`` example indices in passes of ``pass_length``: each pass the
    first ``pass_length`` of a fresh random permutation of all ``n_examples``
    (distinct within a pass; with ``pass_length == n_examples``, epochs)."""
    if updates == 0:
        return np.zeros(0, np.int64)
    passes = -(-updates // pass_length)
    return np.concatenate([rng.permutation(n_examples)[:pass_length]
                           for _ in range(passes)])[:updates]


def learning_rates(learning_rate: float, backoff: float, updates: int, pass_length: int):
    """The step size of each update: ``learning_rate`` times ``backoff`` to the number of
    passes of ``pass_length`` updates done so far, as in the Hogwild paper.
    Shrinking steps make the end of a run insensitive to which worker happened
    to update last."""
    return learning_rate * backoff ** (np.arange(updates) // pass_length)


def _check(features, labels, updates, learning_rate, backoff) -> SparseRows:
    features = np.asarray(features)
    if features.ndim != 2 or features.shape[0] == 0:
        raise ValueError(f"features must be a 2-D array with at least one example, got shape "
                         f"{features.shape}")
    if np.shape(labels) != (features.shape[0],):
        raise ValueError(f"labels must have one entry per example ({features.shape[0]}), got "
                         f"shape {np.shape(labels)}")
    if isinstance(updates, bool) or int(updates) != updates or updates < 0:
        raise ValueError(f"updates must be a whole number >= 0, got {updates!r}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
    if not 0 < backoff <= 1:
        raise ValueError(f"backoff multiplies the learning rate after each pass and must be in "
                         f"(0, 1], got {backoff!r}")
    return SparseRows.from_dense(features)


def serial_sgd(features, labels, updates: int, learning_rate: float, backoff: float = 1.0,
               seed: int = 0):
    """The reference: one process, ``updates`` per-example steps over all the data."""
    rows = _check(features, labels, updates, learning_rate, backoff)
    weights = np.zeros(np.shape(features)[1])
    writes = np.zeros(np.shape(features)[1], np.int64)
    # The order a one-worker Hogwild run takes, so that the two agree bit for bit.
    order = example_order(len(labels), updates, len(labels), np.random.default_rng([seed, 0]))
    rates = learning_rates(learning_rate, backoff, updates, len(labels))
    for i, rate in zip(order, rates):
        columns, values = rows.row(i)
        sgd_update(weights, writes, columns, values, labels[i], rate)
    return weights


def shared_arrays(n_features: int) -> dict:
    """What to declare at launch: the weights (float64) and the write counters."""
    return {WEIGHTS: np.zeros(n_features), WRITES: np.zeros(n_features, np.int64)}


def updates_of_rank(updates: int, rank: int, world_size: int) -> int:
    """An even split of ``updates`` (the first ``updates % world_size`` ranks do one more)."""
    return updates // world_size + (rank < updates % world_size)


def pass_length_of_rank(n_examples: int, rank: int, world_size: int) -> int:
    """A worker's share of one epoch: its updates per pass (at least one)."""
    return max(updates_of_rank(n_examples, rank, world_size), 1)


def hogwild_worker(features, labels, updates: int, learning_rate: float, backoff: float = 1.0,
                   seed: int = 0) -> dict:
    """Run inside ``minidist.launch(..., shared_arrays=shared_arrays(d))``: this rank's
    share of ``updates`` steps on examples drawn from all the data.

    Returns this rank's count of intended counter increments and, on rank 0
    after every rank has finished, the final weights and counters.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rows = _check(features, labels, updates, learning_rate, backoff)
    weights, writes = dist.shared_array(WEIGHTS), dist.shared_array(WRITES)
    if weights.shape != (np.shape(features)[1],):
        raise ValueError(f"rank {rank}: shared array {WEIGHTS!r} has shape {weights.shape} but "
                         f"the data has {np.shape(features)[1]} features; declare "
                         f"shared_arrays=hogwild.shared_arrays({np.shape(features)[1]})")
    my_updates = updates_of_rank(updates, rank, world_size)
    pass_length = pass_length_of_rank(len(labels), rank, world_size)
    order = example_order(len(labels), my_updates, pass_length,
                          np.random.default_rng([seed, rank]))
    rates = learning_rates(learning_rate, backoff, my_updates, pass_length)
    intended = 0
    dist.barrier()  # start together, so that the updates really interleave
    with trace.region(trace.with_info("hogwild updates", updates=my_updates)):
        for i, rate in zip(order, rates):
            columns, values = rows.row(i)
            sgd_update(weights, writes, columns, values, labels[i], rate)
            intended += len(columns)
    dist.barrier()  # rank 0 copies the weights only once nobody writes them any more
    result = {"rank": rank, "updates": my_updates, "intended_writes": intended}
    if rank == 0:
        result["weights"] = weights.copy()
        result["recorded_writes"] = writes.copy()
    return result


@dataclass
class HogwildResult:
    weights: np.ndarray
    updates_per_rank: list
    intended_writes: int  # counter increments the workers made, each counted privately
    recorded_writes: int  # what the unlocked shared counters add up to
    lost_writes: int  # intended - recorded: increments overwritten by a concurrent one


def run_hogwild(features, labels, world_size: int, updates: int, learning_rate: float,
                backoff: float = 1.0, seed: int = 0, transport: str = "shm",
                trace_path=None) -> HogwildResult:
    """Launch ``world_size`` Hogwild workers for ``updates`` steps in total."""
    results = minidist.launch(hogwild_worker, world_size=world_size, transport=transport,
                              args=(features, labels, updates, learning_rate, backoff, seed),
                              shared_arrays=shared_arrays(np.shape(features)[1]),
                              trace=trace_path)
    intended = sum(result["intended_writes"] for result in results)
    recorded = int(results[0]["recorded_writes"].sum())
    return HogwildResult(results[0]["weights"], [result["updates"] for result in results],
                         intended, recorded, intended - recorded)
