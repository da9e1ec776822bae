"""The GPT: against PyTorch (the same model written in torch, recorded in
tests/data/torch_reference/gpt.npz by scripts/record_torch_gpt.py, and live
where torch is installed), shapes, causality, the tied output layer, its
initialisation, a finite-difference check of its gradients in float64, and
generation, with and without a KV cache."""

import functools
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from minidist import no_grad
from minidist.models import GPT, GPTConfig, generate
from minidist.models.kv_cache import KVCache
from minidist.nn import functional as F

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "data" / "torch_reference" / "gpt.npz"
_spec = importlib.util.spec_from_file_location("record_torch_gpt", ROOT / "scripts" / "record_torch_gpt.py")
recorder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recorder)
TOLERANCE = {"float64": dict(rtol=1e-9, atol=1e-12), "float32": dict(rtol=2e-5, atol=2e-6)}


@functools.lru_cache(maxsize=None)
def recorded() -> dict:
    with np.load(REFERENCE) as data:
        return {key: data[key] for key in data.files}


@functools.lru_cache(maxsize=None)
def minidist_results(dtype: str) -> dict:
    """The recorder's case computed by minidist: its parameters loaded by name."""
    x = {key.removeprefix("input/"): value for key, value in recorded().items() if key.startswith("input/")}
    model = GPT(GPTConfig(**recorder.CONFIG), dtype=np.dtype(dtype))
    params = dict(model.named_parameters())
    assert sorted(params) == sorted(key.removeprefix("param/") for key in x if key.startswith("param/"))
    for name, param in params.items():
        param.data[...] = x[f"param/{name}"]
    logits = model(x["idx"])
    loss = F.cross_entropy(logits.reshape(-1, recorder.CONFIG["vocab_size"]), x["targets"].reshape(-1))
    loss.backward()
    out = {f"logits/{dtype}": logits.data, f"loss/{dtype}": loss.data}
    out.update({f"grad/{name}/{dtype}": param.grad for name, param in params.items()})
    return out


def _compare(expected: dict, dtype: str):
    mine = minidist_results(dtype)
    keys = [key for key in expected if key.endswith("/" + dtype) and not key.startswith("input/")]
    assert len(keys) == 2 + len(recorder.parameter_shapes())  # logits, loss, every gradient
    for key in keys:
        np.testing.assert_allclose(mine[key], expected[key], err_msg=key, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_logits_loss_and_every_gradient_agree_with_recorded_torch(dtype):
    _compare(recorded(), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_logits_loss_and_every_gradient_agree_with_live_torch(dtype):
    pytest.importorskip("torch")
    _compare(recorder.record(dtype), dtype)


def tiny(dtype=np.float64, seed=0, **changes):
    config = dict(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=8)
    config.update(changes)
    return GPT(GPTConfig(**config), rng=seed, dtype=dtype)


def tokens(batch, steps, vocab=7, seed=1):
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, steps))


def test_forward_gives_next_token_logits_for_every_position():
    model = tiny(np.float32)
    for steps in (1, 4, 6):
        logits = model(tokens(3, steps))
        assert logits.shape == (3, steps, 7) and logits.dtype == np.float32
    with pytest.raises(ValueError, match="longer than block_size=6; crop it"):
        model(tokens(1, 7))
    with pytest.raises(ValueError, match=r"shape \(batch, time\)"):
        model(np.arange(4))


def test_a_later_token_never_changes_an_earlier_prediction():
    model = tiny()
    idx = tokens(2, 6)
    before = model(idx).data
    for t in range(6):
        changed = idx.copy()
        changed[:, t] = (changed[:, t] + 3) % 7
        after = model(changed).data
        np.testing.assert_allclose(after[:, :t], before[:, :t], rtol=1e-12, atol=1e-14)
        assert not np.allclose(after[:, t:], before[:, t:])  # from t on, it does matter


def test_the_output_layer_is_the_token_embedding():
    model = tiny()
    wte = model.transformer.wte.weight
    assert model.lm_head.weight is wte
    names = [name for name, _ in model.named_parameters()]
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names
    assert sum(p is wte for p in model.parameters()) == 1
    c, v, t, layers = 8, 7, 6, 2
    per_layer = 12 * c * c + 13 * c  # c_attn 3c^2+3c, c_proj c^2+c, MLP 8c^2+5c, two LayerNorms 4c
    assert model.num_parameters() == v * c + t * c + layers * per_layer + 2 * c
    assert model.num_parameters(non_embedding=True) == model.num_parameters() - t * c


