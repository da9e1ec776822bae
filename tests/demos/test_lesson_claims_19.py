"""The claims lesson 19 (experts) states in its text, held beyond the one
seed and the one size the lesson runs: the load-balancing loss's values at
balance and at collapse, the router's collapse without it on other seeds,
the all_to_all's bytes and time against the dense MLP's all_reduce at other
group sizes. Small: no lesson is run whole, no process is started."""

from __future__ import annotations

import numpy as np
import pytest

from minidist import optim
from minidist.data import CharTokenizer, load_shakespeare
from minidist.distributed import simulate
from minidist.models.gpt import GPTConfig
from minidist.models.moe import MoE, MoEGPT, MoEGPTConfig, Routing, load_balancing_loss, moe_layers
from minidist.parallel.expert.costs import balanced_dispatch_bytes, dense_mlp_all_reduce_bytes
from minidist.tensor import Tensor


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("n_expert", [4, 8])
def test_aux_loss_is_1_at_balance_and_e_at_collapse(top_k, n_expert):
    """Section 4: 'At perfect balance the loss is 1 (with k = 1; minidist
    divides the choices by k N, so also with k = 2), and it grows to E when
    the router sends all to one expert and is sure of it'; and about 1 when
    the probabilities are uniform, whatever the choices."""
    tokens = 4 * n_expert
    balanced = np.stack([(np.arange(tokens) + j) % n_expert for j in range(top_k)], axis=1)
    uniform = Tensor(np.full((tokens, n_expert), 1.0 / n_expert))
    kept = np.ones_like(balanced, dtype=bool)
    routing = Routing(balanced, kept, balanced * 0, n_expert, tokens)
    assert load_balancing_loss(uniform, routing).item() == pytest.approx(1.0)
    collapsed_probs = np.zeros((tokens, n_expert))
    collapsed_probs[:, 0] = 1.0
    collapsed = np.stack([np.full(tokens, j) for j in range(top_k)], axis=1)
    routing = Routing(collapsed, kept, collapsed * 0, n_expert, tokens)
    value = load_balancing_loss(Tensor(collapsed_probs), routing).item()
    assert value == pytest.approx(n_expert / top_k)   # k = 1: E
    assert load_balancing_loss(uniform, routing).item() == pytest.approx(1.0)


