"""Hogwild: lock-free SGD on shared weights converges like serial SGD; its lost updates are counted;
its shared memory never outlives the run."""

from __future__ import annotations

import os

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist.data.synthetic import make_sparse_logistic
from minidist.parallel.parameter_server import hogwild
from minidist.runtime.segments import PREFIX

# 4000 examples, 100 features, 5 nonzeros each: two updates share a feature with
# probability about 5 * 5 / 100, and each shard has 10+ examples per feature, so
# the loss of a run hardly depends on which worker happened to update last.
FEATURES, LABELS, _ = make_sparse_logistic(4000, 100, 5, seed=0, dtype=np.float64)
UPDATES = 10 * len(LABELS)
LEARNING_RATE, BACKOFF, SEED = 0.1, 0.7, 0


def hogwild_segments() -> set[str]:
    return {entry for entry in os.listdir("/dev/shm") if entry.startswith(PREFIX)
            and entry.endswith((f"_array-{hogwild.WEIGHTS}", f"_array-{hogwild.WRITES}"))}


def intended_writes(world_size: int, updates: int) -> int:
    """Counter increments the workers make: the nonzeros of every example they visit."""
    nonzeros = np.count_nonzero(FEATURES, axis=1)
    total = 0
    for rank in range(world_size):
        order = hogwild.example_order(len(LABELS), hogwild.updates_of_rank(updates, rank, world_size),
                                      hogwild.pass_length_of_rank(len(LABELS), rank, world_size),
                                      np.random.default_rng([SEED, rank]))
        total += int(nonzeros[order].sum())
    return total


@pytest.fixture(scope="module")
def serial_loss():
    weights = hogwild.serial_sgd(FEATURES, LABELS, UPDATES, LEARNING_RATE, BACKOFF, SEED)
    return hogwild.logistic_loss(weights, FEATURES, LABELS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
def test_hogwild_reaches_serial_sgd_loss_within_one_percent(world_size, serial_loss):
    before = hogwild_segments()
    result = hogwild.run_hogwild(FEATURES, LABELS, world_size, UPDATES, LEARNING_RATE,
                                 BACKOFF, SEED)
    loss = hogwild.logistic_loss(result.weights, FEATURES, LABELS)
    assert abs(loss - serial_loss) <= 0.01 * serial_loss
    assert sum(result.updates_per_rank) == UPDATES
    assert result.intended_writes == intended_writes(world_size, UPDATES)
    assert 0 <= result.lost_writes == result.intended_writes - result.recorded_writes
    assert hogwild_segments() == before


@pytest.mark.blas_kernel
@pytest.mark.timeout(60)
def test_one_worker_is_serial_sgd_bit_for_bit_and_loses_nothing():
    updates = 3 * len(LABELS) + 17  # ends partway through a pass
    result = hogwild.run_hogwild(FEATURES, LABELS, 1, updates, LEARNING_RATE, BACKOFF, SEED)
    serial = hogwild.serial_sgd(FEATURES, LABELS, updates, LEARNING_RATE, BACKOFF, SEED)
    np.testing.assert_array_equal(result.weights, serial)
    assert result.lost_writes == 0
    assert result.recorded_writes == result.intended_writes == intended_writes(1, updates)


def test_a_learning_rate_that_backs_off_after_each_pass():
    rates = hogwild.learning_rates(0.5, 0.5, updates=7, pass_length=3)
    np.testing.assert_array_equal(rates, [0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125])


def test_sgd_update_follows_the_logistic_gradient():
    weights, writes = np.array([0.5, -1.0, 2.0]), np.zeros(3, np.int64)
    columns, values = np.array([0, 2]), np.array([1.5, -0.5])
    margin = 0.5 * 1.5 + 2.0 * -0.5
    expected = weights.copy()
    expected[columns] -= 0.1 * (1 / (1 + np.exp(-margin)) - 1) * values
    hogwild.sgd_update(weights, writes, columns, values, 1, 0.1)
    np.testing.assert_allclose(weights, expected, rtol=1e-15)
    np.testing.assert_array_equal(writes, [1, 0, 1])


def fail_while_others_update():
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails during Hogwild")
    return hogwild.hogwild_worker(FEATURES, LABELS, UPDATES, LEARNING_RATE, BACKOFF, SEED)


@pytest.mark.timeout(60)
def test_shared_weights_are_released_when_a_worker_raises():
    before = hogwild_segments()
    with pytest.raises(dist.WorkerError, match="rank 1 fails during Hogwild"):
        minidist.launch(fail_while_others_update, world_size=3,
                        shared_arrays=hogwild.shared_arrays(FEATURES.shape[1]))
    assert hogwild_segments() == before


def test_weights_of_the_wrong_size_are_a_clear_error():
    def worker():
        return hogwild.hogwild_worker(FEATURES, LABELS, 10, LEARNING_RATE)

    with pytest.raises(dist.WorkerError, match="has shape .3,. but the data has 100 features"):
        minidist.launch(worker, world_size=1, shared_arrays=hogwild.shared_arrays(3))


def test_every_worker_samples_from_all_the_data_distinct_within_a_pass():
    """No shards (see hogwild's docstring for what they cost): each worker's
    examples come from the whole set, a pass is its share of an epoch, and
    an example appears at most once per pass."""
    n_examples, world_size = 1000, 4
    for rank in range(world_size):
        per_pass = hogwild.pass_length_of_rank(n_examples, rank, world_size)
        assert per_pass == 250
        order = hogwild.example_order(n_examples, 5 * per_pass + 7, per_pass,
                                      np.random.default_rng([SEED, rank]))
        assert len(order) == 5 * per_pass + 7
        for start in range(0, len(order), per_pass):
            one_pass = order[start:start + per_pass]
            assert len(set(one_pass.tolist())) == len(one_pass)
        residues = set((order % world_size).tolist())  # a shard would be one residue
        assert residues == set(range(world_size))
    assert hogwild.example_order(n_examples, 0, 250, np.random.default_rng(0)).size == 0
