"""Activation recomputation must change memory, never results.

The same model trained a few steps with and without recomputation gives the
same outputs, gradients, running statistics and weights, bit for bit, with
Dropout (masks from the default generator and from a layer's own) and
BatchNorm in the model; under DistributedDataParallel on 2 ranks too. And
the graph kept for the backward is smaller.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
from minidist import Tensor, enable_grad, nn, no_grad, optim
from minidist.data import load_digits
from minidist.nn.recompute import (
    CheckpointedSequential,
    ForwardState,
    checkpoint,
    checkpoint_sequential,
    kept_for_backward,
    segment_layers,
)

# Values through BLAS, compared exactly or to a rounding: run again on Haswell kernels by .ci/run.
pytestmark = pytest.mark.blas_kernel

STEPS = 3


def _mlp():
    nn.init.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3),
        nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.2, rng=5),
        nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 10))


def _cnn():
    nn.init.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.ReLU(), nn.Dropout(0.1, rng=7),
        nn.Linear(32, 10))


def _batches(kind):
    x, y, _, _ = load_digits(flatten=(kind == "mlp"))
    return [(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(STEPS)]


FORWARDS = {
    "plain": lambda model, x: model(x),
    "sequential-2": lambda model, x: checkpoint_sequential(model, 2, x),
    "sequential-4": lambda model, x: checkpoint_sequential(model, 4, x),
    "wrapper-every-1": lambda model, x: CheckpointedSequential(model, every=1)(x),
    "wrapper-every-3": lambda model, x: CheckpointedSequential(model, every=3)(x),
}


def _train(kind, forward):
    model = _mlp() if kind == "mlp" else _cnn()
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nn.init.manual_seed(1)
    record = []
    for x, y in _batches(kind):
        optimizer.zero_grad()
        out = forward(model, Tensor(x))
        loss = nn.CrossEntropyLoss()(out, y)
        loss.backward()
        record.append(out.data.copy())
        record.extend(p.grad.copy() for p in model.parameters())
        optimizer.step()
    record.extend(np.array(t) for t in model.state_dict().values())
    record.append(nn.init.default_generator().random(4))  # the stream goes on unchanged
    return record


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("how", [name for name in FORWARDS if name != "plain"])
def test_same_bits_as_without_recomputation(kind, how):
    expected = _train(kind, FORWARDS["plain"])
    got = _train(kind, FORWARDS[how])
    assert len(got) == len(expected)
    for index, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{kind} {how}: item {index} differs"


def test_batchnorm_counts_one_update_per_forward():
    model = _mlp()
    out = checkpoint_sequential(model, 3, Tensor(_batches("mlp")[0][0]))
    out.sum().backward()
    assert int(model[1].num_batches_tracked.data) == 1


def test_input_gradient_and_checkpoint_of_a_function():
    model = _mlp()
    x = _batches("mlp")[0][0]
    nn.init.manual_seed(3)
    plain_input = Tensor(x, requires_grad=True)
    model(plain_input).sum().backward()
    plain = [plain_input.grad.copy()] + [p.grad.copy() for p in model.parameters()]
    model = _mlp()  # fresh: Dropout(rng=5) has advanced its own generator
    nn.init.manual_seed(3)
    inputs = Tensor(x, requires_grad=True)
    head, tail = model[0:5], model[5:]
    out = tail(checkpoint(lambda t: head(t), inputs, modules=head))
    out.sum().backward()
    got = [inputs.grad] + [p.grad for p in model.parameters()]
    assert all(np.array_equal(a, b) for a, b in zip(got, plain))


def test_outside_grad_mode_it_is_a_plain_forward():
    model = _mlp().eval()
    x = Tensor(_batches("mlp")[0][0])
    with no_grad():
        out = checkpoint_sequential(model, 2, x)
    assert not out.requires_grad and np.array_equal(out.data, model(x).data)


def test_replay_restores_generators_and_buffers():
    model = _mlp()
    x = Tensor(_batches("mlp")[0][0])
    state = ForwardState(model)
    with no_grad():
        first = model(x).data
    stats = model[1].running_mean.data.copy()
    after = nn.init.default_generator().bit_generator.state
    with state.replay(), enable_grad():
        again = model(x)
    assert again.requires_grad and np.array_equal(again.data, first)
    assert np.array_equal(model[1].running_mean.data, stats)
    assert nn.init.default_generator().bit_generator.state == after


def test_segments_and_wrapper_keep_names():
    model = _mlp()
    assert [len(s) for s in segment_layers(model, 3)] == [4, 4, 2]
    assert [len(s) for s in segment_layers(model, 20)] == [1] * 10
    wrapped = CheckpointedSequential(model, every=2)
    assert list(wrapped.state_dict()) == list(model.state_dict())
    with pytest.raises(ValueError, match="every"):
        CheckpointedSequential(model, every=0)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_keeps_fewer_activations(kind):
    """Walk the graph: the arrays (node outputs, masks, im2col columns, ...)
    held for backward, with and without recomputation."""
    model = _mlp() if kind == "mlp" else _cnn()
    x = Tensor(_batches(kind)[0][0].copy())  # not a view: its base is the whole data set
    plain_count, plain_bytes = kept_for_backward(model(x))
    segments = 3
    count, nbytes = kept_for_backward(checkpoint_sequential(model, segments, x))
    # Kept: the input and each checkpoint node's output (the next segment's
    # input), then only the last segment's own graph.
    *recomputed, last = segment_layers(model, segments)
    with no_grad():
        last_input = nn.Sequential(*[layer for group in recomputed for layer in group])(x)
    tail_count, _ = kept_for_backward(nn.Sequential(*last)(Tensor(last_input.data,
                                                                  requires_grad=True)))
    assert count == tail_count + len(recomputed)
    assert count < plain_count and nbytes < plain_bytes
    print(f"{kind}: {plain_count} arrays {plain_bytes} B kept without, {count} arrays "
          f"{nbytes} B with recomputation")
    assert nbytes < plain_bytes / 2


# ------------------------------------------------------------------ DDP, 2 ranks

def _ddp_worker():
    from minidist.parallel.data.ddp import DistributedDataParallel

    rank = minidist.distributed.get_rank()
    weights = {}
    for recompute in (False, True):
        model = _cnn()
        if recompute:
            model = CheckpointedSequential(model, every=3)
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.004)
        optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        nn.init.manual_seed(10 + rank)  # different masks per rank, the same with and without
        for x, y in _batches("cnn"):
            x, y = x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8]
            optimizer.zero_grad(set_to_none=False)
            nn.CrossEntropyLoss()(ddp(Tensor(x)), y).backward()
            optimizer.step()
        weights[recompute] = [np.array(t) for t in model.state_dict().values()]
    return weights, len(ddp.buckets), [p.data.copy() for p in model.parameters()]


@pytest.mark.timeout(120)
def test_ddp_two_ranks_same_weights():
    results = minidist.launch(_ddp_worker, world_size=2, transport="shm", timeout=60)
    for rank, (weights, buckets, _) in enumerate(results):
        assert buckets > 1
        for a, b in zip(weights[True], weights[False]):
            assert np.array_equal(a, b), f"rank {rank}: weights differ with recomputation"
    # The parameters agree across ranks (BatchNorm's statistics stay local).
    assert all(np.array_equal(a, b) for a, b in zip(results[0][2], results[1][2]))
