"""SyncBatchNorm on uneven shards must equal one BatchNorm on the global batch.

One launch per world size (2, 3, 4), traced, runs every case inside the
workers: a SyncBatchNorm on (N, C) input, one without affine parameters and
with momentum=None, and a small conv net (Conv2d, BatchNorm2d, ReLU)
converted by ``convert_sync_batchnorm`` on (N, C, H, W) images. The shards
are small and uneven, one rank holding no samples at all. Two training steps,
then one evaluation step. Each rank returns its shard of the outputs and
input gradients, its local parameter gradients (their sum over ranks is the
global gradient), its running statistics, and how many messages it sent or
received while evaluating, and the bytes its trace's send events carry in
each step's forward and backward. The parent compares with a single-process
BatchNorm on the concatenated batch, shows that plain BatchNorm on the
same shards is far off, and checks the bytes against
:func:`sync_batchnorm_bytes`.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, trace
from minidist.parallel.data.sync_batchnorm import SyncBatchNorm, sync_batchnorm_bytes

WORLD_SIZES = (2, 3, 4)
STEPS = 2
CHANNELS = 3
# Per-rank batch sizes: uneven, and a rank with none from 3 ranks on.
VECTOR_SHARDS = {2: [3, 5], 3: [4, 0, 3], 4: [2, 3, 0, 4]}
IMAGE_SHARDS = {2: [1, 3], 3: [2, 1, 0], 4: [1, 0, 2, 1]}
CASES = ("vectors", "vectors no affine, momentum None", "images through a converted net")


def _model(case, sync: bool):
    if case == "vectors":
        layer = nn.BatchNorm1d(CHANNELS, momentum=0.3)
        rng = np.random.default_rng(1)
        layer.weight.data[...] = rng.uniform(0.5, 1.5, CHANNELS)
        layer.bias.data[...] = rng.uniform(-1, 1, CHANNELS)
    elif case == "vectors no affine, momentum None":
        layer = nn.BatchNorm1d(CHANNELS, affine=False, momentum=None)
    else:
        layer = nn.Sequential(nn.Conv2d(2, CHANNELS, 3, padding=1, rng=5),
                              nn.BatchNorm2d(CHANNELS), nn.ReLU())
    return SyncBatchNorm.convert_sync_batchnorm(layer) if sync else layer


def _batches(case, world):
    """Per step: the global input and the weights of the loss sum(y * r)."""
    sizes = IMAGE_SHARDS[world] if case.startswith("images") else VECTOR_SHARDS[world]
    shape = (2, 4, 3) if case.startswith("images") else (CHANNELS,)
    out_shape = (CHANNELS, 4, 3) if case.startswith("images") else (CHANNELS,)
    rng = np.random.default_rng(world)
    total = sum(sizes)
    # Scaled and shifted per channel, so wrong statistics show.
    batches = [((rng.standard_normal((total,) + shape) * 3 + 2).astype(np.float32),
                rng.standard_normal((total,) + out_shape).astype(np.float32))
               for _ in range(STEPS + 1)]
    return sizes, batches


def _shard(array, sizes, rank):
    start = sum(sizes[:rank])
    return array[start:start + sizes[rank]].copy()


def _norm(model):
    return model if isinstance(model, nn.BatchNorm1d | SyncBatchNorm) else model[1]


def _run(model, batches, shard):
    """STEPS training steps and one evaluation step on this rank's shard."""
    steps = []
    recorder = trace.current()  # None in the parent's reference run
    events = recorder.events if recorder is not None else []
    start = len(events)
    sent = []
    for x, r in batches[:STEPS]:
        model.zero_grad()
        x = Tensor(shard(x), requires_grad=True)
        first = len(events)
        y = model(x)
        middle = len(events)
        (y * Tensor(shard(r))).sum().backward()
        sent.append((_sent_bytes(events[first:middle]), _sent_bytes(events[middle:])))
        grads = {name: p.grad.copy() for name, p in model.named_parameters()}
        steps.append((y.data.copy(), x.grad.copy(), grads))
    norm = _norm(model)
    stats = (norm.running_mean.data.copy(), norm.running_var.data.copy(),
             int(norm.num_batches_tracked.data))
    model.eval()
    collectives = sum(1 for event in events[start:] if dict(zip(trace.FIELDS, event))["kind"] == "collective")
    first = len(events)
    evaluated = model(Tensor(shard(batches[STEPS][0]))).data.copy()
    messages = sum(1 for event in events[first:]
                   if dict(zip(trace.FIELDS, event))["kind"] in ("send", "recv", "collective"))
    return dict(steps=steps, stats=stats, eval=evaluated, eval_messages=messages,
                train_collectives=collectives, sent=sent)


