"""The memory ledger counts the bytes of the arrays that exist, by category,
each byte once, keeps the peak, writes ``memory`` trace events and enforces a
per-rank limit."""

from __future__ import annotations

import numpy as np
import pytest

import minidist
from minidist import Tensor, memory, nn, optim
from minidist import trace as _trace

FLOAT = 4
PARAMETERS = (8 * 4 + 8 + 3 * 8 + 3) * FLOAT  # Linear(4, 8) and Linear(8, 3)


def _mlp():
    np.random.seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _loss(model, batch=5):
    out = model(Tensor(np.ones((batch, 4), np.float32)))
    return (out * out).sum()


def test_parameters_and_gradients_of_an_mlp():
    model = _mlp()
    ledger = memory.Ledger(model)
    assert ledger.measure()["parameters"] == PARAMETERS
    assert ledger.measure()["gradients"] == 0
    _loss(model).backward()
    held = ledger.measure()
    assert held["parameters"] == PARAMETERS and held["gradients"] == PARAMETERS


def test_sgd_momentum_and_adam_state_after_a_step():
    model = _mlp()
    sgd = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _loss(model).backward()
    assert memory.Ledger(model, sgd).measure()["optimizer_state"] == 0
    sgd.step()
    assert memory.Ledger(model, sgd).measure()["optimizer_state"] == PARAMETERS

    adam = optim.Adam(model.parameters(), lr=0.1)
    adam.step()  # exp_avg and exp_avg_sq per parameter; the int step counts nothing
    assert memory.Ledger(model, adam).measure()["optimizer_state"] == 2 * PARAMETERS


def test_activations_of_a_known_graph():
    model = _mlp()
    loss = _loss(model, batch=5)
    # input 5x4, hidden 5x8, relu's bool mask 5x8, relu 5x8, output 5x3,
    # its square 5x3, the float32 loss: the weights are parameters, not counted
    expected = 5 * 4 * FLOAT + 5 * 8 * FLOAT + 5 * 8 + 5 * 8 * FLOAT + 2 * 5 * 3 * FLOAT + FLOAT
    assert memory.Ledger(model).measure(graph=loss)["activations"] == expected
    loss.backward()  # frees the graph: only the loss itself is left
    assert memory.Ledger(model).measure(graph=loss)["activations"] == FLOAT


def test_saved_arrays_found_in_closures():
    x = Tensor(np.arange(6, dtype=np.float64).reshape(2, 3), requires_grad=True)
    y = x.exp()
    assert [a is y.data for a in y.saved_arrays()] == [True]
    assert x.saved_arrays() == []
    # x (48), exp's output (48, also what it saved), the float64 sum (8)
    assert memory.Ledger().measure(graph=y.sum())["activations"] == 48 + 48 + 8


def test_shared_and_viewed_arrays_count_once():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, shared)
    assert memory.Ledger(model).measure()["parameters"] == (16 + 4) * FLOAT

    ledger = memory.Ledger()
    bucket = np.zeros(100, np.float32)
    ledger.track("buffers", bucket)
    ledger.track("buffers", bucket[:10])      # a view of it
    ledger.track("buffers", bucket[50:].reshape(5, 10))
    assert ledger.measure()["buffers"] == 400

    # a .grad that is a view into a tracked bucket is a gradient, counted once
    param = nn.Parameter(np.zeros(25, np.float32))
    param.grad = bucket[:25]
    ledger = memory.Ledger([param])
    ledger.track("buffers", bucket)
    held = ledger.measure()
    assert held["gradients"] == 400 and held["buffers"] == 0


def test_tracked_buffers_drop_out_when_freed():
    ledger = memory.Ledger()
    buffer = ledger.track("buffers", np.zeros(1000, np.uint8))
    assert ledger.measure()["buffers"] == 1000
    del buffer
    assert ledger.measure()["buffers"] == 0
    with pytest.raises(ValueError, match="unknown memory category"):
        ledger.track("cache", np.zeros(1))


def test_peak_over_samples():
    model = _mlp()
    sgd = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ledger = memory.Ledger(model, sgd)
    loss = _loss(model)
    forward = ledger.sample("forward", graph=loss)
    loss.backward()
    ledger.sample("backward", graph=loss)
    sgd.step()
    last = ledger.sample("step")
    report = ledger.report()
    assert report.current == last.bytes
    assert report.peak["activations"] == forward.bytes["activations"] > 0
    assert report.peak["optimizer_state"] == PARAMETERS
    assert report.peak_total == max(sample.total for sample in report.samples)
    # the forward (parameters and 564 bytes of activations) beats the step (3 x 268)
    assert report.peak_label == "forward" and report.peak_total == forward.total


