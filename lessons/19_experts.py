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
# # Lesson 19: experts
#
# A transformer block spends most of its parameters and most of its work
# per token in the MLP (lesson 16: 8 d^2 of the block's 12 d^2 weights). A
# **mixture of experts** (MoE: Shazeer et al., *Outrageously Large Neural
# Networks: The Sparsely-Gated Mixture-of-Experts Layer*, 2017; Lepikhin et
# al., *GShard: Scaling Giant Models with Conditional Computation and
# Automatic Sharding*, 2020; Fedus, Zoph and Shazeer, *Switch Transformers:
# Scaling to Trillion Parameter Models with Simple and Efficient Sparsity*,
# 2021) keeps E such MLPs,
# the *experts*, and a small *router* that sends each token to k of them:
# E times the parameters for about k times the work of one MLP. The
# experts do not fit on one rank for long, and they need not: **expert
# parallelism** (EP) puts each rank's share of the experts on it and sends
# every token to the rank of its expert and back, with an all_to_all. It is
# set against **tensor parallelism** (TP, lesson 17), which splits one dense
# MLP's matrices over the ranks. This chapter:
#
# 1. what an MoE layer holds and costs, against the dense MLP;
# 2. routing on tiny numbers, by hand: top-k, Switch's gate (k = 1) and
#    GShard's pair (k = 2), checked against the layer;
# 3. capacity: the capacity factor, the dropped choices counted, and what
#    happens to a token whose every choice is dropped;
# 4. load balance and Switch's auxiliary loss, by hand, then what it does to
#    the router over a short training run;
# 5. expert parallelism on 2 processes: the counts, then the tokens, in an
#    all_to_all with uneven split sizes, drawn from a traced step, equal to
#    one process; its bytes from the trace against the formula and against
#    the tensor-parallel dense MLP's all_reduce on the same tokens;
# 6. the all_to_all against the all_reduce at 8 to 128 ranks (256 in the
#    full form), simulated;
# 7. the MoE GPT trained on an expert x data parallel mesh, equal to one
#    process.
#
# Library code: `minidist/models/moe.py` (the layer, `MoEGPT`),
# `minidist/parallel/expert/dispatch.py` (the strategy),
# `minidist/parallel/expert/costs.py` (the formulas), `viz/moe_dispatch.py` (the
# picture).
#
# Symbols as in `lessons/NOTATION.md`: d the model width, E experts, k the
# experts a token is sent to, n the ranks of a group, s bytes per value, N a
# message's bytes, g a gate (the weight the router gives an expert's output;
# p is kept for pipeline stages); a batch of B sequences of T positions
# holds B T tokens.
#
# **Quick and full form.** The quick form (`MINIDIST_LESSON_QUICK=1`) trains
# section 4's three MoE GPTs for 60 steps each (the full form: 200),
# simulates section 6 at 8 to 128 ranks (full: to 256), and runs section 7
# on one mesh of 2 processes (full: also two meshes of 4). Section 4's
# verdict on the loss can differ between the forms: at 60 steps the loss is
# still falling fast, and which run is ahead can change from one stretch of
# steps to the next; in either form the text weighs the differences against
# their noise.

# %%
import numpy as np
from rich.console import Console

import minidist
import minidist.distributed as dist
from minidist import Tensor, optim, trace
from minidist.data import CharTokenizer, load_shakespeare
from minidist.distributed import simulate
from minidist.lesson import (
    glue,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    use_headless_matplotlib,
)
from minidist.models.gpt import MLP, GPTConfig
from minidist.models.moe import MoE, MoEGPT, MoEGPTConfig, expert_capacity, moe_layers
from minidist.parallel.expert.costs import (
    balanced_dispatch_bytes,
    dense_mlp_all_reduce_bytes,
    dispatch_bytes,
    dispatch_matrix,
)
from minidist.parallel.expert.dispatch import (
    ExpertParallelMoE,
    allreduce_moe_grads,
    expert_parallel_gpt,
)
from minidist.parallel.mesh.plan_inputs import CLUSTER
from minidist.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

import matplotlib.pyplot as plt  # noqa: E402

from viz.moe_dispatch import dispatch_figure, dispatch_text  # noqa: E402

QUICK = quick()
OUT = output_dir()
#: matplotlib's tableau-colorblind10 (lessons 10 and 17's colours).
COLOURS = ("#006BA4", "#FF800E", "#ABABAB", "#595959", "#5F9ED1", "#C85200", "#898989", "#A2C8EC")


def relative_error(actual, wanted):
    return float(np.abs(actual - wanted).max() / np.abs(wanted).max())


