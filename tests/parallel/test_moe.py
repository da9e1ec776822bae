"""The mixture-of-experts MLP on one process (minidist/models/moe.py): the
routing against a token-by-token loop, the output against each token's
experts summed by hand, dropped tokens giving zero (the block's residual
alone), Switch's loss by its definition, and every gradient (input, router,
experts) against central finite differences in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minidist.models.gpt import GPT, GPTConfig
from minidist.models.moe import (
    MoE,
    MoEGPT,
    MoEGPTConfig,
    expert_capacity,
    moe_layers,
    route,
)
from minidist.nn import functional as F
from minidist.tensor import Tensor

CONFIG = MoEGPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=6, n_expert=4)


def _probs(tokens, experts, seed=0):
    logits = np.random.default_rng(seed).normal(size=(tokens, experts))
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _route_by_hand(probs, k, capacity):
    """GShard's priority as a loop: every first choice in token order, then every second."""
    tokens, experts = probs.shape
    order = [sorted(range(experts), key=lambda e: (-probs[t, e], e))[:k] for t in range(tokens)]
    taken = [0] * experts
    kept = np.zeros((tokens, k), dtype=bool)
    for which in range(k):
        for t in range(tokens):
            expert = order[t][which]
            kept[t, which] = taken[expert] < capacity
            taken[expert] += 1
    return np.array(order), kept


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("factor", [0.5, 1.0, 1.25, None])
def test_routing_equals_the_loop_of_its_definition(k, factor):
    probs = _probs(13, 4, seed=k)
    routing = route(probs, k, factor)
    capacity = 13 if factor is None else math.ceil(k * 13 / 4 * factor)
    assert routing.capacity == capacity == expert_capacity(13, 4, k, factor)
    choices, kept = _route_by_hand(probs, k, capacity)
    np.testing.assert_array_equal(routing.choices, choices)
    np.testing.assert_array_equal(routing.kept, kept)
    assert routing.dropped == int((~kept).sum())
    assert routing.dropped_tokens == int((~kept.any(axis=1)).sum())
    assert (routing.load <= capacity).all() and routing.load.sum() == kept.sum()
    np.testing.assert_array_equal(routing.routed, np.bincount(choices.ravel(), minlength=4))
    if factor == 0.5:
        assert routing.dropped > 0   # the case must drop something to test it


def _model(k, factor=1.0, seed=0, n_expert=4):
    return MoE(CONFIG, n_expert, k, factor, rng=seed, dtype=np.float64)


def _input(seed=1, shape=(2, 5, 6)):
    return np.random.default_rng(seed).normal(size=shape)


@pytest.mark.parametrize("k", [1, 2])
def test_output_is_each_tokens_gated_experts_and_zero_when_dropped(k):
    moe = _model(k, factor=0.5)
    x = _input()
    y = moe(Tensor(x)).data.reshape(-1, 6)
    flat = x.reshape(-1, 6)
    logits = flat @ moe.router.weight.data.T
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    routing = moe.routing
    assert routing.dropped_tokens > 0
    for t in range(flat.shape[0]):
        expected = np.zeros(6)
        chosen = probs[t, routing.choices[t]]
        gates = chosen if k == 1 else chosen / chosen.sum()   # Switch's, GShard's
        for which in range(k):
            if routing.kept[t, which]:
                expert = moe.experts[int(routing.choices[t, which])]
                expected += gates[which] * expert(Tensor(flat[t:t + 1])).data[0]
        np.testing.assert_allclose(y[t], expected, rtol=1e-12, atol=1e-14)
        if not routing.kept[t].any():
            assert (y[t] == 0).all()   # in a block, x + 0: the residual alone


def test_switch_loss_is_E_times_sum_of_fraction_times_mean_probability():
    moe = _model(2)
    x = _input()
    moe(Tensor(x))
    logits = x.reshape(-1, 6) @ moe.router.weight.data.T
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    fraction = np.bincount(moe.routing.choices.ravel(), minlength=4) / moe.routing.choices.size
    assert moe.aux_loss.item() == pytest.approx(4 * (fraction * probs.mean(axis=0)).sum(), rel=1e-12)
    # Uniform routing gives 1: every f_i = P_i = 1/E.
    moe.router.weight.data[...] = 0
    moe(Tensor(np.eye(8, 6)))
    assert moe.routing.routed.tolist() == [8, 8, 0, 0]   # ties go to the lower index
    assert moe.aux_loss.item() == pytest.approx(4 * (0.5 * 0.25 + 0.5 * 0.25))