def test_the_limit_is_enforced_with_a_clear_error():
    model = _mlp()
    ledger = memory.Ledger(model, limit_bytes=PARAMETERS + 100, rank=3)
    ledger.sample("fits")
    with pytest.raises(memory.MemoryLimitError, match=r"rank 3: allocating a bucket"):
        ledger.check(200, "a bucket")
    ledger.check(100, "a bucket")  # exactly at the limit is allowed
    _loss(model).backward()
    with pytest.raises(MemoryError, match="over the per-rank memory limit .* largest is "
                                          "parameters"):
        ledger.sample("after backward")


def _worker():
    import minidist.distributed as dist

    model = _mlp()
    sgd = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ledger = memory.Ledger(model, sgd)
    bucket = ledger.track("buffers", np.zeros(64, np.float32))
    scratch = ledger.track("buffers", np.zeros(64 * dist.get_rank(), np.float32))
    loss = _loss(model)
    ledger.sample("forward", graph=loss)
    loss.backward()
    dist.all_reduce(bucket)
    ledger.sample("backward")
    sgd.step()
    ledger.sample("step")
    del scratch
    return ledger.report().peak_total


def test_samples_are_trace_events_of_each_rank(tmp_path):
    path = tmp_path / "memory.trace.jsonl"
    peaks = minidist.launch(_worker, world_size=2, trace=str(path))
    events = _trace.read_jsonl(path).events
    timeline = memory.memory_timeline(events)
    assert sorted(timeline) == [0, 1]
    for rank in (0, 1):
        samples = timeline[rank]
        assert len(samples) == 3
        assert [held["buffers"] for _, held in samples] == [256 + 256 * rank] * 3
        assert samples[-1][1]["optimizer_state"] == PARAMETERS
        assert max(sum(held.values()) for _, held in samples) == peaks[rank]
    labels = [_trace.label_text(e["label"]) for e in events if e["kind"] == "memory"]
    assert "memory forward" in labels
    _trace.to_chrome(events)  # the export takes the new kind in its own lane


def test_timeline_reads_the_pipeline_ledger_events():
    label = _trace.with_info("memory", params=10, grads=0, optimizer=0, activations=5,
                             live_microbatches=1, stage=0)
    events = [{"rank": 0, "kind": "memory", "start": 1, "end": 1, "label": label}]
    (time, held), = memory.memory_timeline(events)[0]
    assert held == {"parameters": 10, "gradients": 0, "optimizer_state": 0, "buffers": 0,
                    "activations": 5}


# ---------------------------------------------------------------------- a transformer's layers