def test_the_tied_gradient_is_the_sum_of_both_uses():
    idx, targets = tokens(2, 5), tokens(2, 5, seed=2)
    tied = tiny()
    loss = F.cross_entropy(tied(idx).reshape(-1, 7), targets.reshape(-1))
    loss.backward()
    untied = tiny()  # same seed: same numbers, then given its own output matrix
    from minidist.nn import Parameter

    untied.lm_head.weight = Parameter(untied.transformer.wte.weight.data.copy())
    F.cross_entropy(untied(idx).reshape(-1, 7), targets.reshape(-1)).backward()
    both = untied.transformer.wte.weight.grad + untied.lm_head.weight.grad
    np.testing.assert_allclose(tied.transformer.wte.weight.grad, both, rtol=1e-12, atol=1e-15)
    assert np.abs(untied.transformer.wte.weight.grad).max() > 0 and np.abs(untied.lm_head.weight.grad).max() > 0


def test_initialisation_is_gpt2s():
    model = GPT(GPTConfig(vocab_size=50, block_size=64, n_layer=4, n_head=4, n_embd=64), rng=0)
    params = dict(model.named_parameters())
    residual = 0.02 / math.sqrt(2 * 4)
    for name, p in params.items():
        if name.endswith("c_proj.weight"):
            assert abs(p.data.std() - residual) < 0.1 * residual, name
        elif name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            assert (p.data == 1).all(), name
        elif name.endswith(".bias"):
            assert (p.data == 0).all(), name
        else:
            assert abs(p.data.std() - 0.02) < 0.002 and abs(p.data.mean()) < 0.002, name
    same, other = GPT(model.config, rng=0), GPT(model.config, rng=1)
    assert all(np.array_equal(a.data, b.data) for a, b in zip(model.parameters(), same.parameters()))
    assert not np.array_equal(model.transformer.wte.weight.data, other.transformer.wte.weight.data)


def test_a_fresh_model_predicts_every_token_about_equally():
    model = GPT(GPTConfig(vocab_size=62, block_size=32, n_layer=2, n_head=2, n_embd=32), rng=0)
    idx, targets = tokens(8, 32, vocab=62), tokens(8, 32, vocab=62, seed=9)
    loss = F.cross_entropy(model(idx).reshape(-1, 62), targets.reshape(-1)).item()
    assert abs(loss - math.log(62)) < 0.05


def test_gradients_match_finite_differences_in_float64():
    model = tiny(np.float64, seed=3, gelu="none")
    for p in model.parameters():  # move off the special initial values (zero biases, unit gains)
        p.data += np.random.default_rng(p.data.size).normal(0, 0.05, p.data.shape)
    idx, targets = tokens(2, 5), tokens(2, 5, seed=4)

    def loss_value():
        return F.cross_entropy(model(idx).reshape(-1, 7), targets.reshape(-1))

    loss_value().backward()
    params = dict(model.named_parameters())
    rng = np.random.default_rng(0)
    checked = 0
    for name in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                 "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                 "transformer.h.1.attn.c_proj.weight", "transformer.h.1.mlp.c_fc.weight",
                 "transformer.h.1.mlp.c_proj.bias", "transformer.ln_f.bias"):
        p = params[name]
        for _ in range(3):
            index = tuple(rng.integers(0, size) for size in p.data.shape)
            saved, eps = p.data[index], 1e-6
            p.data[index] = saved + eps
            up = loss_value().item()
            p.data[index] = saved - eps
            down = loss_value().item()
            p.data[index] = saved
            numeric = (up - down) / (2 * eps)
            assert abs(p.grad[index] - numeric) <= 1e-7 + 1e-6 * abs(numeric), (name, index, p.grad[index], numeric)
            checked += 1
    assert checked == 27


def test_generation_extends_the_context_and_is_repeatable():
    model = tiny(np.float32)
    start = tokens(2, 3)
    out = generate(model, start, 10, seed=5)  # 13 tokens > block_size 6: the context is cropped
    assert out.shape == (2, 13) and out.dtype == np.int64
    assert np.array_equal(out[:, :3], start) and out.min() >= 0 and out.max() < 7
    assert np.array_equal(out, generate(model, start, 10, seed=5))
    one = generate(model, start[0], 4, seed=1)
    assert one.shape == (7,) and model.training


def test_a_kv_cache_gives_the_logits_of_the_whole_context():
    model = tiny(np.float64)
    context = tokens(2, 6)
    whole = model(context).data
    cache = KVCache(model.config.n_layer, model.config.block_size)
    with no_grad():
        parts = [model(context[:, :3], cache=cache).data]        # the prompt, causally
        parts += [model(context[:, t:t + 1], cache=cache).data for t in range(3, 6)]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-12, atol=1e-14)
    assert cache.length == 6
    assert cache.nbytes() == 2 * 2 * (2 * 2 * 6 * 4) * 8   # K and V, 2 layers, (B, H, T, D), float64


def test_generation_with_a_kv_cache_draws_the_same_tokens():
    model = tiny(np.float64)
    for start, new in ((tokens(2, 3), 10), (tokens(1, 6), 4), (tokens(3, 1), 5)):
        # 13 tokens on a block_size of 6: the window slides and the cache starts again
        for top_k in (None, 2):
            plain = generate(model, start, new, seed=5, top_k=top_k)
            cached = generate(model, start, new, seed=5, top_k=top_k, use_cache=True)
            assert np.array_equal(plain, cached)


