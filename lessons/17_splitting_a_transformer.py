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
# # Lesson 17: splitting a transformer
#
# Lesson 10 split one dense layer's weight matrix over workers, by rows and
# by columns (Dettmers' 1000 x 500 layer), and paired a column split with a
# row split so that an MLP needs one all_reduce per pass. Every large model
# today is a transformer, trained with exactly that idea applied to each
# block (Megatron-LM: Shoeybi et al., 2019), then with the activations cut
# along the sequence too (Korthikanti et al., 2022), and with data and
# pipeline parallelism on top: a **3D** mesh of ranks. This chapter:
#
# 1. why split: the memory of one GPT layer against the memory of a rank,
#    and the column / row recap on Dettmers' layer;
# 2. tensor parallelism (TP) on one block, step by step: which rows of the
#    attention's q, k, v projection each rank holds (its heads), the MLP's
#    column then row split, the **two all_reduces per pass** and why there
#    are only two (Megatron's f and g), traced on 2 ranks and checked against
#    the unsplit block; the bytes of a whole GPT step next to the formula;
#    torch's `parallelize_module` plan doing the same;
# 3. sequence parallelism (SP): a reduce_scatter and an all_gather instead of
#    each all_reduce, the same bytes, and the activation memory per rank from
#    the memory ledger next to the formula, with and without it;
# 4. the device mesh: which rank sits in which group;
# 5. a run of the GPT on a mesh of data x tensor x pipeline ranks;
# 6. plans for one model on one budget of ranks (1,024 of them, simulated):
#    every factorisation compared, and the order in which *The Ultra-Scale
#    Playbook* (Tazi et al., "The Ultra-Scale Playbook: Training LLMs on GPU
#    Clusters", Hugging Face, 2025) grows them.
#
# Library code: `minidist/models/gpt.py` (the GPT),
# `minidist/parallel/tensor/gpt.py` (TP and SP on it),
# `minidist/parallel/tensor/costs.py` (the formulas), `minidist/distributed/device_mesh.py`,
# `minidist/parallel/placements/parallelize.py` and `styles.py` (torch's face, on DTensors),
# `minidist/parallel/mesh/plan_3d.py` (a step predicted) and `choose_plan.py`
# (the plans compared).

# %%
import numpy as np
from rich.console import Console