def _sent_bytes(events):
    """Bytes of the send events among ``events`` (this rank's trace)."""
    return sum(event["bytes"] for event in (dict(zip(trace.FIELDS, e)) for e in events)
               if event["kind"] == "send")


def _worker():
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for case in CASES:
        sizes, batches = _batches(case, world)

        def shard(array, sizes=sizes):
            return _shard(array, sizes, rank)

        model = _model(case, sync=True)
        assert isinstance(_norm(model), SyncBatchNorm)
        results[case] = _run(model, batches, shard)
        # Plain BatchNorm on the same shard: its own statistics (if it can).
        local = _model(case, sync=False)
        count = sizes[rank] * (12 if case.startswith("images") else 1)
        results[case]["local"] = (local(Tensor(shard(batches[0][0]))).data.copy()
                                  if count > 1 else None)
    return results


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda p: f"world{p}")
def run(request, tmp_path_factory):
    world = request.param
    path = tmp_path_factory.mktemp("syncbn") / f"syncbn{world}.jsonl"
    return world, minidist.launch(_worker, world_size=world, transport="shm", trace=str(path))


def _close(name, got, want, tolerance=2e-5):
    scale = 1.0 + float(np.abs(want).max())
    error = float(np.abs(got - want).max()) if want.size else 0.0
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert error <= tolerance * scale, f"{name}: max error {error:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("case", CASES)
def test_sync_batchnorm_equals_batchnorm_on_the_global_batch(run, case):
    world, results = run
    ranks = [results[rank][case] for rank in range(world)]
    _, batches = _batches(case, world)
    reference = _run(_model(case, sync=False), batches, lambda array: array.copy())
    for step in range(STEPS):
        name = f"{case}, world {world}, step {step}"
        want_y, want_grad_x, want_grads = reference["steps"][step]
        _close(f"{name}: output", np.concatenate([r["steps"][step][0] for r in ranks]), want_y)
        _close(f"{name}: input gradient",
               np.concatenate([r["steps"][step][1] for r in ranks]), want_grad_x)
        for parameter, want in want_grads.items():
            # Each rank's gradient is over its shard; the sum is the global one.
            total = sum(r["steps"][step][2][parameter] for r in ranks)
            _close(f"{name}: gradient of {parameter}", total, want, tolerance=1e-4)
    for rank, result in enumerate(ranks):
        for got, want, what in zip(result["stats"], reference["stats"],
                                   ("running_mean", "running_var", "num_batches_tracked")):
            _close(f"{case}, rank {rank}: {what}", np.asarray(got), np.asarray(want))
        # Training: one all_reduce forward and one backward per step.
        assert result["train_collectives"] == 2 * STEPS
        assert result["eval_messages"] == 0, "evaluation must not communicate"
    _close(f"{case}: evaluation output", np.concatenate([r["eval"] for r in ranks]),
           reference["eval"])


@pytest.mark.parametrize("case", CASES)
def test_local_batchnorm_on_the_same_shards_is_far_off(run, case):
    world, results = run
    sizes, batches = _batches(case, world)
    reference = _run(_model(case, sync=False), batches, lambda array: array.copy())
    difference = 0.0
    for rank in range(world):
        local = results[rank][case]["local"]
        if local is not None:
            want = _shard(reference["steps"][0][0], sizes, rank)
            difference = max(difference, float(np.abs(local - want).max()))
    assert difference > 0.1, f"{case}: local BatchNorm differs by only {difference:.3g}"


