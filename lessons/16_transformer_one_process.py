# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 16: a transformer on one process
#
# Every strategy of the earlier chapters was run on MLPs and CNNs. Today the
# same strategies are taught on transformers: tensor parallelism splits the
# attention heads, sequence and context parallelism split the sequence.
# Before a transformer can be split it has to exist, train, and be
# understood on one process: what its layers compute, how it learns, what a
# step costs in arithmetic and in memory, and how to train it in half
# precision. This chapter:
#
# 1. the layers, each on a tiny array: the embedding, LayerNorm, causal
#    attention, GELU, a pre-LayerNorm block;
# 2. a character-level GPT trained on the bundled Shakespeare: the loss
#    curve, a sample, and what its attention learned to look at;
# 3. a step's FLOPs counted from the model, against the machine's measured
#    matrix-product peak (MFU);
# 4. memory per layer against the sequence length: parameters, gradients,
#    optimizer state, and the activations, whose attention term grows as T^2,
#    measured next to the formula, and recomputation removing it;
# 5. mixed precision: float16 gradients that underflow without loss scaling,
#    and a GPT trained in float16 with float32 master weights next to float32.
#
# Library code: `minidist/nn/` (`embedding.py`, `layernorm.py`, GELU in
# `activation.py`, attention in `functional.py`), `minidist/models/gpt.py`
# (the GPT), `minidist/train_gpt.py` (what `minidist train --model gpt`
# runs), `minidist/flops.py` (FLOPs, the measured matrix-product peak,
# MFU), `minidist/memory.py` (the ledger per layer), `minidist/amp/`
# (GradScaler, MasterWeights).
#
# **Quick and full form.** The quick form (`MINIDIST_LESSON_QUICK=1`) runs
# every section on less: section 2 trains a one-block GPT of width 32,
# context 32, batch 8, for 300 steps (the full form: the default
# configuration, 4 blocks of width 128, context 64, batch 12, 2,000 steps);
# section 3 times a model of 2 blocks, context 32, batch 8, at widths 32, 64
# and 128 (full: 4 blocks, context 64, batch 12, widths 64, 128, 256 and
# 384); section 4 measures the block at 4 context lengths, 16 to 1024 by
# factors of 4 (full: 8, 16 to 2048 by factors of 2); section 5 trains the
# digits MLP for 3 epochs before it counts the gradients that underflow
# (full: 5 epochs) and the small GPT for 40 steps (full: 400). Where a
# verdict can differ between the forms, the text says why.

# %%
import math
import re
from collections import Counter

import numpy as np

from minidist import Tensor, amp, flops, memory, nn, no_grad, optim
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, split_tokens
from minidist.experiments.mixed_precision import gradient_underflow
from minidist.lesson import (
    glue,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    use_headless_matplotlib,
)
from minidist.lesson_timing import timed
from minidist.models import GPTConfig, KVCache, generate
from minidist.models.gpt import Block
from minidist.nn import functional as F
from minidist.runtime.blas_threads import set_blas_threads
from minidist.train_gpt import GPT_DEFAULTS, build_gpt, language_model_loss, train_gpt

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
# One BLAS thread: these products are small, and a second thread waiting for
# a busy core stalls every one of them (train_gpt does the same).
set_blas_threads(1)

import matplotlib.pyplot as plt  # noqa: E402

QUICK = quick()
OUT = output_dir()
np.set_printoptions(precision=3, suppress=True)

# %% [markdown]
# ## 1. The layers, on tiny arrays
#
# A GPT turns a sequence of token ids into, at every position, a
# distribution over the next token. Its layers, bottom to top:
#
# **Embedding.** `nn.Embedding(V, d)` is a table of V rows of d numbers; the
# id i picks row i. Its backward adds each position's gradient into the row
# it picked, so an id that occurs twice collects two gradients:

# %%
nn.init.manual_seed(0)
embedding = nn.Embedding(5, 3)
ids = np.array([[0, 2, 2, 4]])                   # (B=1, T=4): id 2 twice
rows = embedding(ids)                            # shape (1, 4, 3)
rows.sum().backward()
print("table (5 rows of 3 numbers):\n", embedding.weight.data)
print(f"ids {ids[0].tolist()}: the rows they pick, an array of shape {rows.shape}:\n",
      rows.data[0])
print("gradient of the sum, row by row (how often each id occurred):",
      embedding.weight.grad[:, 0])
assert np.array_equal(embedding.weight.grad[:, 0], np.bincount(ids.ravel(), minlength=5))

# %% [markdown]
# **LayerNorm.** Each position's d features are shifted to mean 0 and scaled
# to variance 1, then multiplied by a learned gain and shifted by a learned
# bias (1 and 0 at the start). Unlike BatchNorm nothing is shared across the
# batch or the sequence: each row is normalised alone, so a row times ten
# gives the same output.

# %%
layer_norm = nn.LayerNorm(4)
x = Tensor(np.array([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]], dtype=np.float32))
normed = layer_norm(x).data
print("input:\n", x.data, "\nLayerNorm(4):\n", normed)
print("mean per row:", normed.mean(axis=1), " variance per row:", normed.var(axis=1))
assert np.allclose(normed[0], normed[1], atol=1e-5)

# %% [markdown]
# **Causal attention.** Every position makes a query q, a key k and a value
# v, for each of the H heads D = d/H features. Position i's output is a weighted average of
# the values, the weights P = softmax(q k^T / sqrt(D)) over the keys. A
# language model must not see the future: the *causal mask* lets query i
# use keys 0..i only (the scores above the diagonal are set to minus
# infinity before the softmax, so their weights are exactly 0).
# `F.scaled_dot_product_attention(q, k, v, is_causal=True)` does it on
# (B, H, T, D) arrays, all heads in one batched product. By hand, one head,
# T = 4, D = 2:

# %%
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 1, 4, 2)).astype(np.float32) for _ in range(3))
scores = q[0, 0] @ k[0, 0].T / math.sqrt(2)
scores[np.triu_indices(4, 1)] = -np.inf                  # the future: forbidden
weights = np.exp(scores - scores.max(axis=1, keepdims=True))
weights /= weights.sum(axis=1, keepdims=True)
by_hand = weights @ v[0, 0]
attended = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v), is_causal=True).data
print("attention weights P (row = query, column = key):\n", weights)
print("output, by hand:\n", by_hand, "\nscaled_dot_product_attention:\n", attended[0, 0])
assert np.allclose(by_hand, attended[0, 0], atol=1e-6)