import minidist
import minidist.distributed as dist
from minidist import Tensor, memory, optim, trace
from minidist.distributed.collectives.traffic import ring_all_reduce_sent
from minidist.distributed.device_mesh import groups_along, mesh_layout
from minidist.lesson import (
    glue,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    use_headless_matplotlib,
)
from minidist.models.gpt import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.parallel import (
    ColwiseParallel,
    PackedColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from minidist.parallel.mesh import choose_plan, plan_3d, plan_inputs
from minidist.parallel.mesh.gpt_3d import GPT3D
from minidist.parallel.model.costs import format_table, split_bytes
from minidist.parallel.tensor.costs import format_step_bytes, gpt_activation_bytes, gpt_step_bytes
from minidist.parallel.tensor.gpt import qkv_rows, shard_index, tensor_parallel_gpt
from minidist.parallel.tensor.vocab import vocab_parallel_cross_entropy

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

import matplotlib.pyplot as plt  # noqa: E402

from viz.device_mesh import mesh_figure, mesh_text  # noqa: E402
from viz.timeline import bytes_per_dimension, draw_timeline  # noqa: E402

QUICK = quick()
OUT = output_dir()
#: matplotlib's tableau-colorblind10: the colour of rank r (lesson 10's).
COLOURS = ("#006BA4", "#FF800E", "#ABABAB", "#595959")
HATCHES = ("", "//", "..", "xx")


def relative_error(actual, wanted):
    return float(np.abs(actual - wanted).max() / np.abs(wanted).max())


def region(events, rank, label):
    return next((e["start"], e["end"]) for e in events if e["rank"] == rank
                and e["kind"] == "compute" and e["label"] == label)


def inside(events, rank, label, kind):
    """The events of ``kind`` that ``rank`` recorded inside its region ``label``."""
    start, end = region(events, rank, label)
    return sorted((e for e in events if e["rank"] == rank and e["kind"] == kind
                   and start <= e["start"] and e["end"] <= end), key=lambda e: e["start"])


def sent(events, rank, label):
    """Bytes ``rank`` sent inside its region ``label`` (every message is a send event)."""
    return sum(e["bytes"] for e in inside(events, rank, label, "send"))


def calls(events, rank, label):
    """The collectives ``rank`` called inside ``label``, in order."""
    return [trace.label_info(e["label"])["collective"] for e in inside(events, rank, label,
                                                                        "collective")]


# What the quick form cuts (it is chosen by MINIDIST_LESSON_QUICK):
glue("quick_form", QUICK)
glue("lesson_form",
     "This is the lesson's **quick form** (`MINIDIST_LESSON_QUICK=1`): every run is on 2 "
     "processes. The full form also counts the activations on 4 tensor-parallel ranks "
     "(section 3's table gets rows for n = 4), asks a 2 x 2 x 2 mesh of 8 processes "
     "instead of a 1 x 1 x 2 one (section 4) and trains on it too (section 5). The model, its "
     "sizes, and the predictions of sections 1 and 6 are the same in both forms."
     if QUICK else
     "This is the lesson's **full form**. The quick form (`MINIDIST_LESSON_QUICK=1`) runs "
     "everything on 2 processes: no 4-rank rows in section 3, a 1 x 1 x 2 mesh in section 4, "
     "and no 2 x 2 x 2 mesh of 8 processes in section 5; the model, its sizes, and the "
     "predictions of sections 1 and 6 are the same in both forms.")

# %% jupyter={"source_hidden": true}
say("""
{glue}`lesson_form`
""")

# %% [markdown]
# ## 1. Why split a transformer
#
# A GPT block holds four Linears: the attention's `c_attn` (d -> 3d: the
# queries, keys and values of every head at once) and `c_proj` (d -> d), and
# the MLP's `c_fc` (d -> 4d) and `c_proj` (4d -> d): 12 d^2 weights, plus
# biases and two LayerNorms (the symbols are the course's,
# `lessons/NOTATION.md`: B sequences of T tokens, width d, H heads, L
# layers, s bytes per value). Training with Adam in fp32 keeps 16 bytes per
# parameter (lesson 12). For backward, each block also keeps its
# activations: a few (B, T, d) arrays and the attention probabilities P,
# (B, H, T, T), which grow with the square of the context. The count is
# lesson 16's, `memory.transformer_block_activation_bytes`: what minidist's
# ops keep for one block, P included (lesson 18 splits the same count into
# P and the rest), here in values of s = 2 bytes as in mixed precision. The
# planner of section 6 counts with the same function
# (`GPTShape.layer_activation_bytes` calls it).
#
# A GPT of today's middle size, 32 layers of width 4096 with 32 heads, a
# vocabulary of 50,304 and contexts of 4,096 tokens (the planner's example),
# on a GPU of 80 GB:

# %%
BIG = plan_inputs.GPTShape(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304, seq_len=4096,
                           global_batch=1024, micro_batch=1)
RANK_MEMORY = 80e9
ITEMSIZE = 2    # s: bytes per activation value, as in mixed precision
layer_states = 16 * BIG.block_parameters()
block_terms = memory.transformer_block_activation_terms(1, BIG.seq_len, BIG.n_embd, BIG.n_head,
                                                        itemsize=ITEMSIZE)
layer_activations = sum(block_terms.values())
block_p = block_terms["attention: probabilities P (B H T T)"]
assert layer_activations == BIG.layer_activation_bytes(itemsize=ITEMSIZE)   # one count
print(f"GPT of {BIG.parameters() / 1e9:.2f} B parameters, {BIG.n_layer} layers, width "
      f"{BIG.n_embd}, {BIG.n_head} heads, context {BIG.seq_len}")
print(f"one block: {BIG.block_parameters() / 1e6:.1f} M parameters = "
      f"{glue('block_states_gb', layer_states / 1e9, '{:.2f} GB')} of model states "
      f"(16 bytes each); {glue('block_activations_gb', layer_activations / 1e9, '{:.2f} GB')} "
      f"of activations for one sequence, P included "
      f"({glue('block_p_gb', block_p / 1e9, '{:.2f} GB')} of P, "
      f"{glue('block_rest_gb', (layer_activations - block_p) / 1e9, '{:.2f} GB')} the rest)")
whole_model = 16 * BIG.parameters() + BIG.n_layer * layer_activations
print(f"the whole model, one sequence in flight: "
      f"{glue('whole_model_gb', whole_model / 1e9, '{:.0f} GB')} against "
      f"{RANK_MEMORY / 1e9:.0f} GB a rank: "
      f"{glue('whole_model_ranks', whole_model / RANK_MEMORY, '{:.1f}')} ranks' worth")
print(f"\n{'split over n ranks':>18} {'states GB':>10} {'activations GB':>15} "
      f"{'+ sequence parallel':>20}   (L = {BIG.n_layer} blocks, P included)")
split_rows = {}
for n in (1, 2, 4, 8):
    states = 16 * BIG.n_layer * BIG.block_parameters(n)
    plain = BIG.n_layer * BIG.layer_activation_bytes(n, itemsize=ITEMSIZE)
    sharded = (BIG.n_layer * BIG.layer_activation_bytes(n, sequence_parallel=True,
                                                        itemsize=ITEMSIZE) if n > 1 else None)
    split_rows[n] = (states, plain, sharded)
    print(f"{n:>18} {states / 1e9:>10.1f} {plain / 1e9:>15.1f} "
          + (f"{sharded / 1e9:>20.1f}" if sharded else f"{'-':>20}"))
states8, plain8, sharded8 = split_rows[8]
glue("states_8", states8 / split_rows[1][0], ".0%")
glue("plain_8", plain8 / split_rows[1][1], ".0%")
glue("sharded_8", sharded8 / split_rows[1][1], ".0%")
assert whole_model > RANK_MEMORY
assert sharded8 < plain8 and plain8 > split_rows[1][1] / 8   # what the text below says

# %% jupyter={"source_hidden": true}
say("""
The model does not fit on one rank ({glue}`whole_model_gb`, {glue}`whole_model_ranks`
ranks' worth), and data parallelism, which copies it to every rank, cannot
help. Splitting each layer over n ranks divides the weights by n (at n = 8
a rank keeps {glue}`states_8` of the model states: the LayerNorms and the
row layers' biases stay whole); it divides only part of
the activations ({glue}`plain_8` of them stay on each of 8 ranks): the
LayerNorms, the residual sums and the row layers' outputs, all of shape
(B, T, d), are kept whole on every rank. Sequence parallelism (section 3)
cuts most of those ({glue}`sharded_8` at n = 8). Activations are also what
pipeline stages and recomputation (lessons 9, 12) attack; section 6 puts
them together.
""")

# %% [markdown]
# **The recap.** Lesson 10 ran both splits of Dettmers' 1000 x 500 layer at
# batch 128 on 2 processes. The column split (each rank 250 of the 500
# outputs) stacks its pieces forward and adds partial input gradients
# backward; the row split (each rank 500 of the 1000 inputs) adds partial
# outputs forward and stacks the input gradient backward. The bytes, from
# `split_bytes` (lesson 10 showed them equal to the trace, byte for byte):

# %%
seed_layer = split_bytes(1000, 500, 128, world_size=2)
print(format_table(seed_layer))

# %% [markdown]
# The last two rows are Megatron's trick: a column layer that does **not**
# gather its output hands each rank exactly the slice of features that a row
# layer **with a split input** wants. Between them nothing moves, whatever
# the function applied element by element in between (here GELU): one
# all_reduce per pass for the pair. A transformer block is two such pairs.
#
# ## 2. Tensor parallelism on one block, step by step
#
# The lesson's GPT is small enough for one core: 2 blocks of width 64 with 8
# heads, a vocabulary of 64 words, sequences of 32 tokens, 4 a batch.
# `tensor_parallel_gpt(model, group)` turns the whole model into this rank's
# shard; each rank builds the same model from the same seed and keeps its
# pieces.
#
# **Attention, split by heads.** The heads are independent of each other
# until `c_proj` mixes them. So rank r takes H / n of the heads: the rows of
# `c_attn` that make *their* queries, keys and values (a column split: the
# outputs of a Linear are the rows of its (out, in) weight) and the columns
# of `c_proj` that read their outputs (a row split). `c_attn` is fused, its
# (3d, d) weight the q rows, then the k rows, then the v rows, so a rank's
# rows are three blocks, not one (`qkv_rows`).
#
# **The MLP**: `c_fc` column-split (4d / n hidden units a rank), the GELU on
# the units a rank holds, `c_proj` row-split.
#
# Which rows and columns each of 2 ranks holds, read from the shards the
# ranks built (not from the formula) and drawn:

# %%
CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=8, n_embd=64)
BATCH, STEPS = 4, 32
TP = 2          # section 2's ranks
d = CONFIG.n_embd
LINEARS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def gpt():
    return GPT(CONFIG, rng=0)


def tokens(step=0):
    rng = np.random.default_rng(10 + step)
    return (rng.integers(0, CONFIG.vocab_size, (BATCH, STEPS)),
            rng.integers(0, CONFIG.vocab_size, (BATCH, STEPS)))


def block_data():
    rng = np.random.default_rng(1)
    return (rng.normal(size=(BATCH, STEPS, d)).astype(np.float32),
            rng.normal(size=(BATCH, STEPS, d)).astype(np.float32))


def layer_of(block, name):
    part, linear = name.split(".")
    return getattr(getattr(block, part), linear)


def grads(module):
    return {name: param.grad.copy() for name, param in module.named_parameters()}


def torch_plan(model, group):
    """torch's plan for the GPT, as its users write it (see below)."""
    plan = {"transformer.wte": RowwiseParallel(), "lm_head": ColwiseParallel()}
    for part, style in (("attn.c_attn", PackedColwiseParallel(3)),
                        ("attn.c_proj", RowwiseParallel()),
                        ("mlp.c_fc", ColwiseParallel()), ("mlp.c_proj", RowwiseParallel())):
        plan[f"transformer.h.*.{part}"] = style
    parallelize_module(model, group, plan)
    for block in model.transformer.h:
        block.attn.n_head //= dist.get_world_size(group)   # as torch users (torchtitan) do
    model.lm_head.weight = model.transformer.wte.weight   # tie the two vocabulary shards again
    return model, plan