def test_a_layer_keeps_the_aux_loss_of_its_routing():
    """Section 4's hand computation: the layer's aux_loss is E sum f_i P_i of
    its own routing and router probabilities."""
    config = GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=4)
    layer = MoE(config, 4, 1, None, rng=2, dtype=np.float64)
    x = np.random.default_rng(3).normal(size=(16, 4))
    layer(Tensor(x))
    logits = x @ layer.router.weight.data.T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    fraction = np.bincount(probs.argmax(axis=1), minlength=4) / 16
    assert layer.aux_loss.item() == pytest.approx(4 * float(fraction @ probs.mean(axis=0)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [1, 2])
def test_without_the_aux_loss_the_router_collapses_and_switchs_coefficient_evens_it(seed):
    """Section 4: without the loss one expert takes most tokens and a large
    part of the choices is dropped at capacity factor 1.25; with 0.01 the
    busiest share and the dropped share fall (the lesson's seed is 0)."""
    text = load_shakespeare()
    chars = CharTokenizer(text)
    ids = np.asarray(chars.encode(text))

    def run(coefficient):
        config = MoEGPTConfig(vocab_size=chars.vocab_size, block_size=32, n_layer=2, n_head=2,
                              n_embd=32, n_expert=4, top_k=1, capacity_factor=1.25,
                              aux_loss_coef=coefficient)
        model = MoEGPT(config, rng=seed)
        optimizer = optim.AdamW(model.parameters(), lr=3e-3)
        rng = np.random.default_rng(1)
        busiest, dropped = [], []
        for _ in range(60):
            starts = rng.integers(0, len(ids) - 33, 8)
            idx = np.stack([ids[s:s + 32] for s in starts])
            targets = np.stack([ids[s + 1:s + 33] for s in starts])
            optimizer.zero_grad()
            model.loss(model(idx), targets).backward()
            optimizer.step()
            layers = moe_layers(model)
            busiest.append(layers[0].routing.routed.max() / layers[0].routing.tokens)
            dropped.append(sum(r.routing.dropped for r in layers) / sum(r.routing.tokens
                                                                         for r in layers))
        return np.mean(busiest), np.mean(dropped)

    (busy_off, lost_off), (busy_on, lost_on) = run(0.0), run(0.01)
    assert busy_off > 0.7 and lost_off > 0.35
    assert busy_on < busy_off - 0.15 and lost_on < lost_off / 1.5


@pytest.mark.parametrize("world", [2, 4, 8, 64])
def test_k1_dispatch_sends_the_dense_all_reduces_bytes_and_k2_twice(world):
    """Section 5: 'with k = 1, the same bytes as the tensor-parallel MLP;
    with k = 2, twice' (evenly spread, nothing dropped)."""
    tokens, width = 64 * world, 16
    dense = dense_mlp_all_reduce_bytes(tokens, width, world)
    assert balanced_dispatch_bytes(tokens, 1, width, world) == dense[0]
    assert balanced_dispatch_bytes(tokens, 2, width, world) == 2 * dense[0]


@pytest.mark.parametrize("world", [4, 12, 256])
def test_two_even_all_to_alls_take_the_ring_all_reduces_time(world):
    """Section 6: with k = 1 the two pairwise all_to_alls take exactly the
    ring all_reduce's time; k = 2 adds bytes, not messages."""
    nbytes, alpha, beta = 1 << 22, 1e-5, 4e-11
    a2a = {k: simulate("all_to_all", "pairwise", world, k * nbytes, alpha=alpha, beta=beta,
                       gamma=0.0).time for k in (1, 2)}
    ring = simulate("all_reduce", "ring", world, nbytes, alpha=alpha, beta=beta, gamma=0.0).time
    assert 2 * a2a[1] == pytest.approx(ring, rel=1e-9)
    assert 2 * (a2a[2] - a2a[1]) == pytest.approx(2 * (world - 1) / world * nbytes * beta,
                                                  rel=1e-9)


def test_the_latencies_share_grows_with_the_group_and_k2s_extra_shrinks():
    """Section 6: 'the message count grows with it': the latencies' share of
    the ring all_reduce's time grows with n, and k = 2's extra cost, being
    bytes, is a smaller and smaller part of its time (the lesson's link and
    shapes, at more group sizes than it runs)."""
    from minidist.parallel.mesh.plan_inputs import CLUSTER

    link, nbytes = CLUSTER.inter, 4096 * 4096 * 2
    shares, ratios = [], []
    for world in (4, 8, 16, 32, 64, 128, 256, 512):
        a2a = {k: simulate("all_to_all", "pairwise", world, k * nbytes, alpha=link.alpha,
                           beta=link.beta, gamma=0.0).time for k in (1, 2)}
        ring = simulate("all_reduce", "ring", world, nbytes, alpha=link.alpha, beta=link.beta,
                        gamma=0.0).time
        shares.append(2 * (world - 1) * link.alpha / ring)
        ratios.append(a2a[2] / a2a[1])
    assert all(a < b for a, b in zip(shares, shares[1:]))
    assert all(a > b > 1 for a, b in zip(ratios, ratios[1:]))


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_even_figure_already_leaves_out_the_local_rows_and_drops_fall_short_of_it(top_k):
    """Section 5: '2 (n-1)/n k B T d s' counts only the rows that cross a
    link, as the backward column does (the forward adds the counts): an even
    matrix with nothing dropped meets it exactly, one with dropped choices
    (the same spread, fewer rows) falls short of it by the rows dropped."""
    from minidist.parallel.expert.costs import dispatch_bytes

    tokens, width, s, n = 24, 16, 8, 2
    even = np.full((n, n), top_k * tokens // n)
    counted = dispatch_bytes(even, 4, width, itemsize=s)
    figure = balanced_dispatch_bytes(tokens, top_k, width, n, itemsize=s)
    assert all(b == figure for b in counted.backward)
    assert all(f == figure + c for f, c in zip(counted.forward, counted.counts))
    dropped = even - np.array([[1, 1], [1, 1]])          # one choice dropped per cell
    short = dispatch_bytes(dropped, 4, width, itemsize=s)
    assert all(figure - b == 2 * width * s for b in short.backward)   # a row each way


def test_the_gate_is_named_g_not_the_pipelines_p():
    """lessons/NOTATION.md: p is the pipeline's stages, P_i Switch's mean
    probability; lesson 19 calls the router's gate g, and NOTATION says so."""
    from pathlib import Path

    lessons = Path(__file__).parents[2] / "lessons"
    notation = (lessons / "NOTATION.md").read_text()
    assert "| g | a gate" in notation
    source = (lessons / "19_experts.py").read_text()
    assert "**gate** g" in source and "**gate** p" not in source and '"p(e0)"' not in source


def test_the_dense_all_reduce_and_k1_all_to_alls_coincide_so_the_picture_draws_both():
    """Section 6's picture: the ring all_reduce's line and k = 1's coincide
    at every group size (their times are equal), so the lesson draws the ring
    wide and pale under a dashed k = 1 line and says so in the legend."""
    from pathlib import Path

    for n in (8, 128):
        a2a = simulate("all_to_all", "pairwise", n, 4096 * 4096 * 2, alpha=10e-6,
                       beta=1 / 25e9, gamma=0.0)
        ring = simulate("all_reduce", "ring", n, 4096 * 4096 * 2, alpha=10e-6,
                        beta=1 / 25e9, gamma=0.0)
        assert abs(2 * a2a.time / ring.time - 1) < 1e-6
    source = (Path(__file__).parents[2] / "lessons" / "19_experts.py").read_text()
    assert "(the same time as k = 1)" in source
