"""The memory ledger, on every rank, against ZeRO's formula; and a per-rank cap.

One launch per world size (1-4) trains the digits MLP (64 -> 128 -> 10, 9610
parameters: 9610 is 1 mod 3 and 2 mod 4, so the flat buffers pad) with Adam
under DDP, ZeRO stage 1, FSDP stage 2 and stage 3, a :class:`Ledger` on each
rank sampling after forward (with the graph), after backward and after the
step. Each strategy registers its communication buffers with
``track_memory(ledger)`` as ``buffers``.

What is measured, per rank, stated as the test asserts it:

* model states (``parameters + gradients + optimizer_state``), at their peak
  over the samples, equal :func:`zero_model_state_bytes` but for the padding:
  ``formula <= measured <= formula + 16 (N - 1)`` bytes per flat buffer (one
  for DDP/stage 1, one per layer for stages 2 and 3). They fall as N grows for
  stages 1-3 and stay at 16 psi for DDP.
* ``buffers``, what the formula does not count:

  - DDP: 0. Its buckets *are* the gradients (the ``.grad`` arrays are views).
    They exist from construction, so before the first backward, while no
    ``.grad`` exists, they count as 4 psi of ``buffers``: the buffers are
    compared from the second step on, the model states over all samples.
  - stage 1: ``4 * shard`` bytes: the slice's gradient, copied out of DDP's
    buckets for the inner optimizer (the flat weights are the parameters).
  - stage 2: 0. The kept full weights are the parameters (the shards are views
    into them); a layer's full gradient lives only inside its backward hook.
  - stage 3: at the forward sample, every layer's gathered full weights:
    ``4 * sum(padded)`` bytes, a full-size copy of the parameters. NumPy layers
    keep their weight in the autograd closure, so "freeing" a layer after its
    forward cannot release it until backward (see ``minidist.parallel.data.zero``);
    torch frees it. After backward it is 0.

The cap: with ``limit_bytes`` between stage 3's peak and DDP's, DDP's ledger
raises :class:`MemoryLimitError` on every rank, naming the rank and the
categories, while stage 3 trains its steps under the same cap.
"""

from __future__ import annotations

import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, memory, nn, optim
from minidist.data import load_digits
from minidist.parallel.data.costs import zero_model_state_bytes
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.fsdp import FullyShardedDataParallel
from minidist.parallel.data.zero import ZeroRedundancyOptimizer
from minidist.train import build_model

STEPS = 3
BATCH = 6
METHODS = ("ddp", "zero1", "fsdp2", "fsdp3")
PSI = 64 * 128 + 128 + 128 * 10 + 10          # 9610
LAYERS = [64 * 128 + 128, 128 * 10 + 10]
MODEL_STATES = ("parameters", "gradients", "optimizer_state")


def _padded(n, world_size):
    return -(-n // world_size) * world_size


def _wrap(method, model):
    if method in ("ddp", "zero1"):
        wrapped = DistributedDataParallel(model)
        if method == "ddp":
            optimizer = optim.Adam(wrapped.parameters(), lr=0.01)
        else:
            optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optim.Adam, lr=0.01)
    else:
        strategy = "SHARD_GRAD_OP" if method == "fsdp2" else "FULL_SHARD"
        wrapped = FullyShardedDataParallel(model, sharding_strategy=strategy)
        optimizer = optim.Adam(wrapped.parameters(), lr=0.01)
    return wrapped, optimizer


def _run(method, limit_bytes=None):
    """Train STEPS steps with a ledger; return (peak model states, peak buffers,
    buffers at the forward sample, peak total), or the MemoryLimitError's text."""
    rank = dist.get_rank()
    wrapped, optimizer = _wrap(method, build_model("mlp", seed=0))
    ledger = memory.Ledger(wrapped, optimizer, limit_bytes=limit_bytes, rank=rank)
    (optimizer if method == "zero1" else wrapped).track_memory(ledger)
    if method == "zero1":
        wrapped.track_memory(ledger)
    x, y = load_digits()[:2]
    loss_fn = nn.CrossEntropyLoss()
    world_size = dist.get_world_size()
    try:
        for step in range(STEPS):
            start = (step * world_size + rank) * BATCH
            optimizer.zero_grad(set_to_none=False)
            # A copy: a view would keep the whole data set alive, as activations.
            batch = Tensor(x[start:start + BATCH].copy())
            loss = loss_fn(wrapped(batch), y[start:start + BATCH])
            ledger.sample(f"forward {step}", graph=loss)
            loss.backward()
            ledger.sample(f"backward {step}")
            optimizer.step()
            ledger.sample(f"step {step}")
    except memory.MemoryLimitError as error:
        return str(error)
    samples = ledger.report().samples
    states = max(sum(s.bytes[c] for c in MODEL_STATES) for s in samples)
    buffers = max(s.bytes["buffers"] for s in samples[3:])    # from step 1 on
    forward_buffers = samples[-3].bytes["buffers"]
    return states, buffers, forward_buffers, ledger.report().peak_total


def _worker():
    return {method: _run(method) for method in METHODS}


@pytest.mark.timeout(240)
def test_measured_model_states_match_the_formula_and_fall_with_n():
    measured = {}
    for world_size in (1, 2, 3, 4):
        results = minidist.launch(_worker, world_size=world_size, transport="shm",
                                  timeout=120)
        for method in METHODS:
            stage = METHODS.index(method)
            formula = zero_model_state_bytes(PSI, world_size, stage)
            buffers_flat = 1 if stage < 2 else len(LAYERS)
            shard = sum(_padded(n, world_size) // world_size
                        for n in ([PSI] if stage < 2 else LAYERS))
            for rank, per_method in enumerate(results):
                states, buffers, forward_buffers, _ = per_method[method]
                label = (method, world_size, rank, states, formula)
                assert formula <= states <= formula + 16 * (world_size - 1) * buffers_flat, label
                expected_buffers = {0: 0, 1: 4 * shard, 2: 0,
                                    3: 4 * sum(_padded(n, world_size) for n in LAYERS)}[stage]
                assert buffers == expected_buffers, (label, buffers, expected_buffers)
                if stage == 3:
                    assert forward_buffers == expected_buffers, label
                # Every rank holds the same amount but for the padding's place.
                assert abs(states - results[0][method][0]) <= 16 * world_size * buffers_flat, label
            measured[(method, world_size)] = results[0][method][0]
    for world_size in (2, 3, 4):
        assert measured[("ddp", world_size)] == 16 * PSI
        for method in METHODS[1:]:
            assert measured[(method, world_size)] < measured[(method, world_size - 1)], \
                (method, world_size, measured)


# --------------------------------------------------------------------------- the cap


def _capped(limit_bytes):
    return {method: _run(method, limit_bytes) for method in ("ddp", "fsdp3")}


@pytest.mark.timeout(120)
def test_a_model_that_does_not_fit_under_ddp_trains_under_stage_3():
    world_size = 4
    # DDP holds 16 psi of model states; stage 3 about 4 psi, plus its gathered
    # layers (4 psi at most, see the module docstring) and a few activations.
    limit = 12 * PSI
    results = minidist.launch(_capped, world_size=world_size, transport="shm",
                              args=(limit,), timeout=60)
    for rank, result in enumerate(results):
        message = result["ddp"]
        assert isinstance(message, str), result
        assert message.startswith(f"rank {rank}: at 'step 0'"), message
        assert f"per-rank memory limit of {limit:,} bytes" in message
        assert "The largest is optimizer_state" in message or "ZeRO" in message
        states, buffers, _, peak = result["fsdp3"]
        assert peak <= limit, (peak, limit)
