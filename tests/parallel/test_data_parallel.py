"""Data parallel training must equal one process training on the whole batch.

One launch per (world size, flavour) runs every case inside the workers
(optimizer x dtype x even or uneven shards x bucketing x overlap) and returns,
for each case, a digest of every rank's weights after every step and the
final weights. The parent checks that all ranks hold identical bits after
every step, and compares the final weights with single-process training on
the concatenated batch.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim
from minidist.data import load_digits
from minidist.parallel.data.coordinator import CoordinatorDataParallel
from minidist.parallel.data.ddp import DistributedDataParallel

STEPS = 20
BATCH_PER_RANK = 6
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-10}


def _model(dtype, seed):
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 16), nn.ReLU(),
                         nn.Linear(16, 10)).to(dtype)


def _optimizer(name, parameters):
    if name == "sgd":
        return optim.SGD(parameters, lr=0.1, momentum=0.9)
    return optim.Adam(parameters, lr=0.01)


def _shard_sizes(world_size, uneven):
    """Every rank's examples per step; with ``uneven`` the last rank gets fewer."""
    sizes = [BATCH_PER_RANK] * world_size
    if uneven:
        sizes[-1] = BATCH_PER_RANK - 4
    return sizes


def _batches(dtype, sizes):
    """For each step, the global batch as one list of per-rank (x, y) shards."""
    x, y = load_digits(dtype=dtype)[:2]
    total, steps, offset = sum(sizes), [], 0
    for _ in range(STEPS):
        x_step, y_step = x[offset:offset + total], y[offset:offset + total]
        bounds = np.cumsum([0] + sizes)
        steps.append([(x_step[a:b], y_step[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])
        offset += total
    return steps


def _flat_weights(model):
    return np.concatenate([p.data.reshape(-1) for p in model.parameters()])


def _digest(model):
    return hashlib.sha256(_flat_weights(model).tobytes()).hexdigest()


CASES = [
    dict(optimizer=optimizer, dtype=dtype, uneven=uneven)
    for optimizer in ("sgd", "adam") for dtype in (np.float32, np.float64)
    for uneven in (False, True)
]
# DDP also varies how gradients travel: many small buckets or one, overlapped or not,
# and gradient accumulation over two micro-batches with no_sync().
DDP_VARIANTS = [
    dict(bucket_mb=0.002, overlap=True, accumulate=False),
    dict(bucket_mb=0.002, overlap=False, accumulate=False),
    dict(bucket_mb=25.0, overlap=True, accumulate=False),
    dict(bucket_mb=0.002, overlap=True, accumulate=True),
]


def _single_process(case, world_size):
    """The reference: one process, one step per global batch."""
    model = _model(case["dtype"], seed=0)
    optimizer = _optimizer(case["optimizer"], model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    for shards in _batches(case["dtype"], _shard_sizes(world_size, case["uneven"])):
        x = np.concatenate([s[0] for s in shards])
        y = np.concatenate([s[1] for s in shards])
        optimizer.zero_grad()
        loss_fn(model(Tensor(x)), y).backward()
        optimizer.step()
    return _flat_weights(model)


def _train_coordinator(case):
    rank = dist.get_rank()
    model = _model(case["dtype"], seed=rank)  # differs per rank: the broadcast must fix it
    optimizer = _optimizer(case["optimizer"], model.parameters())
    coordinated = CoordinatorDataParallel(model, optimizer)
    loss_fn = nn.CrossEntropyLoss()
    digests = []
    for shards in _batches(case["dtype"], _shard_sizes(dist.get_world_size(), case["uneven"])):
        x, y = shards[rank]
        optimizer.zero_grad()
        loss_fn(model(Tensor(x)), y).backward()
        coordinated.step(batch_size=len(x))
        digests.append(_digest(model))
    return digests, _flat_weights(model)


def _train_ddp(case):
    rank = dist.get_rank()
    model = _model(case["dtype"], seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=case["bucket_mb"], overlap=case["overlap"])
    optimizer = _optimizer(case["optimizer"], ddp.parameters())
    loss_fn = nn.CrossEntropyLoss()
    digests = []
    for shards in _batches(case["dtype"], _shard_sizes(dist.get_world_size(), case["uneven"])):
        x, y = shards[rank]
        optimizer.zero_grad(set_to_none=False)
        if case["accumulate"]:
            half = len(x) // 2
            with ddp.no_sync():
                (loss_fn(ddp(Tensor(x[:half])), y[:half]) / 2).backward()
            (loss_fn(ddp(Tensor(x[half:])), y[half:]) / 2).backward()
        else:
            loss_fn(ddp(Tensor(x)), y).backward()
        optimizer.step()
        digests.append(_digest(model))
    return digests, _flat_weights(model), len(ddp.buckets)


def _coordinator_worker():
    return [_train_coordinator(case) for case in CASES]


def _ddp_worker():
    return [_train_ddp({**case, **variant}) for variant in DDP_VARIANTS for case in CASES]


def _check(results, cases, world_size):
    for index, case in enumerate(cases):
        per_rank = [rank_results[index] for rank_results in results]
        digests = [r[0] for r in per_rank]
        for step in range(STEPS):
            step_digests = {d[step] for d in digests}
            assert len(step_digests) == 1, f"{case}: ranks differ after step {step + 1}"
        expected = _single_process(case, world_size)
        np.testing.assert_allclose(per_rank[0][1], expected, rtol=0,
                                   atol=TOLERANCE[case["dtype"]], err_msg=str(case))


@pytest.mark.blas_kernel
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_coordinator_matches_single_process(world_size):
    results = minidist.launch(_coordinator_worker, world_size=world_size, transport="shm",
                              timeout=60)
    _check(results, CASES, world_size)


@pytest.mark.blas_kernel
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ddp_matches_single_process(world_size):
    results = minidist.launch(_ddp_worker, world_size=world_size, transport="shm", timeout=60)
    cases = [{**case, **variant} for variant in DDP_VARIANTS for case in CASES]
    _check(results, cases, world_size)
    bucket_counts = {case["bucket_mb"]: results[0][i][2] for i, case in enumerate(cases)}
    assert bucket_counts[0.002] > 1 and bucket_counts[25.0] == 1


def _buckets_and_unused_parameter():
    model = _model(np.float32, seed=0)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.002)
    order = [[tuple(p.data.shape) for p in bucket] for bucket in ddp.buckets]
    x, y = load_digits()[:2]
    nn.CrossEntropyLoss()(ddp(Tensor(x[:4])), y[:4]).backward()
    views = all(p.grad.base is not None for p in model.parameters())
    # The last layer left out of the graph: its bucket can never complete.
    hidden = ddp.module[3](ddp.module[2](ddp.module[1](ddp.module[0](Tensor(x[:4])))))
    hidden.sum().backward()
    try:
        ddp(Tensor(x[:4]))
    except RuntimeError as error:
        message = str(error)
    else:
        message = ""
    return order, views, message


@pytest.mark.timeout(60)
def test_buckets_follow_backward_order_and_unused_parameters_are_named():
    [(order, views, message)] = minidist.launch(_buckets_and_unused_parameter, world_size=1,
                                                transport="shm", timeout=30)
    flat_order = [shape for bucket in order for shape in bucket]
    assert flat_order == [(10,), (10, 16), (16,), (16, 24), (24,), (24, 64)]
    assert len(order) > 1
    assert views, "after a synchronized backward every .grad is a view into its bucket"
    assert "4.weight" in message and "4.bias" in message and "rank 0" in message