# %% [markdown]
# Row 0 can only look at itself (weight 1); every row sums to 1; everything
# above the diagonal is 0.
#
# **GELU.** The MLP's nonlinearity, x Phi(x) with Phi the normal
# distribution's CDF: like ReLU for large |x|, smooth near 0, slightly
# negative for small negative x. minidist's is the exact erf form
# (torch's `nn.GELU()` default):

# %%
points = np.array([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0], dtype=np.float32)
gelu = nn.GELU()(Tensor(points)).data
exact = np.array([p * 0.5 * (1 + math.erf(p / math.sqrt(2))) for p in points.astype(float)])
print(f"{'x':>6} {'GELU':>8} {'x Phi(x)':>9} {'ReLU':>6}")
for p, g, e in zip(points, gelu, exact):
    print(f"{p:6.1f} {g:8.4f} {e:9.4f} {max(p, 0):6.1f}")
assert np.allclose(gelu, exact, atol=1e-6)

# %% [markdown]
# **The block.** A pre-LayerNorm block normalises *before* each sublayer and
# adds the sublayer's output to its input (the residual stream):
#
#     x = x + attention(ln_1(x))     positions talk to each other (the past only)
#     x = x + mlp(ln_2(x))           each position alone: d -> 4d -> GELU -> d
#
# The causal mask makes the whole block causal: change the token at
# position 3, and the outputs at positions 0, 1, 2 do not move by a single
# bit; those from 3 on do.

# %%
tiny = GPTConfig(vocab_size=10, block_size=6, n_layer=1, n_head=2, n_embd=8)
block = Block(tiny, rng=np.random.default_rng(0))
before = rng.standard_normal((1, 6, 8)).astype(np.float32)
after = before.copy()
# A different token at position 3: another vector. (Adding the same number
# to all its features would not do: LayerNorm subtracts a row's mean, so
# the block would barely see it.)
after[0, 3] = rng.standard_normal(8).astype(np.float32)
with no_grad():
    moved = np.abs(block(Tensor(after)).data - block(Tensor(before)).data).max(axis=-1)[0]
print("largest change of the block's output, per position:",
      ", ".join(f"{m:.1e}" for m in moved))
assert np.all(moved[:3] == 0) and np.all(moved[3:] > 0)

# %% [markdown]
# A GPT is then: token embedding + position embedding (an id says *what*,
# the position row says *where*), L blocks (`n_layer`; in this lesson's
# formulas L counts the blocks, and the loss is called the loss), a final
# LayerNorm, and the logits: the token embedding's table used again as the
# output layer (*weight tying*: one matrix, two uses). Where the parameters
# of the default configuration (`minidist train --model gpt`) sit, under
# the names the model gives them (`minidist/models/gpt.py`): `wte` the token
# embedding (V rows of d), `wpe` the position embedding (one row of d for
# each of the `block_size` positions: `block_size` is the context length T,
# the most positions the model sees at once, 64 in this configuration),
# `block 0` ... the blocks, `ln_f` the final LayerNorm; the output layer,
# `lm_head`, is `wte` again, so it has no row of its own:

# %%
text = load_shakespeare()
tokenizer = CharTokenizer(text)
default = build_gpt(tokenizer.vocab_size)
config = default.config
d = config.n_embd
parts = Counter()
for name, param in default.named_parameters():
    if name.startswith("transformer.h."):
        part = f"block {name.split('.')[2]}"
    else:
        part = name.rsplit(".", 1)[0].removeprefix("transformer.")
    parts[part] += param.data.size
for part, count in parts.items():
    print(f"{part:22} {count:>9,}")
print(f"{'total':22} {default.num_parameters():>9,}  "
      f"(12 L d^2 = {12 * config.n_layer * d * d:,}, L = {config.n_layer}: the blocks' matrices)")
assert parts["block 0"] == 12 * d * d + 13 * d       # 4 matrices, their biases, two LayerNorms

# %% [markdown]
# Each block holds 12 d^2 weights in its four matrices (q, k, v: 3 d^2;
# attention's output: d^2; the MLP: 4 d^2 + 4 d^2) and 13 d in biases and
# LayerNorm gains; the embeddings are small here because the vocabulary is
# 62 characters (GPT-2's 50,257 tokens make them a third of the small model).
#
# ## 2. Training the GPT on Shakespeare
#
# `train_gpt` is what `minidist train --model gpt` runs (nanoGPT's
# recipe: AdamW, warm-up then cosine decay, the loss on the same fixed
# windows of the training and validation text every few steps). The quick
# form trains a one-block model for a few hundred steps; the full form the
# default configuration, 4 blocks of width 128, for 2,000 steps (minutes of
# one core).
#
# The loss is the cross-entropy: the mean over positions of -ln p, p the
# probability the model gave the character that came next. With the natural
# logarithm its unit is the *nat*, so it reads in nats per character (a
# model that guesses uniformly among V characters scores ln V). Two
# yardsticks first, counted from the text: a model that knows only how
# often each character occurs, and one that knows the previous character
# (both estimated on the training text, scored on the validation text).

# %%
train_tokens, val_tokens = split_tokens(tokenizer.encode(text), 0.1)
V = tokenizer.vocab_size
unigram = (np.bincount(train_tokens, minlength=V) + 1) / (len(train_tokens) + V)
pairs = np.ones((V, V))                               # add-one smoothing
np.add.at(pairs, (train_tokens[:-1], train_tokens[1:]), 1)
pairs /= pairs.sum(axis=1, keepdims=True)
YARDSTICKS = {
    f"uniform, ln {V}": math.log(V),
    "character frequencies": float(-np.log(unigram[val_tokens]).mean()),
    "previous character known": float(-np.log(pairs[val_tokens[:-1], val_tokens[1:]]).mean()),
}
for name, value in YARDSTICKS.items():
    print(f"{name:26} {value:.3f} nats per character")

# %%
if QUICK:
    RUN = dict(n_layer=1, n_head=2, n_embd=32, block_size=32, batch_size=8, steps=300,
               eval_every=50, eval_batches=4, sample_chars=200)
else:
    RUN = dict(GPT_DEFAULTS, eval_every=100, eval_batches=20, sample_chars=400)
trained = train_gpt(**RUN, seed=0, progress=False)
model, history = trained["model"], trained["history"]

