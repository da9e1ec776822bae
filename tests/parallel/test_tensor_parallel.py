"""Tensor parallel layers must compute what the unsplit layer computes, and send
exactly the bytes the formula says (lessons 10 and 17).

One launch per world size (1, 2, 3, 4; and 2 on the pipe transport), with
tracing on, runs every case inside the workers:

* each split (column with gather_output False/True, row with
  input_is_parallel True/False), with and without bias, in float32, built
  with ``from_linear`` from one seeded ``nn.Linear``: the parent assembles
  the output, the input gradient and the weight and bias gradients from the
  ranks' shards and compares them with the unsplit layer;
* the MLP block (column, ReLU, row) against the unsplit 2-layer MLP, and
  its messages: one all_reduce in forward, one in backward;
* the bytes: Dettmers' 1000 -> 500 layer at batch 128 (999 -> 501 on 3
  ranks, which must divide both) for data parallel and each split, each
  pass in a trace region; the bytes of each rank's send events in the
  region must equal :func:`split_bytes` exactly;
* shapes that do not divide: the error names the layer, the dimension and
  the world size.

A separate launch trains the digits MLP with the column/row pair on 2 ranks
and compares with single-process training from the same seed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import load_digits
from minidist.parallel.model.costs import STRATEGIES, format_table, split_bytes
from minidist.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear

IN, OUT, BATCH = 12, 24, 5  # 12 and 24 divide by 1, 2, 3 and 4
HIDDEN = 24
RTOL, ATOL = 2e-5, 2e-6  # float32 round-off: the split sums in another order
LAUNCHES = [(1, "shm"), (2, "shm"), (3, "shm"), (4, "shm"), (2, "pipe")]
SPLITS = [("column", dict(gather_output=False)), ("column", dict(gather_output=True)),
          ("row", dict(input_is_parallel=True)), ("row", dict(input_is_parallel=False))]


def _linear(in_features, out_features, bias=True, seed=0):
    return nn.Linear(in_features, out_features, bias=bias, rng=seed)


def _data(batch, in_features, out_features, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, in_features)).astype(np.float32)
    upstream = rng.normal(size=(batch, out_features)).astype(np.float32)
    return x, upstream


def _own_columns(array, rank, world):
    width = array.shape[-1] // world
    return array[..., rank * width:(rank + 1) * width]


def _split_layer(kind, flags, bias):
    full = _linear(IN, OUT, bias=bias)
    if kind == "column":
        return ColumnParallelLinear.from_linear(full, **flags)
    return RowParallelLinear.from_linear(full, **flags)


def _run_split(kind, flags, bias):
    rank, world = dist.get_rank(), dist.get_world_size()
    layer = _split_layer(kind, flags, bias)
    x, upstream = _data(BATCH, IN, OUT)
    split_input = kind == "row" and flags["input_is_parallel"]
    split_output = kind == "column" and not flags["gather_output"]
    xt = Tensor(_own_columns(x, rank, world).copy() if split_input else x, requires_grad=True)
    y = layer(xt)
    g = _own_columns(upstream, rank, world) if split_output else upstream
    (y * Tensor(g)).sum().backward()
    return dict(y=y.data, x_grad=xt.grad, weight_grad=layer.weight.grad,
                bias_grad=None if layer.bias is None else layer.bias.grad,
                shard=(layer.shard.start, layer.shard.stop))


def _run_mlp(group=None, name="mlp"):
    first, second = _linear(IN, HIDDEN, seed=2), _linear(HIDDEN, IN, seed=3)
    block = nn.Sequential(ColumnParallelLinear.from_linear(first, group=group), nn.ReLU(),
                          RowParallelLinear.from_linear(second, group=group))
    x, upstream = _data(BATCH, IN, IN, seed=4)
    xt = Tensor(x, requires_grad=True)
    with trace.region(f"{name} forward"):
        y = block(xt)
    with trace.region(f"{name} backward"):
        (y * Tensor(upstream)).sum().backward()
    return dict(y=y.data, x_grad=xt.grad,
                grads=[p.grad for p in block.parameters()])


def _bytes_shape(world):
    return (1000, 500, 128) if 1000 % world == 0 and 500 % world == 0 else (999, 501, 128)


def _run_bytes():
    """Each strategy's forward and backward in regions named for the trace."""
    rank, world = dist.get_rank(), dist.get_world_size()
    in_features, out_features, batch = _bytes_shape(world)
    full = _linear(in_features, out_features, bias=False, seed=5)
    x, upstream = _data(batch, in_features, out_features, seed=6)
    layers = {
        "column": ColumnParallelLinear.from_linear(full, gather_output=True),
        "row": RowParallelLinear.from_linear(full, input_is_parallel=False),
        "column_split_output": ColumnParallelLinear.from_linear(full),
        "row_split_input": RowParallelLinear.from_linear(full),
    }
    for name in STRATEGIES:
        if name == "data_parallel":
            layer, rows = full, np.array_split(np.arange(batch), world)[rank]
            inputs, grad = x[rows], upstream[rows]
        else:
            layer = layers[name]
            inputs = _own_columns(x, rank, world) if name == "row_split_input" else x
            grad = _own_columns(upstream, rank, world) if name == "column_split_output" else upstream
        xt = Tensor(np.ascontiguousarray(inputs), requires_grad=True)
        with trace.region(f"bytes {name} forward"):
            y = layer(xt)
        with trace.region(f"bytes {name} backward"):
            (y * Tensor(grad)).sum().backward()
            if name == "data_parallel":
                dist.all_reduce(full.weight.grad, algorithm="ring")