def table(rows, header):
    """Rows of numbers under a header, right-aligned."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(f"{str(h):>{w}}" for h, w in zip(header, widths))]
    lines += ["  ".join(f"{str(c):>{w}}" for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


# %% [markdown]
# ## 1. What an MoE layer holds
#
# The GPT's MLP is d -> 4d -> GELU -> d: 8 d^2 weights and 5 d biases,
# 16 d^2 flops per token forward (2 per multiply-add). An MoE layer of E
# such experts with a router (a d -> E Linear without bias) holds
# E (8 d^2 + 5 d) + d E parameters; a token goes through k experts, so it
# costs k 16 d^2 flops plus the router's 2 d E. With experts of the GPT's
# shape, for widths 768 (GPT-2 small's) and 4096, and E and k as in Mixtral
# (Jiang et al., *Mixtral of Experts*, 2024: 8 experts, k = 2) or in the
# Switch Transformer (up to hundreds, k = 1):

# %%
def mlp_parameters(width):
    return 8 * width * width + 5 * width


for width, experts, k in ((768, 8, 2), (768, 64, 1), (4096, 8, 2)):
    params = experts * mlp_parameters(width) + width * experts
    flops = k * 16 * width * width + 2 * width * experts
    print(f"d = {width:>4}, E = {experts:>2}, k = {k}: {params / 1e6:7.1f} M parameters "
          f"({params / mlp_parameters(width):5.1f}x the MLP's), {flops / 1e6:6.1f} M flops a "
          f"token forward ({flops / (16 * width * width):.2f}x)")

small = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16)
moe_small = MoE(small, n_expert=4, top_k=1, rng=0)
counted = sum(p.data.size for p in moe_small.parameters())
assert counted == 4 * mlp_parameters(16) + 16 * 4   # the formula above, on a real layer
assert sum(p.data.size for p in MLP(small, rng=0).parameters()) == mlp_parameters(16)
print(f"a real MoE(width 16, 4 experts) counts {counted:,} parameters = 4 x "
      f"{mlp_parameters(16):,} + 16 x 4")

# %% [markdown]
# Parameters grow with E, work with k: that is the whole appeal. The cost is
# elsewhere: the tokens of a batch must be **routed** (sections 2 to 4), and
# once the experts live on different ranks, **moved** (sections 5 to 7).
#
# ## 2. Routing, by hand
#
# Eight tokens of width 4 and an MoE layer of 4 experts. The router is a
# Linear: `probs = softmax(x W_r^T)`, one probability per expert for every
# token. With k = 1 (Switch) each token goes to its most probable expert and
# its output is that expert's output times the probability itself, the
# **gate** g: were the gate normalised to 1, the router would get no
# gradient from the output and could not learn. With k = 2 (GShard, and
# Mixtral's softmax over the top k is the same) a token goes to its two most
# probable experts, gated by their probabilities divided by their sum.

# %%
TINY = GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=4)
TINY_EXPERTS = 4
tiny_x = np.random.default_rng(5).normal(size=(8, TINY.n_embd))


def tiny_moe(top_k, capacity_factor=None):
    return MoE(TINY, TINY_EXPERTS, top_k, capacity_factor, rng=0, dtype=np.float64)


layer = tiny_moe(1)
logits = tiny_x @ layer.router.weight.data.T
probs = np.exp(logits - logits.max(axis=1, keepdims=True))
probs /= probs.sum(axis=1, keepdims=True)
first = probs.argmax(axis=1)
order = np.argsort(-probs, axis=1, kind="stable")
second = order[:, 1]
pair_gates = probs[np.arange(8), first] / (probs[np.arange(8), first] + probs[np.arange(8), second])
print(table([[t, *(f"{p:.3f}" for p in probs[t]), int(first[t]), f"{probs[t, first[t]]:.3f}",
              f"{first[t]},{second[t]}", f"{pair_gates[t]:.3f},{1 - pair_gates[t]:.3f}"]
             for t in range(8)],
            ["token", "prob e0", "prob e1", "prob e2", "prob e3", "k=1: expert", "gate g",
             "k=2: experts", "gates g"]))


def expert_out(moe, expert, rows):
    return moe.experts[int(expert)](Tensor(rows)).data


by_hand = np.stack([probs[t, first[t]] * expert_out(layer, first[t], tiny_x[t:t + 1])[0]
                    for t in range(8)])
switch_y = layer(Tensor(tiny_x)).data
pair = tiny_moe(2)
by_hand_2 = np.stack([pair_gates[t] * expert_out(pair, first[t], tiny_x[t:t + 1])[0]
                      + (1 - pair_gates[t]) * expert_out(pair, second[t], tiny_x[t:t + 1])[0]
                      for t in range(8)])
gshard_y = pair(Tensor(tiny_x)).data
print(f"\nk = 1: the layer's output against the hand's, largest difference "
      f"{np.abs(switch_y - by_hand).max():.1e}; k = 2: {np.abs(gshard_y - by_hand_2).max():.1e}")
assert np.allclose(switch_y, by_hand, rtol=1e-12, atol=1e-14)
assert np.allclose(gshard_y, by_hand_2, rtol=1e-12, atol=1e-14)
assert (layer.routing.choices[:, 0] == first).all() and (pair.routing.choices[:, 1] == second).all()

# %% [markdown]
# The layer computes exactly this: a gather of each token's row for each of
# its choices, the experts on their rows, and a scatter-add of the gated
# outputs back into the tokens. Only the chosen experts work: with k = 1 a
# token costs one MLP, whatever E.
#
# ## 3. Capacity: places per expert, and the dropped
#
# An expert's buffer has a fixed size, so that its work, and later what a
# rank receives, has a bound. Each expert takes at most
# `capacity = ceil(k B T / E * capacity_factor)` of a batch's k B T choices
# (k for each of its B T tokens): a capacity factor of 1.0 gives each
# expert exactly its even share. Places go in token order, and with k = 2 all first choices before
# any second choice (GShard's priority). A choice that finds its expert full
# is **dropped**. The eight tokens above, capacity factor 1.0 (2 places an
# expert for k = 1, 4 for k = 2):

# %%
for top_k in (1, 2):
    capped = tiny_moe(top_k, capacity_factor=1.0)
    capped_y = capped(Tensor(tiny_x)).data
    routing = capped.routing
    print(f"k = {top_k}: capacity = ceil({top_k} x 8 / 4 x 1.0) = {routing.capacity}")
    rows = [[t, *(f"e{routing.choices[t, c]} slot {routing.slot[t, c]} "
                  + ("kept" if routing.kept[t, c] else "DROPPED") for c in range(top_k))]
            for t in range(8)]
    print(table(rows, ["token"] + [f"choice {c + 1}" for c in range(top_k)]))
    print(f"   routed to each expert {routing.routed.tolist()}, kept {routing.load.tolist()}: "
          f"{routing.dropped} choice(s) dropped, {routing.dropped_tokens} token(s) with every "
          f"choice dropped\n")
    assert routing.capacity == expert_capacity(8, 4, top_k, 1.0)
    assert (routing.load <= routing.capacity).all() and routing.dropped > 0
    if top_k == 1:
        lost = np.flatnonzero(~routing.kept.any(axis=1))
        switch_routing, switch_lost, switch_capped_y = routing, lost, capped_y

print(f"k = 1: the layer's output for the dropped token(s) {switch_lost.tolist()}: "
      f"{np.abs(switch_capped_y[switch_lost]).max():.1f} everywhere")
assert switch_lost.size > 0 and (switch_capped_y[switch_lost] == 0).all()

# %% [markdown]
# A dropped token gets **nothing** from the layer: its output rows are zero.
# In the block, `x + moe(ln_2(x))`, that token passes through on the
# residual alone, as if the block had no MLP for it; nothing breaks, but the
# token was not computed on. With k = 2 a token whose first choice was full
# may still have its second: fewer tokens lose everything.
#
# How many are dropped depends on the factor and on how evenly the router
# spreads a batch. A random layer of 8 experts on 512 random tokens:

# %%
WIDE = GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=16)
many_x = np.random.default_rng(7).normal(size=(512, WIDE.n_embd))
FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, None)
rows, dropped_share = [], {}
for top_k in (1, 2):
    for factor in FACTORS:
        sweep = MoE(WIDE, 8, top_k, factor, rng=1, dtype=np.float64)
        sweep(Tensor(many_x))
        routing = sweep.routing
        dropped_share[(top_k, factor)] = routing.dropped / (512 * top_k)
        rows.append([top_k, "none" if factor is None else factor, routing.capacity,
                     routing.dropped, f"{dropped_share[(top_k, factor)]:.1%}",
                     routing.dropped_tokens, max(routing.routed)])
print(table(rows, ["k", "factor", "capacity", "dropped choices", "share", "tokens lost",
                   "busiest expert"]))
for top_k in (1, 2):
    shares = [dropped_share[(top_k, f)] for f in FACTORS]
    assert all(a >= b for a, b in zip(shares, shares[1:])) and shares[-1] == 0

# %% [markdown]
# A larger factor drops fewer choices and costs more: every expert's buffer
# (and, under expert parallelism, every message) is sized for the capacity,
# used or not. Switch trains with a factor of 1 to 1.25. Even a random
# router is not even: at factor 1.0 the busiest expert's surplus is dropped.
# A router that *learns* to favour a few experts is far worse, which is what
# section 4 is about.
#
# ## 4. Load balance and its auxiliary loss
#
# Nothing in the language-model loss asks the router to spread the tokens.
# Early in training one expert happens to be a little better, gets more
# tokens, learns faster, and gets more still: the router **collapses** onto
# a few experts, the others idle, and with a capacity the surplus is
# dropped. Switch adds an auxiliary loss:
#
# `aux = E * sum_i f_i P_i`,
#
# f_i the fraction of the batch's choices that name expert i (counted: no
# gradient) and P_i the router's mean probability of expert i (through which
# the gradient flows). Lowering it means moving probability away from the
# experts that are chosen most. By hand on the tiny layer of section 2:

# %%
fraction = np.bincount(first, minlength=TINY_EXPERTS) / 8
mean_probs = probs.mean(axis=0)
aux_by_hand = TINY_EXPERTS * float((fraction * mean_probs).sum())
print(f"f = {fraction.round(3).tolist()} (counted), P = {mean_probs.round(3).tolist()}")
print(f"aux = 4 x sum f_i P_i = {aux_by_hand:.4f}; the layer's aux_loss {layer.aux_loss.item():.4f}")
assert abs(aux_by_hand - layer.aux_loss.item()) < 1e-12


def switch_aux(f, p):
    return len(f) * float(np.dot(f, p))


E = TINY_EXPERTS
uniform, collapsed = np.full(E, 1 / E), np.eye(E)[0]
print(f"perfect balance, f = P = 1/E: {switch_aux(uniform, uniform):.2f}; everything on one "
      f"expert, f = P = (1, 0, 0, 0): {switch_aux(collapsed, collapsed):.2f} (= E); every token "
      f"on expert 0 but P uniform: {switch_aux(collapsed, uniform):.2f}")
assert switch_aux(uniform, uniform) == 1.0 and switch_aux(collapsed, collapsed) == E
assert switch_aux(collapsed, uniform) == 1.0

# %% [markdown]
# At perfect balance the loss is 1 (with k = 1; minidist divides the choices
# by k B T, so also with k = 2), and it grows to E when the router sends all
# to one expert and is sure of it. The last value is a warning: a router
# whose probabilities are nearly uniform scores about 1 *whatever* it
# chooses, since then E sum_i f_i P_i is about sum_i f_i = 1. The loss's
# value is a weak signal; the load itself is what to watch.
#
# **A short training run.** The MoE GPT (2 blocks of width 32, 4 experts a
# block, k = 1, capacity factor 1.25) on the bundled Shakespeare, B = 8
# sequences of T = 32 characters a step (256 tokens), three times from the
# same seed and the same batches: without the auxiliary loss, with Switch's
# coefficient 0.01, and with 0.1. Per step, each expert's share of the
# first block's tokens and the share of choices dropped:

# %%
TRAIN = 60 if QUICK else 200
COEFFICIENTS = (0.0, 0.01, 0.1)
text = load_shakespeare()
chars = CharTokenizer(text)
ids = np.asarray(chars.encode(text))


def shakespeare_batch(rng, batch=8, steps=32):
    starts = rng.integers(0, len(ids) - steps - 1, batch)
    return (np.stack([ids[s:s + steps] for s in starts]),
            np.stack([ids[s + 1:s + steps + 1] for s in starts]))


def balance_run(coefficient):
    config = MoEGPTConfig(vocab_size=chars.vocab_size, block_size=32, n_layer=2, n_head=2,
                          n_embd=32, n_expert=4, top_k=1, capacity_factor=1.25,
                          aux_loss_coef=coefficient)
    model = MoEGPT(config, rng=0)
    optimizer = optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(1)
    shares, dropped, losses = [], [], []
    for _ in range(TRAIN):
        idx, targets = shakespeare_batch(rng)
        optimizer.zero_grad()
        logits = model(idx)
        loss = model.loss(logits, targets)
        loss.backward()
        optimizer.step()
        layers = moe_layers(model)
        shares.append(layers[0].routing.routed / layers[0].routing.tokens)
        dropped.append(sum(r.routing.dropped for r in layers) / sum(r.routing.tokens for r in layers))
        losses.append(loss.item() - coefficient * model.aux_loss().item())   # the LM part
    return dict(shares=np.array(shares), dropped=np.array(dropped), losses=np.array(losses))


balance = {c: balance_run(c) for c in COEFFICIENTS}
LAST = 10   # steps the final loss is averaged over
print(f"{TRAIN} steps; averaged over the run:")
print(table([[c, f"{balance[c]['shares'].max(axis=1).mean():.2f}",
              f"{balance[c]['dropped'].mean():.1%}", f"{balance[c]['losses'][-LAST:].mean():.3f}"]
             for c in COEFFICIENTS],
            ["aux coefficient", "busiest expert's share", "choices dropped",
             f"LM loss, last {LAST} steps"]))
busiest = {c: balance[c]["shares"].max(axis=1).mean() for c in COEFFICIENTS}
lost = {c: balance[c]["dropped"].mean() for c in COEFFICIENTS}
final = {c: balance[c]["losses"][-LAST:].mean() for c in COEFFICIENTS}
# The noise of a mean over LAST steps, each on its own batch: its standard error.
noise = {c: balance[c]["losses"][-LAST:].std(ddof=1) / np.sqrt(LAST) for c in COEFFICIENTS}
collapse = int(np.argmax(balance[0.0]["shares"].max(axis=1) > 0.7))
print(f"without the loss, one expert first takes over 70% of block 0's tokens at step {collapse}")
print("the final loss's noise (standard error of the mean of the last "
      f"{LAST} steps' batch losses): " + ", ".join(f"{c}: {noise[c]:.3f}" for c in COEFFICIENTS))
assert busiest[0.0] > 0.7 and lost[0.0] > 0.35 and 0 < collapse < 40   # the collapse


# %%
def draw_balance():
    figure, axes = plt.subplots(1, len(COEFFICIENTS), figsize=(11, 4.1), sharey=True)
    steps = np.arange(TRAIN)
    for axis, coefficient in zip(axes, COEFFICIENTS):
        run = balance[coefficient]
        axis.stackplot(steps, run["shares"].T, colors=COLOURS[:4],
                       labels=[f"expert {e}" for e in range(4)])
        axis.plot(steps, run["dropped"], color="black", lw=1.2,
                  label="share of the choices dropped (both blocks)")
        axis.axhline(0.25, color="white", lw=1.0, ls=":",
                     label="an even share of the tokens, 1/E = 0.25")
        axis.set_title(f"aux coefficient {coefficient}", fontsize=10)
        axis.set_xlabel("training step")
        axis.set_xlim(0, TRAIN - 1)
        axis.set_ylim(0, 1)
    axes[0].set_ylabel("share of block 0's tokens, stacked")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, facecolor="#C8C8C8")
    figure.suptitle("the router's load per expert (stacked), with and without Switch's loss",
                    fontsize=11)
    figure.tight_layout(rect=(0, 0.13, 1, 1))
    return figure


show_figure(draw_balance(), "load_balance.png")

# %%
EVEN = 1 / 4   # an even share of 4 experts
glue("train_steps", TRAIN, "d")
glue("collapse_step", collapse, "d")
# The three runs: off (no auxiliary loss), switch (0.01), strong (0.1).
glue("busiest_off", busiest[0.0], ".2f")
glue("busiest_switch", busiest[0.01], ".2f")
glue("busiest_strong", busiest[0.1], ".2f")
glue("lost_off", lost[0.0], ".1%")       # the table's digits
glue("lost_switch", lost[0.01], ".1%")
glue("lost_strong", lost[0.1], ".1%")
glue("loss_off", final[0.0], ".3f")
glue("loss_switch", final[0.01], ".3f")
glue("loss_strong", final[0.1], ".3f")
glue("noise_off", noise[0.0], ".3f")
glue("noise_switch", noise[0.01], ".3f")
glue("noise_strong", noise[0.1], ".3f")
glue("noises", ", ".join(f"{noise[c]:.3f}" for c in COEFFICIENTS))
glue("last_steps", LAST, "d")
glue("even_times", busiest[0.01] / EVEN, ".1f")
glue("switch_closeness", "close to an even quarter" if busiest[0.01] <= 1.2 * EVEN else
     f"still {busiest[0.01] / EVEN:.1f} times an even quarter")
glue("switch_dropped", "fewer" if lost[0.01] < lost[0.0] else "no fewer")
glue("dropped_fraction", lost[0.01] / lost[0.0], ".0%")
evens_more = busiest[0.1] < busiest[0.01] and lost[0.1] < lost[0.01]
glue("strong_verdict", "evens them more" if evens_more else "does not even them more")


def loss_against_none(c):
    """How the final loss with coefficient c stands against none, beyond the noise."""
    gap = final[c] - final[0.0]
    band = 2 * np.hypot(noise[c], noise[0.0])
    if abs(gap) <= band:
        return (f"no different within the noise (a difference of {gap:+.3f}, where twice the "
                f"combined noise is {band:.3f})")
    return (f"{'higher' if gap > 0 else 'lower'} by {abs(gap):.3f}, more than twice the "
            f"combined noise ({band:.3f})")


glue("switch_loss_verdict", loss_against_none(0.01))
glue("strong_loss_verdict", loss_against_none(0.1))
glue("switch_hurt", "hurt" if final[0.01] - final[0.0] > 2 * np.hypot(noise[0.01], noise[0.0])
     else "did not hurt")
# Switch's general finding, too large a coefficient costs the LM loss, against this run.
strong_gap = final[0.1] - final[0.0]
strong_band = 2 * np.hypot(noise[0.1], noise[0.0])
lowest = min(COEFFICIENTS, key=lambda c: final[c])
glue("strong_side", "higher" if strong_gap > strong_band else "lower" if strong_gap < -strong_band
     else "within")
glue("lowest_coefficient", lowest, "{}")
glue("strong_general", (
    "this run agrees: 0.1 cost the language model's loss beyond the noise"
    if strong_gap > strong_band else
    "this run shows the opposite: 0.1 ended "
    + ("with the lowest loss of the three" if lowest == 0.1 else "below no auxiliary loss")
    + ", below no auxiliary loss's by more than twice the combined noise"
    + (" (it also dropped the fewest choices, so more tokens were computed on by an expert;"
       " a short run of a small model)" if min(lost, key=lost.get) == 0.1 else
       " (a short run of a small model)")
    if strong_gap < -strong_band else
    "this run cannot tell: 0.1's loss is within the noise of no auxiliary loss's"))

# %% jupyter={"source_hidden": true}
say("""
Without the loss the router collapses: at step {glue}`collapse_step` one expert first takes
over 70% of the first block's tokens, the busiest expert's share averages
{glue}`busiest_off` over the run, and with room for only 1.25 times an even share,
{glue}`lost_off` of the choices are dropped (and pass through on the residual, uncomputed).
With Switch's 0.01 the busiest share averages {glue}`busiest_switch`,
{glue}`switch_closeness` (1/E = 0.25), and {glue}`switch_dropped` choices are dropped:
{glue}`lost_switch`, {glue}`dropped_fraction` of the collapsed run's. 0.1
{glue}`strong_verdict` (busiest {glue}`busiest_strong`, {glue}`lost_strong` dropped).

