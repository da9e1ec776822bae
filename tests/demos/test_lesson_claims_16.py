"""The claims lesson 16 (a transformer on one process) states in its text,
held on formulas or with fixed seeds on one process (the lesson prints its
own measured numbers; the direction each sentence states is held here).
Small: no lesson is run whole."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from minidist import amp, flops, memory, optim
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, split_tokens
from minidist.experiments.mixed_precision import gradient_underflow
from minidist.models import GPTConfig
from minidist.nn import functional as F
from minidist.train_gpt import build_gpt


def test_embeddings_are_a_third_of_gpt2_small_and_a_block_is_12_d2_plus_13_d():
    """Section 1: '12 d^2 weights in its four matrices ... and 13 d in biases
    and LayerNorm gains'; 'GPT-2's 50,257 tokens make them a third of the
    small model'."""
    d, layers, vocab, context = 768, 12, 50257, 1024
    embeddings = vocab * d + context * d
    total = embeddings + layers * (12 * d * d + 13 * d) + 2 * d
    assert total == pytest.approx(124.4e6, rel=0.01)         # GPT-2 small's 124M
    assert 0.3 < embeddings / total < 0.34
    small = build_gpt(62, n_layer=1, n_head=2, n_embd=16, block_size=8)
    block = sum(p.data.size for p in small.transformer.h[0].parameters())
    assert block == 12 * 16 * 16 + 13 * 16


@pytest.mark.parametrize("d,T", [(32, 32), (128, 64), (768, 1024)])
def test_attention_flops_are_t_over_6d_of_the_blocks_dense_flops(d, T):
    """Section 3: attention's 12 n_layer d T per token is T / 6d of the
    blocks' 6 x 12 n_layer d^2 (GPT-2 small: 2/9)."""
    config = GPTConfig(vocab_size=62, block_size=T, n_layer=3, n_head=4, n_embd=d)
    count = flops.gpt_step_flops(config, batch=2)
    blocks_dense = 6 * 12 * config.n_layer * d * d * count.tokens
    assert Fraction(count.attention, blocks_dense) == Fraction(T, 6 * d)
    assert Fraction(1024, 6 * 768) == Fraction(2, 9)


@pytest.mark.parametrize("d,h", [(128, 4), (64, 2), (32, 8)])
def test_p_outweighs_the_rest_of_a_block_from_t_25d_plus_2_over_h(d, h):
    """Section 4: B H T^2 = (25 d + 2) B T where P overtakes the rest; doubling
    T quadruples P; recomputation keeps one (B, T, d) array."""
    crossover = (25 * d + 2) / h

    def split(T):
        terms = memory.transformer_block_activation_terms(4, T, d, h)
        p = terms["attention: probabilities P (B H T T)"]
        return p, sum(terms.values()) - p

    below, above = int(np.floor(crossover)), int(np.floor(crossover)) + 1
    assert split(below)[0] <= split(below)[1] and split(above)[0] > split(above)[1]
    assert split(2 * above)[0] == 4 * split(above)[0]
    assert memory.transformer_block_activation_bytes(4, 100, d, h, recompute=True) == 4 * 100 * d * 4


@pytest.mark.parametrize("s", [2, 4, 8])
def test_a_block_keeps_25_btd_plus_2_bt_plus_bht2_values_of_s_bytes(s):
    """Section 4: with s the bytes per value (lessons/NOTATION.md), one block
    keeps 25 B T d + 2 B T values and P's B H T^2; the same function is the
    count lessons 17 and 18 use (the planner's too)."""
    from minidist.parallel.mesh.plan_inputs import GPTShape

    B, T, d, H = 4, 64, 128, 4
    assert memory.transformer_block_activation_bytes(B, T, d, H, s) == \
        s * (25 * B * T * d + 2 * B * T + B * H * T * T)
    shape = GPTShape(n_layer=2, n_embd=d, n_head=H, vocab_size=62, seq_len=T,
                     global_batch=B, micro_batch=B)
    assert shape.layer_activation_bytes(itemsize=s) == \
        memory.transformer_block_activation_bytes(B, T, d, H, s)


def test_at_short_contexts_a_blocks_model_states_outweigh_its_activations():
    """Section 4's picture: the dotted line (weights + gradients + Adam, 16
    bytes per parameter) is above the activations at T = 16 and below at
    T = 1024, for the lesson's block (width 128, 4 heads, batch 4)."""
    d = 128
    states = 16 * (12 * d * d + 13 * d)
    assert memory.transformer_block_activation_bytes(4, 16, d, 4) < states
    assert memory.transformer_block_activation_bytes(4, 1024, d, 4) > states


