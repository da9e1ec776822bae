"""Context parallelism: ring attention and Ulysses must compute
what attention on the whole sequence computes, send the bytes of their
formulas, and train the GPT to the weights of one process.

One traced launch per world size (2 and 4 ranks, shm, float64) runs every
case inside the workers:

* ring attention and Ulysses on (B, H, L_r, D) pieces of a sequence (zig-zag
  split), causal and not, at a length that 2n divides and at one it does
  not (uneven blocks): each rank's output rows and the gradients of its q,
  k, v rows against F.scaled_dot_product_attention on the whole sequence;
* each call in a trace region: each rank's sent bytes equal
  :mod:`minidist.parallel.context.costs`'s formulas;
* three AdamW steps of the context-parallel GPT, ring and Ulysses, on a CP
  mesh (2 ranks: cp=2 x dp=1; 4 ranks: dp=2 x cp=2, each dp rank its own
  sequences): the final weights equal one process's after the same steps on
  the whole batches.

The zig-zag's balance and the refusals run in this process.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import optim, trace
from minidist.models.gpt import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.parallel.context.costs import (
    format_attention_bytes,
    ring_attention_bytes,
    ulysses_bytes,
)
from minidist.parallel.context.gpt import context_parallel_gpt
from minidist.parallel.context.ring_attention import ring_attention
from minidist.parallel.context.split import block_work, rank_chunks, rank_positions, shard_sequence
from minidist.parallel.context.ulysses import ulysses_attention
from minidist.tensor import Tensor

BATCH, HEADS, WIDTH, VALUE_WIDTH = 2, 4, 3, 5
LENGTHS = {2: (12, 11), 4: (16, 13)}   # per world: 2n divides the first, not the second
SCHEMES = {"ring": ring_attention, "ulysses": ulysses_attention}
CAUSAL = [False, True]
RTOL, ATOL = 1e-10, 1e-12
CONFIG = GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=4, n_embd=16)
GPT_STEPS, TRAIN_STEPS, GPT_BATCH = 11, 3, 2   # 11 tokens: uneven chunks on 2 ranks


def _inputs(seq_len, seed=0):
    rng = np.random.default_rng(seed + seq_len)
    shape = (BATCH, HEADS, seq_len)
    return (rng.standard_normal(shape + (WIDTH,)), rng.standard_normal(shape + (WIDTH,)),
            rng.standard_normal(shape + (VALUE_WIDTH,)), rng.standard_normal(shape + (VALUE_WIDTH,)))


def _attend(scheme, seq_len, is_causal):
    world, rank = dist.get_world_size(), dist.get_rank()
    q, k, v, grad_out = (shard_sequence(x, seq_len, world, rank, axis=2) for x in _inputs(seq_len))
    q, k, v = (Tensor(x, requires_grad=True) for x in (q, k, v))
    with trace.region(f"{scheme} forward {seq_len} {is_causal}"):
        out = SCHEMES[scheme](q, k, v, seq_len, is_causal=is_causal)
    with trace.region(f"{scheme} backward {seq_len} {is_causal}"):
        (out * Tensor(grad_out)).sum().backward()
    return dict(out=out.data, grads=[q.grad, k.grad, v.grad])


def _batches(step, dp_rank=0):
    rng = np.random.default_rng(100 + 10 * step + dp_rank)
    return (rng.integers(0, CONFIG.vocab_size, (GPT_BATCH, GPT_STEPS)),
            rng.integers(0, CONFIG.vocab_size, (GPT_BATCH, GPT_STEPS)))


def _train(attention):
    world = dist.get_world_size()
    dp = 2 if world == 4 else 1
    mesh = dist.init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "cp"))
    shard = context_parallel_gpt(GPT(CONFIG, rng=0).to(np.float64), mesh["cp"], attention=attention)
    optimizer = optim.AdamW(shard.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(TRAIN_STEPS):
        idx, targets = _batches(step, mesh.get_local_rank("dp"))
        optimizer.zero_grad()
        loss = shard.loss(shard(shard.shard(idx), GPT_STEPS), shard.shard(targets), GPT_STEPS)
        loss.backward()
        shard.allreduce_grads(dp_group=mesh["dp"].get_group())
        optimizer.step()
        losses.append(loss.item())
    return dict(losses=losses, weights={name: p.data.copy() for name, p in shard.named_parameters()})


def _worker():
    world = dist.get_world_size()
    attended = {(scheme, seq_len, causal): _attend(scheme, seq_len, causal)
                for scheme in SCHEMES for seq_len in LENGTHS[world] for causal in CAUSAL}
    return dict(attended=attended, trained={name: _train(name) for name in SCHEMES},
                refused=_refusal())


def _refusal():
    x = Tensor(np.zeros((1, 3, 2, 4)))
    try:
        ulysses_attention(x, x, x, 2 * dist.get_world_size())
    except ValueError as error:
        return str(error)
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("context_parallel")
    outcome = {}
    for world in LENGTHS:
        path = folder / f"cp{world}.jsonl"
        results = minidist.launch(_worker, world_size=world, transport="shm", trace=str(path),
                                  timeout=240)
        outcome[world] = (results, trace.read_jsonl(path).events)
    return outcome


CASES = [(world, scheme, seq_len, causal) for world in LENGTHS for scheme in SCHEMES
         for seq_len in LENGTHS[world] for causal in CAUSAL]


def _case_id(case):
    world, scheme, seq_len, causal = case
    return f"{scheme}-n{world}-T{seq_len}-{'causal' if causal else 'full'}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_attention_across_ranks_equals_whole_attention(runs, case):
    world, scheme, seq_len, causal = case
    results, _ = runs[world]
    q, k, v, grad_out = (Tensor(x, requires_grad=True) for x in _inputs(seq_len))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (out * grad_out).sum().backward()
    for rank, result in enumerate(results):
        got = result["attended"][(scheme, seq_len, causal)]
        rows = rank_positions(seq_len, world, rank)
        np.testing.assert_allclose(got["out"], out.data[:, :, rows], rtol=RTOL, atol=ATOL,
                                   err_msg=f"output of rank {rank}")
        for name, grad, whole in zip("qkv", got["grads"], (q.grad, k.grad, v.grad)):
            np.testing.assert_allclose(grad, whole[:, :, rows], rtol=RTOL, atol=ATOL,
                                       err_msg=f"d{name} of rank {rank}")


def _sent(events, rank, label):
    region = [e for e in events if e["rank"] == rank and e["kind"] == "compute"
              and e["label"] == label][0]
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and region["start"] <= e["start"] and e["end"] <= region["end"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_bytes_in_the_trace_equal_the_formula(runs, case):
    world, scheme, seq_len, causal = case
    _, events = runs[world]
    formula = (ring_attention_bytes if scheme == "ring" else ulysses_bytes)(
        BATCH, HEADS, seq_len, WIDTH, world, itemsize=8, value_dim=VALUE_WIDTH)
    measured = {}
    for part in ("forward", "backward"):
        measured[(scheme, part)] = tuple(_sent(events, rank, f"{scheme} {part} {seq_len} {causal}")
                                         for rank in range(world))
        assert measured[(scheme, part)] == getattr(formula, part), part
    print(format_attention_bytes([formula], measured))


def _whole_trained(dp):
    model = GPT(CONFIG, rng=0).to(np.float64)
    optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(TRAIN_STEPS):
        pieces = [_batches(step, dp_rank) for dp_rank in range(dp)]
        idx = np.concatenate([p[0] for p in pieces])
        targets = np.concatenate([p[1] for p in pieces])
        optimizer.zero_grad()
        loss = F.cross_entropy(model(idx).reshape(-1, CONFIG.vocab_size), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: p.data for name, p in model.named_parameters()}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", list(LENGTHS), ids=["cp2xdp1", "dp2xcp2"])
@pytest.mark.parametrize("attention", list(SCHEMES))
def test_context_parallel_gpt_trains_to_the_weights_of_one_process(runs, world, attention):
    results, _ = runs[world]
    dp = 2 if world == 4 else 1
    losses, weights = _whole_trained(dp)
    for rank, result in enumerate(results):
        trained = result["trained"][attention]
        if dp == 1:   # with dp = 2 each rank's loss is its own sequences' mean
            np.testing.assert_allclose(trained["losses"], losses, rtol=1e-10)
        assert set(trained["weights"]) == set(weights)
        for name, whole in weights.items():
            np.testing.assert_allclose(trained["weights"][name], whole, rtol=1e-8, atol=1e-10,
                                       err_msg=f"{name} on rank {rank}")


# --------------------------------------------------------------------------
# In this process: the split, its balance, the formulas' shapes, the refusals


def test_the_zigzag_split_covers_the_sequence_once():
    for world in (1, 2, 3, 4):
        for seq_len in (world, 2 * world, 13, 16, 31):
            for layout in ("zigzag", "contiguous"):
                every = np.concatenate([rank_positions(seq_len, world, rank, layout)
                                        for rank in range(world)])
                assert sorted(every.tolist()) == list(range(seq_len))
    assert rank_chunks(16, 4, 1) == [(2, 4), (12, 14)]   # chunks 1 and 2n - 2 of 8


def test_zigzag_balances_causal_work_and_contiguous_blocks_do_not():
    for world in (2, 4, 8):
        zigzag = block_work(8 * world, world, is_causal=True)
        assert (zigzag == zigzag[:, :1]).all()   # every step: every rank the same work
        contiguous = block_work(8 * world, world, is_causal=True, layout="contiguous")
        assert (contiguous[1:, 0] == 0).all()    # rank 0 idles after its own block
        work = contiguous.sum(axis=0)
        assert work[-1] == world * work[0]       # the last rank: n blocks, rank 0: one
        full = block_work(8 * world, world, False).sum()
        assert zigzag.sum() < full and contiguous.sum() < full


def test_ulysses_sends_less_than_the_ring_for_the_same_shapes():
    for world in (2, 4, 8):
        ring = ring_attention_bytes(1, 8, 64 * world, 16, world, itemsize=4)
        ulysses = ulysses_bytes(1, 8, 64 * world, 16, world, itemsize=4)
        block = 64 * 8 * 16 * 4   # B H (T/n) D s
        assert ring.forward == (2 * (world - 1) * block,) * world
        assert ring.backward == (2 * (2 * world - 1) * block,) * world
        assert ulysses.forward == ulysses.backward == (4 * (world - 1) * block // world,) * world
        assert ring.forward[0] == ulysses.forward[0] * world // 2


def test_ulysses_refuses_heads_that_do_not_divide(runs):
    for result in runs[2][0]:
        message = result["refused"]
        assert "3 heads are not divisible by 2" in message and "ring attention" in message
