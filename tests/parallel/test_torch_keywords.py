"""The strategies' keywords as torch spells them, in a ported script:
``process_group=`` on DDP, ZeroRedundancyOptimizer, FSDP, PowerSGDState and
``SyncBatchNorm.convert_sync_batchnorm``; DDP's ``bucket_cap_mb`` (default
25); FSDP's ``sharding_strategy=ShardingStrategy.*`` with NO_SHARD computing
what DDP computes; PowerSGD's ``start_powerSGD_iter`` (default 1,000).

One launch of two ranks trains the same small model each way from the same
weights and data; the parent compares the weights each way ended with.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim
from minidist.data import load_digits
from minidist.parallel import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    ShardingStrategy,
    ZeroRedundancyOptimizer,
)
from minidist.parallel import SyncBatchNorm as ParallelSyncBatchNorm
from minidist.parallel.data.powersgd import PowerSGDState, powersgd_hook
from minidist.parallel.data.sync_batchnorm import SyncBatchNorm


def _nn_refusal() -> str:
    """torch users look in torch.nn: minidist.nn says where the class is."""
    try:
        nn.SyncBatchNorm  # noqa: B018
    except AttributeError as error:
        return str(error)
    return "no error"

STEPS = 4
BATCH = 16


def _model():
    nn.init.manual_seed(3)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def _train(wrap, optimizer_of=None):
    """Train ``wrap(model)`` STEPS steps of SGD with momentum; the weights after."""
    rank = dist.get_rank()
    wrapped = wrap(_model())
    parameters = wrapped.parameters()
    optimizer = (optimizer_of or (lambda p: optim.SGD(p, lr=0.1, momentum=0.9)))(parameters)
    x, y = load_digits()[:2]
    for step in range(STEPS):
        start = (step * 2 + rank) * BATCH
        optimizer.zero_grad()
        loss = nn.CrossEntropyLoss()(wrapped(Tensor(x[start:start + BATCH])),
                                     y[start:start + BATCH])
        loss.backward()
        optimizer.step()
    if isinstance(wrapped, FullyShardedDataParallel):
        return np.concatenate([w.reshape(-1) for w in wrapped.full_weights()])
    return np.concatenate([p.data.reshape(-1) for p in wrapped.module.parameters()])


def _error(fn) -> str:
    try:
        fn()
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def _script():
    world = dist.group.WORLD
    out = {}
    out["ddp defaults"] = _train(lambda m: DistributedDataParallel(m))
    out["ddp torch keywords"] = _train(lambda m: DistributedDataParallel(
        m, process_group=world, bucket_cap_mb=0.002, broadcast_buffers=True))
    out["ddp buckets"] = (len(DistributedDataParallel(_model()).buckets),
                          len(DistributedDataParallel(_model(), bucket_cap_mb=0.002).buckets))
    out["fsdp NO_SHARD"] = _train(lambda m: FullyShardedDataParallel(
        m, process_group=world, sharding_strategy=ShardingStrategy.NO_SHARD))
    out["fsdp NO_SHARD by name"] = _train(lambda m: FullyShardedDataParallel(
        m, sharding_strategy="NO_SHARD"))
    out["fsdp FULL_SHARD enum"] = _train(lambda m: FullyShardedDataParallel(
        m, world, ShardingStrategy.FULL_SHARD))
    out["fsdp FULL_SHARD default"] = _train(lambda m: FullyShardedDataParallel(m))
    out["fsdp strategy"] = FullyShardedDataParallel(_model()).sharding_strategy
    zero = []
    out["zero"] = _train(lambda m: zero.append(DistributedDataParallel(m)) or zero[-1],
                         lambda p: ZeroRedundancyOptimizer(p, optim.SGD, process_group=world,
                                                           lr=0.1, momentum=0.9))

    def powersgd(state):
        def wrap(model):
            ddp = DistributedDataParallel(model, process_group=world)
            ddp.register_comm_hook(state, powersgd_hook)
            return ddp
        return wrap

    out["powersgd default start"] = _train(powersgd(PowerSGDState(world)))
    out["powersgd start 2"] = _train(powersgd(PowerSGDState(
        process_group=world, matrix_approximation_rank=1, start_powerSGD_iter=2)))
    state = PowerSGDState(None, 1, 2)
    out["powersgd positional"] = (state.process_group, state.matrix_approximation_rank,
                                  state.start_powerSGD_iter, PowerSGDState().start_powerSGD_iter)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    converted = ParallelSyncBatchNorm.convert_sync_batchnorm(model, process_group=world)
    out["sync bn"] = (type(converted[1]).__name__, converted[1].process_group is world,
                      SyncBatchNorm(4, process_group=world).process_group is world,
                      ParallelSyncBatchNorm is SyncBatchNorm, _nn_refusal())
    out["errors"] = {
        "zero group=": _error(lambda: ZeroRedundancyOptimizer(
            _model().parameters(), optim.SGD, group=world, lr=0.1)),
        "hybrid": _error(lambda: FullyShardedDataParallel(
            _model(), sharding_strategy=ShardingStrategy.HYBRID_SHARD)),
        "unknown": _error(lambda: FullyShardedDataParallel(_model(), sharding_strategy="ZERO9")),
        "powersgd int first": _error(lambda: PowerSGDState(5)),
        "ddp bucket_mb": _error(lambda: DistributedDataParallel(_model(), bucket_mb=1)),
        "ddp cap 0": _error(lambda: DistributedDataParallel(_model(), bucket_cap_mb=0)),
    }
    return out


@pytest.mark.timeout(240)
def test_strategies_take_torch_s_keywords():
    results = minidist.launch(_script, world_size=2, transport="shm", timeout=120)
    for out in results:
        ddp = out["ddp defaults"]
        np.testing.assert_array_equal(out["ddp torch keywords"], ddp)
        assert out["ddp buckets"][0] == 1 and out["ddp buckets"][1] > 1   # 25 MB: one bucket
        # NO_SHARD is DDP's computation: on two ranks, bit for bit.
        np.testing.assert_array_equal(out["fsdp NO_SHARD"], ddp)
        np.testing.assert_array_equal(out["fsdp NO_SHARD by name"], ddp)
        np.testing.assert_array_equal(out["fsdp FULL_SHARD enum"], out["fsdp FULL_SHARD default"])
        np.testing.assert_allclose(out["fsdp FULL_SHARD enum"], ddp, rtol=1e-5, atol=1e-6)
        assert out["fsdp strategy"] is ShardingStrategy.FULL_SHARD
        assert out["fsdp strategy"] == "FULL_SHARD"
        np.testing.assert_allclose(out["zero"], ddp, rtol=1e-5, atol=1e-6)
        # torch's default warm-up (1,000 steps) is plain all-reduce: DDP's bits.
        np.testing.assert_array_equal(out["powersgd default start"], ddp)
        assert not np.array_equal(out["powersgd start 2"], ddp)     # it compressed
        assert out["powersgd positional"] == (None, 1, 2, 1_000)
        assert out["sync bn"][:4] == ("SyncBatchNorm", True, True, True)
        assert "from minidist.parallel import SyncBatchNorm" in out["sync bn"][4]
        errors = out["errors"]
        assert "process_group= (torch's name), not group=" in errors["zero group="]
        assert "HYBRID_SHARD" in errors["hybrid"] and "not implemented" in errors["hybrid"]
        assert "'ZERO9' is not one" in errors["unknown"]
        assert errors["powersgd int first"].startswith("TypeError") and \
            "PowerSGDState(None, matrix_approximation_rank=2)" in errors["powersgd int first"]
        assert "unexpected keyword argument 'bucket_mb'" in errors["ddp bucket_mb"]
        assert "bucket_cap_mb must be positive" in errors["ddp cap 0"]
    np.testing.assert_array_equal(results[0]["ddp defaults"], results[1]["ddp defaults"])
