"""Krizhevsky's hybrid (lesson 10): convolutions data parallel, dense
layers model parallel, on the digits CNN of ``minidist.train``.

One launch per world size (1, 2, 4), tracing on, runs every case in the
workers: one SGD step of the hybrid (each rank its share of the batch), of
pure model parallel (DenseModelParallel: whole batch everywhere, convs
replicated) and of pure data parallel (DistributedDataParallel), each in a
trace region. The parent checks that the weights after the step equal the
single-process step on the whole batch (the dense shards assembled), and
that the bytes each rank sent in each region equal :func:`strategy_bytes`
exactly. A separate launch trains the CNN with the hybrid on 2 ranks and
compares with one process from the same seed.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import load_digits
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.model.hybrid import (
    DenseModelParallel,
    HybridParallel,
    all_gather_batch,
    format_strategy_table,
    strategy_bytes,
)
from minidist.train import build_model

BATCH, LR = 8, 0.1
RTOL, ATOL = 2e-5, 2e-6
WORLDS = (1, 2, 4)
INPUT_SHAPE = (1, 8, 8)


def _batch():
    x, y = load_digits(flatten=False)[:2]
    return np.ascontiguousarray(x[:BATCH], np.float32), y[:BATCH]


def _own(array):
    b = len(array) // dist.get_world_size()
    return array[dist.get_rank() * b:(dist.get_rank() + 1) * b]


def _sgd_step(model, forward, labels):
    optimizer = optim.SGD(model.parameters(), lr=LR)
    optimizer.zero_grad()
    loss = nn.CrossEntropyLoss()(forward(), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def _weights(model):
    return [p.data.copy() for p in model.parameters()]


def _worker():
    x, y = _batch()
    results = {}
    hybrid = HybridParallel(build_model("cnn"))
    labels = all_gather_batch(_own(y))
    with trace.region("hybrid step"):
        loss = _sgd_step(hybrid, lambda: hybrid(Tensor(_own(x))), labels)
    results["hybrid"] = dict(loss=loss, weights=_weights(hybrid), labels=labels)
    split = DenseModelParallel(build_model("cnn"))
    with trace.region("model_parallel step"):
        loss = _sgd_step(split, lambda: split(Tensor(x)), y)
    results["model_parallel"] = dict(loss=loss, weights=_weights(split))
    ddp = DistributedDataParallel(build_model("cnn"), algorithm="ring")
    with trace.region("data_parallel step"):
        _sgd_step(ddp, lambda: ddp(Tensor(_own(x))), _own(y))
    results["data_parallel"] = dict(weights=_weights(ddp))
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hybrid")
    outcome = {}
    for world in WORLDS:
        path = folder / f"hybrid{world}.jsonl"
        results = minidist.launch(_worker, world_size=world, trace=str(path), timeout=90)
        outcome[world] = (results, trace.read_jsonl(path).events)
    return outcome


def _single_step():
    model = build_model("cnn")
    x, y = _batch()
    loss = _sgd_step(model, lambda: model(Tensor(x)), y)
    return loss, _weights(model)


def _assemble(per_rank):
    """The whole model's weights from the ranks' (conv weights, bias x2,
    column weight and bias shards, row weight shard, row bias)."""
    first = per_rank[0]
    convs = first[:4]
    column_weight = np.concatenate([w[4] for w in per_rank], axis=0)
    column_bias = np.concatenate([w[5] for w in per_rank])
    row_weight = np.concatenate([w[6] for w in per_rank], axis=1)
    return convs + [column_weight, column_bias, row_weight, first[7]]


@pytest.mark.blas_kernel
@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("strategy", ["hybrid", "model_parallel", "data_parallel"])
def test_one_step_equals_the_single_process_step(runs, world, strategy):
    results, _ = runs[world]
    loss, expected = _single_step()
    per_rank = [r[strategy]["weights"] for r in results]
    for weights in per_rank[1:]:  # the replicated convolutions stay identical
        for mine, first in zip(weights[:4], per_rank[0][:4]):
            np.testing.assert_array_equal(mine, first)
    whole = per_rank[0] if strategy == "data_parallel" else _assemble(per_rank)
    for actual, wanted in zip(whole, expected, strict=True):
        assert actual.shape == wanted.shape
        np.testing.assert_allclose(actual, wanted, rtol=RTOL, atol=ATOL)
    if strategy != "data_parallel":
        for result in results:
            assert result[strategy]["loss"] == pytest.approx(loss, rel=1e-5)
    if strategy == "hybrid":
        np.testing.assert_array_equal(results[0]["hybrid"]["labels"], _batch()[1])


def _sent_in_region(events, rank, label, skip_calls=()):
    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and start <= e["start"] and e["end"] <= end
               and trace.label_info(e["label"]).get("call") not in skip_calls)


def _count_calls(events, rank, label):
    """The calls of DistributedDataParallel's 8-byte example count (an int64
    all_reduce), which strategy_bytes leaves out."""
    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    return {trace.label_info(e["label"]).get("call") for e in events
            if e["rank"] == rank and e["kind"] == "collective" and start <= e["start"]
            and e["end"] <= end and trace.label_info(e["label"]).get("itemsize") == 8}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", WORLDS)
def test_bytes_in_the_trace_equal_the_formula(runs, world):
    _, events = runs[world]
    table = strategy_bytes(build_model("cnn"), INPUT_SHAPE, BATCH, world)
    measured = {}
    for strategy in ("hybrid", "model_parallel", "data_parallel"):
        label = f"{strategy} step"
        sent = [_sent_in_region(events, rank, label,
                                _count_calls(events, rank, label)
                                if strategy == "data_parallel" else ())
                for rank in range(world)]
        assert tuple(sent) == table.bytes_per_rank(strategy), strategy
        measured[strategy] = sent[0]
    assert "bytes in trace" in format_strategy_table(table, measured)


def test_strategy_bytes_weights_against_activations():
    """The digits CNN at batch 64 on 2 ranks: the convolutions' weights are
    far fewer than their activations, the first dense layer's about equal."""
    table = strategy_bytes(build_model("cnn"), INPUT_SHAPE, 64, 2)
    conv1, conv2, dense1, dense2 = table.layers
    assert (conv1.weights, conv1.activations) == (16 * 9 + 16, 64 * 64)
    assert (conv2.weights, conv2.activations) == (32 * 16 * 9 + 32, 64 * 16 * 64)
    assert (dense1.weights, dense1.activations) == (512 * 64 + 64, 64 * 512)
    assert (dense2.weights, dense2.activations) == (64 * 10 + 10, 64 * 64)
    weights = sum(layer.weights for layer in table.layers)
    assert table.values("data_parallel") == weights  # ring all_reduce on 2 ranks: N values
    # Model parallel: features' gradient all_reduced (64 x 512), logits all_reduced (64 x 10).
    assert table.values("model_parallel") == 64 * 512 + 64 * 10
    # Hybrid: conv gradients + half the features each way + the logits.
    assert table.values("hybrid") == conv1.weights + conv2.weights + 2 * 32 * 512 + 64 * 10
    assert "weights/act." in str(table)
    with pytest.raises(ValueError, match="evenly"):
        strategy_bytes(build_model("cnn"), INPUT_SHAPE, 63, 2)


