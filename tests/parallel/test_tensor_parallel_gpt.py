"""The GPT split by tensor (and sequence) parallelism must compute what the
whole GPT computes, train to the same weights, send the bytes of the
formula and keep the activation bytes of the formula.

One traced launch per world size (2 and 4 ranks, shm, float64) runs every
case inside the workers:

* :func:`tensor_parallel_gpt` with and without sequence parallelism, on a
  vocabulary of 11 words (uneven shares on 2 and 4 ranks): logits (the
  ranks' columns side by side), loss and every parameter's gradient (each
  rank's shard against its rows or columns of the whole gradient);
* each pass in a trace region: the bytes of each rank's sends equal
  :func:`gpt_step_bytes`, and the forward's collectives are 2 per block
  plus the embedding's and the loss's three;
* the memory ledger after forward and loss against :func:`gpt_activation_bytes`;
* three AdamW steps on fixed batches (the group given as a 1-D mesh
  stand-in, an object with ``get_group()``): the final shards equal the
  whole model's weights after the same steps;
* ``parallelize_module`` with torch's styles on the GPT against the same
  whole model, and its refusals;
* shapes that do not divide: the errors say what and what to do;
* the vocabulary-parallel loss with ``ignore_index`` (torch's -100 and
  another label, some tokens or all of them ignored) against
  ``F.cross_entropy`` of the whole logits.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, memory, optim, trace
from minidist.models.gpt import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.parallel import (
    ColwiseParallel,
    PackedColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from minidist.parallel.tensor.costs import format_step_bytes, gpt_activation_bytes, gpt_step_bytes
from minidist.parallel.tensor.gpt import qkv_rows, tensor_parallel_gpt
from minidist.parallel.tensor.vocab import vocab_parallel_cross_entropy, vocab_range

CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16)
EVEN = GPTConfig(vocab_size=12, block_size=8, n_layer=1, n_head=4, n_embd=16)
BATCH, STEPS, TRAIN_STEPS = 2, 8, 3
RTOL, ATOL = 1e-9, 1e-12
WORLDS = [2, 4]
MODES = [False, True]   # sequence_parallel


def _model(config=CONFIG):
    return GPT(config, rng=0).to(np.float64)


def _batch(step=0, vocab=CONFIG.vocab_size):
    rng = np.random.default_rng(10 + step)
    return rng.integers(0, vocab, (BATCH, STEPS)), rng.integers(0, vocab, (BATCH, STEPS))


def _grads(module):
    return {name: param.grad.copy() for name, param in module.named_parameters()}


def _run_split(sequence_parallel):
    name = "sp" if sequence_parallel else "tp"
    shard = tensor_parallel_gpt(_model(), sequence_parallel=sequence_parallel)
    idx, targets = _batch()
    with trace.region(f"{name} forward"):
        logits = shard(idx)
        loss = shard.loss(logits, targets)
    activations = memory.Ledger(shard).sample("forward", graph=loss).bytes["activations"]
    with trace.region(f"{name} backward"):
        loss.backward()
        shard.allreduce_sequence_parallel_grads()
    # One block alone, on this rank's input (T/n positions with sequence parallelism).
    positions = STEPS // dist.get_world_size() if sequence_parallel else STEPS
    x = np.random.default_rng(3).standard_normal((BATCH, positions, CONFIG.n_embd))
    block = memory.layer_activation_bytes(shard.transformer.h[0], x)
    return dict(logits=logits.data, loss=loss.item(), grads=_grads(shard),
                activations=activations, block=block)


def _train(sequence_parallel):
    shard = tensor_parallel_gpt(_model(), dist.init_device_mesh("cpu", (dist.get_world_size(),)),
                                sequence_parallel=sequence_parallel)
    optimizer = optim.AdamW(shard.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(TRAIN_STEPS):
        idx, targets = _batch(step)
        optimizer.zero_grad()
        loss = shard.loss(shard(idx), targets)
        loss.backward()
        shard.allreduce_sequence_parallel_grads()
        optimizer.step()
    return {name: param.data.copy() for name, param in shard.named_parameters()}


def _torch_plan(model, group):
    plan = {"transformer.wte": RowwiseParallel(), "lm_head": ColwiseParallel()}
    for part, style in (("attn.c_attn", PackedColwiseParallel(3)), ("attn.c_proj", RowwiseParallel()),
                        ("mlp.c_fc", ColwiseParallel()), ("mlp.c_proj", RowwiseParallel())):
        plan[f"transformer.h.*.{part}"] = style
    parallelize_module(model, group, plan)
    for block in model.transformer.h:
        block.attn.n_head //= dist.get_world_size(group)   # as torch users do
    model.lm_head.weight = model.transformer.wte.weight  # tie the two vocabulary shards again
    return model


def _run_torch_plan():
    model = _torch_plan(GPT(EVEN, rng=0).to(np.float64), None)
    idx, targets = _batch(vocab=EVEN.vocab_size)
    logits = model(idx)
    loss = vocab_parallel_cross_entropy(logits, targets)
    loss.backward()
    return dict(logits=logits.data, loss=loss.item(), grads=_grads(model))


def _error(attempt):
    try:
        attempt()
    except (ValueError, TypeError) as error:
        return str(error)
    return None


def _errors():
    world = dist.get_world_size()
    odd_heads = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=world + 1,
                          n_embd=4 * (world + 1))

    def unsplit_heads():
        model = GPT(EVEN, rng=0)
        parallelize_module(model, None, {"transformer.h.0.attn.c_attn": PackedColwiseParallel(3),
                                         "transformer.h.0.attn.c_proj": RowwiseParallel()})
        model(np.zeros((1, 4), dtype=np.int64))

    return dict(
        heads=_error(lambda: tensor_parallel_gpt(GPT(odd_heads, rng=0))),
        sequence=_error(lambda: tensor_parallel_gpt(_model(), sequence_parallel=True)(
            np.zeros((1, world + 1), dtype=np.int64))),
        fused=_error(lambda: parallelize_module(GPT(EVEN, rng=0), None,
                                                {"transformer.h.0.attn.c_attn": ColwiseParallel()})),
        unsplit_heads=_error(unsplit_heads),
        no_match=_error(lambda: parallelize_module(GPT(EVEN, rng=0), None, {"h.*.mlp": ColwiseParallel()})),
    )


#: (ignore_index, which tokens carry it): padding (-100) on some tokens, a
#: word id (3) as the label to ignore, and every token ignored.
IGNORED = [(-100, [0, 5, 6]), (3, None), (-100, "all")]


def _ignoring_case(ignore_index, where):
    """Whole float64 logits (2, 4, 11) and targets with ``ignore_index`` placed."""
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((2, 4, CONFIG.vocab_size))
    targets = rng.integers(0, CONFIG.vocab_size, size=(2, 4))
    targets[0, 0] = 3  # a token labelled 3 in every case: ignored only in the second
    if where == "all":
        targets[...] = ignore_index
    elif where is not None:
        targets.reshape(-1)[where] = ignore_index
    return logits, targets


def _run_ignoring():
    rank, world = dist.get_rank(), dist.get_world_size()
    start, stop = vocab_range(CONFIG.vocab_size, rank, world)
    results = []
    for ignore_index, where in IGNORED:
        logits, targets = _ignoring_case(ignore_index, where)
        shard = Tensor(logits[..., start:stop].copy(), requires_grad=True)
        loss = vocab_parallel_cross_entropy(shard, targets, vocab_start=start,
                                            ignore_index=ignore_index)
        loss.backward()
        results.append((float(loss.item()), shard.grad.copy(), start, stop))
    return results


def _worker():
    return dict(split={mode: _run_split(mode) for mode in MODES},
                trained={mode: _train(mode) for mode in MODES},
                torch_plan=_run_torch_plan(), errors=_errors(), ignoring=_run_ignoring())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tensor_parallel_gpt")
    outcome = {}
    for world in WORLDS:
        path = folder / f"tp{world}.jsonl"
        results = minidist.launch(_worker, world_size=world, transport="shm", trace=str(path),
                                  timeout=120)
        outcome[world] = (results, trace.read_jsonl(path).events)
    return outcome


# --------------------------------------------------------------------------
# The whole model, in this process


def _whole(config=CONFIG):
    model = _model(config)
    idx, targets = _batch(vocab=config.vocab_size)
    logits = model(idx)
    loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), targets.reshape(-1))
    loss.backward()
    return logits.data, loss.item(), _grads(model)


def _whole_trained():
    model = _model()
    optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(TRAIN_STEPS):
        idx, targets = _batch(step)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(idx).reshape(-1, CONFIG.vocab_size), targets.reshape(-1))
        loss.backward()
        optimizer.step()
    return {name: param.data for name, param in model.named_parameters()}


def _place(name, full_shape, rank, world, config):
    """Where rank's shard of parameter ``name`` sits in the whole parameter."""
    if name.endswith("wte.weight") or name == "lm_head.weight":
        return slice(*vocab_range(config.vocab_size, rank, world))
    if ".c_attn." in name:
        return qkv_rows(config.n_embd, config.n_head, rank, world)
    if ".c_fc." in name:
        width = full_shape[0] // world
        return slice(rank * width, (rank + 1) * width)
    if name.endswith("c_proj.weight"):
        width = full_shape[1] // world
        return (slice(None), slice(rank * width, (rank + 1) * width))
    return Ellipsis   # replicated


