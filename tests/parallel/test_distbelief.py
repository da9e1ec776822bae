"""DistBelief-style model parallel (lesson 10): every layer's units
partitioned over the workers, activations and gradients exchanged with
all_to_all, must compute what the unsplit net computes, and send exactly
the bytes :func:`distbelief_bytes` says.

One launch per world size (1, 2, 3, 4), tracing on, runs every case: the
partitioned MLP 12 -> 24 -> 36 -> 12 (widths divisible by 1-4) forward and
backward against the unsplit float64 net (outputs, every weight and bias
gradient assembled from the partitions, the input gradient summed over the
workers' partial ones), the collectives of each pass, the bytes of each
pass against the formula, and the error for a width that does not divide.
A separate launch trains the digits MLP on 2 workers against one process.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import load_digits
from minidist.parallel.model.distbelief import DistBeliefMLP, PartitionedLinear, distbelief_bytes

SIZES = (12, 24, 36, 12)
BATCH = 5
RTOL, ATOL = 2e-5, 2e-6
WORLDS = (1, 2, 3, 4)


def _linears(dtype=np.float32):
    return [nn.Linear(a, b, rng=10 + i).to(dtype) for i, (a, b) in enumerate(zip(SIZES, SIZES[1:]))]


def _data():
    rng = np.random.default_rng(3)
    return (rng.normal(size=(BATCH, SIZES[0])).astype(np.float32),
            rng.normal(size=(BATCH, SIZES[-1])).astype(np.float32))


def _worker():
    model = DistBeliefMLP.from_linears(_linears())
    x, upstream = _data()
    xt = Tensor(x, requires_grad=True)
    with trace.region("distbelief forward"):
        y = model(xt)
    with trace.region("distbelief backward"):
        (y * Tensor(upstream)).sum().backward()
    error = None
    if dist.get_world_size() > 1:
        try:
            PartitionedLinear(4, dist.get_world_size() + 1, rng=0)
        except ValueError as caught:
            error = str(caught)
    # From sizes with the default generator: the same partitions of one net on every worker.
    nn.init.manual_seed(7)
    seeded = DistBeliefMLP((4, 12, 12))
    return dict(y=y.data, x_grad=xt.grad,
                grads=[(layer.weight.grad, layer.bias.grad) for layer in model.layers],
                units=[(layer.units.start, layer.units.stop) for layer in model.layers],
                error=error, seeded=[layer.weight.data for layer in seeded.layers])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("distbelief")
    outcome = {}
    for world in WORLDS:
        path = folder / f"distbelief{world}.jsonl"
        results = minidist.launch(_worker, world_size=world, trace=str(path), timeout=60)
        outcome[world] = (results, trace.read_jsonl(path).events)
    return outcome


def _unsplit():
    linears = _linears(np.float64)
    x, upstream = _data()
    xt = Tensor(x.astype(np.float64), requires_grad=True)
    h = xt
    for index, layer in enumerate(linears):
        h = layer(h)
        if index < len(linears) - 1:
            h = h.relu()
    (h * Tensor(upstream.astype(np.float64))).sum().backward()
    return h.data, xt.grad, linears


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.blas_kernel
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", WORLDS)
def test_partitioned_mlp_equals_the_unsplit_mlp(runs, world):
    results, _ = runs[world]
    y, x_grad, linears = _unsplit()
    for rank, result in enumerate(results):
        assert result["y"].dtype == np.float32
        _close(result["y"], y)  # the whole logits on every worker
        for layer, (start, stop) in enumerate(result["units"]):
            width = SIZES[layer + 1] // world
            assert (start, stop) == (rank * width, (rank + 1) * width)
    # Each worker's input gradient is the part that flowed through its units.
    _close(sum(r["x_grad"] for r in results), x_grad)
    for layer, linear in enumerate(linears):
        _close(np.concatenate([r["grads"][layer][0] for r in results]), linear.weight.grad)
        _close(np.concatenate([r["grads"][layer][1] for r in results]), linear.bias.grad)


def _region(events, rank, label):
    return next((e["start"], e["end"]) for e in events
                if e["rank"] == rank and e["kind"] == "compute" and e["label"] == label)


def _inside(events, rank, region, kind):
    start, end = region
    return [e for e in events if e["rank"] == rank and e["kind"] == kind
            and start <= e["start"] and e["end"] <= end]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_exchanges_and_bytes_equal_the_formula(runs, world):
    _, events = runs[world]
    table = distbelief_bytes(SIZES, BATCH, world)
    for rank in range(world):
        forward = _region(events, rank, "distbelief forward")
        backward = _region(events, rank, "distbelief backward")
        calls = [[trace.label_info(e["label"])["collective"]
                  for e in _inside(events, rank, region, "collective")]
                 for region in (forward, backward)]
        if world == 1:
            assert calls == [[], []]
        else:
            # Two hidden layers: two exchanges of activations, then the logits' all_gather;
            # backward: two exchanges of gradients (the logits' gather needs none).
            assert calls == [["all_to_all", "all_to_all", "all_gather"],
                             ["all_to_all", "all_to_all"]]
        sent = [sum(e["bytes"] for e in _inside(events, rank, region, "send"))
                for region in (forward, backward)]
        assert sent == [sum(table.forward) * 4, sum(table.backward) * 4], rank


def test_distbelief_bytes_formula():
    table = distbelief_bytes((64, 128, 10), batch=64, world_size=2)
    assert table.forward == (64 * 64, 64 * 5) and table.backward == (64 * 64, 0)
    assert table.bytes == 4 * (2 * 64 * 64 + 64 * 5)
    # Data parallel moves every weight gradient: 64*128 + 128 + 128*10 + 10 values.
    assert table.data_parallel_values == 64 * 128 + 128 + 128 * 10 + 10
    with pytest.raises(ValueError, match="divide"):
        distbelief_bytes((64, 128, 10), batch=8, world_size=4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_width_that_does_not_divide_names_it(runs, world):
    error = runs[world][0][0]["error"]
    assert f"out_features={world + 1}" in error and f"over {world} workers" in error


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", WORLDS)
def test_built_from_sizes_the_partitions_are_pieces_of_one_net(runs, world):
    nn.init.manual_seed(7)
    whole = [nn.Linear(4, 12), nn.Linear(12, 12)]
    results, _ = runs[world]
    for layer, linear in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([r["seeded"][layer] for r in results]),
                                      linear.weight.data)


# --------------------------------------------------------------------------
# Training the digits MLP partitioned over 2 workers

HIDDEN, EPOCHS, DIGITS_BATCH, LR = 64, 8, 64, 0.3


def _digits_linears():
    nn.init.manual_seed(0)
    return [nn.Linear(64, HIDDEN), nn.Linear(HIDDEN, 10)]


def _train(model):
    x, y, x_test, y_test = load_digits()
    optimizer = optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    order = np.random.default_rng(0)
    for _ in range(EPOCHS):
        indices = order.permutation(len(x))
        for start in range(0, len(x), DIGITS_BATCH):
            rows = indices[start:start + DIGITS_BATCH]
            optimizer.zero_grad()
            loss = loss_fn(model(Tensor(x[rows])), y[rows])
            loss.backward()
            optimizer.step()
    predictions = model(Tensor(x_test)).data.argmax(axis=1)
    return float((predictions == y_test).mean()), loss.item()


def _digits_worker():
    return _train(DistBeliefMLP.from_linears(_digits_linears()))


@pytest.mark.timeout(120)
def test_digits_mlp_on_two_workers_trains_like_one_process():
    first, second = _digits_linears()
    accuracy, loss = _train(nn.Sequential(first, nn.ReLU(), second))
    results = minidist.launch(_digits_worker, world_size=2, timeout=60)
    assert accuracy > 0.9
    for split_accuracy, split_loss in results:
        assert abs(split_accuracy - accuracy) <= 1.5 / 355
        assert split_loss == pytest.approx(loss, rel=1e-3)