def test_float16_flushes_below_half_its_smallest_number():
    """Section 5: 'its smallest positive number is 2^-24 (6e-8), and anything
    below half of that becomes 0'."""
    assert float(np.float16(2.0**-24)) == 2.0**-24 and float(np.float16(2.0**-25)) == 0.0
    assert float(np.float16(2.0**-25 * 1.01)) == 2.0**-24
    assert 5.9e-8 < 2.0**-24 < 6.0e-8


@pytest.mark.timeout(120)
def test_each_factor_of_16_in_the_loss_scale_rescues_most_of_what_was_left():
    """Section 5, with the lesson's quick setting (3 epochs): fewer activation
    gradients underflow at every larger scale, less than half as many as at
    the scale before; and some do without scaling."""
    rows = gradient_underflow(epochs=3, scales=(1.0, 2.0**4, 2.0**8, 2.0**12, 2.0**16))
    lost = [row["activation_underflowed"] for row in rows]
    assert lost[0] > 0
    assert all(after < before / 2 for before, after in zip(lost, lost[1:]))


def _losses(mode, steps, windows_seed, tokens, vocab):
    """The lesson's train_precision, compact: the small GPT in float32 or in
    mixed precision (float16 model, float32 masters, GradScaler)."""
    model = build_gpt(vocab, n_layer=1, n_head=2, n_embd=32, block_size=32, seed=0)
    windows = RandomWindows(tokens, 32, 8, seed=windows_seed)
    if mode == "mixed":
        model.half()
        masters = amp.MasterWeights(model)
        optimizer, scaler = optim.AdamW(masters.parameters(), lr=3e-3), amp.GradScaler()
    else:
        optimizer = optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        x, y = windows.sample()
        model.zero_grad()
        loss = F.cross_entropy(model(x).astype(np.float32).reshape(-1, vocab), y.reshape(-1))
        if mode == "mixed":
            scaler.scale(loss).backward()
            masters.copy_grads_to_masters()
            scaler.step(optimizer)
            scaler.update()
            masters.copy_masters_to_model()
        else:
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
    return np.array(losses)


@pytest.mark.timeout(180)
def test_mixed_precision_is_closer_to_float32_than_float32_on_other_windows():
    """Section 5: 'Mixed precision follows float32's curve closer than float32
    follows itself on other windows' (the lesson's quick form: 40 steps,
    moving average over 2)."""
    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    tokens = split_tokens(tokenizer.encode(text), 0.1)[0]
    vocab = tokenizer.vocab_size

    def smooth(values):
        return np.convolve(values, np.ones(2) / 2, mode="valid")

    single = smooth(_losses("float32", 40, 0, tokens, vocab))
    mixed = smooth(_losses("mixed", 40, 0, tokens, vocab))
    other = smooth(_losses("float32", 40, 1, tokens, vocab))
    assert np.abs(mixed - single).mean() < np.abs(other - single).mean()
    assert mixed[-5:].mean() < mixed[:5].mean()               # and it learned


def test_a_kv_cache_runs_each_position_once_where_recomputing_runs_t_squared_over_2():
    """Section 2, the KV cache: 'without the cache the t-th character runs all
    t positions before it, about T^2 / 2 for a context of T; with it each
    position runs once'; the characters agree."""
    from minidist.models import generate

    model = build_gpt(62, n_layer=1, n_head=2, n_embd=16, block_size=12).to(np.float64)
    prompt = np.arange(3)[None, :]
    new = model.config.block_size - prompt.shape[1]
    counted = {}
    for use_cache in (False, True):
        positions = []
        hook = model.transformer.wte.register_forward_hook(
            lambda module, inputs, output, seen=positions: seen.append(np.shape(inputs[0])[-1]))
        counted[use_cache] = (generate(model, prompt, new, seed=3, use_cache=use_cache),
                              sum(positions))
        hook.remove()
    assert counted[False][1] == sum(range(3, 12))                      # 3 + 4 + ... + 11
    assert counted[True][1] == 11                                      # each position once
    assert np.array_equal(counted[False][0], counted[True][0])