def _check_shards(per_rank, whole, world, config=CONFIG):
    for rank, shards in enumerate(per_rank):
        assert set(shards) == set(whole)
        for name, full in whole.items():
            np.testing.assert_allclose(shards[name], full[_place(name, full.shape, rank, world, config)],
                                       rtol=RTOL, atol=ATOL, err_msg=f"{name} on rank {rank}")


def _check_logits(per_rank, logits):
    np.testing.assert_allclose(np.concatenate(per_rank, axis=-1), logits, rtol=RTOL, atol=ATOL)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("sequence_parallel", MODES, ids=["tp", "tp+sp"])
def test_split_gpt_equals_the_whole_gpt(runs, world, sequence_parallel):
    results, _ = runs[world]
    logits, loss, grads = _whole()
    split = [r["split"][sequence_parallel] for r in results]
    _check_logits([s["logits"] for s in split], logits)
    for s in split:
        assert s["loss"] == pytest.approx(loss, rel=RTOL)
    _check_shards([s["grads"] for s in split], grads, world)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("sequence_parallel", MODES, ids=["tp", "tp+sp"])
def test_training_gives_the_weights_of_one_process(runs, world, sequence_parallel):
    results, _ = runs[world]
    _check_shards([r["trained"][sequence_parallel] for r in results], _whole_trained(), world)