@pytest.mark.parametrize("case", CASES)
def test_bytes_in_the_trace_equal_the_formula(run, case):
    """Per rank and per step, the bytes of the send events in forward (the
    all_reduce of [sum x | sum x^2 | count], 2C + 1 float64) and in backward
    ([sum g | sum g x_hat], 2C float64) equal :func:`sync_batchnorm_bytes`
    exactly. With C = 3 the 7 and 6 values split into uneven ring chunks on
    2, 3 and 4 ranks (forward on every world size), so ranks send different
    amounts and a formula off by one chunk fails."""
    world, results = run
    forward, backward = sync_batchnorm_bytes(CHANNELS, world)
    for rank in range(world):
        assert results[rank][case]["sent"] == [(forward[rank], backward[rank])] * STEPS, rank
    assert (2 * CHANNELS + 1) % world != 0
    if world > 2:
        assert len(set(forward)) > 1  # the ranks' shares differ: uneven chunks


def test_sync_batchnorm_bytes_formula_by_hand():
    # 7 values on 4 ranks: chunks 2, 2, 2, 1; rank r sends 14 - c[r+1] - c[r+2].
    # 6 values: chunks 2, 2, 1, 1, rank r sends 12 - c[r+1] - c[r+2].
    assert sync_batchnorm_bytes(3, 4, itemsize=1) == ((10, 11, 11, 10), (9, 10, 9, 8))
    # On 2 ranks the ring sends the whole array once: 8 bytes a value.
    assert sync_batchnorm_bytes(3, 2) == ((56, 56), (48, 48))
    assert sync_batchnorm_bytes(3, 1) == ((0,), (0,))


def test_convert_sync_batchnorm_replaces_and_keeps_state():
    model = nn.Sequential(nn.Conv2d(2, 4, 3, rng=0), nn.BatchNorm2d(4, momentum=0.2),
                          nn.ReLU(), nn.Flatten(),
                          nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5, eps=1e-3)))
    inner = model[4][1]
    inner.eval()
    rng = np.random.default_rng(0)
    for norm in (model[1], inner):
        norm.running_mean.data[...] = rng.standard_normal(norm.num_features)
        norm.running_var.data[...] = rng.uniform(0.5, 2, norm.num_features)
        norm.num_batches_tracked.data[...] = 7
    before = {name: np.array(value) for name, value in model.state_dict().items()}
    weights = [model[1].weight, model[1].bias, inner.weight, inner.bias]

    converted = SyncBatchNorm.convert_sync_batchnorm(model)

    assert converted is model
    assert isinstance(model[1], SyncBatchNorm) and isinstance(model[4][1], SyncBatchNorm)
    assert model[1].momentum == 0.2 and model[4][1].eps == 1e-3
    assert [model[1].weight, model[1].bias, model[4][1].weight, model[4][1].bias] == weights
    assert model[1].training and not model[4][1].training
    after = model.state_dict()
    assert sorted(after) == sorted(before)
    for name, value in before.items():
        np.testing.assert_array_equal(np.asarray(after[name]), value, err_msg=name)
    # A bare BatchNorm comes back as a new SyncBatchNorm.
    bare = nn.BatchNorm1d(3, affine=False, track_running_stats=False)
    replaced = SyncBatchNorm.convert_sync_batchnorm(bare)
    assert isinstance(replaced, SyncBatchNorm) and replaced is not bare
    assert replaced.weight is None and replaced.running_mean is None


def test_outside_a_run_sync_batchnorm_is_batchnorm():
    x = np.random.default_rng(3).standard_normal((6, 3, 2, 2)).astype(np.float32)
    plain, sync = nn.BatchNorm2d(3), SyncBatchNorm(3)
    np.testing.assert_allclose(sync(Tensor(x)).data, plain(Tensor(x)).data, rtol=1e-6)
    np.testing.assert_allclose(sync.running_var.data, plain.running_var.data, rtol=1e-6)
    with pytest.raises(ValueError, match="SyncBatchNorm\\(3\\) expects input"):
        sync(Tensor(np.zeros((2, 4), np.float32)))