def _gpt_config():
    from minidist.models.gpt import GPTConfig

    return GPTConfig(vocab_size=13, block_size=96, n_layer=2, n_head=4, n_embd=32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_blocks_activations_are_the_formula_and_grow_with_the_square_of_the_length(dtype):
    from minidist.models.gpt import Block

    config = _gpt_config()
    rows = memory.activations_against_length(lambda: Block(config, rng=0, dtype=dtype), config.n_embd,
                                             config.n_head, 3, [8, 24, 48, 96], dtype=dtype)
    itemsize = np.dtype(dtype).itemsize
    for row in rows:
        assert row["measured"] == row["formula"], row
        steps = row["T"]
        assert row["attention_scores"] == 3 * config.n_head * steps * steps * itemsize
        # What is left once the T^2 term is taken off is linear in T: 25 (B, T, d)
        # arrays and the two LayerNorms' 1/std.
        assert row["measured"] - row["attention_scores"] == 3 * steps * (25 * config.n_embd + 2) * itemsize
        # Recomputation keeps the block's output only: the T^2 term is gone.
        assert row["measured_recompute"] == row["formula_recompute"] == 3 * steps * config.n_embd * itemsize
    # Per token, the bytes grow by B H itemsize for every position of context.
    per_token = [row["measured"] // row["T"] for row in rows]
    assert per_token[-1] - per_token[0] == 3 * config.n_head * (96 - 8) * itemsize


def test_recomputation_gives_the_same_gradients_it_saves_memory_for():
    from minidist.models.gpt import Block

    config = _gpt_config()
    block = Block(config, rng=0, dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((2, 16, config.n_embd))
    grads = []
    for recompute in (False, True):
        block.zero_grad()
        start = Tensor(x, requires_grad=True)
        out = nn.checkpoint(block, start) if recompute else block(start)
        (out * out).sum().backward()
        grads.append([start.grad] + [p.grad.copy() for p in block.parameters()])
    for plain, recomputed in zip(*grads):
        np.testing.assert_array_equal(plain, recomputed)


def test_parameters_gradients_and_adamw_state_per_layer_of_a_gpt():
    from minidist.models.gpt import GPT

    config = _gpt_config()
    model = GPT(config, rng=0)
    optimizer = optim.AdamW(model.parameters(), lr=1e-3)
    idx = np.random.default_rng(0).integers(0, config.vocab_size, (2, 16))
    logits = model(idx)
    nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), idx.reshape(-1)).backward()
    optimizer.step()
    layers = {"wte": model.transformer.wte, "wpe": model.transformer.wpe,
              **{f"h.{i}": block for i, block in enumerate(model.transformer.h)},
              "ln_f": model.transformer.ln_f, "lm_head": model.lm_head}
    table = memory.layer_bytes(layers, optimizer)
    d = config.n_embd
    block_parameters = (12 * d * d + 13 * d) * FLOAT  # weights, biases (3d + d + 4d + d), 2 LayerNorms (4d)
    for i in range(config.n_layer):
        assert table[f"h.{i}"] == {"parameters": block_parameters, "gradients": block_parameters,
                                   "optimizer_state": 2 * block_parameters}  # exp_avg, exp_avg_sq
    assert table["wte"]["parameters"] == config.vocab_size * d * FLOAT
    assert table["lm_head"] == {"parameters": 0, "gradients": 0, "optimizer_state": 0}  # tied to wte
    everything = memory.Ledger(model, optimizer).measure()
    for category in ("parameters", "gradients", "optimizer_state"):
        assert sum(row[category] for row in table.values()) == everything[category]


def test_split_backward_bytes_measures_a_stage_and_leaves_it_as_it_was():
    model = nn.Sequential(nn.Linear(6, 5, rng=18), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3, rng=19))
    before = [b.data.copy() for b in model.buffers()]
    batch = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    measured = memory.split_backward_bytes(model, batch)
    # Linear(6, 5): x and dY; BatchNorm1d: its (5,) dweight and dbias,
    # computed in I; Linear(5, 3): its input and dY.
    assert measured["weights_pending"] == 4 * (8 * (6 + 5) + 5 + 5 + 8 * (5 + 3))
    assert measured["forward"] > measured["weights_pending"]
    assert all(p.grad is None for p in model.parameters())
    assert all(np.array_equal(b.data, saved) for b, saved in zip(model.buffers(), before))


def test_split_backward_bytes_of_a_first_stage_is_the_whole_backwards():
    stage = nn.Sequential(nn.Embedding(10, 4, rng=1), nn.Linear(4, 3, rng=2))
    measured = memory.split_backward_bytes(stage, np.array([[1, 2, 3], [4, 5, 5]]))
    # Token ids need no gradient, so W is the whole backward and keeps all
    # of it: the embedding's (6, 4) output, which the Linear's dW reads, the
    # (6, 3) output and its gradient, and the (6,) int64 ids the embedding's
    # gradient is scattered by.
    assert measured["weights_pending"] == 6 * 4 * FLOAT + 2 * 6 * 3 * FLOAT + 6 * 8


def test_a_sample_counts_what_a_split_backward_keeps_as_activations():
    from minidist.split_backward import backward_input

    model = _mlp()
    x = Tensor(np.ones((5, 4), np.float32), requires_grad=True)
    out = model(x)
    pending = backward_input((out * out).sum(), inputs=[x])
    ledger = memory.Ledger(model)
    held = ledger.sample("between I and W", weights_pending=pending).bytes
    assert held["activations"] == pending.nbytes > 0
    assert held["parameters"] == PARAMETERS and held["gradients"] == 0
    pending.backward_weight()
    assert ledger.sample("after W", weights_pending=[pending]).bytes["activations"] == 0