# %%
steps = [h["step"] for h in history]
figure, axis = plt.subplots(figsize=(6.4, 3.6))
axis.plot(steps, [h["train_loss"] for h in history], "o-", color="#006BA4", label="train")
axis.plot(steps, [h["val_loss"] for h in history], "s-", color="#FF800E", label="validation")
for (name, value), style in zip(YARDSTICKS.items(), (":", "--", "-.")):
    axis.axhline(value, color="0.45", linestyle=style, linewidth=1, label=name)
axis.set_xlabel("step")
axis.set_ylabel("loss (nats per character)")
c = model.config
axis.set_title(f"GPT: {c.n_layer} block{'s' if c.n_layer > 1 else ''} x {c.n_head} heads, width {c.n_embd}, context "
               f"{c.block_size}, batch {RUN['batch_size']}")
axis.legend(fontsize=8, loc="upper right")
figure.tight_layout()
show_figure(figure, "gpt_loss.png")

words = re.findall(r"[a-z]+", trained["sample"].lower())
known = set(re.findall(r"[a-z]+", text.lower()))
real = sum(w in known for w in words)
beaten = [name for name, value in YARDSTICKS.items() if trained["val_loss"] < value]
print(f"validation loss {trained['val_loss']:.3f} after {RUN['steps']} steps "
      f"({trained['seconds']:.0f} s, {trained['tokens_per_s']:,.0f} tokens/s); below: "
      + (", ".join(beaten) or "none of the yardsticks"))
print(f"{real} of the sample's {len(words)} words ({real / max(len(words), 1):.0%}) "
      "are words of the play")
glue("val_loss", trained["val_loss"], ".3f")
glue("train_steps", RUN["steps"], ",d")
glue("pair_yardstick", YARDSTICKS["previous character known"], ".3f")
glue("pair_side", "below" if trained["val_loss"] < YARDSTICKS["previous character known"]
     else "above")
glue("real_words", f"{real} of its {len(words)}")
glue("run_size", f"{c.n_layer}-block model of width {c.n_embd}")

# %% [markdown]
# The sample above is printed by `train_gpt` (temperature 0.8, from a
# newline). Read it against the curve: above the "previous character known"
# line a model has learned letters and spaces, below it words, names in
# capitals followed by a colon, lines of verse. The line under the picture
# says which yardsticks this run went below, and how many of the sample's
# words are words of the play.

# %% jupyter={"source_hidden": true}
say("""
This run, a {glue}`run_size` trained for {glue}`train_steps` steps, ended {glue}`pair_side`
that line: a validation loss of {glue}`val_loss` against the previous character's
{glue}`pair_yardstick`, and {glue}`real_words` sampled words are words of the play. (The
quick form's model is smaller and trains far fewer steps than the full form's, which is why
the two forms can land on different sides of the line.)
""")

# %% [markdown]
# **What the attention learned.** The weights P of the last block's heads on
# a line of the validation text, recomputed here by hand from the trained
# weights (q and k from `c_attn`, the attention's d -> 3d Linear that makes q,
# k and v for all heads at once; then the mask, the softmax), and checked
# against the layer's own output. Each picture is one head, its colour the
# weight, 0 (white) to 1 (dark blue), as the colour bar says:

# %%
line = tokenizer.decode(val_tokens[:200]).split("\n")
line = next((s for s in line if len(s) >= 24), tokenizer.decode(val_tokens[:24]))[:24]
idx = tokenizer.encode(line)[None, :]
heads, width = c.n_head, c.n_embd
with no_grad():
    t = model.transformer
    x = t.wte(idx) + t.wpe(np.arange(idx.shape[1]))
    for layer in t.h[:-1]:
        x = layer(x)
    last = t.h[-1]
    qkv = last.attn.c_attn(last.ln_1(x)).data.reshape(1, len(line), 3, heads, width // heads)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))     # (1, H, T, D)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(width // heads)
    scores[..., np.triu_indices(len(line), 1)[0], np.triu_indices(len(line), 1)[1]] = -np.inf
    P = np.exp(scores - scores.max(axis=-1, keepdims=True))
    P /= P.sum(axis=-1, keepdims=True)
    layer_out = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v), is_causal=True).data
assert np.allclose(P @ v, layer_out, atol=1e-5)

figure, axes = plt.subplots(1, heads, figsize=(3.3 * heads, 4.0), layout="constrained")
labels = [ch if ch != " " else "_" for ch in line]
for h, axis in enumerate(np.atleast_1d(axes)):
    image = axis.imshow(P[0, h], cmap="Blues", vmin=0, vmax=1)
    axis.set_xticks(range(len(line)), labels, fontsize=6)
    axis.set_yticks(range(len(line)), labels, fontsize=6)
    axis.set_title(f"head {h}", fontsize=9)
    axis.set_xlabel("key (what is looked at)", fontsize=8)
np.atleast_1d(axes)[0].set_ylabel("query (who looks)", fontsize=8)
figure.colorbar(image, ax=np.atleast_1d(axes).tolist(), shrink=0.7,
                label="attention weight P (each row sums to 1)")
figure.suptitle(f"last block's attention on {line!r} ('_' = space)", fontsize=10)
show_figure(figure, "attention_pattern.png", dpi=110)
own = [float(np.diag(P[0, h]).mean()) for h in range(heads)]
previous = [float(np.diag(P[0, h], -1).mean()) for h in range(heads)]
# An even spread: query i gives each of the i + 1 keys it may see 1 / (i + 1).
even_own = float(np.mean(1 / np.arange(1, len(line) + 1)))
even_previous = float(np.mean(1 / np.arange(2, len(line) + 1)))
print("weight on the own position, mean per head:", np.round(own, 2))
print("weight on the previous position, mean per head:", np.round(previous, 2))
print(f"(an even spread over the keys a query may see: {even_own:.2f} and {even_previous:.2f})")
glue("own_weights", own, "{}")
glue("previous_weights", previous, "{}")
glue("own_weight", ", ".join(f"{w:.2f}" for w in own))
glue("previous_weight", ", ".join(f"{w:.2f}" for w in previous))
glue("even_own", even_own, ".2f")
glue("even_previous", even_previous, ".2f")
# A head has specialised on the last characters when one of them takes half its weight.
focused = [h for h in range(heads) if max(own[h], previous[h]) >= 0.5]
near_even = all(o < 2 * even_own and p < 2 * even_previous for o, p in zip(own, previous))
glue("heads_kind", "specialised" if focused else "near even" if near_even else "leaning")
if focused:
    glue("heads_verdict", "; ".join(
        f"head {h} puts most of its weight on "
        + ("its own position" if own[h] >= previous[h] else "the position before")
        for h in focused) + ": the last few characters, where spelling is decided"
        + ("" if len(focused) == heads else "; the other heads spread theirs over the line"))