def tensor_parallel_run():
    """On each rank: one block forward and backward, then one GPT step, each
    pass a traced region; then the same GPT under torch's plan."""
    shard = tensor_parallel_gpt(gpt())
    block = shard.transformer.h[0]
    x, upstream = block_data()
    inputs = Tensor(x, requires_grad=True)
    with trace.region("block forward"):
        y = block(inputs)
    with trace.region("block backward"):
        (y * Tensor(upstream)).sum().backward()   # a loss whose dY is `upstream`
    found = dict(y=y.data, x_grad=inputs.grad, grads=grads(block),
                 weights={name: layer_of(block, name).weight.data.copy() for name in LINEARS},
                 styles={name: type(layer_of(block, name)).__name__ for name in LINEARS})
    shard.zero_grad()
    idx, targets = tokens()
    with trace.region("gpt forward"):
        logits = shard(idx)
        loss = shard.loss(logits, targets)
    with trace.region("gpt backward"):
        loss.backward()
    found.update(logits=logits.data, loss=loss.item())
    model, plan = torch_plan(gpt(), None)
    torch_logits = model(idx)
    found.update(torch_logits=torch_logits.data,
                 torch_loss=vocab_parallel_cross_entropy(torch_logits, targets).item(),
                 plan={name: repr(style) for name, style in plan.items()})
    return found


tp_trace = OUT / "tp_block.trace.jsonl"
tp_runs = minidist.launch(tensor_parallel_run, world_size=TP, transport="shm",
                          trace=str(tp_trace))
tp_events = trace.read_jsonl(tp_trace).events

whole = gpt()
whole_block = whole.transformer.h[0]


def held_rows(piece, full):
    """The rows of ``full`` that ``piece`` is made of, found by comparing values."""
    return [int(np.flatnonzero((full == row).all(axis=1))[0]) for row in piece]


def ranges(rows):
    """[0, 1, 2, 5, 6] -> "0:3, 5:7"."""
    runs, start = [], rows[0]
    for previous, row in zip(rows, rows[1:] + [None]):
        if row != previous + 1:
            runs.append(f"{start}:{previous + 1}")
            start = row
    return ", ".join(runs)


holdings = {}
for rank, found in enumerate(tp_runs):
    print(f"rank {rank}:")
    for name in LINEARS:
        full = layer_of(whole_block, name).weight.data
        piece = found["weights"][name]
        column_split = found["styles"][name] == "ColumnParallelLinear"
        rows = held_rows(piece if column_split else piece.T, full if column_split else full.T)
        holdings[(rank, name)] = rows
        what = "rows" if column_split else "columns"
        print(f"   {name:12} {found['styles'][name]:21} weight {piece.shape[0]:>3} x "
              f"{piece.shape[1]:<3} of {full.shape[0]:>3} x {full.shape[1]:<3}: "
              f"{what} {ranges(rows)}")
    heads = CONFIG.n_head // TP
    print(f"   heads {rank * heads}..{(rank + 1) * heads - 1}: c_attn's rows are "
          f"qkv_rows(n_embd={d}, n_head={CONFIG.n_head}, rank={rank}, world_size={TP})")
    assert holdings[(rank, "attn.c_attn")] == qkv_rows(d, CONFIG.n_head, rank, TP).tolist()
