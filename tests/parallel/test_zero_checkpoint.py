"""Checkpoints of sharded models (ZeRO stage 1, FSDP stages 2 and 3, FSDP's NO_SHARD) round-trip.

``save_checkpoint`` gathers a sharded model's weights and optimizer state into
the file an unsharded model writes (one optimizer entry per parameter, the
optimizer's own class), so it loads into a plain model, and into a sharded
model on another world size. The test, for each stage with Adam on the digits
MLP, a global batch of 12 split evenly over the ranks:

* on 2 ranks: 2 steps, save, 1 more step (the continuation);
* a fresh sharded model (other initial weights) on 2 ranks loads it and takes
  the same step: *bit for bit* the continuation;
* the same on 3 ranks: within float32 round-off (another split of the batch
  sums the gradient in another order; atol 1e-6);
* a plain model and a plain Adam load it outside any launch: the weights are
  the gathered ones bit for bit, they and Adam's state are within round-off
  of one process's two steps on the whole batches, and one step on the whole
  batch is within round-off of the continuation.

NO_SHARD keeps every unit's whole flat buffer on every rank: its optimizer
state was gathered as if sharded, and saving failed (an all_gather of the
whole buffer into a buffer of its own size).
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim
from minidist.data import load_digits
from minidist.parallel.data.checkpoint_files import load_checkpoint, save_checkpoint
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.fsdp import FullyShardedDataParallel
from minidist.parallel.data.zero import ZeroRedundancyOptimizer
from minidist.train import build_model

GLOBAL_BATCH = 12


def _build(method, seed):
    model = build_model("mlp", seed=seed)
    if method == "zero1":
        wrapped = DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optim.Adam, lr=0.01)
    else:
        strategy = {"fsdp2": "SHARD_GRAD_OP", "fsdp3": "FULL_SHARD",
                    "fsdp_no_shard": "NO_SHARD"}[method]
        wrapped = FullyShardedDataParallel(model, sharding_strategy=strategy)
        optimizer = optim.Adam(wrapped.parameters(), lr=0.01)
    return model, wrapped, optimizer


def _batch(step):
    x, y = load_digits()[:2]
    return x[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH], \
        y[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]


def _step(wrapped, optimizer, step, rank, world_size):
    x, y = _batch(step)
    share = GLOBAL_BATCH // world_size
    optimizer.zero_grad(set_to_none=False)
    nn.CrossEntropyLoss()(wrapped(Tensor(x[rank * share:(rank + 1) * share])),
                          y[rank * share:(rank + 1) * share]).backward()
    optimizer.step()


def _weights(method, model, wrapped):
    arrays = wrapped.full_weights() if method != "zero1" else \
        [p.data.copy() for p in model.parameters()]
    return np.concatenate([a.reshape(-1) for a in arrays])


def _save_and_continue(method, path):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, wrapped, optimizer = _build(method, seed=0)
    for step in range(2):
        _step(wrapped, optimizer, step, rank, world_size)
    saved = _weights(method, model, wrapped)
    save_checkpoint(path, wrapped, optimizer, step=2)
    _step(wrapped, optimizer, 2, rank, world_size)
    return saved, _weights(method, model, wrapped)


def _load_and_continue(method, path):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, wrapped, optimizer = _build(method, seed=1)
    extra = load_checkpoint(path, wrapped, optimizer)
    loaded = _weights(method, model, wrapped)
    _step(wrapped, optimizer, extra["step"], rank, world_size)
    return loaded, _weights(method, model, wrapped)


@pytest.mark.blas_kernel
@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["zero1", "fsdp2", "fsdp3", "fsdp_no_shard"])
def test_sharded_checkpoint_round_trips(tmp_path, method):
    path = str(tmp_path / "ckpt.npz")
    saved, continued = minidist.launch(_save_and_continue, world_size=2, transport="shm",
                                       args=(method, path), timeout=60)[0]
    for world_size in (2, 3):
        results = minidist.launch(_load_and_continue, world_size=world_size, transport="shm",
                                  args=(method, path), timeout=60)
        for loaded, after in results:
            np.testing.assert_array_equal(loaded, saved)
            if world_size == 2:
                np.testing.assert_array_equal(after, continued)
            else:
                np.testing.assert_allclose(after, continued, rtol=0, atol=1e-6)

    # The same file in a plain model: the unsharded format.
    model = build_model("mlp", seed=3)
    adam = optim.Adam(model.parameters(), lr=0.01)
    extra = load_checkpoint(path, model, adam)
    flat = np.concatenate([p.data.reshape(-1) for p in model.parameters()])
    np.testing.assert_array_equal(flat, saved)
    assert all(adam.state[i]["exp_avg"].shape == p.data.shape
               for i, p in enumerate(model.parameters()))
    # ... equal to one process's two steps on the whole batches, weights and
    # Adam's state (float32 round-off: the ranks' halves summed in another order).
    alone = build_model("mlp", seed=0)
    alone_adam = optim.Adam(alone.parameters(), lr=0.01)
    for step in range(2):
        _step(alone, alone_adam, step, 0, 1)
    np.testing.assert_allclose(
        flat, np.concatenate([p.data.reshape(-1) for p in alone.parameters()]), rtol=0,
        atol=1e-6)
    for index in range(len(list(model.parameters()))):
        loaded_state, alone_state = adam.state[index], alone_adam.state[index]
        assert set(loaded_state) == set(alone_state)
        for name, value in alone_state.items():
            np.testing.assert_allclose(np.asarray(loaded_state[name]), np.asarray(value),
                                       rtol=1e-5, atol=1e-7, err_msg=f"{index} {name}")
    x, y = _batch(extra["step"])
    adam.zero_grad()
    nn.CrossEntropyLoss()(model(Tensor(x)), y).backward()
    adam.step()
    flat = np.concatenate([p.data.reshape(-1) for p in model.parameters()])
    np.testing.assert_allclose(flat, continued, rtol=0, atol=1e-6)