def _regions(events, rank):
    return {e["label"]: (e["start"], e["end"]) for e in events
            if e["rank"] == rank and e["kind"] == "compute"}


def _inside(events, rank, region, kind):
    start, end = region
    return [e for e in events if e["rank"] == rank and e["kind"] == kind
            and start <= e["start"] and e["end"] <= end]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("sequence_parallel", MODES, ids=["tp", "tp+sp"])
def test_bytes_in_the_trace_equal_the_formula(runs, world, sequence_parallel):
    _, events = runs[world]
    name = "sp" if sequence_parallel else "tp"
    formula = gpt_step_bytes(CONFIG, BATCH, STEPS, world, sequence_parallel, itemsize=8)
    measured = {}
    for part in ("forward", "backward"):
        measured[part] = tuple(
            sum(e["bytes"] for e in _inside(events, rank, _regions(events, rank)[f"{name} {part}"], "send"))
            for rank in range(world))
        assert measured[part] == getattr(formula, part), part
    text = format_step_bytes(formula, measured)
    print(text)   # the formula next to the trace's count (pytest -s shows it)
    assert "in the trace" in text
    # One collective per block half forward (2 per block), the embedding's and the loss's three.
    forward = [trace.label_info(e["label"])["collective"]
               for e in _inside(events, 0, _regions(events, 0)[f"{name} forward"], "collective")]
    if sequence_parallel:
        assert forward.count("reduce_scatter") == 2 * CONFIG.n_layer + 1
        assert forward.count("all_gather") == 2 * CONFIG.n_layer + 1
        assert forward.count("all_reduce") == 3
    else:
        assert forward == ["all_reduce"] * (2 * CONFIG.n_layer + 1 + 3)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("sequence_parallel", MODES, ids=["tp", "tp+sp"])