heads_per_rank = CONFIG.n_head // TP
glue("rows_per_block", d // TP)
glue("heads_rank0", f"0 to {heads_per_rank - 1}")
glue("heads_rank1", f"{heads_per_rank} to {2 * heads_per_rank - 1}")
glue("heads_per_rank", heads_per_rank)
# What the text below says: each third of rank r's c_attn rows is one block of d / n rows.
assert all(len(ranges(holdings[(r, "attn.c_attn")]).split(", ")) == 3 for r in range(TP))


def draw_holdings():
    figure, axes = plt.subplots(1, len(LINEARS), figsize=(11, 4.4),
                                gridspec_kw=dict(width_ratios=[1, 1, 1, 4]))
    for axis, name in zip(axes, LINEARS):
        out, inn = layer_of(whole_block, name).weight.data.shape
        column_split = tp_runs[0]["styles"][name] == "ColumnParallelLinear"
        picture = np.zeros((out, inn))
        for rank in range(TP):
            for index in holdings[(rank, name)]:
                if column_split:
                    picture[index, :] = rank
                else:
                    picture[:, index] = rank
        axis.imshow(picture, cmap=plt.matplotlib.colors.ListedColormap(COLOURS[:TP]),
                    aspect="equal", interpolation="nearest")
        axis.set_title(f"{name}\n({out} x {inn}) by {'rows' if column_split else 'columns'}",
                       fontsize=9)
        axis.set_xticks([0, inn - 1])
        axis.set_yticks([0, out - 1])
        if name == "attn.c_attn":
            for third, letter in enumerate("qkv"):
                axis.text(inn + 2, third * d + d / 2, letter, va="center", fontsize=9)
    handles = [plt.matplotlib.patches.Patch(color=COLOURS[r], label=f"rank {r}")
               for r in range(TP)]
    figure.legend(handles=handles, loc="lower center", ncol=TP, fontsize=9)
    figure.suptitle(f"one GPT block's four weights ((out, in) as stored) on {TP} ranks: "
                    "who holds what", fontsize=11)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    return figure


show_figure(draw_holdings(), "tp_block_weights.png")

# %% jupyter={"source_hidden": true}
say("""
Rank 0's `c_attn` rows are three blocks of d / n = {glue}`rows_per_block`:
the queries, keys and values of heads {glue}`heads_rank0`; rank 1's those
of heads {glue}`heads_rank1`. On each rank the weight keeps the [q; k; v]
layout of a GPT with {glue}`heads_per_rank` heads, so the attention code
runs unchanged on its share of heads. The two `c_proj` layers are split by
columns (their inputs), `c_fc` by rows (its outputs).
""")

# %% [markdown]
# **The communication, and why there are only two.** Follow one half of the
# block, `x + attn(ln_1(x))`, on rank r:
#
# * `ln_1(x)` is computed whole on every rank (x is whole);
# * `c_attn` (column) needs the whole input, which every rank has: nothing
#   to send. Its output is rank r's heads' q, k, v;
# * the attention of those heads needs only those q, k, v: nothing to send;
# * `c_proj` (row) multiplies rank r's heads' outputs by its columns: a
#   whole-sized *partial* sum. Here the ranks must add: **one all_reduce**,
#   and x + attn(...) is whole again on every rank.
#
# Backward, in reverse: the gradient arriving at `c_proj`'s output is whole
# on every rank, so its backward needs nothing; the attention's backward is
# per head; `c_attn`'s backward gives a partial gradient of its input (rank
# r's heads' share of it): **one all_reduce** to add them. The MLP half is
# the same with units instead of heads. Megatron names the two places
# **f** (identity forward, all_reduce backward: before a column layer,
# `copy_to_parallel_region`) and **g** (all_reduce forward, identity
# backward: after a row layer, `reduce_from_parallel_region`): so per block,
# 2 all_reduces forward and 2 backward, whatever the number of heads or the
# width. The trace of the 2-rank run says the same, and the block's output,
# its input's gradient and each rank's weight gradients equal the unsplit
# block's:

# %%
x, upstream = block_data()
inputs = Tensor(x, requires_grad=True)
whole_y = whole_block(inputs)
(whole_y * Tensor(upstream)).sum().backward()
whole_grads = grads(whole_block)
btd = BATCH * STEPS * d


for rank, found in enumerate(tp_runs):
    weight_error = max(relative_error(found["grads"][name], whole_grads[name][shard_index(name, whole_grads[name].shape, rank, TP, CONFIG)])
                       for name in whole_grads)
    print(f"rank {rank}: forward calls {calls(tp_events, rank, 'block forward')}, "
          f"backward calls {calls(tp_events, rank, 'block backward')}")
    print(f"   sent {sent(tp_events, rank, 'block forward'):,} bytes forward and "
          f"{sent(tp_events, rank, 'block backward'):,} backward; formula: 2 all_reduces x "
          f"2 (n - 1)/n B T d s bytes (a ring all_reduce of B T d values of s = 4 bytes) "
          f"= 2 x {4 * ring_all_reduce_sent(btd, TP)[rank]:,} = "
          f"{2 * 4 * ring_all_reduce_sent(btd, TP)[rank]:,} bytes each way")
    print(f"   largest relative difference from the unsplit block: "
          f"Y {relative_error(found['y'], whole_y.data):.1e}, "
          f"dX {relative_error(found['x_grad'], inputs.grad):.1e}, "
          f"weight gradients {weight_error:.1e}")
    for part in ("forward", "backward"):
        assert calls(tp_events, rank, f"block {part}") == ["all_reduce"] * 2
        assert sent(tp_events, rank, f"block {part}") == 2 * 4 * ring_all_reduce_sent(btd, TP)[rank]
    assert weight_error < 1e-4
    assert 4 * ring_all_reduce_sent(btd, TP)[rank] == 2 * (TP - 1) * btd * 4 // TP   # the formula

# %% [markdown]
# Two all_reduces of B x T x d = 4 x 32 x 64 values each way, and a ring on
# 2 ranks sends each rank's half twice: 2 (n - 1)/n B T d values per
# all_reduce. The differences are float32 rounding: the partial sums are
# added in another order.
#
# **A whole GPT step.** Around the blocks: the token embedding is split by
# vocabulary (each rank looks up the words it holds and the others give
# zeros: one all_reduce), and the logits stay split by vocabulary too: the
# vocab-parallel cross-entropy takes the maximum, the target's logit and the
# sum of exponentials over the ranks (three all_reduces of B x T values),
# never gathering the (B, T, V) logits. `gpt_step_bytes` counts it all:
# (2L + 1) all_reduces of B T d forward (the embedding and the L blocks' two
# row layers) and as many backward (the column layers and `lm_head`). Its
# table, with what the trace counted:

# %%
step_formula = gpt_step_bytes(CONFIG, BATCH, STEPS, TP)
step_measured = {part: tuple(sent(tp_events, rank, f"gpt {part}") for rank in range(TP))
                 for part in ("forward", "backward")}
print(format_step_bytes(step_formula, step_measured))
assert step_measured["forward"] == step_formula.forward
assert step_measured["backward"] == step_formula.backward
forward_calls = calls(tp_events, 0, "gpt forward")
print(f"\nrank 0's forward: {len(forward_calls)} collectives, "
      f"{forward_calls.count('all_reduce')} all_reduces = 2 L + 1 + 3 = "
      f"{2 * CONFIG.n_layer + 1 + 3}")
whole_logits = whole(tokens()[0])
whole_loss = F.cross_entropy(whole_logits.reshape(-1, CONFIG.vocab_size),
                             tokens()[1].reshape(-1)).item()
split_logits = np.concatenate([found["logits"] for found in tp_runs], axis=-1)
print(f"loss: whole GPT {whole_loss:.6f}, split {tp_runs[0]['loss']:.6f}; logits side by side: "
      f"largest relative difference {relative_error(split_logits, whole_logits.data):.1e}")
assert abs(whole_loss - tp_runs[0]["loss"]) < 1e-4

# %% [markdown]
# **torch's face.** A torch user does not call `tensor_parallel_gpt`: they
# write a *plan*, a dictionary from module names to styles, and
# `parallelize_module(model, mesh_or_group, plan)` lays the layers' weights
# out as DTensors (Shard(0) for a column split, Shard(1) for a row split)
# and their ops follow the placement rules. The
# same run also built the GPT that way (the plan below, written by the
# function `torch_plan` in section 2's code, which each rank ran after
# `tensor_parallel_gpt`): `ColwiseParallel`
# is the column split (f before it), `RowwiseParallel` the row split (g
# after it); `PackedColwiseParallel(3)` is the column split of a fused
# q, k, v weight, taking the rank's rows from each third, as `qkv_rows` does;
# the embedding is `RowwiseParallel` (its weight's rows are words). The plan,
# and the logits it gives, against `tensor_parallel_gpt`'s:

# %%
for name, style in tp_runs[0]["plan"].items():
    print(f"   {name:28} {style}")
for rank, found in enumerate(tp_runs):
    difference = np.abs(found["torch_logits"] - found["logits"]).max()
    print(f"rank {rank}: logits {found['torch_logits'].shape} = (B, T, V/n: its "
          f"{found['torch_logits'].shape[-1]} of the {CONFIG.vocab_size} words), "
          f"largest difference from "
          f"tensor_parallel_gpt's {difference:.1e}; loss {found['torch_loss']:.6f}")
    assert difference < 1e-5
    assert found["torch_logits"].shape == (BATCH, STEPS, CONFIG.vocab_size // TP)

# %% [markdown]
# The same split, the same numbers: `tensor_parallel_gpt` is the plan above
# written once for the GPT (it also sets each block's head count to H / n,
# which torch users do by hand after `parallelize_module`).
#
# ## 3. Sequence parallelism: the same bytes, less memory
#
# Between g (after a row layer) and the next f (before a column layer) every
# rank computes the same thing on the same whole (B, T, d) array: the
# residual sum, the LayerNorm (and dropout, in a model with dropout). The
# work is repeated n times and the arrays are kept n times. Korthikanti et
# al. cut that region **along the sequence**: each rank keeps T / n of the
# positions. g becomes a **reduce_scatter** (each rank receives the sum for
# its positions only) and f an **all_gather** (the column layer needs every
# position). As a ring all_reduce *is* a reduce_scatter followed by an
# all_gather (lesson 4), the bytes are the same, but for one all_reduce of
# the gradients of the parameters used on T/n positions (LayerNorms, the row
# layers' biases, the position embedding), which each rank now sees only a
# share of.
#
# The step on 2 ranks with `sequence_parallel=True`, and each rank's
# activations after the forward and the loss, counted by the memory ledger
# (it walks the arrays the autograd graph keeps alive), next to
# `gpt_activation_bytes`, with and without sequence parallelism (full form:
# on 4 ranks too):

# %%
SP_WORLDS = (2,) if QUICK else (2, 4)


def sequence_parallel_run():
    found = {}
    for sequence_parallel in (False, True):
        name = "sp" if sequence_parallel else "tp"
        shard = tensor_parallel_gpt(gpt(), sequence_parallel=sequence_parallel)
        idx, targets = tokens()
        with trace.region(f"{name} forward"):
            logits = shard(idx)
            loss = shard.loss(logits, targets)
        held = memory.Ledger(shard).sample("forward", graph=loss).bytes
        with trace.region(f"{name} backward"):
            loss.backward()
            shard.allreduce_sequence_parallel_grads()
        found[name] = dict(activations=held["activations"], loss=loss.item())
    return found


sp_runs, sp_events = {}, {}
for world in SP_WORLDS:
    path = OUT / f"sp{world}.trace.jsonl"
    sp_runs[world] = minidist.launch(sequence_parallel_run, world_size=world, transport="shm",
                                     trace=str(path))
    sp_events[world] = trace.read_jsonl(path).events

world = 2
plain_formula = gpt_step_bytes(CONFIG, BATCH, STEPS, world)
sp_formula = gpt_step_bytes(CONFIG, BATCH, STEPS, world, sequence_parallel=True)
sp_measured = {part: tuple(sent(sp_events[world], rank, f"sp {part}") for rank in range(world))
               for part in ("forward", "backward")}
print(format_step_bytes(sp_formula, sp_measured))
forward_calls = calls(sp_events[world], 0, "sp forward")
print("\nrank 0's forward: " + ", ".join(f"{forward_calls.count(c)} {c}"
                                          for c in ("reduce_scatter", "all_gather", "all_reduce")))
print(f"forward bytes a rank: {sp_formula.forward[0]:,} with sequence parallelism, "
      f"{plain_formula.forward[0]:,} without; backward {sp_formula.backward[0]:,} against "
      f"{plain_formula.backward[0]:,} (the difference: the gradients' all_reduce)")
for part in ("forward", "backward"):
    assert sp_measured[part] == getattr(sp_formula, part)
assert sp_formula.forward == plain_formula.forward
assert [forward_calls.count(c) for c in ("reduce_scatter", "all_gather", "all_reduce")] == \
    [2 * CONFIG.n_layer + 1, 2 * CONFIG.n_layer + 1, 3]

# %% [markdown]
# Each all_reduce became a reduce_scatter and an all_gather, and the
# forward sends exactly the bytes of plain tensor parallelism. What changed
# is memory:

# %%
activation_rows = {}
print(f"{'ranks':>5} {'rank':>4} {'mode':>7} {'ledger':>10} {'formula':>10} "
      f"{'one block (formula, P included)':>32}")
for world in SP_WORLDS:
    for rank, found in enumerate(sp_runs[world]):
        for name, sequence_parallel in (("tp", False), ("sp", True)):
            formula = gpt_activation_bytes(CONFIG, BATCH, STEPS, world, rank, sequence_parallel)
            counted = found[name]["activations"]
            activation_rows[(world, rank, name)] = counted
            print(f"{world:>5} {rank:>4} {'TP' if name == 'tp' else 'TP + SP':>7} "
                  f"{counted:>10,} {formula.total:>10,} {formula.per_block:>32,}")
            assert counted == formula.total
            # The blocks' share is lesson 16's count, split: one function.
            assert formula.per_block == memory.transformer_block_activation_bytes(
                BATCH, STEPS, d, CONFIG.n_head, tp=world, sequence_parallel=sequence_parallel)
unsplit_block = memory.transformer_block_activation_bytes(BATCH, STEPS, d, CONFIG.n_head)
print(f"{1:>5} {0:>4} {'whole':>7} {'':>10} {'':>10} {unsplit_block:>32,}")

whole_idx, whole_targets = tokens()
whole_again = gpt()
whole_logits = whole_again(whole_idx)
whole_loss = F.cross_entropy(whole_logits.reshape(-1, CONFIG.vocab_size), whole_targets.reshape(-1))
whole_activations = memory.Ledger(whole_again).sample("forward", graph=whole_loss).bytes[
    "activations"]
print(f"the whole GPT in one process: {whole_activations:,} bytes of activations")
# The text's formulas for one block, in values of s = 4 bytes, against the table's column:
B_, T_, H_ = BATCH, STEPS, CONFIG.n_head
print(f"one block by the formulas below (B = {B_}, T = {T_}, d = {d}, H = {H_}, s = 4 bytes):")
for w in SP_WORLDS:
    tp_values = B_ * T_ * d * (12 + 17 / w) + 2 * B_ * T_ + B_ * H_ * T_ ** 2 / w
    sp_values = B_ * T_ * d * (4 + 27 / w) + 2 * B_ * T_ / w + B_ * H_ * T_ ** 2 / w
    print(f"   n = {w}: TP s (B T d (12 + 17/n) + 2 B T + B H T^2 / n) = {4 * tp_values:,.0f}; "
          f"TP + SP s (B T d (4 + 27/n) + 2 B T / n + B H T^2 / n) = {4 * sp_values:,.0f}")
    assert 4 * tp_values == memory.transformer_block_activation_bytes(B_, T_, d, H_, tp=w)
    assert 4 * sp_values == memory.transformer_block_activation_bytes(
        B_, T_, d, H_, tp=w, sequence_parallel=True)
    if w == 2:
        glue("sp_block_2", int(4 * sp_values), ",")
        glue("tp_block_2", int(4 * tp_values), ",")

# %% [markdown]
# The ledger and the formula agree to the byte, on every rank, and the
# formula's blocks are lesson 16's count of one block (P included),
# `memory.transformer_block_activation_bytes`, split over n ranks. Unsplit
# (the last row), a block keeps 25 B T d + 2 B T values and P's B H T^2.
# Split by tensor parallelism, q, k, v, P, the heads' outputs and the MLP's
# arrays are divided by n, but each row layer keeps three whole arrays (its
# partial product, the all_reduce's summed copy, the bias added) where the
# unsplit block keeps one: per block a rank keeps B T d (12 + 17/n) + 2 B T
# values plus B H T^2 / n (16/n for 17/n once a rank holds a single head,
# whose output needs no copy): the 12 B T d are the whole arrays every rank
# repeats. With sequence parallelism, B T d (4 + 27/n) + 2 B T / n values
# plus the same B H T^2 / n (26/n for 27/n with a single head); the lines
# just above put the run's sizes into both formulas. What stays whole is the column layers' gathered input (kept for their weight
# gradient; Megatron gathers it again in backward instead) and the row
# layers' partial product. The formula up to n = 8, where each rank holds
# one of the 8 heads (more ranks than heads cannot split it), and the
# ledger's counts as dots:

# %%
def draw_activations():
    worlds = [2, 4, 8]
    figure, axis = plt.subplots(figsize=(7.5, 4.2))
    for name, sequence_parallel, style in (("tensor parallel", False, "-o"),
                                           ("+ sequence parallel", True, "--s")):
        values = [gpt_activation_bytes(CONFIG, BATCH, STEPS, w, 0, sequence_parallel).total / 1e6
                  for w in worlds]
        line, = axis.plot(worlds, values, style, label=f"{name} (formula)", markerfacecolor="none")
        key = "sp" if sequence_parallel else "tp"
        axis.plot(SP_WORLDS, [activation_rows[(w, 0, key)] / 1e6 for w in SP_WORLDS], "o",
                  color=line.get_color(), markersize=9, label=f"{name} (ledger, rank 0)")
    axis.axhline(whole_activations / 1e6, color="black", alpha=0.5, linestyle=":")
    axis.text(worlds[-1], whole_activations / 1e6, "one process, whole GPT", ha="right",
              va="bottom", fontsize=9)
    axis.set_xscale("log", base=2)
    axis.set_xticks(worlds, [str(w) for w in worlds])
    axis.set_ylim(0, whole_activations / 1e6 * 1.15)
    axis.set_xlabel("tensor-parallel ranks n")
    axis.set_ylabel("MB of activations a rank keeps")
    axis.set_title(f"the lesson's GPT, batch {BATCH} x {STEPS} tokens, float32", fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="lower left")
    figure.tight_layout()
    return figure


show_figure(draw_activations(), "sp_activations.png")
kept = {}
for w in (2, 4, 8):
    plain = gpt_activation_bytes(CONFIG, BATCH, STEPS, w).total / whole_activations
    sharded = gpt_activation_bytes(CONFIG, BATCH, STEPS, w, sequence_parallel=True).total \
        / whole_activations
    kept[w] = (plain, sharded)
    print(f"n = {w}: a rank keeps {plain:.0%} of the whole GPT's activations with TP, "
          f"{sharded:.0%} with TP + SP")
glue("tp_kept_8", kept[8][0], ".0%")
glue("sp_kept_8", kept[8][1], ".0%")
glue("tp_kept_8_verdict", "more than half" if kept[8][0] > 0.5 else "less than half")
glue("sp_kept_8_verdict", "less than a third" if kept[8][1] < 1 / 3 else "more than a third")
glue("tp_kept_4", kept[4][0], ".0%")
glue("tp_drops", [kept[2][0] - kept[4][0], kept[4][0] - kept[8][0]])
glue("sp_kept", [kept[w][1] for w in (2, 4, 8)])
assert kept[8][1] < kept[4][1] < kept[2][1]   # sequence parallelism: shrinks with n
assert kept[4][0] - kept[8][0] < kept[2][0] - kept[4][0]   # plain TP: flattens out

# %% jupyter={"source_hidden": true}
say("""
Plain tensor parallelism flattens out: whatever n, every rank keeps the
12 B T d of whole arrays per block (from 4 to 8 ranks its share of the
whole GPT's activations falls only from {glue}`tp_kept_4` to {glue}`tp_kept_8`). With sequence
parallelism nearly everything shrinks with n: at 8 ranks a rank keeps
{glue}`sp_kept_8` of the whole GPT's activations ({glue}`sp_kept_8_verdict`),
where plain tensor parallelism still keeps {glue}`tp_kept_8`
({glue}`tp_kept_8_verdict`).
""")

# %% [markdown]
#
# ## 4. The device mesh
#
# Tensor parallelism sends two all_reduces per block per pass: it wants the
# fastest link, the ranks of one node. Pipeline stages send one activation
# per micro-batch to a neighbour; data parallelism one gradient sum per
# step. A 3D run lays its ranks out as an array, the **device mesh**, one
# axis per kind of parallelism, and each kind talks within its own groups:
# the ranks that share every coordinate but its own. Megatron's order, and
# the one of `minidist.parallel.mesh.plan_3d` and of `GPT3D` (section 5): `init_device_mesh("cpu", (pp, dp,
# tp), mesh_dim_names=("pp", "dp", "tp"))`, row-major, tp the fastest index,
# so the tp ranks are neighbours (one node) and the pp groups stride across
# the machine.
#
# The mesh of 8 ranks as 2 x 2 x 2, drawn (`minidist viz mesh 2x2x2 --names
# pp,dp,tp`) and listed:

# %%
MESH_SHAPE, MESH_NAMES = (2, 2, 2), ("pp", "dp", "tp")
show_figure(mesh_figure(MESH_SHAPE, MESH_NAMES), "device_mesh.png")
layout = mesh_layout(MESH_SHAPE)
for dim, name in enumerate(MESH_NAMES):
    print(f"{name} groups: {groups_along(layout, dim)}")
where_is_5 = tuple(int(i) for i in np.argwhere(layout == 5)[0])
print("rank 5: " + ", ".join(f"{name} {index}" for name, index in zip(MESH_NAMES, where_is_5))
      + "; its groups: " + ", ".join(
          f"{name} {next(g for g in groups_along(layout, dim) if 5 in g)}"
          for dim, name in enumerate(MESH_NAMES)))
assert where_is_5 == (1, 0, 1)   # what the text below says of rank 5
assert [next(g for g in groups_along(layout, dim) if 5 in g) for dim in range(3)] == \
    [[1, 5], [5, 7], [4, 5]]

# %% [markdown]
# Rank 5 sits at pp 1, dp 0, tp 1: it all_reduces its blocks' activations
# with rank 4, its gradients with rank 7, and passes activations to and from
# rank 1. On real processes, each rank asks the mesh
# (`mesh.get_coordinate()`, `mesh.get_group(name)`); the layout above says
# what they must answer. In the quick form, 2 processes as a 1 x 1 x 2 mesh
# (pure tensor parallelism); in the full form the 8 of the picture:

# %%
RUN_SHAPE = (1, 1, 2) if QUICK else MESH_SHAPE


def mesh_answers(shape):
    mesh = dist.init_device_mesh("cpu", shape, mesh_dim_names=MESH_NAMES)
    return dict(rank=dist.get_rank(), coordinate=mesh.get_coordinate(),
                groups={name: list(mesh.get_group(name).ranks) for name in MESH_NAMES},
                local={name: mesh.get_local_rank(name) for name in MESH_NAMES})


answers = minidist.launch(mesh_answers, world_size=int(np.prod(RUN_SHAPE)), transport="shm",
                          args=(RUN_SHAPE,))
run_layout = mesh_layout(RUN_SHAPE)
for answer in answers:
    print(f"rank {answer['rank']}: coordinate {answer['coordinate']}, "
          + ", ".join(f"{name} group {answer['groups'][name]} (local rank {answer['local'][name]})"
                      for name in MESH_NAMES))
    assert tuple(int(i) for i in np.argwhere(run_layout == answer["rank"])[0]) == \
        tuple(answer["coordinate"])
    for dim, name in enumerate(MESH_NAMES):
        assert answer["groups"][name] in groups_along(run_layout, dim)
print()
Console(width=100).print(mesh_text(RUN_SHAPE, MESH_NAMES, color=False))

# %% [markdown]
# ## 5. A run on a mesh
#
# `GPT3D(model, mesh, schedule, microbatches)` (`minidist/parallel/mesh/gpt_3d.py`)
# puts the three together on one `(pp, dp, tp)` mesh: the GPT's layers,
# `[embeddings, block 0, ..., block L-1, ln_f + lm_head]`, are cut into
# pipeline stages; each stage is split over its tp group by section 2's
# pieces; the whole is replicated over the dp group. Per step: the tp
# all_reduces inside every block, one activation forward and one gradient
# back between neighbouring stages per micro-batch, one all_reduce of the
# gradients over dp after the pipeline drains, and one more that the tied
# embedding needs: `wte` lives on the first stage and `lm_head`, the same
# matrix, on the last, so the two ranks that hold its copies sum their
# gradients (Megatron's *embedding group*).
#
# Each mesh below trains three AdamW steps of the lesson's GPT (in float64,
# so that rounding does not hide a mistake) on the same global batches, and
# its shards are compared with one process trained on the same batches. In
# the quick form the three 1-D meshes of 2 processes (this machine's cores);
# in the full form also the 2 x 2 x 2 mesh of section 4, 8 processes:

# %%
TRAIN_STEPS, MICROBATCHES = 3, 2
MESHES = {2: [(1, 1, 2), (2, 1, 1), (1, 2, 1)]}
if not QUICK:
    MESHES[8] = [MESH_SHAPE]


def mesh_name(shape):
    return " x ".join(f"{name}{size}" for name, size in zip(MESH_NAMES, shape) if size > 1)


def gpt64():
    return GPT(CONFIG, rng=0).to(np.float64)


def train_on_mesh(shapes):
    """For each mesh shape: GPT3D trained TRAIN_STEPS steps, each step a
    traced region; this rank's shards, its tp rank and the losses."""
    found = {}
    for shape in shapes:
        name = mesh_name(shape)
        mesh = dist.init_device_mesh("cpu", shape, mesh_dim_names=MESH_NAMES)
        model = GPT3D(gpt64(), mesh, "1f1b", microbatches=MICROBATCHES)
        optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        losses = []
        for step in range(TRAIN_STEPS):
            with trace.region(f"{name} step {step}", kind="step"):
                losses.append(model.step(*tokens(step), optimizer))
        found[name] = dict(params={n: p.data.copy() for n, p in model.named_parameters().items()},
                           tp_rank=mesh.get_local_rank("tp"), losses=losses)
    return found


mesh_runs, mesh_traces = {}, {}
for world, shapes in MESHES.items():
    mesh_traces[world] = OUT / f"mesh{world}.trace.jsonl"
    mesh_runs[world] = minidist.launch(train_on_mesh, world_size=world, transport="shm",
                                       args=(shapes,), trace=str(mesh_traces[world]),
                                       timeout=600)

one = gpt64()
one_optimizer = optim.AdamW(one.parameters(), lr=1e-2, weight_decay=0.1)
one_losses = []
for step in range(TRAIN_STEPS):
    idx, targets = tokens(step)
    one_optimizer.zero_grad()
    loss = F.cross_entropy(one(idx).reshape(-1, CONFIG.vocab_size), targets.reshape(-1))
    loss.backward()
    one_optimizer.step()
    one_losses.append(loss.item())
one_weights = {name: p.data for name, p in one.named_parameters()}
one_weights["lm_head.weight"] = one.lm_head.weight.data   # the tied matrix under both names
print("one process, losses " + ", ".join(f"{value:.6f}" for value in one_losses))

for world, shapes in MESHES.items():
    for shape in shapes:
        name = mesh_name(shape)
        worst, held = 0.0, set()
        for found in mesh_runs[world]:
            run = found[name]
            for param, shard in run["params"].items():
                full = one_weights[param]
                piece = full[shard_index(param, full.shape, run["tp_rank"], shape[2], CONFIG)]
                worst = max(worst, relative_error(shard, piece))
                held.add(param)
        held.add("lm_head.weight")   # with one pipeline stage it is wte, named once
        last = [found[name]["losses"] for found in mesh_runs[world]
                if found[name]["losses"][0] is not None]
        losses = np.mean(last, axis=0)   # the replicas' mean: the global batch's loss
        print(f"{name:>16} on {world} processes: losses " + ", ".join(f"{v:.6f}" for v in losses)
              + f"; weights against one process's: largest relative difference {worst:.1e}")
        assert held == set(one_weights), name
        assert worst < 1e-9, name
        assert np.allclose(losses, one_losses, rtol=1e-9), name

# %% [markdown]
# Every mesh ends with one process's weights, to float64 rounding, whatever
# it split: the tensor-parallel shards are their rows and columns of the
# whole matrices, the pipeline ranks hold different layers, the replicas the
# same ones; and each step's loss is one process's loss.
#
# **Who talked to whom.** A message between two ranks of the mesh runs
# along the one dimension in which their coordinates differ (rank 5 and rank
# 7 differ in dp only). `viz.timeline.bytes_per_dimension` counts the bytes
# of every send in the trace that way, and the timeline colours each message
# and each collective call by its dimension (`color_by="mesh"`; a trace whose
# header names the mesh, as `examples/gpt_3d.py` writes it, gets it by
# default). The bytes of each run, and the timeline of its last step:

# %%
def run_events(events, name, step=None):
    """The events of one mesh run (of its step ``step`` only, if given): each
    rank's events inside its own step regions (not what came before them, such
    as the broadcast over dp that makes the replicas' first weights equal)."""
    prefix = f"{name} step" if step is None else f"{name} step {step}"
    spans = {}
    for e in events:
        if e["kind"] == "step" and e["label"].startswith(prefix):
            start, end = spans.get(e["rank"], (e["start"], e["end"]))
            spans[e["rank"]] = (min(start, e["start"]), max(end, e["end"]))
    return [e for e in events if e["rank"] in spans
            and spans[e["rank"]][0] <= e["start"] and e["end"] <= spans[e["rank"]][1]]


print(f"{'mesh':>16} " + " ".join(f"{name + ' bytes':>12}" for name in MESH_NAMES)
      + "   (all ranks, all steps)")
timelines, measured_bytes = {}, {}
for world, shapes in MESHES.items():
    events = trace.read_jsonl(mesh_traces[world]).events
    for shape in shapes:
        name = mesh_name(shape)
        totals = bytes_per_dimension(run_events(events, name), mesh=(shape, MESH_NAMES))
        print(f"{name:>16} " + " ".join(f"{totals[dim]:>12,}" for dim in MESH_NAMES)
              + (f"   and {totals['other']:,} between ranks of no one dimension"
                 if totals.get("other") else ""))
        for dim, along in enumerate(MESH_NAMES):
            assert (totals[along] > 0) == (shape[dim] > 1), (shape, along)
        timelines[f"timeline_{name.replace(' x ', '_')}.png"] = draw_timeline(
            run_events(events, name, TRAIN_STEPS - 1), color_by="mesh",
            mesh=(shape, MESH_NAMES), title=f"{name}: the last training step")
        measured_bytes[name] = totals
per_microbatch = gpt_step_bytes(CONFIG, BATCH // MICROBATCHES, STEPS, 2, itemsize=8)
tp_formula = TRAIN_STEPS * MICROBATCHES * sum(per_microbatch.total)
print(f"tp2 by section 2's formula: {TRAIN_STEPS} steps x {MICROBATCHES} micro-batches x "
      f"gpt_step_bytes of {BATCH // MICROBATCHES} sequences on 2 ranks, float64, both ranks = "
      f"{tp_formula:,} bytes")
assert measured_bytes["tp2"]["tp"] == tp_formula
for file_name, timeline in timelines.items():
    show_figure(timeline, file_name)

# %% [markdown]
# Each dimension sends only when it has more than one rank, and what it sends
# is of its own kind: tp's activations in every block, pp's activations and
# gradients at the stage boundary (and the tied embedding's gradient sum),
# dp's gradient sum once a step. And tp's bytes are section 2's formula,
# applied micro-batch by micro-batch.
#
# %% [markdown]
# ## 6. Plans for one model on one budget of ranks
#
# How should 1,024 ranks be split between data, tensor and pipeline
# parallelism for section 1's GPT, with a global batch of 1,024 sequences of
# 4,096 tokens? No laptop runs that, but its step can be *predicted* from the
# pieces the course already has: the model's FLOPs, the cost model's time of
# every collective on a cluster's links (8 ranks a node, NVLink-like inside,
# InfiniBand-like between: `plan_inputs.CLUSTER`), the pipeline schedule run on
# its virtual clock (lesson 9), and ZeRO's byte counts (lesson 12).
# `compare_plans` predicts every dp x tp x pp of 1,024 (tp within a node),
# keeps those whose fullest rank fits in 80 GB, and ranks them by step time:

# %%
RANKS = 1024
comparison = choose_plan.compare_plans(BIG, RANKS, memory_limit=RANK_MEMORY)
shown = comparison.ranked[:8]
tried = len(comparison.ranked) + len(comparison.too_big) + len(comparison.impossible)
print(f"{RANKS} ranks: {tried} plans dp x tp x pp (tp within a node); "
      f"{len(comparison.ranked)} fit in {RANK_MEMORY / 1e9:.0f} GB a rank, "
      f"{len(comparison.too_big)} do not, {len(comparison.impossible)} cannot split the model:")
for why, plans in choose_plan.why_impossible(comparison.impossible).items():
    print(f"  {len(plans)} where {why} ({plans[0]}, ...)")
print(choose_plan.format_table(shown))
print("too big: " + ", ".join(f"{p.plan} ({p.memory_total / 1e9:.0f} GB)"
                              for p in comparison.too_big[:6])
      + (", ..." if len(comparison.too_big) > 6 else ""))

# %% [markdown]
# The Ultra-Scale Playbook (Tazi et al., 2025) has a decision tree that
# grows the dimensions in an order instead of trying them all: first make one step fit, with tensor
# parallelism inside a node (it needs the fastest link), then with pipeline
# stages across nodes; every rank left over goes to data parallelism.
# `playbook_plan` follows it, step by step:

# %%
playbook = choose_plan.playbook_plan(BIG, RANKS, memory_limit=RANK_MEMORY)
for decision in playbook.decisions:
    print("  " + decision)
best = comparison.best
place_of_playbook = [str(p.plan) for p in comparison.ranked].index(str(playbook.step.plan)) + 1
print(f"\nthe Playbook's plan {playbook.step.plan}: {playbook.step.total * 1e3:,.0f} ms a step, "
      f"number {place_of_playbook} of {len(comparison.ranked)}; the fastest, {best.plan}: "
      f"{best.total * 1e3:,.0f} ms ({playbook.step.total / best.total:.2f}x)")
# What the text below says of these plans:
assert len({round(p.compute, 9) for p in comparison.ranked}) == 1   # the same compute
assert playbook.step.plan.pp == 1 and best.plan.pp > 1
assert best.pp_bubble < playbook.step.dp_comm - best.dp_comm   # the bubble costs less than it saves
assert playbook.step.total < 1.2 * best.total   # among the good ones
assert comparison.too_big[-1].plan.dp == RANKS  # dp alone does not fit


# %%
def draw_plans(predictions, playbook_step):
    parts = (("compute", "tab:blue"), ("tp_comm", "tab:orange"), ("pp_bubble", "tab:grey"),
             ("dp_comm", "tab:green"))
    too_big = {str(p.plan) for p in comparison.too_big}
    labels = [str(p.plan) + ("  (Playbook)" if str(p.plan) == str(playbook_step.plan) else "")
              + ("  (too big)" if str(p.plan) in too_big else "") for p in predictions]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 5.4), sharey=True,
                                         gridspec_kw=dict(width_ratios=[3, 2]))
    where = np.arange(len(predictions))
    start = np.zeros(len(predictions))
    for name, colour in parts:
        values = np.array([getattr(p, name) for p in predictions])
        left.barh(where, values, left=start, color=colour, label=name.replace("_", " "))
        start += values
    left.set_yticks(where, labels, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("seconds a step (predicted)")
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=4)
    left.set_title(f"{RANKS} ranks: the fastest that fit, then two that do not", fontsize=10)
    start = np.zeros(len(predictions))
    for name, colour in (("parameters", "tab:blue"), ("gradients", "tab:orange"),
                         ("optimizer_state", "tab:green"), ("activations", "tab:red")):
        values = np.array([p.memory[name] for p in predictions]) / 1e9
        right.barh(where, values, left=start, color=colour, label=name.replace("_", " "))
        start += values
    right.axvline(RANK_MEMORY / 1e9, color="black", linestyle=":")
    right.set_xlabel("GB on the fullest rank")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    right.set_title("memory a rank (limit dotted)", fontsize=10)
    figure.tight_layout()
    return figure


pictured = list(shown)
if str(playbook.step.plan) not in [str(p.plan) for p in pictured]:
    pictured.append(playbook.step)
pictured += comparison.too_big[:2]   # the smallest of those over the limit
show_figure(draw_plans(pictured, playbook.step), "plans_1024.png")

# %% [markdown]
# Read the bars. Compute is the same for every plan: the same FLOPs shared
# by the same 1,024 ranks. What differs is what each dimension adds on top.
# Tensor parallelism's all_reduces sit on the critical path of every block,
# in every micro-batch: cheap on a node's link, but they grow with tp. The
# pipeline's bubble is its fill and drain, (p - 1) stage-times, which more
# micro-batches per pipeline (a smaller dp) make a smaller share. Data
# parallelism's gradient sum is paid once a step, on the slow link between
# nodes, and a rank sums only the gradients of the layers it holds: 1 / (tp
# pp) of the model. And memory decides which plans may run at all: dp alone
# keeps the whole model on every rank.
#
# The Playbook's order stops at the first plan that fits: tensor parallelism
# grown until the model fits, no pipeline, every other rank to data
# parallelism. That plan is among the good ones, but not the fastest here:
# the fastest adds a few pipeline stages, whose bubble costs less than what
# they save on the data-parallel gradient sum. The order is a rule of thumb
# for where to start; the prediction says where to end.
#
# One plan's breakdown, a mesh of 8 x 8 x 16 (`minidist plan --mesh
# 8x8x16`):

# %%
print(plan_3d.predict_step(BIG, plan_inputs.Plan(dp=8, tp=8, pp=16)))

# %% [markdown]
# **Exercise.** Write the two communications of an attention split by heads
# yourself (Megatron's f and g: where the all_reduce goes, forward and
# backward), checked on real processes against the unsplit block, with the
# replay of your messages:
#
#     minidist exercise start tensor_parallel_attention
#
# **Try**, with three constants of the lesson's code (`BIG`, section 1's
# GPT shape; `RANK_MEMORY`, section 1's 80 GB a rank; `RANKS`, section 6's
# 1,024 ranks): `compare_plans(BIG, RANKS, memory_limit=RANK_MEMORY,
# sequence_parallel=True)` or `zero_stage=1`, `recompute=True`, or
# `schedule="interleaved_1f1b", virtual_stages=2`, and see which plans start
# to fit and which win; halve `global_batch` and watch the pipeline's bubble
# grow; run `minidist plan --ranks 1024 --memory 80GB` for the same table
# from the command line.