def _objective(moe, x, weights):
    y = moe(x)
    return (y * Tensor(weights)).sum() + moe.aux_loss * 0.3


@pytest.mark.parametrize("k", [1, 2])
def test_gradients_equal_finite_differences(k):
    """Input, router (through the gates and the loss) and an expert's
    weights, central differences in float64 with the routing fixed by
    the data (a step of 1e-6 crosses no tie here)."""
    moe = _model(k, factor=0.75)
    x0 = _input()
    weights = np.random.default_rng(5).normal(size=x0.shape)
    x = Tensor(x0.copy(), requires_grad=True)
    _objective(moe, x, weights).backward()
    assert moe.routing.dropped > 0
    busy = int(np.argmax(moe.routing.load))
    checked = [("x", x), ("router", moe.router.weight), ("c_fc", moe.experts[busy].c_fc.weight),
               ("c_proj bias", moe.experts[busy].c_proj.bias)]
    rng = np.random.default_rng(7)
    for name, tensor in checked:
        analytic = tensor.grad.copy()
        for flat_index in rng.choice(tensor.data.size, size=min(8, tensor.data.size), replace=False):
            index = np.unravel_index(flat_index, tensor.data.shape)
            saved = tensor.data[index]
            values = []
            for step in (1e-6, -1e-6):
                tensor.data[index] = saved + step
                values.append(_objective(moe, Tensor(x.data), weights).item())
            tensor.data[index] = saved
            numeric = (values[0] - values[1]) / 2e-6
            assert analytic[index] == pytest.approx(numeric, rel=1e-6, abs=1e-9), (name, index)


def test_an_expert_without_tokens_gets_a_zero_gradient():
    moe = _model(1, factor=None, n_expert=4)
    moe.router.weight.data[...] = 0
    moe.router.weight.data[0, 0] = 5.0       # every token with a positive x_0 to expert 0
    x = np.abs(_input())
    moe(Tensor(x)).sum().backward()
    assert moe.routing.load.tolist() == [10, 0, 0, 0]
    for expert in moe.experts[1:]:
        assert all(p.grad is not None and not p.grad.any() for p in expert.parameters())


def test_moe_gpt_adds_the_weighted_aux_loss_and_draws_the_same_model_from_a_seed():
    model = MoEGPT(CONFIG, rng=0).to(np.float64)
    again = MoEGPT(CONFIG, rng=0).to(np.float64)
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    assert len(moe_layers(model)) == CONFIG.n_layer
    names = dict(model.named_parameters())
    assert names["transformer.h.0.mlp.experts.3.c_proj.weight"].data.std() < 0.02
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    logits = model(idx)
    lm = F.cross_entropy(logits.reshape(-1, 11), idx.reshape(-1)).item()
    aux = sum(layer.aux_loss.item() for layer in moe_layers(model))
    assert model.loss(logits, idx).item() == pytest.approx(lm + 0.01 * aux, rel=1e-12)
    # Experts hold E times the MLP's parameters, plus the router.
    dense = GPT(CONFIG, rng=0).num_parameters()
    mlp = 8 * 36 + 5 * 6
    assert model.num_parameters() == dense + CONFIG.n_layer * ((4 - 1) * mlp + 6 * 4)


@pytest.mark.parametrize(("fields", "words"), [
    (dict(n_expert=0), "n_expert must be a positive int"),
    (dict(top_k=5), "top_k must be an int from 1 to n_expert=4"),
    (dict(capacity_factor=0.0), "capacity_factor must be a positive finite number"),
    (dict(capacity_factor=float("inf")), "positive finite number, or None for no limit"),
    (dict(capacity_factor=float("nan")), "positive finite number, or None for no limit"),
    (dict(capacity_factor="1.25"), "positive finite number, or None for no limit"),
])
def test_a_config_that_cannot_route_says_why(fields, words):
    with pytest.raises(ValueError, match=words):
        MoEGPTConfig(vocab_size=11, **fields)
    layer = dict(n_expert=4, top_k=1, capacity_factor=1.25)
    layer.update(fields)
    with pytest.raises(ValueError, match=words):   # the layer alone, at construction
        MoE(GPTConfig(vocab_size=11, n_embd=8, n_head=2), **layer)
    with pytest.raises(TypeError, match="MoEGPTConfig"):
        MoEGPT(GPTConfig(vocab_size=11))