The language model's loss over the last {glue}`last_steps` steps: {glue}`loss_off` without the
auxiliary loss, {glue}`loss_switch` with 0.01, {glue}`loss_strong` with 0.1; each a mean of
{glue}`last_steps` batches, whose noise (its standard error) is {glue}`noises` in the same
order. Against no auxiliary loss, 0.01's is {glue}`switch_loss_verdict`; 0.1's
{glue}`strong_loss_verdict`. In this run of {glue}`train_steps` steps
Switch's coefficient {glue}`switch_hurt` the loss beyond the noise. Fedus, Zoph and Shazeer
found that too large a coefficient trades the language model's loss for balance;
{glue}`strong_general`.
""")

# %% [markdown]
# A run of this size, from one seed, says little about the loss: Fedus,
# Zoph and Shazeer (*Switch Transformers*, above) chose 0.01 as large
# enough to balance the load and small enough not to overwhelm the language
# model's loss, over far longer trainings of far larger models.
# Perfect balance is not the goal in itself: characters are not equally
# frequent, and a router that sends every space to one expert is doing its
# job. The loss only stops the rich-get-richer loop.
#
# ## 5. Expert parallelism on 2 ranks
#
# With E experts on n ranks, rank j holds experts j E/n .. (j+1) E/n - 1 and
# its own tokens; the router is replicated, so every rank routes its own
# tokens (its own capacity group: nothing needs to be agreed to decide what
# is dropped). Then, in each MoE layer:
#
# 1. **counts**: each rank counts its rows for each expert, (E,), and an
#    `all_to_all` of these integers (E / n to each rank) tells every rank
#    how many rows to expect from whom: split sizes must be known before
#    the rows are sent;
# 2. **dispatch**: an `all_to_all_single` of the rows with *uneven* split
#    sizes: `input_split_sizes[j]` the rows for rank j's experts (the rows
#    are grouped expert by expert, so rank by rank),
#    `output_split_sizes[i]` what rank i sends here;
# 3. each local expert runs on the rows that arrived for it, from every
#    source;
# 4. **combine**: the outputs go back by the transposed all_to_all (split
#    sizes swapped), and the source gates and adds them into its tokens as
#    on one process.
#
# Backward is the two row all_to_alls transposed. On 2 processes: one MoE
# layer of 4 experts, width 16, 24 tokens a rank, float64, capacity factor
# 1.0, once with k = 1 and once with k = 2, each pass a traced region; in
# the same run the dense MLP split by tensor parallelism (lesson 17: its
# first Linear, `c_fc`, d -> 4d, by columns, its second, `c_proj`, 4d -> d,
# by rows; in the table below "dense MLP, TP") on the same 24 tokens:

# %%
EP = 2
LAYER = GPTConfig(vocab_size=8, block_size=24, n_layer=1, n_head=2, n_embd=16)
LAYER_EXPERTS, TOKENS = 4, 24
CASES = (1, 2)   # k


def whole_layer(top_k):
    return MoE(LAYER, LAYER_EXPERTS, top_k, 1.0, rng=3, dtype=np.float64)


def rank_tokens(rank):
    rng = np.random.default_rng(40 + rank)
    return (rng.normal(size=(TOKENS, LAYER.n_embd)), rng.normal(size=(TOKENS, LAYER.n_embd)))


def expert_parallel_run():
    rank = dist.get_rank()
    x, upstream = rank_tokens(rank)
    found = {}
    for top_k in CASES:
        shard = ExpertParallelMoE(whole_layer(top_k))
        inputs = Tensor(x, requires_grad=True)
        with trace.region(f"k{top_k} forward"):
            y = shard(inputs)
        with trace.region(f"k{top_k} backward"):
            (y * Tensor(upstream)).sum().backward()
        found[top_k] = dict(y=y.data, x_grad=inputs.grad, router=shard.router.weight.grad,
                            experts={n: p.grad for n, p in shard.experts.named_parameters()},
                            start=shard.expert_start, routing=shard.routing,
                            dispatch=shard.dispatch)
    dense = MLP(LAYER, rng=3).to(np.float64)
    dense.c_fc = ColumnParallelLinear.from_linear(dense.c_fc)
    dense.c_proj = RowParallelLinear.from_linear(dense.c_proj)
    inputs = Tensor(x, requires_grad=True)
    with trace.region("dense forward"):
        y = dense(inputs)
    with trace.region("dense backward"):
        (y * Tensor(upstream)).sum().backward()
    return found


ep_trace = OUT / "expert_parallel.trace.jsonl"
ep_runs = minidist.launch(expert_parallel_run, world_size=EP, transport="shm", trace=str(ep_trace))
ep_events = trace.read_jsonl(ep_trace).events

for top_k in CASES:
    print(f"k = {top_k}:")
    for rank, found in enumerate(ep_runs):
        d = found[top_k]["dispatch"]
        print(f"   rank {rank} (experts {found[top_k]['start']}..{found[top_k]['start'] + 1}): "
              f"counts received {d.received_per_expert.tolist()} (row i: what rank i sends to "
              f"each of my experts); rows sent to ranks 0, 1: {d.sent.tolist()}, received "
              f"from them: {d.received.tolist()}")
    matrix = dispatch_matrix([found[top_k]["routing"] for found in ep_runs], EP)
    assert (matrix == np.array([found[top_k]["dispatch"].sent for found in ep_runs])).all()
    assert (matrix.T == np.array([found[top_k]["dispatch"].received for found in ep_runs])).all()

# %% [markdown]
# The split sizes are uneven: each rank sends what its router chose, and a
# rank receives what the others' routers chose for its experts. The counts
# travel first because a receiver must size its buffer and cut it before
# the rows arrive.
#
# `viz/moe_dispatch.py` draws the traced step from the ranks' routings: in
# the top row each token of each rank, coloured by the rank its expert is
# on (hatched: dropped), below, each expert's load stacked by source rank
# against its capacity (the sum of the ranks' capacities). The terminal view
# says the same with a digit per token:

# %%
steps = [[found[top_k]["routing"] for found in ep_runs] for top_k in CASES]
labels = [f"k = {top_k}" for top_k in CASES]
show_figure(dispatch_figure(steps, labels), "moe_dispatch.png", dpi=110)
Console(width=110).print(dispatch_text(steps, labels, color=False))
total_dropped = {top_k: sum(found[top_k]["routing"].dropped for found in ep_runs)
                 for top_k in CASES}
print("dropped choices, all ranks: " + ", ".join(f"k = {k}: {v}" for k, v in total_dropped.items()))

# %% [markdown]
# **Equal to one process.** For each rank's tokens, the output, the input's
# gradient and the router's gradient must be those of the whole MoE run on
# those tokens alone (each rank's tokens are one capacity group); an
# expert's gradient is the sum of what every rank's tokens give it:

# %%
for top_k in CASES:
    expert_sum = None
    worst = 0.0
    for rank, found in enumerate(ep_runs):
        whole = whole_layer(top_k)
        x, upstream = rank_tokens(rank)
        inputs = Tensor(x, requires_grad=True)
        y = whole(inputs)
        (y * Tensor(upstream)).sum().backward()
        got = found[top_k]
        worst = max(worst, relative_error(got["y"], y.data), relative_error(got["x_grad"], inputs.grad),
                    relative_error(got["router"], whole.router.weight.grad))
        grads = {n: p.grad for n, p in whole.experts.named_parameters()}
        expert_sum = grads if expert_sum is None else {n: expert_sum[n] + grads[n] for n in grads}
    expert_worst = 0.0
    for found in ep_runs:
        got = found[top_k]
        for name, grad in got["experts"].items():
            index, rest = name.split(".", 1)
            expert_worst = max(expert_worst, relative_error(
                grad, expert_sum[f"{got['start'] + int(index)}.{rest}"]))
    print(f"k = {top_k}: largest relative difference from one process: outputs, input and router "
          f"gradients {worst:.1e}; experts' gradients {expert_worst:.1e}")
    assert worst < 1e-12 and expert_worst < 1e-12

# %% [markdown]
# The same numbers to float64 rounding: the all_to_alls only move rows, the
# arithmetic is one process's.
#
# **The bytes.** `dispatch_bytes` (`minidist/parallel/expert/costs.py`)
# counts what each rank sends, per layer, from the dispatch matrix M
# (M[i, j]: rank i's rows for rank j's experts): forward, (n - 1) E/n counts
# of 8 bytes, then the rows rank r sends to the other ranks' experts (the sum
# of M[r, j] over j != r) and the rows it sends back to the ranks whose rows
# its experts computed (the sum of M[j, r] over j != r), d s bytes each;
# backward the same two transposed. The tensor-parallel dense MLP sends one
# ring all_reduce of the rank's B T d values per pass, N = B T d s bytes
# (`dense_mlp_all_reduce_bytes`). Both against the trace:

# %%
def sent(events, rank, label):
    """Bytes ``rank`` sent inside its region ``label``."""
    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and start <= e["start"] and e["end"] <= end)


def calls(events, rank, label):
    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    inside = sorted((e for e in events if e["rank"] == rank and e["kind"] == "collective"
                     and start <= e["start"] and e["end"] <= end), key=lambda e: e["start"])
    return [trace.label_info(e["label"])["collective"] for e in inside]


C, S = LAYER.n_embd, 8
dense_formula = dense_mlp_all_reduce_bytes(TOKENS, C, EP, itemsize=S)
rows = []
for top_k in CASES:
    matrix = dispatch_matrix([found[top_k]["routing"] for found in ep_runs], EP)
    formula = dispatch_bytes(matrix, LAYER_EXPERTS, C, itemsize=S)
    for rank in range(EP):
        forward, backward = sent(ep_events, rank, f"k{top_k} forward"), sent(ep_events, rank,
                                                                            f"k{top_k} backward")
        rows.append([f"MoE k={top_k}", rank, matrix[rank].tolist(), f"{forward:,}",
                     f"{formula.counts[rank]:,} + {formula.dispatch[rank]:,} + "
                     f"{formula.combine[rank]:,}", f"{backward:,}", f"{formula.backward[rank]:,}"])
        assert (forward, backward) == (formula.forward[rank], formula.backward[rank])
    assert calls(ep_events, 0, f"k{top_k} forward") == ["all_to_all"] * 3
    assert calls(ep_events, 0, f"k{top_k} backward") == ["all_to_all"] * 2
for rank in range(EP):
    forward, backward = sent(ep_events, rank, "dense forward"), sent(ep_events, rank,
                                                                     "dense backward")
    rows.append(["dense MLP, TP", rank, "-", f"{forward:,}", f"{dense_formula[rank]:,}",
                 f"{backward:,}", f"{dense_formula[rank]:,}"])
    assert forward == backward == dense_formula[rank]
assert calls(ep_events, 0, "dense forward") == calls(ep_events, 0, "dense backward") == ["all_reduce"]
print(table(rows, ["layer", "rank", "rows to ranks 0, 1", "forward (trace)",
                   "formula: counts + dispatch + combine", "backward (trace)", "formula"]))
even = {k: balanced_dispatch_bytes(TOKENS, k, C, EP, itemsize=S) for k in CASES}
print(f"\nspread evenly, nothing dropped, 2 (n-1)/n k B T d s a pass: k = 1 {even[1]:,.0f}, "
      f"k = 2 {even[2]:,.0f} bytes; the dense MLP's all_reduce, 2 (n-1)/n N with N = B T d s: "
      f"{dense_formula[0]:,}")
assert even[1] == dense_formula[0] and even[2] == 2 * dense_formula[0]
crossed = {}
for top_k in CASES:   # what the text below says of this run
    matrix = dispatch_matrix([found[top_k]["routing"] for found in ep_runs], EP)
    formula = dispatch_bytes(matrix, LAYER_EXPERTS, C, itemsize=S)
    assert all(formula.backward[r] < even[top_k] for r in range(EP)) and total_dropped[top_k] > 0
    # The rows that crossed a link in a pass (dispatch + combine, the counts aside: the
    # backward column), rank by rank, against the even figure's 2 (n-1)/n k B T.
    rows_crossed = [int(formula.backward[r] // (C * S)) for r in range(EP)]
    kept = int(matrix.sum())
    crossed[top_k] = dict(rows=rows_crossed, even_rows=int(round(even[top_k] / (C * S))),
                          bytes=[int(formula.backward[r]) for r in range(EP)],
                          dropped=total_dropped[top_k], choices=top_k * TOKENS * EP, kept=kept,
                          remote_share=float((kept - np.trace(matrix)) / kept))
glue("crossed", crossed, "{}")
glue("rows_k1", " and ".join(str(v) for v in crossed[1]["rows"]))
glue("rows_k2", " and ".join(str(v) for v in crossed[2]["rows"]))
glue("even_rows_k1", crossed[1]["even_rows"], "d")
glue("even_rows_k2", crossed[2]["even_rows"], "d")
glue("crossed_bytes_k1", " and ".join(f"{v:,}" for v in crossed[1]["bytes"]))
glue("crossed_bytes_k2", " and ".join(f"{v:,}" for v in crossed[2]["bytes"]))
glue("dropped_k1", crossed[1]["dropped"], "d")
glue("dropped_k2", crossed[2]["dropped"], "d")
glue("choices_k1", crossed[1]["choices"], "d")
glue("choices_k2", crossed[2]["choices"], "d")
glue("row_bytes", C * S, "d")
glue("counts_bytes", formula.counts[0], "d")
glue("even_k1", even[1], ",.0f")
glue("even_k2", even[2], ",.0f")
glue("even_remote", (EP - 1) / EP, ".0%")
glue("remote_verdict", "; ".join(
    f"with k = {k}, {v['remote_share']:.0%} of the kept choices went to the other rank's "
    "experts, " + ("more than" if v["remote_share"] > (EP - 1) / EP else
                   "as many as" if v["remote_share"] == (EP - 1) / EP else "fewer than")
    + " the even spread's share" for k, v in crossed.items()))

# %% [markdown]
# Three all_to_alls forward (the counts, the dispatch, the combine), two
# backward, and the trace's bytes are the formula's to the byte on every
# rank. Where they stand against the dense MLP: spread evenly, an all_to_all
# sends (n - 1)/n of a rank's k B T rows each way, and a ring all_reduce of
# B T rows sends 2 (n - 1)/n of them: **with k = 1, the same bytes as the
# tensor-parallel MLP; with k = 2, twice**. Not the bytes, then, but their
# shape is what differs: the all_reduce's pieces are equal by construction,
# the all_to_all's are what the routers chose.

# %% jupyter={"source_hidden": true}
say("""
This run's are below the even figure. Compare like with like, the rows that crossed a link
(dispatch and combine; the backward column, since the forward adds the counts'
{glue}`counts_bytes` bytes):
with k = 1 the two ranks moved {glue}`rows_k1` rows of d s = {glue}`row_bytes` bytes
({glue}`crossed_bytes_k1` bytes) against {glue}`even_rows_k1` rows ({glue}`even_k1` bytes)
spread evenly; with k = 2 {glue}`rows_k2` against {glue}`even_rows_k2` ({glue}`crossed_bytes_k2`
against {glue}`even_k2` bytes). The even figure already leaves out the rows for a rank's own
experts ((n - 1)/n of the choices cross, {glue}`even_remote` here). What is missing is the
dropped choices, which are never sent: {glue}`dropped_k1` of the {glue}`choices_k1` with
k = 1, {glue}`dropped_k2` of the {glue}`choices_k2` with k = 2. Where the kept choices went
moves the count too: {glue}`remote_verdict`. And an overloaded rank receives more than the
even share, and everyone waits for it.
""")

# %% [markdown]
# And the two groups do different work for those bytes: the
# tensor-parallel ranks all hold the *same* B T tokens, the expert-parallel
# ranks each their own, so the expert-parallel group moves n times as many
# tokens through the layer for the bytes.
#
# ## 6. At many ranks, simulated
#
# How do the two compare when the group grows? The simulator runs the real
# collective code on simulated ranks on a virtual clock (lesson 3): the
# pairwise all_to_all twice (dispatch and combine; the counts' few bytes
# left out) against the ring all_reduce once, for one pass of one layer.
# The shapes of a large model: width d = 4096, B T = 4096 tokens a rank,
# s = 2 bytes a value, on the links between nodes of
# `minidist.parallel.mesh.plan_inputs.CLUSTER` (10 us a message, 25 GB/s):

# %%
BIG_C, BIG_N, BIG_S = 4096, 4096, 2
LINK = CLUSTER.inter
assert (LINK.alpha, 1 / LINK.beta) == (10e-6, 25e9)   # as the text above says
WORLDS = (8, 16, 32, 64, 128) if QUICK else (8, 16, 32, 64, 128, 256)
simulated = {}
for n in WORLDS:
    a2a = {k: simulate("all_to_all", "pairwise", n, k * BIG_N * BIG_C * BIG_S, alpha=LINK.alpha,
                       beta=LINK.beta, gamma=0.0) for k in (1, 2)}
    ring = simulate("all_reduce", "ring", n, BIG_N * BIG_C * BIG_S, alpha=LINK.alpha,
                    beta=LINK.beta, gamma=0.0)
    simulated[n] = dict(k1=2 * a2a[1].time, k2=2 * a2a[2].time, ring=ring.time,
                        predicted=(2 * a2a[1].predicted, ring.predicted))
print("EP: the MoE layer's two all_to_alls, expert parallelism; TP: the dense MLP's all_reduce, "
      "tensor parallelism; formula: the alpha-beta prediction, ms")
print(table([[n, f"{v['k1'] * 1e3:.2f}", f"{v['k2'] * 1e3:.2f}", f"{v['ring'] * 1e3:.2f}",
              f"{v['predicted'][0] * 1e3:.2f}", f"{v['predicted'][1] * 1e3:.2f}"]
             for n, v in simulated.items()],
            ["ranks", "EP k=1 ms", "EP k=2 ms", "TP all_reduce ms", "formula k=1", "formula ring"]))
latency_share = {n: 2 * (n - 1) * LINK.alpha / v["ring"] for n, v in simulated.items()}
print("the latencies' share, 2 (n - 1) alpha of the all_reduce's time: "
      + ", ".join(f"{n} ranks {share:.0%}" for n, share in latency_share.items()))
for v in simulated.values():
    assert abs(v["k1"] - v["predicted"][0]) <= 1e-6 * v["k1"]
    assert abs(v["ring"] - v["predicted"][1]) <= 1e-6 * v["ring"]
    assert abs(v["k1"] / v["ring"] - 1) < 1e-6   # k = 1: the all_reduce's time
# What the text below says: the time grows with n, the latencies' share with it,
# and k = 2's extra (its bytes) stays while its ratio to k = 1 falls towards 1.
ratios = [simulated[n]["k2"] / simulated[n]["k1"] for n in WORLDS]
assert all(a > b for a, b in zip(ratios, ratios[1:])) and ratios[0] > 1.9
assert latency_share[8] < 0.1 and 0.4 < latency_share[128] < 0.6


# %%
def draw_simulated():
    figure, axis = plt.subplots(figsize=(7.5, 4.3))
    worlds = list(simulated)
    # The ring all_reduce and k = 1 take the same time: the ring is drawn wide and
    # pale underneath, k = 1 thin and dashed on top, so that both show.
    for key, label, style, width, size in (
            ("ring", "dense MLP, TP: ring all_reduce (the same time as k = 1)", "-o", 6, 11),
            ("k1", "MoE k = 1: 2 pairwise all_to_alls", "--s", 1.5, 6),
            ("k2", "MoE k = 2: 2 pairwise all_to_alls", "--^", 1.5, 6)):
        axis.plot(worlds, [simulated[n][key] * 1e3 for n in worlds], style, label=label,
                  markerfacecolor="none", linewidth=width, markersize=size,
                  alpha=0.45 if key == "ring" else 1.0)
    axis.set_xscale("log", base=2)
    axis.set_xticks(worlds, [str(n) for n in worlds])
    axis.set_ylim(bottom=0)
    axis.set_xlabel("ranks in the group")
    axis.set_ylabel("ms for one layer's pass (simulated)")
    axis.set_title(f"{BIG_N} tokens a rank, width {BIG_C}, 2-byte values, 25 GB/s links",
                   fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    return figure


show_figure(draw_simulated(), "all_to_all_vs_all_reduce.png")
glue("fewest_ranks", WORLDS[0], "d")
glue("most_ranks", WORLDS[-1], "d")
glue("latency_fewest", latency_share[WORLDS[0]], ".0%")
glue("latency_most", latency_share[WORLDS[-1]], ".0%")
glue("k2_ratio_fewest", ratios[0], ".2f")
glue("k2_ratio_most", ratios[-1], ".2f")

# %% [markdown]
# The simulated clocks equal the alpha-beta formulas. With k = 1 the two
# pairwise all_to_alls take exactly the ring all_reduce's time (in the
# picture the k = 1 line lies on the all_reduce's, drawn wide and pale under
# it): the same
# 2 (n - 1) messages a rank, the same 2 (n - 1)/n N bytes (N = B T d s, a
# rank's tokens). k = 2 sends twice the bytes but the same number of
# messages.

# %% jupyter={"source_hidden": true}
say("""
The bytes a rank sends hardly change with n (the (n - 1)/n of its data), the message count
grows with it: at {glue}`fewest_ranks` ranks the latencies are {glue}`latency_fewest` of the all_reduce's time,
at {glue}`most_ranks` ranks {glue}`latency_most`, and k = 2's extra cost, being bytes, is a
smaller and smaller part: k = 2 takes {glue}`k2_ratio_fewest` times k = 1's time at
{glue}`fewest_ranks` ranks, {glue}`k2_ratio_most` times at {glue}`most_ranks`.
""")

# %% [markdown]
# What the formula leaves out, and real systems fight, is the shape: these
# are *even* all_to_alls. The pairwise exchange takes, in each of its n - 1
# steps, the larger of what a rank sends and receives, so a rank whose
# experts are popular sets the pace of the whole step. The capacity factor
# bounds that rank's share (at most factor times the even one), the
# auxiliary loss makes it rarer, and topology does the rest: DeepSeek-V3
# (DeepSeek-AI, *DeepSeek-V3 Technical Report*, 2024) sends each token to
# experts on at most 4 nodes, so that less of the
# all_to_all crosses the slow links between nodes. (A dense MLP would not be
# split over 128 ranks at all; tensor parallelism stays inside a node,
# lesson 17. Experts spread that far because each rank holds whole experts
# and its own tokens.)
#
# ## 7. The MoE GPT on an expert x data parallel mesh
#
# `expert_parallel_gpt(model, mesh["ep"])` makes every MoE layer of a
# `MoEGPT` this rank's share of its experts. On a mesh `dp x ep` every rank
# trains on its own batch; the dense parameters (attention, embeddings,
# LayerNorms, routers) are on every rank, and an expert on the dp ranks of
# one ep coordinate. So `allreduce_moe_grads` averages each kind over its
# own group: the dense gradients over the world, the experts' over dp (the
# all_to_all's backward has already summed the ep ranks' tokens into them).
# DDP could not: it averages every parameter over one group, and would
# overwrite the other ep ranks' experts with rank 0's.
#
# Three AdamW steps of a small MoE GPT (4 experts, k = 2, capacity factor
# 1.0, the auxiliary loss on), float64, each rank's batch its own capacity
# group; one process trains on all the ranks' batches, each a capacity
# group, the loss their mean. Quick form: ep2 x dp1 (2 processes); full
# form also ep2 x dp2 and ep4 (4 processes):

# %%
GPT_CONFIG = MoEGPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16,
                          n_expert=4, top_k=2, capacity_factor=1.0, aux_loss_coef=0.01)
GPT_STEPS, GPT_BATCH = 3, 2
MESHES = {2: [(1, 2)]} if QUICK else {2: [(1, 2)], 4: [(2, 2), (1, 4)]}   # (dp, ep)


def moe_gpt():
    return MoEGPT(GPT_CONFIG, rng=0).to(np.float64)


def gpt_batch(step, rank):
    rng = np.random.default_rng(1000 * step + rank)
    return (rng.integers(0, GPT_CONFIG.vocab_size, (GPT_BATCH, GPT_CONFIG.block_size)),
            rng.integers(0, GPT_CONFIG.vocab_size, (GPT_BATCH, GPT_CONFIG.block_size)))


def train_on_mesh(shapes):
    found = {}
    for shape in shapes:
        mesh = dist.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "ep"))
        model = expert_parallel_gpt(moe_gpt(), mesh["ep"])
        optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        losses = []
        for step in range(GPT_STEPS):
            idx, targets = gpt_batch(step, dist.get_rank())
            optimizer.zero_grad()
            loss = model.loss(model(idx), targets)
            loss.backward()
            allreduce_moe_grads(model, mesh["dp"])
            optimizer.step()
            losses.append(loss.item())
        found[shape] = dict(weights={n: p.data.copy() for n, p in model.named_parameters()},
                            start=model.transformer.h[0].mlp.expert_start, losses=losses)
    return found


def one_process(world):
    model = moe_gpt()
    optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(GPT_STEPS):
        optimizer.zero_grad()
        per_rank = []
        for rank in range(world):   # each rank's batch one capacity group, as on the ranks
            idx, targets = gpt_batch(step, rank)
            per_rank.append(model.loss(model(idx), targets))
        total = per_rank[0]
        for loss in per_rank[1:]:
            total = total + loss
        (total * (1.0 / world)).backward()
        optimizer.step()
        losses.append([loss.item() for loss in per_rank])
    return {n: p.data for n, p in model.named_parameters()}, np.array(losses)


def whole_name(name, start):
    """A shard's parameter name in the whole model (its local expert index shifted)."""
    if ".mlp.experts." not in name:
        return name
    head, rest = name.split(".mlp.experts.")
    index, tail = rest.split(".", 1)
    return f"{head}.mlp.experts.{start + int(index)}.{tail}"