else:
    below_even = any(o < even_own or p < even_previous for o, p in zip(own, previous))
    glue("heads_verdict", "no head has specialised on the last characters: "
         + ("each gives them less than twice what an even spread would"
            + (" (and some mean is below the even spread's)" if below_even else "")
            if near_even else "some give them at least twice an even spread ("
            + ", ".join(f"head {h} {where}: {ratio:.2f} times"
                        for h in range(heads)
                        for where, ratio in (("on its own position", own[h] / even_own),
                                             ("on the one before", previous[h] / even_previous))
                        if ratio >= 2)
            + "), none half")
         + f", after {RUN['steps']:,} steps of a {c.n_layer}-block model")

# %% jupyter={"source_hidden": true}
say("""
Nothing above the diagonal: the mask. Below it, the means above say, head by head, that
a query's own position gets {glue}`own_weight` of its weight and the position before it
{glue}`previous_weight`, where an even spread over the keys a query may see would give
{glue}`even_own` and {glue}`even_previous`. In this run {glue}`heads_verdict`. (Heads that
have specialised show as a dark diagonal, or a dark line just below it; a head can also
learn to look back to the last space, where the word began, which these two means do not
measure: look for dark cells in the `_` columns.)
""")

# %% [markdown]
# **Generating faster: the KV cache.** `generate` draws one character at a
# time, and for each it runs the whole context through every block again. In
# a causal model nothing later changes what an earlier position computed, so
# the keys and values of the positions already seen come out the same every
# time. A KV cache keeps them (`minidist/models/kv_cache.py`): the prompt
# runs once and fills each layer's cache; after that each call feeds the one
# new character, which appends its key and value and attends over all of
# them. Below, the same draws (same seed) with and without it, filling the
# context from a short prompt to `block_size`: how many positions went
# through the blocks, the time (fastest of interleaved repeats), and whether
# the characters agree.

# %%
prompt = np.asarray(tokenizer.encode("ROMEO:"))[None, :]
NEW = c.block_size - prompt.shape[1]   # up to a full context
CASES = {"recompute the context": False, "KV cache": True}


def generate_counting(use_cache):
    """The characters drawn, and how many positions went through the blocks
    (counted at the token embedding, which every position enters by)."""
    positions = []
    hook = model.transformer.wte.register_forward_hook(
        lambda module, inputs, output: positions.append(np.shape(inputs[0])[-1]))
    try:
        drawn = generate(model, prompt, NEW, temperature=0.8, seed=1, use_cache=use_cache)
    finally:
        hook.remove()
    return drawn, sum(positions)


texts, fed = {}, {}
for case, use_cache in CASES.items():
    texts[case], fed[case] = generate_counting(use_cache)
gen_times = timed({case: (lambda use=use: generate(model, prompt, NEW, temperature=0.8, seed=1,
                                                   use_cache=use))
                   for case, use in CASES.items()},
                  repeats=5)
print(f"{NEW} characters from {prompt.shape[1]} of prompt, context {c.block_size}:")
print(f"{'':22} {'positions through the blocks':>28} {'time':>9} {'characters/s':>13}")
for case in texts:
    print(f"{case:22} {fed[case]:>28,} {gen_times.best[case] * 1e3:>7.1f} ms "
          f"{NEW / gen_times.best[case]:>13,.0f}")
same = np.array_equal(texts["recompute the context"], texts["KV cache"])
# The cache as the draws left it: the prompt, then each drawn character but the
# last (the last one drawn is never fed back).
drawn = texts["KV cache"]
cache = KVCache(c.n_layer, c.block_size)
with no_grad():
    model(drawn[:, :prompt.shape[1]], cache=cache)
    for position in range(prompt.shape[1], drawn.shape[1] - 1):
        model(drawn[:, position:position + 1], cache=cache)
assert cache.length == fed["KV cache"] == prompt.shape[1] + NEW - 1
assert cache.nbytes() == 2 * c.n_layer * c.block_size * c.n_embd * 4   # 2 L T d s, s = 4 (float32)
print(f"the same {NEW} characters: {same}; the cache holds {cache.length} positions in the room "
      f"it allocated for {c.block_size} (block_size): {cache.nbytes():,} bytes (K and V, "
      f"{c.n_layer} layer{'s' if c.n_layer > 1 else ''}, width {c.n_embd}, float32)")
if gen_times.load.busy:
    print(gen_times.load.note("the positions column is what the cache saves"))