# --------------------------------------------------------------------------
# Training the digits CNN with the hybrid on 2 ranks

EPOCHS, TRAIN_BATCH, TRAIN_LR = 4, 32, 0.2


def _train(model, forward):
    x, y, x_test, y_test = load_digits(flatten=False)
    optimizer = optim.SGD(model.parameters(), lr=TRAIN_LR)
    loss_fn = nn.CrossEntropyLoss()
    order = np.random.default_rng(0)
    for _ in range(EPOCHS):
        indices = order.permutation(len(x))
        for start in range(0, len(x) - TRAIN_BATCH + 1, TRAIN_BATCH):
            rows = indices[start:start + TRAIN_BATCH]
            optimizer.zero_grad()
            logits, labels = forward(x[rows], y[rows])
            loss = loss_fn(logits, labels)
            loss.backward()
            optimizer.step()
    return loss.item(), x_test, y_test


def _hybrid_trainer():
    model = HybridParallel(build_model("cnn"))
    loss, x_test, y_test = _train(model, lambda x, y: (model(Tensor(_own(x))),
                                                       all_gather_batch(_own(y))))
    correct = (model(Tensor(_own(x_test[:354]))).data.argmax(axis=1) == y_test[:354]).mean()
    return float(correct), loss


@pytest.mark.timeout(180)
def test_digits_cnn_hybrid_on_two_ranks_trains_like_one_process():
    model = build_model("cnn")
    loss, x_test, y_test = _train(model, lambda x, y: (model(Tensor(x)), y))
    accuracy = float((model(Tensor(x_test[:354])).data.argmax(axis=1) == y_test[:354]).mean())
    results = minidist.launch(_hybrid_trainer, world_size=2, timeout=120)
    assert accuracy > 0.85
    for hybrid_accuracy, hybrid_loss in results:
        assert abs(hybrid_accuracy - accuracy) <= 1.5 / 354
        assert hybrid_loss == pytest.approx(loss, rel=1e-3)