def test_a_kv_cache_refuses_what_it_cannot_hold():
    model = tiny(np.float64)
    cache = KVCache(model.config.n_layer, model.config.block_size)
    with pytest.raises(RuntimeError, match="generate under minidist.no_grad"):
        model(tokens(1, 2), cache=cache)
    with no_grad():
        model(tokens(1, 5), cache=cache)
        with pytest.raises(ValueError, match="feed one token at a time, got 2"):
            model(tokens(1, 2), cache=cache)
        model(tokens(1, 1), cache=cache)
        with pytest.raises(ValueError, match="exceed block_size=6; crop the context and clear"):
            model(tokens(1, 1), cache=cache)
        with pytest.raises(ValueError, match="holds 1 sequences of 2 heads, the new token 3"):
            cache.clear()
            model(tokens(1, 2), cache=cache)
            model(tokens(3, 1), cache=cache)

    replaced = tiny()
    replaced.transformer.h[0].attn.attend = lambda q, k, v: q
    with pytest.raises(ValueError, match="a KV cache would bypass it; generate with use_cache=False"):
        generate(replaced, tokens(1, 2), 2, use_cache=True)

    class Wrapped(GPT):
        def forward(self, idx):
            return super().forward(idx)

    wrapped = Wrapped(tiny().config, rng=0)
    with pytest.raises(TypeError, match="Wrapped's forward does not: pass use_cache=False"):
        generate(wrapped, tokens(1, 2), 2, use_cache=True)


def test_top_k_1_is_the_most_likely_token_every_time():
    model = tiny(np.float64)
    context = tokens(3, 2)
    out = generate(model, context, 5, top_k=1, seed=0)
    for step in range(5):
        window = out[:, : 2 + step][:, -6:]
        expected = model(window).data[:, -1, :].argmax(axis=-1)
        assert np.array_equal(out[:, 2 + step], expected)


def test_temperature_sharpens_the_draws():
    model = tiny(np.float64, seed=2)
    for p in model.parameters():
        p.data *= 20  # a model with strong opinions
    context = np.zeros((200, 1), dtype=np.int64)
    greedy = generate(model, context[:1], 1, top_k=1)[0, -1]
    cold = generate(model, context, 1, temperature=0.05, seed=0)[:, -1]
    hot = generate(model, context, 1, temperature=5.0, seed=0)[:, -1]
    assert (cold == greedy).mean() > (hot == greedy).mean()
    assert len(set(hot.tolist())) > len(set(cold.tolist()))


def test_mistakes_are_named():
    with pytest.raises(ValueError, match="n_embd=10 must be a multiple of n_head=4"):
        GPTConfig(vocab_size=5, n_head=4, n_embd=10)
    with pytest.raises(ValueError, match="gelu must be"):
        GPTConfig(vocab_size=5, gelu="relu")
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        GPTConfig(vocab_size=0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        generate(tiny(), tokens(1, 2), 3, temperature=0)


@pytest.mark.parametrize(("arguments", "error", "words"), [
    (dict(temperature="hot"), TypeError, "temperature must be a number .* got 'hot' of type str"),
    (dict(temperature=float("inf")), ValueError, "temperature must be > 0 and finite, got inf"),
    (dict(temperature=float("nan")), ValueError, "temperature must be > 0 and finite, got nan"),
    (dict(top_k=2.5), TypeError, "top_k must be None or an int .* got 2.5 of type float"),
    (dict(top_k=0), ValueError, "top_k must be None or >= 1, got 0"),
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int .* got 2.5 of type float"),
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be >= 0, got -1"),
])
def test_generate_refuses_sampling_settings_up_front_naming_the_argument(arguments, error, words):
    model = tiny()
    settings = dict(max_new_tokens=3)
    settings.update(arguments)
    with pytest.raises(error, match=words) as caught:
        generate(model, tokens(1, 2), **settings)
    assert "\n" not in str(caught.value)


def test_a_kv_cache_made_for_another_model_is_refused_before_it_is_read():
    model = tiny(np.float64)   # 2 layers, block_size 6
    with no_grad():
        for cache, words in ((KVCache(1, 6), "the cache has 1 layers and the model 2"),
                             (KVCache(3, 6), "the cache has 3 layers and the model 2"),
                             (KVCache(2, 100), "holds up to 100 positions, more than the model's "
                                               "block_size=6 .*position table, not its vocabulary")):
            with pytest.raises(ValueError, match=words):
                model(tokens(1, 3), cache=cache)
            assert cache.length == 0
        shorter = KVCache(2, 4)    # fewer positions than the model has: usable, up to its own 4
        model(tokens(1, 4), cache=shorter)
        assert shorter.length == 4
    for n_layer, block_size in ((0, 6), (2, 2.5), (True, 6)):
        with pytest.raises(ValueError, match="must be a positive int"):
            KVCache(n_layer, block_size)