def test_activation_bytes_equal_the_formula(runs, world, sequence_parallel):
    results, _ = runs[world]
    for rank, result in enumerate(results):
        formula = gpt_activation_bytes(CONFIG, BATCH, STEPS, world, rank, sequence_parallel, itemsize=8)
        assert result["split"][sequence_parallel]["activations"] == formula.total, rank


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("sequence_parallel", MODES, ids=["tp", "tp+sp"])
def test_one_blocks_activations_are_the_one_count(runs, world, sequence_parallel):
    """The ledger on one split block alone against the course's one count,
    memory.transformer_block_activation_bytes, with tp = n."""
    results, _ = runs[world]
    formula = memory.transformer_block_activation_bytes(
        BATCH, STEPS, CONFIG.n_embd, CONFIG.n_head, itemsize=8, tp=world,
        sequence_parallel=sequence_parallel)
    for rank, result in enumerate(results):
        assert result["split"][sequence_parallel]["block"] == formula, rank
    assert formula == gpt_activation_bytes(CONFIG, BATCH, STEPS, world, 0, sequence_parallel,
                                           itemsize=8).per_block


def test_sequence_parallelism_keeps_less_per_block():
    """At a width where the (B, T, C) arrays dominate: per block the
    sequence-parallel rank keeps BTC (4 + 27/n) against BTC (12 + 17/n)."""
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=8, n_embd=256)
    for world in (2, 4, 8):
        plain = gpt_activation_bytes(config, 4, 32, world)
        sharded = gpt_activation_bytes(config, 4, 32, world, sequence_parallel=True)
        assert sharded.per_block < plain.per_block
        # the part every rank keeps whole: 12 BTC without, 4 BTC with
        btc = 4 * 32 * 256 * 4
        assert plain.per_block - sharded.per_block == 8 * btc - 10 * btc // world + \
            2 * 4 * 32 * 4 * (world - 1) // world


def test_the_step_bytes_are_the_same_with_and_without_sequence_parallelism_but_the_gradient_sum():
    for world in (2, 4):
        plain = gpt_step_bytes(CONFIG, BATCH, STEPS, world)
        sharded = gpt_step_bytes(CONFIG, BATCH, STEPS, world, sequence_parallel=True)
        assert plain.forward == sharded.forward
        grads = sharded.lines[-1][3]
        assert tuple(p + 4 * g for p, g in zip(plain.backward, grads)) == sharded.backward


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
def test_parallelize_module_with_torchs_styles_equals_the_whole_gpt(runs, world):
    results, _ = runs[world]
    logits, loss, grads = _whole(EVEN)
    plan = [r["torch_plan"] for r in results]
    _check_logits([p["logits"] for p in plan], logits)
    for p in plan:
        assert p["loss"] == pytest.approx(loss, rel=RTOL)
    _check_shards([p["grads"] for p in plan], grads, world, EVEN)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
def test_errors_say_what_and_what_to_do(runs, world):
    errors = runs[world][0][0]["errors"]
    assert f"n_head={world + 1}" in errors["heads"] and "divides the head count" in errors["heads"]
    assert f"{world + 1} tokens" in errors["sequence"] and "multiple" in errors["sequence"]
    assert "PackedColwiseParallel(3)" in errors["fused"]
    assert "n_head // tp" in errors["unsplit_heads"]
    assert "no submodule matches 'h.*.mlp'" in errors["no_match"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLDS)
def test_the_vocabulary_parallel_loss_ignores_tokens_as_cross_entropy_does(runs, world):
    results, _ = runs[world]
    for case, (ignore_index, where) in enumerate(IGNORED):
        logits, targets = _ignoring_case(ignore_index, where)
        whole = Tensor(logits.reshape(-1, CONFIG.vocab_size), requires_grad=True)
        with np.errstate(invalid="ignore"):
            loss = F.cross_entropy(whole, targets.reshape(-1), ignore_index=ignore_index)
        loss.backward()
        grad = whole.grad.reshape(logits.shape)
        for ranks_loss, shard_grad, start, stop in (r["ignoring"][case] for r in results):
            if where == "all":
                assert np.isnan(ranks_loss) and np.isnan(loss.item())
            else:
                assert ranks_loss == pytest.approx(loss.item(), rel=RTOL)
            np.testing.assert_allclose(shard_grad, grad[..., start:stop], rtol=RTOL, atol=ATOL)
        ignored = targets == ignore_index
        assert ignored.any() and not np.abs(grad[ignored]).any()