def test_the_cache_holds_one_position_fewer_than_the_context_it_has_room_for():
    """Section 2, the KV cache: drawing from a prompt to a full context feeds
    the prompt and every drawn character but the last, so the cache ends
    with block_size - 1 positions, in the room it allocated for block_size
    (2 L T d s bytes, s = 4 in float32)."""
    from minidist import no_grad
    from minidist.models import KVCache, generate

    model = build_gpt(62, n_layer=2, n_head=2, n_embd=16, block_size=12)
    prompt = np.arange(4)[None, :]
    drawn = generate(model, prompt, 12 - 4, seed=0, use_cache=True)
    cache = KVCache(2, 12)
    with no_grad():
        model(drawn[:, :4], cache=cache)
        for position in range(4, drawn.shape[1] - 1):
            model(drawn[:, position:position + 1], cache=cache)
    assert drawn.shape[1] == 12 and cache.length == 11
    assert cache.nbytes() == 2 * 2 * 12 * 16 * 4


def test_an_even_spread_over_the_visible_keys_gives_the_own_position_the_mean_of_1_over_i():
    """Section 2, the attention heads: the yardstick the text sets the heads'
    means against, an even spread (query i gives each of its i + 1 keys
    1 / (i + 1)), is what uniform attention scores give."""
    T = 24
    scores = np.zeros((T, T))
    scores[np.triu_indices(T, 1)] = -np.inf
    P = np.exp(scores)
    P /= P.sum(axis=1, keepdims=True)
    assert np.diag(P).mean() == pytest.approx(np.mean(1 / np.arange(1, T + 1)))
    assert np.diag(P, -1).mean() == pytest.approx(np.mean(1 / np.arange(2, T + 1)))


def test_attention_costs_12_t_d_flops_per_token_per_block_forward_and_backward():
    """Section 3: 'per token and per block, 4 T d flops forward, 12 T d
    forward and backward'."""
    for layers, d, T in ((1, 32, 16), (3, 64, 32)):
        config = GPTConfig(vocab_size=62, block_size=T, n_layer=layers, n_head=4, n_embd=d)
        count = flops.gpt_step_flops(config, batch=3)
        assert count.attention == 12 * T * d * layers * count.tokens
        assert Fraction(count.attention, 3) == 4 * T * d * layers * count.tokens


def test_p_overtakes_the_rest_of_the_default_block_from_t_801():
    """Section 4's line: at width 128 and 4 heads the threshold (25 d + 2) / H
    is 800.5, not a whole number: at T = 800 P is still the smaller part,
    from T = 801 the larger."""
    d, h = 128, 4
    assert (25 * d + 2) / h == 800.5
    for T, larger in ((800, False), (801, True)):
        terms = memory.transformer_block_activation_terms(4, T, d, h)
        p = terms["attention: probabilities P (B H T T)"]
        assert (p > sum(terms.values()) - p) is larger


def test_the_quick_and_full_settings_are_those_the_lesson_announces():
    """The lesson's opening says what the quick form cuts: the full form
    trains the default configuration (4 blocks of width 128, context 64,
    batch 12, 2,000 steps); the settings in the lesson's code are the ones
    it names."""
    from pathlib import Path

    from minidist.train_gpt import GPT_DEFAULTS

    assert {k: GPT_DEFAULTS[k] for k in ("n_layer", "n_embd", "block_size", "batch_size",
                                         "steps")} == \
        dict(n_layer=4, n_embd=128, block_size=64, batch_size=12, steps=2000)
    source = (Path(__file__).parents[2] / "lessons" / "16_transformer_one_process.py").read_text()
    for line in ('RUN = dict(n_layer=1, n_head=2, n_embd=32, block_size=32, batch_size=8, steps=300,',
                 "WIDTHS = (32, 64, 128) if QUICK else (64, 128, 256, 384)",
                 "MFU_LAYERS, MFU_HEADS = (2, 4) if QUICK else (4, 4)",
                 "MFU_CONTEXT, MFU_BATCH = (32, 8) if QUICK else (64, 12)",
                 "LENGTHS = (16, 64, 256, 1024) if QUICK else (16, 32, 64, 128, 256, 512, 1024, 2048)",
                 "UNDERFLOW_EPOCHS = 3 if QUICK else 5",
                 "MP_BATCH, MP_STEPS, MP_LR = 8, (40 if QUICK else 400), 3e-3"):
        assert line in source, line