for world, shapes in MESHES.items():
    results = minidist.launch(train_on_mesh, world_size=world, transport="shm", args=(shapes,),
                              timeout=600)
    reference, reference_losses = one_process(world)
    for shape in shapes:
        dp, ep = shape
        worst, held, loss_worst = 0.0, set(), 0.0
        for rank, found in enumerate(results):
            run = found[shape]
            for name, value in run["weights"].items():
                worst = max(worst, relative_error(value, reference[whole_name(name, run["start"])]))
                held.add(whole_name(name, run["start"]))
            assert np.allclose(run["losses"], reference_losses[:, rank], rtol=1e-9)
            loss_worst = max(loss_worst, float(np.abs(np.asarray(run["losses"])
                                                      - reference_losses[:, rank]).max()))
        # an expert is 4 parameters (c_fc's and c_proj's weight and bias), in each block
        tensors = sum(".mlp.experts." in n for n in results[0][shape]["weights"])
        experts_a_rank = tensors // (4 * GPT_CONFIG.n_layer)
        assert experts_a_rank == GPT_CONFIG.n_expert // ep
        print(f"ep{ep} x dp{dp} on {world} processes: each rank holds {experts_a_rank} of "
              f"the {GPT_CONFIG.n_expert} experts of each block; mean loss per step (a new "
              f"batch of random tokens each) "
              + ", ".join(f"{v:.6f}" for v in reference_losses.mean(axis=1))
              + f"; weights against one process's: largest relative difference {worst:.1e}; "
              f"every rank's loss at every step against one process's loss on that rank's "
              f"batch: largest difference {loss_worst:.1e}")
        assert held == set(reference) and worst < 1e-9 and loss_worst < 1e-9

# %% [markdown]
# Every rank ends with one process's weights to float64 rounding, the
# experts on the ranks that hold them and the dense parameters everywhere,
# and every rank's loss at every step is one process's loss on that rank's
# batch (the last number of each line above: the largest difference, over
# ranks and steps).
#
# **Your turn**: the exercise `moe_dispatch` has you write the dispatch of
# section 5 yourself, the split sizes and the two all_to_alls, checked on
# real processes and replayed:
#
#     minidist exercise start moe_dispatch
#
# **Try**: raise the capacity factor of section 5 to 2.0 and watch the
# dropped choices and the bytes; in section 4's `balance_run` (the function
# that trains the MoE GPT; its `MoEGPTConfig` sets `top_k`, the k, and
# `aux_loss_coef`, the auxiliary loss's coefficient) set `top_k=2` and see
# whether the router still collapses without the auxiliary loss; in section 6, give the simulator `CLUSTER.intra` (a node's
# links) instead, or a smaller model, and see where the latencies start to
# count.