print(repr(tokenizer.decode(texts["KV cache"][0])))
recompute_s, cache_s = gen_times.best["recompute the context"], gen_times.best["KV cache"]
glue("fed_recompute", fed["recompute the context"], ",d")
glue("fed_cache", fed["KV cache"], ",d")
glue("half_square", c.block_size ** 2 // 2, ",d")
glue("context", c.block_size, "d")
glue("prompt_length", prompt.shape[1], "d")
glue("cache_bytes", cache.nbytes(), ",d")
glue("work_ratio", fed["recompute the context"] / fed["KV cache"], ".1f")
glue("time_ratio", recompute_s / cache_s, ".1f")
glue("recompute_ms", recompute_s * 1e3, "{:.1f} ms")
glue("cache_ms", cache_s * 1e3, "{:.1f} ms")
faster = recompute_s / cache_s
glue("cache_speed", "faster" if faster >= 1.1 else "slower" if faster <= 1 / 1.1 else "same")
work_saved = fed["recompute the context"] / fed["KV cache"]
glue("cache_time_verdict",
     (f"the cache was {faster:.1f} times as fast for {work_saved:.1f} times less work: the time "
      "follows the work less than in proportion" if faster >= 1.1 else
      f"the cache saved no time here, for {work_saved:.1f} times less work" if faster > 1 / 1.1
      else f"the cache was slower here, for {work_saved:.1f} times less work")
     + (" (the machine was busy: see the line above)" if gen_times.load.busy else ""))
glue("same_characters", "agree" if same else "differ")

# %% jupyter={"source_hidden": true}
say("""
The positions column is the work, and it does not depend on the machine: without the cache
the t-th character runs all t positions before it, {glue}`fed_recompute` positions here, about
T^2 / 2 = {glue}`half_square` for a context of T = {glue}`context`; with it each position runs
once: the {glue}`prompt_length` of the prompt, then each drawn character but the last (the
last one drawn is never fed back), {glue}`fed_cache` in all, which is what the cache holds at
the end, in the room it allocated for {glue}`context` ({glue}`cache_bytes` bytes). The time:
{glue}`recompute_ms` without the cache, {glue}`cache_ms` with it, so
{glue}`cache_time_verdict`. One position at a time is a matrix of one row, where a whole
window's rows share each weight's trip from memory, and every call pays a fixed cost (Python,
one NumPy call per operation) however few rows it multiplies.
""")

# %% [markdown]
# Past `block_size` the window slides (generate crops the context to its
# last `block_size` characters): every position moves, and with it every key
# and value, since the position embedding is added at the input, so the
# cache starts again and each further character costs a whole window, with
# or without the cache. (Models that rotate their queries and keys by
# position instead can keep the cache across the slide.) Serving systems
# keep such a cache for every sequence they generate: its bytes, 2 L T d s
# per sequence (K and V, every layer, every position, s bytes a value), are
# what limits how many sequences fit in memory at once.

# %% jupyter={"source_hidden": true}
say("""
The characters {glue}`same_characters` in this run. The cache changes where the keys and values
come from, not what they are: the tests hold the two ways equal bit for bit in float64; in
float32 they may round a logit's last bit differently, which can flip a draw only where a
random number falls within that bit of a boundary.
""")

# %% [markdown]
# ## 3. FLOPs per step and MFU
#
# Nearly all of a transformer's arithmetic is in matrix products. A product
# costs 2 flops (a multiply and an add) for every term of every output: rows
# x inner x columns of them, twice; per token the forward pass
# multiplies every weight matrix once (2 flops per weight), the backward
# twice (the input's gradient and the weight's): **6 flops per weight per
# token**, for the weights that enter a product, 12 L d^2 + d V (the blocks'
# matrices and the tied output layer). Attention adds its two products per
# head, q k^T and P v: per token and per block, 4 T d flops forward, 12 T d
# forward and backward (the backward of a product costs twice its forward,
# as above): the term that grows with the context. `flops.gpt_step_flops` counts both (tests/core/test_flops.py
# checks the count against every product the autograd runs).
#
# MFU, *model FLOPs utilisation*, is that count over the step's time over the
# machine's peak, here measured, not read from a datasheet: the best of a
# few large float32 products on the one thread the lesson uses. A matrix
# product is a GEMM (*general matrix multiply*, the routine's name in BLAS,
# the *Basic Linear Algebra Subprograms*: the library of tuned matrix
# kernels NumPy calls for float32 and float64 products), so the line below
# calls the result the GEMM peak.

# %%
peak = flops.measure_gemm_peak(threads=1, size=1024 if QUICK else 2048)
print(f"GEMM peak of this machine, 1 thread, float32: {peak / 1e9:.1f} GFLOP/s")


def one_step(model, windows):
    """One training step: forward, cross-entropy, backward, AdamW."""
    optimizer = optim.AdamW(model.parameters(), lr=1e-3)
    x, y = windows.sample()

    def step():
        optimizer.zero_grad()
        language_model_loss(model, x, y).backward()
        optimizer.step()
    return step


WIDTHS = (32, 64, 128) if QUICK else (64, 128, 256, 384)
MFU_LAYERS, MFU_HEADS = (2, 4) if QUICK else (4, 4)
MFU_CONTEXT, MFU_BATCH = (32, 8) if QUICK else (64, 12)
steppers, counts = {}, {}
for width in WIDTHS:
    gpt = build_gpt(V, MFU_LAYERS, MFU_HEADS, width, MFU_CONTEXT, seed=0)
    steppers[width] = one_step(gpt, RandomWindows(train_tokens, MFU_CONTEXT, MFU_BATCH, seed=0))
    counts[width] = flops.gpt_step_flops(gpt.config, MFU_BATCH)
# The widths take turns, repeat after repeat, each keeping its fastest step.
step_times = timed(steppers, repeats=5 if QUICK else 8)
print(f"{MFU_LAYERS} blocks, {MFU_HEADS} heads, context {MFU_CONTEXT}, batch {MFU_BATCH} "
      f"({MFU_CONTEXT * MFU_BATCH} tokens per step)")
print(f"{'width':>5} {'matmul weights':>19} {'6 x them x tokens':>17} {'attention':>11} "
      f"{'share':>6} {'step ms':>8} {'GFLOP/s':>8} {'MFU':>6}")
mfu = {}
for width in WIDTHS:
    count, seconds = counts[width], step_times.best[width]
    mfu[width] = flops.achieved(count.total, seconds) / peak
    print(f"{width:>5} {count.matmul_parameters:>19,} {count.dense:>17,} {count.attention:>11,} "
          f"{count.attention / count.total:>6.1%} {seconds * 1e3:>8.1f} {count.total / seconds / 1e9:>8.2f} {mfu[width]:>6.1%}")
print(f"(fastest of {step_times.repeats} interleaved repeats; {step_times.load.describe()})")
busy = step_times.load.note("the flop counts are exact; the times and MFU are not")
if busy:
    print(busy)
rising = all(mfu[a] < mfu[b] for a, b in zip(WIDTHS, WIDTHS[1:]))
mfu_verdict = glue("mfu_verdict", "MFU rose with every step in width" if rising else
                   "MFU did not rise with every step in width in this run"
                   + (" (the machine was busy: see above)" if step_times.load.busy else ""))
print(mfu_verdict)
shares = [counts[w].attention / counts[w].total for w in WIDTHS]
glue("attention_shares", shares, "{}")
glue("attention_share_most", max(shares), ".1%")
glue("attention_share_least", min(shares), ".1%")
glue("mfu_context", MFU_CONTEXT, "d")
glue("mfu_widths", f"{WIDTHS[0]} to {WIDTHS[-1]}")
glue("mfu_range", f"{mfu[WIDTHS[0]]:.1%} at width {WIDTHS[0]} to {mfu[WIDTHS[-1]]:.1%} at "
     f"{WIDTHS[-1]}")

figure, axis = plt.subplots(figsize=(5.4, 3.4))
axis.bar([str(w) for w in WIDTHS], [100 * mfu[w] for w in WIDTHS], color="#006BA4")
axis.set_xlabel("width d (n_embd)")
axis.set_ylabel("MFU (% of the measured peak)")
axis.set_title(f"a GPT training step against {peak / 1e9:.0f} GFLOP/s (1 thread)", fontsize=10)
figure.tight_layout()
show_figure(figure, "mfu_by_width.png")

# %% jupyter={"source_hidden": true}
say("""
At this context, T = {glue}`mfu_context`, attention is {glue}`attention_share_most` of a
step's flops at the smallest width and {glue}`attention_share_least` at the largest (the share
column). MFU went from {glue}`mfu_range`: {glue}`mfu_verdict`.
""")

# %% [markdown]
# Against the blocks' dense products, 6 x 12 L d^2 per token, attention's
# 12 L d T is T / 6d of them: its share falls as the width grows, and it
# matters once the context is several times the width (GPT-2 small: d = 768,
# T = 1024, 2/9). MFU should rise with the width while the products are
# small, and the line under the table says whether it did here (at the
# largest widths the operands may leave the processor's caches, and load
# beside the lesson weighs on the slowest steps most): a product of
# (B T, d) by (d, 4d) is small at the table's smallest widths (the BLAS kernel spends its time
# starting up and moving data, not multiplying), and a step has work that is
# not a product at all (LayerNorm, softmax, GELU, the optimizer's update:
# elementwise and memory-bound, in the time but not in the count), whose
# share shrinks as d grows (it is O(d), the products O(d^2) per token).
# For scale: Chowdhery et al. report in *PaLM: Scaling Language Modeling
# with Pathways* (2022) 46.2 % MFU training its 540B model on 6,144 TPU v4
# chips, counted the same way. `benchmarks/bench_gpt.py` puts minidist's step
# next to PyTorch's on the same model.
#
# ## 4. Memory per layer against the sequence length
#
# What one process holds while it trains the default GPT with AdamW, layer by
# layer, measured by the ledger after a step (`memory.layer_bytes`), in
# bytes, not parameters: each weight's 4 bytes (4 times the counts of
# section 1's table), its gradient's 4, Adam's two moments' 8. The tied
# matrix counts once, with the token embedding (`wte (= lm_head)`: the
# output layer is the same array).

# %%
gpt = build_gpt(V, seed=0)
optimizer = optim.AdamW(gpt.parameters(), lr=1e-3)
optimizer.zero_grad()
language_model_loss(gpt, *RandomWindows(train_tokens, 64, 12, seed=0).sample()).backward()
optimizer.step()
t = gpt.transformer
layers = {"wte (= lm_head)": t.wte, "wpe": t.wpe,
          **{f"block {i}": block for i, block in enumerate(t.h)}, "ln_f": t.ln_f}
table = memory.layer_bytes(layers, optimizer)
print("bytes per layer (4 a value: float32)")
print(f"{'layer':16} {'weights':>11} {'gradients':>11} {'Adam m, v':>11}")
for name, held in table.items():
    print(f"{name:16} {held['parameters']:>11,} {held['gradients']:>11,} "
          f"{held['optimizer_state']:>11,}")
block_states = sum(table["block 0"].values())
assert table["block 0"]["parameters"] == 4 * (12 * d * d + 13 * d)
assert table["block 0"]["optimizer_state"] == 2 * table["block 0"]["parameters"]

# %% [markdown]
# Those bytes do not depend on the batch or the context. The activations,
# what the graph keeps for the backward, do. For one block (one layer),
# `memory.transformer_block_activation_terms` writes them out as minidist's
# ops keep them, values of s bytes each (s = 4 in float32): 25 B T d values
# (q, k, v, the LayerNorms' outputs, the MLP's 4d-wide arrays, ...), 2 B T of
# LayerNorm statistics, and the attention probabilities P, **B H T^2**
# values: the only term that grows with the square of the context. It is
# the course's one count of a block's activations: lesson 17 splits it over
# tensor-parallel ranks and lesson 18 takes it to long contexts, with the
# same function. `memory.activations_against_length` runs one block of the
# default width on random inputs (batch 4) for several T and measures what its graph
# keeps with the ledger, next to the formula, with and without
# recomputation (`minidist.nn.checkpoint`: the block's graph keeps only its
# input and its output, and its forward runs again in the backward; the
# input is the block before's output, counted there, so each block's own
# count is one (B, T, d) array, its output):

# %%
B = 4
LENGTHS = (16, 64, 256, 1024) if QUICK else (16, 32, 64, 128, 256, 512, 1024, 2048)
block_config = GPTConfig(vocab_size=V, block_size=max(LENGTHS), n_layer=1, n_head=config.n_head,
                         n_embd=d)
rows = memory.activations_against_length(lambda: Block(block_config, rng=np.random.default_rng(0)),
                                         d, config.n_head, B, LENGTHS)
print(f"one block, width {d}, {config.n_head} heads, batch {B} (bytes)")
print(f"{'T':>5} {'formula':>13} {'measured':>13} {'P (B H T^2)':>13} {'share':>6}"
      f" {'recompute':>11} {'measured':>11}")
for row in rows:
    print(f"{row['T']:>5} {row['formula']:>13,} {row['measured']:>13,} "
          f"{row['attention_scores']:>13,} {row['attention_scores'] / row['formula']:>6.0%} "
          f"{row['formula_recompute']:>11,} {row['measured_recompute']:>11,}")
    assert row["formula"] == row["measured"] and row["formula_recompute"] == row["measured_recompute"]
# Where P overtakes the other 25 B T d + 2 B T values: B H T^2 = (25 d + 2) B T.
crossover = (25 * d + 2) / config.n_head
first_above = math.floor(crossover) + 1
print(f"P outweighs the rest of the block's activations (25 B T d + 2 B T values) where "
      f"T > (25 d + 2) / H = {crossover:g}: from T = {first_above:,}")

figure, axis = plt.subplots(figsize=(6.4, 4.0))
T = np.array([row["T"] for row in rows])
MB = 1e6
axis.loglog(T, [row["measured"] / MB for row in rows], "o", color="#C85200",
            label="activations, measured")
axis.loglog(T, [row["formula"] / MB for row in rows], "-", color="#C85200", linewidth=1,
            label="activations, formula")
axis.loglog(T, [row["attention_scores"] / MB for row in rows], "--", color="#A2C8EC",
            label="of which P (B H T^2)")
axis.loglog(T, [row["measured_recompute"] / MB for row in rows], "s-", color="#006BA4",
            label="with recomputation")
axis.axhline(block_states / MB, color="0.3", linestyle=":",
             label="weights + gradients + Adam")
axis.axvline(crossover, color="0.6", linewidth=0.8, label="P = the rest of the activations")
axis.set_xscale("log", base=2)
axis.set_xlabel("sequence length T")
axis.set_ylabel("MB, one block")
axis.set_title(f"one transformer block, width {d}, batch {B}", fontsize=10)
axis.legend(fontsize=8, loc="upper left")
figure.tight_layout()
show_figure(figure, "memory_per_layer.png")

# %% [markdown]
# The measured points sit on the formula to the byte. In the picture above
# (`memory_per_layer.png`), at short contexts the activations grow linearly
# with T (slope 1 on its log-log axes) and the model states (the dotted
# line) dominate; past the vertical line, where P equals the rest, the T^2
# term takes over (slope 2): doubling the context quadruples it.
# Recomputation keeps one (B, T, d) array per block (its output, the next
# block's input): P exists only while one block's backward runs, at the
# price of a second forward. Flash attention goes further and never
# materialises P at all (it recomputes P block by block inside the
# attention's own backward); sequence and context parallelism split T across
# processes.
#
# ## 5. Mixed precision
#
# float16 has 5 exponent bits: its smallest positive number is 2^-24 (6e-8),
# and anything below half of that becomes 0. Gradients are often that small:
# a logit's gradient is (softmax - onehot) / B for a mean over a batch of B
# examples.
# **Loss scaling** multiplies the loss by S before the backward, so every
# gradient is S times larger and clears the underflow; the gradients are
# divided by S again in float32 before the step (GradScaler does both, and
# skips a step whose gradients overflowed to inf, halving S).
#
# The experiment `minidist.experiments.mixed_precision.gradient_underflow`
# measures it on the digits MLP after a few epochs of training (3 in the
# quick form, 5 in the full; by then most examples are classified well and
# their gradients are tiny): the gradient of the mean
# loss over the whole training set, in float16 at several scales, against
# float64. The MLP, not the GPT, because it needs many float16 backward
# passes of a large batch, and float16 products in NumPy have no BLAS (the
# timing of the GPT's step below compares them with float32's).

# %%
SCALES = (1.0, 2.0**4, 2.0**8, 2.0**12, 2.0**16)
UNDERFLOW_EPOCHS = 3 if QUICK else 5
underflow = gradient_underflow(epochs=UNDERFLOW_EPOCHS, scales=SCALES)
print(f"the digits MLP after {UNDERFLOW_EPOCHS} epochs; 'of' counts the entries that are not "
      "0 in float64")
print(f"{'loss scale':>10} {'activation gradients lost':>26} {'weight gradients lost':>22}")
for row in underflow:
    print(f"{row['scale']:>10,.0f} {row['activation_underflowed']:>11,} of "
          f"{row['activation_entries']:>9,} {row['weight_underflowed']:>8,} of "
          f"{row['weight_entries']:>7,}")

figure, axis = plt.subplots(figsize=(6.0, 3.5))
where = np.arange(len(SCALES))
for offset, key, total, colour, label in (
        (-0.2, "activation_underflowed", "activation_entries", "#C85200", "activation gradients"),
        (0.2, "weight_underflowed", "weight_entries", "#006BA4", "weight gradients")):
    axis.bar(where + offset, [100 * r[key] / r[total] for r in underflow], 0.4, color=colour,
             label=label)
axis.set_xticks(where, ["1 (none)"] + [f"2^{int(math.log2(s))}" for s in SCALES[1:]])
axis.set_xlabel("loss scale S")
axis.set_yscale("log")
axis.set_ylabel("% of nonzero entries lost (log)")
axis.set_title("float16 gradients that underflow to 0 (digits MLP)", fontsize=10)
axis.legend(fontsize=8)
figure.tight_layout()
show_figure(figure, "gradient_underflow.png")
assert all(a["activation_underflowed"] >= b["activation_underflowed"]
           for a, b in zip(underflow, underflow[1:]))
lost = [row["activation_underflowed"] for row in underflow]
glue("lost_unscaled", lost[0] / underflow[0]["activation_entries"], ".1%")
glue("lost_weights_unscaled", underflow[0]["weight_underflowed"] / underflow[0]["weight_entries"],
     ".1%")
glue("lost_counts", lost, "{}")
# What each factor of 16 rescued of what the scale before it left
rescued = [1 - after / before if before else 1.0 for before, after in zip(lost, lost[1:])]
glue("rescued", rescued, "{}")
glue("rescued_least", min(rescued), ".0%")
glue("rescued_most", max(rescued), ".0%")
glue("rescue_verdict", "most of" if min(rescued) > 0.5 else "not always most of")
glue("lost_largest_scale", lost[-1], ",d")
# The same for the weight gradients' column (fewer entries, so coarser steps)
lost_weights = [row["weight_underflowed"] for row in underflow]
glue("lost_weight_counts", lost_weights, "{}")
rescued_weights = [1 - after / before for before, after in zip(lost_weights, lost_weights[1:])
                   if before]
glue("rescued_weights", rescued_weights, "{}")
glue("weights_rescue_verdict",
     "no weight gradient was lost at any scale" if not lost_weights[0] else
     f"each factor of 16 rescued between {min(rescued_weights):.0%} and "
     f"{max(rescued_weights):.0%} of those left"
     + (": most of them every time" if min(rescued_weights) > 0.5 else
        ": not always most of them" if max(rescued_weights) > 0.5 else
        ": never most of them")
     + ("" if lost_weights[-1] else
        f", and none is lost from 2^{int(math.log2(SCALES[lost_weights.index(0)]))} on"))
glue("underflow_epochs", UNDERFLOW_EPOCHS, "d")
glue("underflow_epochs_other", 5 if QUICK else 3, "d")
glue("underflow_form_other", "full" if QUICK else "quick")

# %% jupyter={"source_hidden": true}
say("""
After {glue}`underflow_epochs` epochs, without scaling {glue}`lost_unscaled` of the
activation gradients' nonzero entries (and {glue}`lost_weights_unscaled` of the weight
gradients') are exactly 0 in float16: those weights do not learn from those examples at all.
In the activation column each factor of 16 in S rescued {glue}`rescue_verdict` what was left
(between {glue}`rescued_least` and {glue}`rescued_most` of it); at 2^16,
{glue}`lost_largest_scale` activation entries are still lost. In the weight column
{glue}`weights_rescue_verdict`. GradScaler starts at 2^16 and halves S only when something
overflows.

The {glue}`underflow_form_other` form trains the MLP {glue}`underflow_epochs_other` epochs
instead, so its counts differ: the longer it trains, the more examples it fits well, the
smaller their gradients and the more of them underflow; and the entries that are not 0 at
all in float64 (the "of" column) change with the weights too: where a ReLU unit is off for an
example, the gradient at its input is exactly 0, and which units are off depends on the
weights.
""")

# %% [markdown]
# **Training the GPT in mixed precision.** The recipe of Micikevicius et al.,
# *Mixed Precision Training* (2018), as `minidist.amp` implements it: the model in float16 (its
# forward and backward compute in float16), float32 *master* copies of the
# weights that the optimizer steps, the loss in float32 from float32 logits,
# GradScaler around the backward. Against the same model, seed and windows
# in float32, and, as the measure of noise, float32 on other windows. A
# small GPT (one block of width 32), because NumPy's float16 products have
# no BLAS (the timing below).

# %%
MP = dict(n_layer=1, n_head=2, n_embd=32, block_size=32)
MP_BATCH, MP_STEPS, MP_LR = 8, (40 if QUICK else 400), 3e-3


def train_precision(mode, steps, windows_seed=0):
    """Per-step training loss of the small GPT in "float32" or "mixed"."""
    model = build_gpt(V, **MP, seed=0)
    windows = RandomWindows(train_tokens, MP["block_size"], MP_BATCH, seed=windows_seed)
    if mode == "mixed":
        model.half()
        masters = amp.MasterWeights(model)
        optimizer = optim.AdamW(masters.parameters(), lr=MP_LR)
        scaler = amp.GradScaler()
    else:
        optimizer = optim.AdamW(model.parameters(), lr=MP_LR)
    losses, skipped = [], 0
    for _ in range(steps):
        x, y = windows.sample()
        model.zero_grad()
        logits = model(x).astype(np.float32)          # the loss in float32
        loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        if mode == "mixed":
            scale = scaler.get_scale()
            scaler.scale(loss).backward()              # float16 gradients, times S
            masters.copy_grads_to_masters()
            scaler.step(optimizer)                     # unscaled in float32; skipped on inf
            scaler.update()
            skipped += scaler.get_scale() < scale
            masters.copy_masters_to_model()            # float16 weights from the masters
        else:
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
    return np.array(losses), skipped


def forward_backward(model):
    """The forward and backward of one batch (the part that runs in float16)."""
    x, y = RandomWindows(train_tokens, MP["block_size"], MP_BATCH, seed=0).sample()

    def step():
        model.zero_grad()
        F.cross_entropy(model(x).astype(np.float32).reshape(-1, V), y.reshape(-1)).backward()
    return step


speed = timed({"float32": forward_backward(build_gpt(V, **MP, seed=0)),
               "float16": forward_backward(build_gpt(V, **MP, seed=0).half())}, repeats=3)
half_ratio = speed.best["float16"] / speed.best["float32"]
print(f"forward + backward of this GPT: float32 {speed.best['float32'] * 1e3:.1f} ms, float16 "
      f"{speed.best['float16'] * 1e3:.1f} ms ("
      + (f"{half_ratio:.0f}x slower: NumPy multiplies float16 matrices without BLAS)"
         if half_ratio > 1 else f"{1 / half_ratio:.1f}x faster, in this run)"))
if speed.load.busy:
    print(speed.load.note())
glue("half_ratio", half_ratio, ".2f")
glue("half_timing", f"{half_ratio:.0f} times as long as float32's" if half_ratio > 1 else
     f"less time than float32's ({half_ratio:.2f} of it)")

curves = {"float32": train_precision("float32", MP_STEPS)}
curves["mixed"] = train_precision("mixed", MP_STEPS)
curves["float32, other windows"] = train_precision("float32", MP_STEPS, windows_seed=1)


SMOOTH = max(MP_STEPS // 20, 2)   # steps per moving average


def smooth(values, width=SMOOTH):
    return np.convolve(values, np.ones(width) / width, mode="valid")


gap_mixed = np.abs(smooth(curves["mixed"][0]) - smooth(curves["float32"][0])).mean()
gap_noise = np.abs(smooth(curves["float32, other windows"][0])
                   - smooth(curves["float32"][0])).mean()
print(f"mean distance of the smoothed curves from float32's: mixed precision {gap_mixed:.4f}, "
      f"float32 on other windows {gap_noise:.4f}; GradScaler skipped {curves['mixed'][1]} steps")

figure, axis = plt.subplots(figsize=(6.4, 3.6))
for (name, (losses, _)), colour, style in zip(curves.items(), ("#006BA4", "#C85200", "0.6"),
                                               ("-", "--", ":")):
    axis.plot(np.arange(len(smooth(losses))) + 1, smooth(losses), style, color=colour, label=name)
axis.set_xlabel("step")
axis.set_ylabel("training loss (moving average)")
axis.set_title(f"GPT: 1 block of width 32, float32 and mixed precision, {MP_STEPS} steps",
                fontsize=10)
axis.legend(fontsize=8)
figure.tight_layout()
show_figure(figure, "mixed_precision_gpt.png")
glue("gap_mixed", gap_mixed, ".4f")
glue("gap_noise", gap_noise, ".4f")
glue("gap_verdict", "closer" if gap_mixed < gap_noise else "less close")
glue("gap_meaning", "smaller" if gap_mixed < gap_noise else "not smaller")

# %% jupyter={"source_hidden": true}
say("""
Mixed precision followed float32's curve {glue}`gap_verdict` than float32 followed itself on
other windows (a mean distance of {glue}`gap_mixed` against {glue}`gap_noise`): in this run the
difference float16 makes is {glue}`gap_meaning` than the difference the data's order makes.
A float16 forward and backward of this GPT took {glue}`half_timing` (the timing above).
""")

# %% [markdown]
# What mixed precision saves is memory
# and, on hardware with float16 units, time: the activations are half the
# bytes (the weights are not: float16 copy + float32 master + float32
# gradient cost more per parameter than float32 alone), and a GPU's tensor
# cores multiply float16 several times faster than float32. NumPy has
# neither: here mixed precision is a lesson in numerics, not in speed.
#
# **Try**: train the full configuration (`minidist train --model gpt`) and
# change `--context`: the step's attention flops and the block's activations
# both grow with it; rerun section 4 with `recompute` in mind and find the
# context where the T^2 term is half the block's memory. Set the GradScaler's
# `init_scale` (the loss scale S it starts from) to 1 in `train_precision`
# (the function of section 5 that trains the small GPT: replace its
# `amp.GradScaler()` by `amp.GradScaler(init_scale=1.0)`) and watch how
# often it grows the scale back.