def _errors():
    """Shapes that do not divide, on every world size but 1."""
    messages = []
    world = dist.get_world_size()
    attempts = [lambda: ColumnParallelLinear(4, world + 1, rng=0),
                lambda: RowParallelLinear.from_linear(_linear(world + 1, 3)),
                lambda: ColumnParallelLinear.from_linear(_linear(3, 2 * world + 1),
                                                         gather_output=True)]
    for attempt in attempts:
        try:
            attempt()
        except ValueError as error:
            messages.append(str(error))
        else:
            messages.append(None)
    return messages


def _worker():
    splits = {(kind, tuple(flags.items()), bias): _run_split(kind, flags, bias)
              for kind, flags in SPLITS for bias in (True, False)}
    mlp = _run_mlp()
    _run_bytes()
    errors = _errors() if dist.get_world_size() > 1 else []
    grouped = None
    if dist.get_world_size() == 4:
        # Two tensor-parallel pairs side by side, as in a hybrid layout.
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        grouped = _run_mlp(pairs[dist.get_rank() // 2], "grouped mlp")
    return dict(splits=splits, mlp=mlp, errors=errors, grouped=grouped)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(world, transport) -> (per-rank results, trace events)."""
    folder = tmp_path_factory.mktemp("tensor_parallel")
    outcome = {}
    for world, transport in LAUNCHES:
        path = folder / f"tp{world}{transport}.jsonl"
        results = minidist.launch(_worker, world_size=world, transport=transport,
                                  trace=str(path), timeout=60)
        outcome[world, transport] = (results, trace.read_jsonl(path).events)
    return outcome


def _reference(kind, flags, bias):
    full = _linear(IN, OUT, bias=bias).to(np.float64)
    x, upstream = _data(BATCH, IN, OUT)
    xt = Tensor(x.astype(np.float64), requires_grad=True)
    y = full(xt)
    (y * Tensor(upstream.astype(np.float64))).sum().backward()
    return y.data, xt.grad, full.weight.grad, None if full.bias is None else full.bias.grad


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.blas_kernel
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world, transport", LAUNCHES)
@pytest.mark.parametrize("kind, flags", SPLITS, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={w}" for k, w in v.items()))
@pytest.mark.parametrize("bias", [True, False])
def test_split_equals_the_unsplit_layer(runs, world, transport, kind, flags, bias):
    results, _ = runs[world, transport]
    shards = [r["splits"][kind, tuple(flags.items()), bias] for r in results]
    y, x_grad, weight_grad, bias_grad = _reference(kind, flags, bias)
    for rank, shard in enumerate(shards):
        assert shard["y"].dtype == np.float32
        assert shard["shard"] == (rank * (OUT if kind == "column" else IN) // world,
                                  (rank + 1) * (OUT if kind == "column" else IN) // world)
    whole_output = kind == "row" or flags["gather_output"]
    whole_input = kind == "column" or not flags["input_is_parallel"]
    if whole_output:
        for shard in shards:
            _close(shard["y"], y)
    else:
        _close(np.concatenate([s["y"] for s in shards], axis=-1), y)
    if whole_input:
        for shard in shards:
            _close(shard["x_grad"], x_grad)
    else:
        _close(np.concatenate([s["x_grad"] for s in shards], axis=-1), x_grad)
    # Column split: the ranks hold rows of the (out, in) weight; row split: columns.
    axis = 0 if kind == "column" else 1
    _close(np.concatenate([s["weight_grad"] for s in shards], axis=axis), weight_grad)
    if not bias:
        assert all(s["bias_grad"] is None for s in shards)
    elif kind == "column":
        _close(np.concatenate([s["bias_grad"] for s in shards]), bias_grad)
    else:
        for shard in shards:  # replicated: the whole bias gradient on every rank
            _close(shard["bias_grad"], bias_grad)


def _regions(events, rank):
    return {e["label"]: (e["start"], e["end"]) for e in events
            if e["rank"] == rank and e["kind"] == "compute"}


def _sent_in(events, rank, region):
    start, end = region
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and start <= e["start"] and e["end"] <= end)


def _unsplit_mlp():
    first, second = (_linear(IN, HIDDEN, seed=2).to(np.float64),
                     _linear(HIDDEN, IN, seed=3).to(np.float64))
    x, upstream = _data(BATCH, IN, IN, seed=4)
    xt = Tensor(x.astype(np.float64), requires_grad=True)
    y = second(first(xt).relu())
    (y * Tensor(upstream.astype(np.float64))).sum().backward()
    return y.data, xt.grad, first, second


def _check_mlp(results, world):
    """The ranks' results (one tensor-parallel group, in rank order) against the unsplit MLP."""
    y, x_grad, first, second = _unsplit_mlp()
    width = HIDDEN // world
    for result in results:
        _close(result["y"], y)
        _close(result["x_grad"], x_grad)
    grads = [r["grads"] for r in results]  # column weight, bias; row weight, bias
    _close(np.concatenate([g[0] for g in grads], axis=0), first.weight.grad)
    _close(np.concatenate([g[1] for g in grads]), first.bias.grad)
    _close(np.concatenate([g[2] for g in grads], axis=1), second.weight.grad)
    for g in grads:
        _close(g[3], second.bias.grad)
        assert g[0].shape == (width, IN) and g[2].shape == (IN, width)


def _collectives_in(events, rank, region):
    start, end = region
    calls = [trace.label_info(e["label"]) for e in events
             if e["rank"] == rank and e["kind"] == "collective"
             and start <= e["start"] and e["end"] <= end]
    return [(c["collective"], c["algorithm"], c["world"]) for c in calls]


@pytest.mark.blas_kernel
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world, transport", LAUNCHES)
def test_mlp_block_equals_the_unsplit_mlp_with_one_all_reduce_per_pass(runs, world, transport):
    results, events = runs[world, transport]
    _check_mlp([r["mlp"] for r in results], world)
    for rank in range(world):
        regions = _regions(events, rank)
        for name in ("mlp forward", "mlp backward"):
            expected = [] if world == 1 else [("all_reduce", "ring", world)]
            assert _collectives_in(events, rank, regions[name]) == expected, (rank, name)


@pytest.mark.timeout(120)
def test_mlp_block_in_two_groups_of_two(runs):
    results, events = runs[4, "shm"]
    _check_mlp([r["grouped"] for r in results[:2]], 2)
    _check_mlp([r["grouped"] for r in results[2:]], 2)
    for rank in range(4):
        regions = _regions(events, rank)
        for name in ("grouped mlp forward", "grouped mlp backward"):
            assert _collectives_in(events, rank, regions[name]) == [("all_reduce", "ring", 2)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world, transport", LAUNCHES)
def test_bytes_in_the_trace_equal_the_formula(runs, world, transport):
    _, events = runs[world, transport]
    table = split_bytes(*_bytes_shape(world), world_size=world)
    measured = {}
    for row in table.rows:
        forward = [_sent_in(events, rank, _regions(events, rank)[f"bytes {row.name} forward"])
                   for rank in range(world)]
        backward = [_sent_in(events, rank, _regions(events, rank)[f"bytes {row.name} backward"])
                    for rank in range(world)]
        assert tuple(forward) == row.forward_bytes, (row.name, "forward")
        assert tuple(backward) == row.backward_bytes, (row.name, "backward")
        measured[row.name] = [f + b for f, b in zip(forward, backward)]
    text = format_table(table, measured)
    assert "bytes in trace" in text and "data parallel" in text


def test_dettmers_numbers():
    """Dettmers' example: 1000 x 500 weight, batch 128, 2 workers: data parallel moves the
    500,000-value gradient, the row split 128,000 values, the column split
    160,000; on 2 ranks the ring collectives send exactly those per rank."""
    table = split_bytes(1000, 500, 128, world_size=2)
    assert table["data_parallel"].payload == 500_000
    assert table["row"].payload == 128_000 == 128 * 500 + 128 * 500
    assert table["column"].payload == 160_000 == 128 * 250 + 128 * 1000
    for row in table.rows:
        assert row.values_per_rank == (row.payload,) * 2
        assert row.bytes_per_rank == (4 * row.payload,) * 2
    # On 4 ranks the ring sends 2 (n-1)/n N for an all_reduce and (n-1) pieces
    # for an all_gather.
    table = split_bytes(1000, 500, 128, world_size=4)
    assert table["data_parallel"].values_per_rank == (750_000,) * 4
    assert table["column"].forward_values == (3 * 128 * 125,) * 4
    assert table["column"].backward_values == (192_000,) * 4
    assert table["row"].values_per_rank == (96_000 + 3 * 128 * 250,) * 4
    assert table["column_split_output"].forward_values == (0,) * 4
    assert "500,000" in str(table) and "data parallel" in str(table)


def test_split_bytes_ring_formula_with_uneven_chunks():
    from minidist.distributed.collectives.traffic import ring_all_reduce_sent

    # 10 values on 4 ranks: chunks 3, 3, 2, 2; rank r skips chunks r+1 and r+2.
    assert ring_all_reduce_sent(10, 4) == (15, 16, 15, 14)
    assert sum(ring_all_reduce_sent(10, 4)) == 2 * 3 * 10
    assert ring_all_reduce_sent(10, 1) == (0,)
    with pytest.raises(ValueError, match="divide"):
        split_bytes(10, 9, 4, world_size=4)
    with pytest.raises(ValueError, match="ring"):
        split_bytes(8, 8, 4, world_size=4, algorithm="bruck")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_shapes_that_do_not_divide_name_the_layer_dimension_and_world(runs, world):
    messages = runs[world, "shm"][0][0]["errors"]
    column, row, column_gathered = messages
    assert "ColumnParallelLinear" in column and f"out_features={world + 1}" in column
    assert f"group of {world} ranks" in column
    assert "RowParallelLinear" in row and f"in_features={world + 1}" in row
    assert f"out_features={2 * world + 1}" in column_gathered


# --------------------------------------------------------------------------
# Training the digits MLP with the column/row pair

DIGITS_HIDDEN, EPOCHS, DIGITS_BATCH, LR = 32, 10, 64, 0.3


def _digits_model():
    nn.init.manual_seed(0)
    return nn.Linear(64, DIGITS_HIDDEN), nn.Linear(DIGITS_HIDDEN, 10)


def _train_digits(model):
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
    first, second = _digits_model()
    model = nn.Sequential(ColumnParallelLinear.from_linear(first), nn.ReLU(),
                          RowParallelLinear.from_linear(second))
    return _train_digits(model)


@pytest.mark.timeout(120)
def test_digits_mlp_on_two_ranks_trains_like_one_process():
    first, second = _digits_model()
    accuracy, loss = _train_digits(nn.Sequential(first, nn.ReLU(), second))
    results = minidist.launch(_digits_worker, world_size=2, timeout=60)
    assert accuracy > 0.9
    for split_accuracy, split_loss in results:
        # float32 sums in another order may flip at most one borderline example.
        assert abs(split_accuracy - accuracy) <= 1.5 / 355
        assert split_loss == pytest.approx(loss, rel=1e-3)


@pytest.mark.timeout(120)
def test_the_example_script_runs_and_its_trace_matches_the_formula():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, os.path.join(root, "examples", "tensor_parallel_mlp.py")],
                          capture_output=True, text=True, env=env, timeout=100)
    assert done.returncode == 0, done.stderr
    accuracy_line, *table = done.stdout.strip().splitlines()
    assert "in one process" in accuracy_line
    alone, split = accuracy_line.split("accuracy ")[1].split(" in one process, ")
    assert alone == split.split()[0]
    rows = [line.split() for line in table if line.startswith(("data parallel", "column", "row"))]
    assert len(rows) == 5
    for row in rows:  # "bytes sent" (formula) and "bytes in trace" are the last two columns
        assert row[-1] == row[-2]
