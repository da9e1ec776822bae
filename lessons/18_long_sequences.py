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
# # Lesson 18: long sequences
#
# Lesson 17 split a transformer's weights (tensor parallelism) and the
# activations between its split layers (sequence parallelism). Neither
# helps when the *sequence* is the problem: a context of 128k tokens is too
# long for one rank's memory whatever the width, and attention is the one
# layer in which every position needs every other one. **Context
# parallelism** gives each rank a piece of every sequence and computes
# attention across the ranks. This chapter:
#
# 1. attention's memory against the sequence length: the B H T^2 term,
#    measured and by formula, and what is left once it is gone;
# 2. ring attention, step by step: the zig-zag split and why, the online
#    softmax's merge by hand on tiny numbers, the ring traced on real
#    processes and replayed frame by frame, its outputs and gradients equal
#    to attention on the whole sequence;
# 3. Ulysses: an all_to_all that swaps the sequence split for a head split,
#    equal to whole attention too;
# 4. when each wins: bytes from the trace against the formulas, time
#    measured here, then predicted on a cluster of 2 to 64 ranks;
# 5. the GPT trained with a context-parallel dimension (CP x DP), equal to
#    one process.
#
# Library code: `minidist/parallel/context/` (read in this order: `split.py`, the split and
# its balance; `ring_attention.py`; `ulysses.py`; `gpt.py`, the GPT on a CP
# group; `costs.py`, the bytes),
# `viz/ring_attention_replay.py` (the replay).

# %%
import math

import numpy as np
from rich.console import Console

import minidist
import minidist.distributed as dist
from minidist import Tensor, costmodel, memory, optim, trace
from minidist.distributed import simulate
from minidist.lesson import (
    glue,
    in_notebook,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    show_file,
    use_headless_matplotlib,
)
from minidist.lesson_timing import Load, timed
from minidist.models.gpt import GPT, Block, GPTConfig
from minidist.nn import functional as F
from minidist.parallel.context.costs import (
    format_attention_bytes,
    ring_attention_bytes,
    ulysses_bytes,
)
from minidist.parallel.context.gpt import context_parallel_gpt
from minidist.parallel.context.ring_attention import merge, ring_attention
from minidist.parallel.context.split import (
    block_work,
    chunk_bounds,
    rank_chunks,
    rank_positions,
    shard_sequence,
)
from minidist.parallel.context.ulysses import ulysses_attention
from minidist.parallel.mesh import plan_inputs

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

import matplotlib.pyplot as plt  # noqa: E402

from viz.animate import animate, save_gif  # noqa: E402
from viz.ring_attention_replay import ring_attention_replay  # noqa: E402
from viz.terminal import render_frame  # noqa: E402

QUICK = quick()
OUT = output_dir()
np.set_printoptions(precision=4, suppress=True)
#: matplotlib's tableau-colorblind10, as in lessons 10 and 17.
COLOURS = ("#006BA4", "#FF800E", "#ABABAB", "#595959")
#: The ranks the lesson runs on: 2 in the quick form (this machine's cores), 4 in the full one.
WORLD = 2 if QUICK else 4
#: Section 4's measured layer: T = 256 on 2 ranks in the quick form, 1,024 on 4 in the full one.
QUICK_MEASURE_T, FULL_MEASURE_T = 256, 1024
glue("quick_form", QUICK)
glue("lesson_form",
     "This is the lesson's **quick form** (`MINIDIST_LESSON_QUICK=1`), smaller than the "
     "full form: section 1 measures T up to 512 (full form: up to 2,048); sections "
     "2 to 4 run on 2 ranks (full form: 4), so section 2's ring has T = 16 positions and one "
     "step with messages (full form: T = 32, three steps) and section 3's swap T = 16 on 2 "
     "ranks (full form: T = 32 on 4); section 4 measures a layer of T = 256 on 2 ranks with "
     "5 repeats (full form: T = 1,024 on 4, 10 repeats), whose times can tell another story "
     "(said there); section 5 trains on (dp, cp) = (1, 2), 2 processes (full form: (2, 2), "
     "4). The 128k-token predictions of sections 1 and 4 are the same in both forms."
     if QUICK else
     "This is the lesson's **full form**. The quick form (`MINIDIST_LESSON_QUICK=1`) is "
     "smaller: section 1 stops at T = 512, sections 2 to 4 run on 2 ranks (T = 16 in "
     "sections 2 and 3), section 4 measures T = 256 with 5 repeats, and section 5 trains on "
     "(dp, cp) = (1, 2); the 128k-token predictions are the same in both forms.")

# %% jupyter={"source_hidden": true}
say("""
{glue}`lesson_form`
""")


def relative_error(actual, wanted):
    return float(np.abs(actual - wanted).max() / np.abs(wanted).max())


def sent(events, rank, label):
    """Bytes ``rank`` sent inside its traced region ``label``."""
    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and start <= e["start"] and e["end"] <= end)


# %% [markdown]
# ## 1. Attention's memory against the sequence length
#
# Lesson 16 counted what one transformer block (one layer) keeps for its
# backward, `memory.transformer_block_activation_terms`, in values of s
# bytes each: 25 B T d values of q, k, v, LayerNorm and MLP arrays, 2 B T
# of LayerNorm statistics, and the attention probabilities P, **B H T^2**
# values: the one term that grows with the square of the context. It is the
# course's one count (lesson 17 split the same function over its ranks).
# `memory.activations_against_length` measures a block's graph with the
# memory ledger next to the formula (a block of width 64 with 4 heads, one
# sequence, float32: s = 4):

# %%
D_MODEL, N_HEAD, B = 64, 4, 1
LENGTHS = (64, 128, 256, 512) if QUICK else (64, 128, 256, 512, 1024, 2048)
block_config = GPTConfig(vocab_size=64, block_size=max(LENGTHS), n_layer=1, n_head=N_HEAD,
                         n_embd=D_MODEL)
rows = memory.activations_against_length(lambda: Block(block_config, rng=np.random.default_rng(0)),
                                         D_MODEL, N_HEAD, B, LENGTHS)
print(f"{'T':>5} {'measured':>12} {'formula':>12} {'P (B H T^2)':>12} {'share':>6}")
for row in rows:
    print(f"{row['T']:>5} {row['measured']:>12,} {row['formula']:>12,} "
          f"{row['attention_scores']:>12,} {row['attention_scores'] / row['formula']:>6.0%}")
    assert row["measured"] == row["formula"]
shares = [row["attention_scores"] / row["formula"] for row in rows]
assert all(a < b for a, b in zip(shares, shares[1:]))   # P's share grows with T
for shorter, longer in zip(rows, rows[1:]):             # each T double the one before:
    assert longer["attention_scores"] == 4 * shorter["attention_scores"]
    assert longer["formula"] - longer["attention_scores"] == \
        2 * (shorter["formula"] - shorter["attention_scores"])

# %% [markdown]
# Each doubling of T doubles the rest and quadruples P, whose share only
# grows. FlashAttention's answer on one device is never to keep P: compute
# attention block of keys by block of keys with the *online softmax*
# (section 2), keep one log-sum-exp per query, and rebuild P in the
# backward. But what remains is still linear in T, and a long context
# multiplies it. Lesson 17's GPT (32 layers of width 4096, 32 heads), one
# sequence, 2-byte activations (s = 2), by the same formula, one block split
# into P and the rest (lesson 17 printed their sum at T = 4,096):

# %%
BIG = plan_inputs.GPTShape(n_layer=32, n_embd=4096, n_head=32, vocab_size=50304, seq_len=4096,
                           global_batch=1, micro_batch=1)
RANK_MEMORY = 80e9
CONTEXTS = (4096, 16384, 32768, 65536, 131072)
P_KEY = "attention: probabilities P (B H T T)"
ITEMSIZE = 2   # s
print(f"{'context T':>9} {'P, one block':>13} {'the rest, one block':>20} "
      f"{'32 blocks without P':>20} {'80 GB ranks for them':>21}")
big_rows = []
for T in CONTEXTS:
    terms = memory.transformer_block_activation_terms(1, T, BIG.n_embd, BIG.n_head,
                                                      itemsize=ITEMSIZE)
    p, rest = terms[P_KEY], sum(terms.values()) - terms[P_KEY]
    whole = BIG.n_layer * rest
    big_rows.append((T, p, rest))
    print(f"{T:>9,} {p / 1e9:>10,.2f} GB {rest / 1e9:>17.2f} GB {whole / 1e9:>17.0f} GB "
          f"{math.ceil(whole / RANK_MEMORY):>21}")
T0, p0, rest0 = big_rows[0]
print(f"one block at T = {T0:,}, P included: "
      f"{glue('block_4096_gb', (p0 + rest0) / 1e9, '{:.2f} GB')} = "
      f"{glue('block_4096_p_gb', p0 / 1e9, '{:.2f} GB')} of P + "
      f"{glue('block_4096_rest_gb', rest0 / 1e9, '{:.2f} GB')} the rest (lesson 17's count)")
assert p0 + rest0 == BIG.layer_activation_bytes(itemsize=ITEMSIZE)   # one count, one function
T_long, p_long, rest_long = big_rows[-1]
glue("p_128k_tb", p_long / 1e12, "{:.1f} TB")
glue("rest_128k_gb", BIG.n_layer * rest_long / 1e9, "{:,.0f} GB")
glue("ranks_128k", math.ceil(BIG.n_layer * rest_long / RANK_MEMORY))
assert BIG.n_layer * rest_long > RANK_MEMORY        # 128k does not fit, even without P
assert p_long > 1e12                                 # P alone: a terabyte a block
# Cut over n ranks of context parallelism, each rank's T/n positions keep 1/n of the rest:
for n in (2, 4, 8):
    terms = memory.transformer_block_activation_terms(1, T_long // n, BIG.n_embd, BIG.n_head,
                                                      itemsize=ITEMSIZE)
    assert n * (sum(terms.values()) - terms[P_KEY]) == rest_long


def draw_memory():
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    T = np.array([row["T"] for row in rows])
    left.loglog(T, [row["measured"] / 1e6 for row in rows], "o", color="#C85200",
                label="block, measured")
    left.loglog(T, [row["formula"] / 1e6 for row in rows], "-", color="#C85200", linewidth=1,
                label="block, formula")
    left.loglog(T, [row["attention_scores"] / 1e6 for row in rows], "--", color="#006BA4",
                label="of which P (B H T^2)")
    left.set_xlabel("sequence length T")
    left.set_ylabel("MB kept for the backward")
    left.set_title(f"one block, width {D_MODEL}, {N_HEAD} heads, float32", fontsize=10)
    left.legend(fontsize=8)
    left.grid(alpha=0.3, which="both")
    T = np.array([row[0] for row in big_rows])
    right.loglog(T, [row[1] / 1e9 for row in big_rows], "--", color="#006BA4",
                 label="P, one layer")
    right.loglog(T, [row[2] / 1e9 for row in big_rows], "-s", color="#C85200",
                 label="the rest, one layer")
    right.loglog(T, [BIG.n_layer * row[2] / 1e9 for row in big_rows], "-o", color="#595959",
                 label="the rest, 32 layers")
    right.axhline(RANK_MEMORY / 1e9, color="black", linestyle=":", label="80 GB: one rank")
    right.set_xlabel("context T")
    right.set_ylabel("GB")
    right.set_title("lesson 17's GPT (width 4096, 32 heads), 2 bytes", fontsize=10)
    right.legend(fontsize=8, loc="upper left")
    right.grid(alpha=0.3, which="both")
    figure.tight_layout()
    return figure


show_figure(draw_memory(), "attention_memory.png")

# %% jupyter={"source_hidden": true}
say("""
At 128k tokens P would be {glue}`p_128k_tb` a block, more than a terabyte,
and even without it the other activations of 32 blocks need
{glue}`rest_128k_gb`: {glue}`ranks_128k` ranks' memory. Data parallelism
cannot help (it gives every rank whole sequences); tensor parallelism with
sequence parallelism divides most of them by its n_tp ranks (lesson 17),
but n_tp stops at the heads and at a node's fast links. Cut the *sequence*
over n_cp more ranks and every one of these terms, linear in T, is divided
by n_cp too: each rank keeps its T/n_cp positions. The layers that work
position by position (embeddings, LayerNorms, the MLP, the projections)
need no change. Attention needs every key for every query: the rest of the
lesson is how (from here on n is the context-parallel group's ranks).
""")

# %% [markdown]
#
# ## 2. Ring attention, step by step
#
# **The split, and why zig-zag.** Each rank holds the queries, keys and
# values of its positions. In ring attention each rank keeps its queries and
# passes K, V blocks round a ring: at step j (j = 0 .. n - 1) rank r holds
# the block of rank (r - j) mod n (rank 0, at step 1, rank n - 1's). With
# the causal mask a query sees only keys at or before it. Give
# rank r the r-th contiguous block and rank 0's queries need only its own
# block, while the last rank's need every block. `block_work` counts the
# score entries each rank computes at each step of the ring (T = 16 on 4
# ranks); the zig-zag split cuts the sequence into 2n chunks and gives rank
# r chunks r and 2n - 1 - r, an early one and a late one:

# %%
SPLIT_T, SPLIT_N = 16, 4
for layout in ("contiguous", "zigzag"):
    print(f"{layout}: " + "; ".join(
        f"rank {r} positions " + " + ".join(f"{a}..{b - 1}" for a, b in rank_chunks(
            SPLIT_T, SPLIT_N, r, layout)) for r in range(SPLIT_N)))
work = {layout: block_work(SPLIT_T, SPLIT_N, is_causal=True, layout=layout)
        for layout in ("contiguous", "zigzag")}
busy_share = {}
for layout, table in work.items():
    # A step lasts as long as its busiest rank: the rest of the step is idle time.
    busy_share[layout] = table.sum() / (SPLIT_N * table.max(axis=1).sum())
    print(f"\n{layout}: score entries computed (row: step of the ring, column: rank)\n{table}")
    print(f"   idle (rank, step) pairs: {int((table == 0).sum())} of {table.size}; "
          f"the ranks are busy {busy_share[layout]:.0%} of the ring's time")
assert work["zigzag"].sum() <= work["contiguous"].sum()
assert (work["zigzag"] == work["zigzag"][:, :1]).all() and busy_share["zigzag"] == 1.0
assert (work["contiguous"][1:, 0] == 0).all()   # rank 0 idles after step 0


def draw_work():
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    top = max(table.max() for table in work.values())
    for axis, (layout, table) in zip(axes, work.items()):
        axis.imshow(table, cmap="Blues", vmin=0, vmax=top)
        for step in range(SPLIT_N):
            for rank in range(SPLIT_N):
                value = table[step, rank]
                axis.text(rank, step, str(value), ha="center", va="center", fontsize=9,
                          color="white" if value > top / 2 else "black")
        axis.set_xticks(range(SPLIT_N), [f"rank {r}" for r in range(SPLIT_N)], fontsize=8)
        axis.set_yticks(range(SPLIT_N), [f"step {s}" for s in range(SPLIT_N)], fontsize=8)
        axis.set_title(f"{layout}: busy {busy_share[layout]:.0%}", fontsize=10)
    figure.suptitle(f"causal attention over T = {SPLIT_T} on {SPLIT_N} ranks: score entries "
                    "per rank and ring step", fontsize=10)
    figure.tight_layout()
    return figure


show_figure(draw_work(), "zigzag_balance.png")
triangle = SPLIT_T * (SPLIT_T + 1) // 2
glue("triangle", triangle)
glue("contiguous_total", int(work["contiguous"].sum()))
glue("zigzag_total", int(work["zigzag"].sum()))
assert triangle < work["zigzag"].sum() < work["contiguous"].sum()   # what the text says

# %% jupyter={"source_hidden": true}
say("""
Contiguous blocks leave rank 0 idle after its first step and make every
step as long as its busiest rank; the zig-zag split gives every rank the
same work at every step. (A block that the diagonal cuts is computed whole
and masked afterwards, so both totals, {glue}`contiguous_total` entries
contiguous and {glue}`zigzag_total` zig-zag, are above the T (T + 1) / 2 =
{glue}`triangle` entries of the causal triangle; the zig-zag's smaller
diagonal chunks waste less.)
""")

# %% [markdown]
# **The online softmax, by hand.** A rank never holds a whole row of
# scores: it sees one block of keys at a time. Softmax needs the whole row's
# maximum (for stability) and its sum of exponentials. The online softmax
# keeps, for each query row, the running maximum M, the running sum l of
# exp(score - M), and the output so far o; a new block with its own (M_b,
# l_b, o_b) merges as
#
#     M' = max(M, M_b)
#     l' = l exp(M - M') + l_b exp(M_b - M')          (rescale both sums to M')
#     o' = (l exp(M - M') o + l_b exp(M_b - M') o_b) / l'
#
# or, with the log-sum-exp LSE = M + log l in place of (M, l), as
# `ring_attention.merge` writes it: LSE' = log(exp(LSE) + exp(LSE_b)),
# o' = exp(LSE - LSE') o + exp(LSE_b - LSE') o_b. One query row of six
# scores, the values one number each, split into two blocks of three keys:

# %%
scores = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 4.0])
values = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
halves = [(scores[:3], values[:3]), (scores[3:], values[3:])]
partial = []
for index, (block_scores, v) in enumerate(halves):
    m = block_scores.max()
    weights = np.exp(block_scores - m)
    total = weights.sum()
    o = weights @ v / total
    partial.append((m, total, o))
    print(f"block {index}: scores {block_scores}, values {v}: M = {m:.4f}, "
          f"l = sum exp(score - M) = "
          f"{total:.4f}, o = {o:.4f}, LSE = M + log l = {m + math.log(total):.4f}")
(m1, l1, o1), (m2, l2, o2) = partial
m = max(m1, m2)
total = l1 * math.exp(m1 - m) + l2 * math.exp(m2 - m)
o = (l1 * math.exp(m1 - m) * o1 + l2 * math.exp(m2 - m) * o2) / total
print(f"merged: M' = {m:.4f}, l' = {l1:.4f} exp({m1 - m:.1f}) + {l2:.4f} exp({m2 - m:.1f}) = "
      f"{total:.4f}, o' = {o:.6f}, LSE' = {m + math.log(total):.6f}")
whole_weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
whole_out, whole_lse = whole_weights @ values, float(np.logaddexp.reduce(scores))
print(f"softmax of the whole row: output {whole_out:.6f}, log sum exp {whole_lse:.6f}")
# The library's merge, on (1, 1)-shaped arrays, starting from block 0:
out_so_far = np.array([[o1]])
lse_so_far = np.array([m1 + math.log(l1)])
merge(out_so_far, lse_so_far, np.array([[o2]]), np.array([m2 + math.log(l2)]))
print(f"ring_attention.merge: output {out_so_far[0, 0]:.6f}, LSE {lse_so_far[0]:.6f}")
assert math.isclose(o, whole_out, rel_tol=1e-12) and math.isclose(m + math.log(total), whole_lse)
assert math.isclose(out_so_far[0, 0], whole_out, rel_tol=1e-12)

# %% [markdown]
# The merge is exact, not an approximation, and it does not care about the
# order of the blocks (merge block 1 first and the numbers are the same, to
# rounding). The maximum is what keeps it finite. exp(1000) overflows even
# in float64 (whose largest number is about 1.8e308; exp(1000) is about
# 2e434). Whatever the precision, exp(score - M) never exceeds 1, because no
# score of the row is above its maximum M:

# %%
large = scores + 1000.0
with np.errstate(over="ignore", invalid="ignore"):
    naive = np.exp(large) @ values / np.exp(large).sum()
stable = np.exp(large - large.max()) @ values / np.exp(large - large.max()).sum()
print(f"scores + 1000: exp without the max gives {naive}; with it {stable:.6f} (the same row "
      "shifted: softmax does not move)")
assert np.isnan(naive) and math.isclose(stable, whole_out, rel_tol=1e-9)

# %% [markdown]
# **The ring on real processes.** `ring_attention(q, k, v, T, is_causal=True)`
# on each rank's (B, H, T/n, D) pieces, its T/n positions of every head
# (`shard_sequence` cuts them with the
# zig-zag split). Forward: at each step a rank posts the send of the block
# it holds to its right neighbour and the receive of the next from its left,
# merges the block it holds into its queries' (o, LSE) while the messages
# fly, then waits. Backward: P is rebuilt from the saved LSE, block by
# block; the K, V blocks ring round again, and with each one travels its
# gradient so far (dK, dV), to which each rank adds its queries' share until
# it arrives home. The same run also calls Ulysses (section 3) on the same
# pieces; every call is a traced region:

# %%
TINY_T, TINY_H, TINY_D = 8 * WORLD, 4, 4


def tiny_inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, TINY_H, TINY_T, TINY_D)) for _ in range(4)]   # q, k, v, dO


def attention_run():
    """Ring attention and Ulysses on this rank's pieces of the tiny inputs:
    outputs and q, k, v gradients; and Ulysses' all_to_all on labelled values."""
    world, rank = dist.get_world_size(), dist.get_rank()
    found = {}
    for scheme, attend in (("ring", ring_attention), ("ulysses", ulysses_attention)):
        q, k, v, upstream = (shard_sequence(x, TINY_T, world, rank, axis=2) for x in tiny_inputs())
        q, k, v = (Tensor(x, requires_grad=True) for x in (q, k, v))
        with trace.region(f"{scheme} forward"):
            out = attend(q, k, v, TINY_T, is_causal=True)
        with trace.region(f"{scheme} backward"):
            (out * Tensor(upstream)).sum().backward()
        found[scheme] = dict(out=out.data, grads=(q.grad, k.grad, v.grad))
    # Value 100 x head + position (203: head 2, position 3): where each lands after the swap.
    labelled = 100.0 * np.arange(TINY_H)[:, None] + np.arange(TINY_T)[None, :]     # (H, T)
    mine = shard_sequence(labelled, TINY_T, world, rank, axis=1)                  # (H, T/n)
    found["swap"] = dict(before=mine, after=swap_to_heads(mine))
    return found


def swap_to_heads(mine):
    """Ulysses' sequence -> heads all_to_all, on an (H, T/n) array of this
    rank's positions: rank j gets head group j of them, and this rank gets its
    head group of every rank's positions, put back in order: (H/n, T)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    group = TINY_H // world
    lengths = [len(rank_positions(TINY_T, world, r)) for r in range(world)]
    # Rows of dim 0 go to ranks: rank j's rows are this rank's positions of heads j H/n ...
    outgoing = np.concatenate([mine[j * group:(j + 1) * group].T for j in range(world)])
    incoming = np.empty((TINY_T, group))
    dist.all_to_all_single(incoming, outgoing, output_split_sizes=lengths,
                           input_split_sizes=[lengths[rank]] * world)
    ordered = np.empty_like(incoming)     # rank i's rows are its positions: put them in place
    ordered[np.concatenate([rank_positions(TINY_T, world, r) for r in range(world)])] = incoming
    return ordered.T


attention_trace = OUT / "ring_attention.trace.jsonl"
attention_runs = minidist.launch(attention_run, world_size=WORLD, transport="shm",
                                 trace=str(attention_trace))
attention_events = trace.read_jsonl(attention_trace)
ring = ring_attention_replay(attention_events)   # the first call's forward
print(f"ring attention on {ring.world_size} ranks: a step 0 in which each rank attends to its "
      f"own block, then n - 1 = {ring.steps} {'step' if ring.steps == 1 else 'steps'} with "
      "messages; the frames of its forward:")
block_bytes = 2 * 1 * TINY_H * (TINY_T // WORLD) * TINY_D * 8
print(f"(B = 1, H = {TINY_H} heads of D = {TINY_D}, T = {TINY_T}: T/n = {TINY_T // WORLD} "
      f"positions a rank, float64, s = 8: a message is one rank's K and V, "
      f"2 B H (T/n) D s = {block_bytes:,} bytes = {block_bytes / 1024:g} KiB)")
assert all(message.nbytes == block_bytes for frame in ring.frames[1:] for message in frame.messages)
console = Console(width=88, color_system=None)
for index in range(len(ring.frames)):
    console.print(render_frame(ring, index, color=False, width=88))
for rank, (early, late) in enumerate(ring.frames[-1].holdings):
    # What the text below says: an early chunk merges the blocks of ranks 0..r, a late one all.
    assert early == frozenset(range(rank + 1)) and late == frozenset(range(WORLD))
for frame in ring.frames[1:]:
    # In the frame of step j rank r receives rank ((r - j) mod n)'s block from its left.
    for message in frame.messages:
        assert message.source == (message.target - 1) % WORLD
        assert message.text.endswith(f"of rank {(message.target - frame.index) % WORLD}")

# %% [markdown]
# Read a frame: each rank's output is two cells, its early and its late
# chunk, and a cell's symbol says which ranks' K, V blocks its running
# (o, LSE) has merged: a rank's number for its own block alone ("1": rank
# 1's), "Σk" for k ranks' blocks merged but not yet all, "A" for every
# rank's (the key under each frame names the symbols that frame draws).
# Before any message each rank has attended to its own block. In the frame
# of step j, rank r receives the block of rank (r - j) mod n from its left
# neighbour (which received it a step earlier) and merges it into the
# chunks that may see it: a late chunk sees every block, an early chunk
# only the blocks of earlier positions. The arrows are the messages, each K
# and V of one block. The cost line under the frames is the ring's
# formula, (n - 1) (α + 2 B H (T/n) D s β) per rank. The
# same frames as an animation (a player in a notebook, a GIF beside the
# lesson's outputs):

# %%
gif = save_gif(ring, OUT / "ring_attention.gif", fps=1)
if in_notebook():  # the player, inline; a script names the GIF
    display(animate(ring))  # noqa: F821 - IPython's, in a notebook
else:
    show_file(gif)

# %% [markdown]
# **Equal to attention on the whole sequence.** The whole q, k, v in one
# process, `F.scaled_dot_product_attention(..., is_causal=True)`, the same
# upstream gradient; each rank's output rows and q, k, v gradient rows
# against the whole's rows at its positions:

# %%
q, k, v, upstream = (Tensor(x, requires_grad=True) for x in tiny_inputs())
whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
(whole * Tensor(upstream.data)).sum().backward()
for scheme in ("ring", "ulysses"):
    worst = {"output": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    for rank, found in enumerate(attention_runs):
        rows_of = rank_positions(TINY_T, WORLD, rank)
        got = found[scheme]
        worst["output"] = max(worst["output"], relative_error(got["out"], whole.data[:, :, rows_of]))
        for name, grad, reference in zip(("dq", "dk", "dv"), got["grads"], (q.grad, k.grad, v.grad)):
            worst[name] = max(worst[name], relative_error(grad, reference[:, :, rows_of]))
    print(f"{scheme:>7} on {WORLD} ranks against whole attention, largest relative difference: "
          + ", ".join(f"{name} {value:.1e}" for name, value in worst.items()))
    assert max(worst.values()) < 1e-12, scheme

# %% [markdown]
# Float64 rounding, nothing more: each query's softmax was computed in
# pieces and merged, in another order than the whole row's.
#
# ## 3. Ulysses: swap the sequence for the heads
#
# Heads are independent: attention needs every position of *one* head, not
# every head of one position. DeepSpeed-Ulysses (Jacobs et al., 2023) trades
# the split: an **all_to_all** in which rank r sends head group j (H/n heads)
# of its positions to rank j. Afterwards each rank holds every position of
# its H/n heads, (B, H/n, T, D), and runs ordinary attention on them; a
# second all_to_all trades back. Watch it on values that say where they come
# from: the value at head number a (0 to H - 1) and position number i is
# 100 a + i, so 203 is head 2's position 3. The run above swapped them with
# one `all_to_all_single` (`swap_to_heads`: the exchange of
# `ulysses.sequence_to_heads`, on an (H, T/n) array: every head, the rank's
# T/n positions):

# %%
for rank, found in enumerate(attention_runs):
    print(f"rank {rank} before (rows: heads 0..{TINY_H - 1}, its positions "
          f"{rank_positions(TINY_T, WORLD, rank).tolist()}):\n{found['swap']['before'].astype(int)}")
for rank, found in enumerate(attention_runs):
    group = TINY_H // WORLD
    heads = (f"head {rank * group}" if group == 1 else
             f"heads {rank * group}..{(rank + 1) * group - 1}")
    print(f"rank {rank} after ({heads}, every position in order):\n"
          f"{found['swap']['after'].astype(int)}")
    expected = 100 * np.arange(rank * group, (rank + 1) * group)[:, None] + np.arange(TINY_T)
    assert np.array_equal(found["swap"]["after"], expected)

# %% [markdown]
# After the swap each rank holds whole rows of the sequence for its heads,
# the positions put back in order (the zig-zag pieces arrive chunk by
# chunk), and the causal mask is the ordinary one. Forward: three
# sequence -> heads all_to_alls (q, k, v) and one heads -> sequence (the
# output); backward, their transposes. Section 2's check printed the same
# agreement with whole attention for Ulysses. The catch: each rank needs a
# whole group of heads, so n must divide H (`ulysses_attention` refuses
# otherwise, and suggests ring attention, which splits no heads).
#
# ## 4. When each wins
#
# **Bytes.** Per rank and attention layer, with T/n positions a rank and
# D = Dv (the keys' and the values' head widths equal;
# `minidist/parallel/context/costs.py` has the general table):
#
# * ring: forward 2 (n - 1) B H (T/n) D s (one K, V block a step, n - 1
#   steps); backward those again plus every block's dK, dV on its way home:
#   2 (2n - 1) B H (T/n) D s;
# * Ulysses: 4 (n - 1) B H (T/n^2) D s each way (four all_to_alls, each
#   sending (n - 1)/n of a (B, H, T/n, D) array).
#
# Ring's forward bytes per rank grow from B H T D s at n = 2 towards 2 B H
# T D s, and its backward's from 3 B H T D s towards 4 B H T D s, and they
# stay there whatever n; Ulysses' fall as 1/n (each way, 4 (n - 1)/n^2 B H T
# D s: the same as the ring's forward at n = 2, half of it at n = 4, 2/n of
# it in general). A bigger layer (B = 1, H = 8 heads of D = 32, float32) on
# the lesson's ranks, each pass a traced region, against the formulas:

# %%
MEASURE_T = QUICK_MEASURE_T if QUICK else FULL_MEASURE_T
MEASURE_H, MEASURE_D = 8, 32
REPEATS = 5 if QUICK else 10


def measure_inputs():
    rng = np.random.default_rng(1)
    return [rng.standard_normal((1, MEASURE_H, MEASURE_T, MEASURE_D)).astype(np.float32)
            for _ in range(4)]


def measure_run(repeats):
    """Each scheme's forward and backward once in traced regions, then
    forward + backward timed, the schemes and whole attention on rank 0
    taking turns (the other ranks wait at the barrier meanwhile)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    whole_inputs = measure_inputs()
    pieces = [shard_sequence(x, MEASURE_T, world, rank, axis=2) for x in whole_inputs]

    def step(scheme, label=None):
        q, k, v = (Tensor(x, requires_grad=True) for x in pieces[:3])
        attend = ring_attention if scheme == "ring" else ulysses_attention
        with trace.region(f"{label or scheme} forward"):
            out = attend(q, k, v, MEASURE_T, is_causal=True)
        with trace.region(f"{label or scheme} backward"):
            (out * Tensor(pieces[3])).sum().backward()

    def whole():   # one process, the whole sequence, as without context parallelism
        dist.barrier()
        if rank == 0:
            q, k, v = (Tensor(x, requires_grad=True) for x in whole_inputs[:3])
            (F.scaled_dot_product_attention(q, k, v, is_causal=True)
             * Tensor(whole_inputs[3])).sum().backward()

    def timed_step(scheme):
        def run():
            dist.barrier()
            step(scheme, label=f"timed {scheme}")
        return run

    for scheme in ("ring", "ulysses"):
        step(scheme)
    times = timed({"ring": timed_step("ring"), "ulysses": timed_step("ulysses"),
                   "whole, one process": whole}, repeats=repeats)
    return times.best


measure_trace = OUT / "measure.trace.jsonl"
load = Load.start()
measured = minidist.launch(measure_run, world_size=WORLD, transport="shm", args=(REPEATS,),
                           trace=str(measure_trace), timeout=600)
load = load.finish()
measure_events = trace.read_jsonl(measure_trace).events
formulas = [ring_attention_bytes(1, MEASURE_H, MEASURE_T, MEASURE_D, WORLD, itemsize=4),
            ulysses_bytes(1, MEASURE_H, MEASURE_T, MEASURE_D, WORLD, itemsize=4)]
in_trace = {(scheme, part): tuple(sent(measure_events, rank, f"{scheme} {part}")
                                  for rank in range(WORLD))
            for scheme in ("ring", "ulysses") for part in ("forward", "backward")}
print(f"B = 1, H = {MEASURE_H}, T = {MEASURE_T}, D = {MEASURE_D}, float32, n = {WORLD}: "
      "bytes each rank sends")
print(format_attention_bytes(formulas, in_trace))
for formula in formulas:
    for part in ("forward", "backward"):
        assert in_trace[(formula.scheme, part)] == getattr(formula, part)
ring_total = sum(formulas[0].forward) + sum(formulas[0].backward)
ulysses_total = sum(formulas[1].forward) + sum(formulas[1].backward)
print(f"all ranks, both passes: ring {ring_total:,} bytes, Ulysses {ulysses_total:,} "
      f"({ring_total / ulysses_total:.1f}x less: ring's 2 (n - 1)/n + 2 (2n - 1)/n against "
      f"Ulysses' 2 x 4 (n - 1)/n^2, a ratio of n (3n - 2) / (4 (n - 1)), "
      f"{WORLD * (3 * WORLD - 2) / (4 * (WORLD - 1)):.1f} at n = {WORLD})")
assert ulysses_total < ring_total
assert math.isclose(ring_total / ulysses_total, WORLD * (3 * WORLD - 2) / (4 * (WORLD - 1)))

# %% [markdown]
# The trace and the formulas agree to the byte on every rank. And time, on
# this machine: forward + backward of each scheme, and of whole attention
# on one process, taking turns, the fastest of the repeats (rank 0's):

# %%
best = measured[0]
for name, seconds in best.items():
    print(f"{name:>20}: {seconds * 1e3:7.2f} ms")
print(f"(fastest of {REPEATS} interleaved repeats, one BLAS thread per process; "
      f"{load.describe()})")
busy = load.note("the bytes above are counts and hold; section 4's predictions are the model's")
if busy:
    print(busy)
shm = costmodel.PARAMS["shm"]
# Messages a rank sends: ring, n - 1 K,V blocks forward, n - 1 backward and n dK,dV;
# Ulysses, 8 all_to_alls of n - 1 messages each. Every step sends and receives: xbeta.
messages = {"ring": 3 * WORLD - 2, "ulysses": 8 * (WORLD - 1)}
comm = {formula.scheme: messages[formula.scheme] * shm.alpha
        + shm.xbeta * (formula.forward[0] + formula.backward[0]) for formula in formulas}
for scheme, seconds in comm.items():
    whose = {"ring": "ring attention's", "ulysses": "Ulysses'"}[scheme]
    print(f"the cost model's time for {whose} messages on this machine's shared memory: "
          f"{seconds * 1e3:.2f} ms, {seconds / best[scheme]:.1%} of its measured step")
    assert seconds < best[scheme] / 2   # "a small part of a measured step"

share = {scheme: seconds / best[scheme] for scheme, seconds in comm.items()}
glue("ring_comm_share", share["ring"], ".1%")
glue("ulysses_comm_share", share["ulysses"], ".1%")
against_whole = {scheme: best[scheme] / best["whole, one process"] for scheme in comm}
glue("ring_vs_whole", against_whole["ring"], ".2f")
glue("ulysses_vs_whole", against_whole["ulysses"], ".2f")
faster = [scheme for scheme, ratio in against_whole.items() if ratio < 1]
glue("split_verdict",
     "Both were faster: their ranks split the arithmetic, and the ring's blocks skip the "
     "keys the causal mask hides, where whole attention computes every score and masks "
     "them" if len(faster) == 2 else
     "Neither was faster: on ranks that share a few cores, splitting the arithmetic did "
     "not pay here" if not faster else
     f"Only {'ring attention' if faster == ['ring'] else 'Ulysses'} was faster: on ranks "
     "that share a few cores, the split pays little, and not for every scheme")
glue("machine_busy", bool(busy))
glue("cores_busy", "the machine was busy, so these times include waiting for a core"
     if busy else "the machine was not busy beside the lesson")


def score_bytes(T, n=1):
    """float32 bytes of a (B, H, T/n, T/n) array of scores: whole attention's (n = 1), or
    one ring step's block of a rank."""
    value = MEASURE_H * (T // n) ** 2 * 4
    return f"{value / 2 ** 20:g} MiB" if value >= 2 ** 20 else f"{value / 2 ** 10:g} KiB"


sizes = {form: (T, n, score_bytes(T), score_bytes(T, n)) for form, T, n in
         (("quick", QUICK_MEASURE_T, 2), ("full", FULL_MEASURE_T, 4))}
here, other = ("quick", "full") if QUICK else ("full", "quick")
glue("measure_T", MEASURE_T)
glue("measure_n", WORLD)
glue("size_note",
     "The verdict depends on the sizes, and the {} form's can differ. Here T = {:,} on {} "
     "ranks: whole attention's scores, (B, H, T, T), are {}, a rank's block of them in a ring "
     "step, (B, H, T/n, T/n), {}. The {} form measures T = {:,} on {} ranks: {} and {}. "
     "A larger T/n gives each step more arithmetic against what every step costs whatever "
     "its size (a Python call per block, a message posted and waited for, a turn on a "
     "shared core), and the messages grow only as T while the scores grow as T^2; on the "
     "small sizes splitting the arithmetic is more likely not to pay, on the larger ones "
     "more likely to.".format(other, *sizes[here], other, *sizes[other]))

# %% jupyter={"source_hidden": true}
say("""
On one machine's shared memory the messages' modelled time is a small part
of a measured step ({glue}`ring_comm_share` of the ring's,
{glue}`ulysses_comm_share` of Ulysses'): the rest is arithmetic, split over
ranks that share this machine's cores with each other and with whatever
else runs, and their waits for one another. Against whole attention on one
process, ring attention took {glue}`ring_vs_whole` times its time and
Ulysses {glue}`ulysses_vs_whole` times. {glue}`split_verdict`
({glue}`cores_busy`). {glue}`size_note` Where the link is a real network the bytes matter,
and no laptop has 64 ranks: the choice is *predicted*.
""")

# %% [markdown]
# **Beyond this machine.** A long-context layer: one sequence of 128k
# tokens, 32 heads of 128, 2-byte values, on the cluster of lesson 17's
# section 6 (`plan_inputs.CLUSTER`: 400 TFLOP/s a rank, NVLink within a
# node of 8, InfiniBand between nodes). The messages' time comes from the simulator:
# ring attention's forward messages are exactly a ring all_gather's (n - 1
# steps, each rank passing a block to its right), Ulysses' forward four
# pairwise all_to_alls. Compute is the causal attention's 2 B H T^2 D
# flops, split evenly by the zig-zag. The ring overlaps each step's message
# with that step's blocks, so a step lasts the longer of the two; Ulysses
# must wait for its all_to_alls before (and after) attending:

# %%
LONG = dict(batch=1, heads=32, seq_len=131072, head_dim=128, itemsize=2)
SIM_WORLDS = (2, 4, 8, 16, 32, 64)
machine = plan_inputs.CLUSTER
flops_rank = 2 * LONG["batch"] * LONG["heads"] * LONG["seq_len"] ** 2 * LONG["head_dim"]
predictions = []
print(f"{'n':>3} {'link':>10} {'ring MB':>8} {'Ulysses MB':>10} {'compute ms':>10} "
      f"{'ring ms':>8} {'Ulysses ms':>10}   (a rank, one layer's forward)")
for n in SIM_WORLDS:
    link = machine.link(n)
    ring_bytes = ring_attention_bytes(**{k: LONG[k] for k in ("batch", "heads", "seq_len",
                                                                "head_dim")}, world=n,
                                      itemsize=LONG["itemsize"]).forward[0]
    block = 2 * LONG["batch"] * LONG["heads"] * (LONG["seq_len"] // n) * LONG["head_dim"] \
        * LONG["itemsize"]
    gather = simulate("all_gather", "ring", world_size=n, nbytes=n * block, alpha=link.alpha,
                      beta=link.beta)
    compute = flops_rank / n / machine.flops
    step_message = gather.time / (n - 1)
    ring_time = (n - 1) * max(compute / n, step_message) + compute / n
    if LONG["heads"] % n == 0:
        ulysses_sent = ulysses_bytes(**{k: LONG[k] for k in ("batch", "heads", "seq_len",
                                                               "head_dim")}, world=n,
                                     itemsize=LONG["itemsize"]).forward[0]
        exchange = simulate("all_to_all", "pairwise", world_size=n, nbytes=block // 2,
                            alpha=link.alpha, beta=link.beta)
        ulysses_time = 4 * exchange.time + compute
        assert math.isclose(exchange.time, exchange.predicted, rel_tol=1e-6)
    else:
        ulysses_sent = ulysses_time = None
    assert math.isclose(gather.time, gather.predicted, rel_tol=1e-6)
    assert math.isclose(gather.bytes / n, ring_bytes, rel_tol=1e-9)
    predictions.append(dict(n=n, ring_bytes=ring_bytes, ulysses_bytes=ulysses_sent,
                            compute=compute, ring=ring_time, ulysses=ulysses_time,
                            message=step_message, link=machine.link_name(n)))
    print(f"{n:>3} {machine.link_name(n):>10} {ring_bytes / 1e6:>8.0f} "
          + (f"{ulysses_sent / 1e6:>10.0f}" if ulysses_sent else f"{'n > H':>10}")
          + f" {compute * 1e3:>10.2f} {ring_time * 1e3:>8.2f} "
          + (f"{ulysses_time * 1e3:>10.2f}" if ulysses_time else f"{'-':>10}"))

ring_sizes = [p["ring_bytes"] for p in predictions]
ulysses_scaled = [p["ulysses_bytes"] * p["n"] for p in predictions if p["ulysses_bytes"]]
assert max(ring_sizes) < 2 * min(ring_sizes)                 # ring: about constant
assert max(ulysses_scaled) < 2 * min(ulysses_scaled)         # Ulysses: about 1/n
by_n = {p["n"]: p for p in predictions}
intra = [p for p in predictions if p["link"] == "intra-node"]
inter = [p for p in predictions if p["link"] == "inter-node" and p["ulysses"]]
assert all(p["message"] <= p["compute"] / p["n"] for p in intra)   # hidden within a node
assert all(p["ring"] > p["ulysses"] for p in inter)                # Ulysses wins across nodes
assert all(p["ring"] < p["ulysses"] for p in intra)               # the ring wins within a node
assert by_n[64]["ulysses"] is None                                 # 32 heads cannot go to 64
assert math.isclose(machine.inter.beta, 8 * machine.intra.beta)    # "eight times slower"
# The block length above which a ring step's message hides behind its arithmetic:
# a step's blocks, 2 B H (T/n)^2 D flops at a rank's FLOP/s, against its message,
# 2 B H (T/n) D s bytes at beta a byte: equal at T/n = (FLOP/s) s beta.
print("a ring step's message hides behind its blocks' arithmetic when T/n >= (FLOP/s) s beta "
      f"({machine.flops / 1e12:.0f} TFLOP/s a rank, s = {LONG['itemsize']} bytes a value):")
hide_at = {}
for name, link in (("intra-node", machine.intra), ("inter-node", machine.inter)):
    hide_at[name] = machine.flops * LONG["itemsize"] * link.beta
    print(f"   {name}: beta = 1 / ({1 / link.beta / 1e9:.0f} GB/s), (FLOP/s) s beta = "
          f"{hide_at[name]:,.0f} positions")
for p in predictions:   # the table's verdicts are these thresholds'
    assert (p["message"] <= p["compute"] / p["n"]) == \
        (LONG["seq_len"] / p["n"] >= hide_at[p["link"]] * (1 - 1e-12))
glue("hide_intra", hide_at["intra-node"], ",.0f")
glue("hide_inter", hide_at["inter-node"], ",.0f")
largest_intra = max(p["n"] for p in intra)
smallest_inter = min(p["n"] for p in predictions if p["link"] == "inter-node")
glue("block_intra", LONG["seq_len"] // largest_intra, ",")
glue("n_intra", largest_intra)
glue("block_inter", LONG["seq_len"] // smallest_inter, ",")
glue("n_inter", smallest_inter)
glue("ulysses_share_inter", by_n[smallest_inter]["ulysses_bytes"] / by_n[smallest_inter]["ring_bytes"],
     ".3f")
glue("ulysses_share_formula", 2 / smallest_inter, ".3f")
assert math.isclose(by_n[smallest_inter]["ulysses_bytes"] / by_n[smallest_inter]["ring_bytes"],
                    2 / smallest_inter)   # Ulysses sends 2/n of the ring's bytes


def draw_choice():
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    worlds = [p["n"] for p in predictions]
    u_worlds = [p["n"] for p in predictions if p["ulysses"]]
    left.plot(worlds, [p["ring_bytes"] / 1e6 for p in predictions], "-o", color=COLOURS[0],
              label="ring attention")
    left.plot(u_worlds, [p["ulysses_bytes"] / 1e6 for p in predictions if p["ulysses"]], "-s",
              color=COLOURS[1], label="Ulysses (n must divide H = 32)")
    left.set_yscale("log")
    left.set_ylabel("MB a rank sends (forward)")
    right.plot(worlds, [p["ring"] * 1e3 for p in predictions], "-o", color=COLOURS[0],
               label="ring attention")
    right.plot(u_worlds, [p["ulysses"] * 1e3 for p in predictions if p["ulysses"]], "-s",
               color=COLOURS[1], label="Ulysses")
    right.plot(worlds, [p["compute"] * 1e3 for p in predictions], ":", color=COLOURS[3],
               label="compute alone")
    right.set_yscale("log")
    right.set_ylabel("ms, one layer's forward (predicted)")
    right.axvspan(machine.node_size * 1.3, max(worlds) * 1.1, color="0.92")
    right.text(machine.node_size * 1.5, max(p["ring"] for p in predictions) * 1e3, "across nodes",
               fontsize=8, va="top")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(worlds, [str(n) for n in worlds])
        axis.set_xlabel("context-parallel ranks n")
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=8, loc="lower left")
    left.set_title("bytes: ring about constant, Ulysses as 1/n", fontsize=10)
    right.set_title("time on lesson 17's cluster (simulated messages)", fontsize=10)
    figure.suptitle("one attention layer, T = 128k, 32 heads of 128, 2 bytes", fontsize=10)
    figure.tight_layout()
    return figure


show_figure(draw_choice(), "ring_or_ulysses.png")

# %% jupyter={"source_hidden": true}
say("""
Read the two panels together. Within a node, the ring's per-step message
is shorter than the step's arithmetic (even at n = {glue}`n_intra` a block
of T/n = {glue}`block_intra` positions is above (FLOP/s) s β =
{glue}`hide_intra`, the block at which a step's arithmetic, 2 B H (T/n)^2 D
flops, lasts as long as its message, 2 B H (T/n) D s bytes),
so its bytes cost nothing: the ring's time is the compute's, and Ulysses
pays its four all_to_alls on top. Across nodes the link is eight times
slower, the blocks are shorter (T/n = {glue}`block_inter` at n =
{glue}`n_inter`, below (FLOP/s) s β = {glue}`hide_inter`), and the ring's messages
outlast the arithmetic: each step waits for its block, while Ulysses,
sending 2/n of the ring's bytes ({glue}`ulysses_share_inter` of them at n =
{glue}`n_inter`, 2/n = {glue}`ulysses_share_formula`), wins. And past H ranks
Ulysses cannot go at all. Real systems combine them: Ulysses within a node
(up to the heads), ring attention across nodes. Megatron-LM calls it
hierarchical context parallelism, `cp_comm_type="a2a+p2p"`: all_to_all
("a2a") within the node, the ring's point-to-point messages ("p2p") between
nodes; and Fang and Zhao build the same two-level scheme in "USP: A Unified
Sequence Parallelism Approach for Long Context Generative AI" (2024; USP:
unified sequence parallelism).
""")

# %% [markdown]
#
# ## 5. The GPT with a context-parallel dimension
#
# `context_parallel_gpt(model, mesh["cp"])` makes each rank a replica of the
# GPT that holds its positions of every sequence: every weight replicated,
# the position embedding looking up the rank's positions, attention ring or
# Ulysses over the cp group through the GPT's attention hook, the loss the
# mean over every token of the batch. Each rank's gradients are its tokens'
# share; `allreduce_grads` sums them over cp and averages over dp (the dp
# ranks see other sequences). Three AdamW steps in float64 on a mesh of
# (dp, cp), against one process on the whole batches; quick form: (dp, cp) =
# (1, 2), full form: (2, 2) on 4 processes. The GPT is a small one (the
# first lines below give its sizes), on sequences of T = 22 tokens: not a
# multiple of the zig-zag's 2n chunks, so that the split is tried where the
# chunks cannot be equal (`chunk_bounds` makes them as equal as they can
# be, the first ones one position longer):

# %%
CONFIG = GPTConfig(vocab_size=32, block_size=24, n_layer=2, n_head=4, n_embd=16)
SEQ, BATCH, TRAIN_STEPS = 22, 2, 3    # 22 tokens: uneven chunks on 2 and 4 ranks
MESH = (1, 2) if QUICK else (2, 2)


def batches(step, dp_rank):
    rng = np.random.default_rng(100 + 10 * step + dp_rank)
    return (rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)),
            rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)))


def train_cp(mesh_shape):
    mesh = dist.init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "cp"))
    found = {}
    for attention in ("ring", "ulysses"):
        shard = context_parallel_gpt(GPT(CONFIG, rng=0).to(np.float64), mesh["cp"],
                                     attention=attention)
        optimizer = optim.AdamW(shard.parameters(), lr=1e-2, weight_decay=0.1)
        losses = []
        for step in range(TRAIN_STEPS):
            idx, targets = batches(step, mesh.get_local_rank("dp"))
            optimizer.zero_grad()
            loss = shard.loss(shard(shard.shard(idx), SEQ), shard.shard(targets), SEQ)
            loss.backward()
            shard.allreduce_grads(dp_group=mesh["dp"].get_group())
            optimizer.step()
            losses.append(loss.item())
        found[attention] = dict(losses=losses, dp=mesh.get_local_rank("dp"),
                                weights={n: p.data.copy() for n, p in shard.named_parameters()})
    return found


print(f"the GPT: {CONFIG.n_layer} blocks of width {CONFIG.n_embd}, {CONFIG.n_head} heads, a "
      f"vocabulary of {CONFIG.vocab_size} words; {BATCH} sequences of T = {SEQ} tokens a dp rank "
      f"a step; on cp = {MESH[1]} ranks, 2n = {2 * MESH[1]} zig-zag chunks of "
      + ", ".join(str(b - a) for a, b in zip(chunk_bounds(SEQ, 2 * MESH[1]),
                                            chunk_bounds(SEQ, 2 * MESH[1])[1:]))
      + " positions:")
for r in range(MESH[1]):
    print(f"   cp rank {r}: positions " + " + ".join(f"{a}..{b - 1}" for a, b in
                                                   rank_chunks(SEQ, MESH[1], r)))
assert SEQ % (2 * MESH[1])   # uneven chunks, as the text says
cp_runs = minidist.launch(train_cp, world_size=int(np.prod(MESH)), transport="shm",
                          args=(MESH,), timeout=600)

one = GPT(CONFIG, rng=0).to(np.float64)
one_optimizer = optim.AdamW(one.parameters(), lr=1e-2, weight_decay=0.1)
one_losses = []
for step in range(TRAIN_STEPS):
    pieces = [batches(step, dp_rank) for dp_rank in range(MESH[0])]
    idx, targets = np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])
    one_optimizer.zero_grad()
    loss = F.cross_entropy(one(idx).reshape(-1, CONFIG.vocab_size), targets.reshape(-1))
    loss.backward()
    one_optimizer.step()
    one_losses.append(loss.item())
one_weights = {name: p.data for name, p in one.named_parameters()}
print(f"one process, {MESH[0] * BATCH} sequences of {SEQ} tokens a step: losses "
      + ", ".join(f"{value:.6f}" for value in one_losses))
for attention in ("ring", "ulysses"):
    worst = max(relative_error(found[attention]["weights"][name], whole_weight)
                for found in cp_runs for name, whole_weight in one_weights.items())
    # Each dp rank's loss is its own sequences' mean; their mean is the global batch's.
    losses = np.mean([found[attention]["losses"] for found in cp_runs], axis=0)
    print(f"dp {MESH[0]} x cp {MESH[1]}, {attention:>7}: mean loss over the ranks "
          + ", ".join(f"{value:.6f}" for value in losses)
          + f"; weights against one process's: largest relative difference {worst:.1e}")
    assert worst < 1e-9 and np.allclose(losses, one_losses, rtol=1e-9), attention
    assert all(set(found[attention]["weights"]) == set(one_weights) for found in cp_runs)

# %% [markdown]
# Every rank ends with one process's weights, to float64 rounding, with
# either attention: a context-parallel replica computes exactly the model's
# gradient, each rank its tokens' share, and the sum over the cp group is
# the whole. What a rank keeps is its T/n positions' activations (section 1's
# division), at the price of section 4's messages in every attention layer.
#
# **Exercise.** Write the online softmax's merge yourself, the heart of ring
# attention, and watch it run on real processes with its replay:
#
#     minidist exercise start ring_attention_merge
#
# **Try**: `block_work(T, n, is_causal=True, layout="contiguous")` for
# larger n and watch the busy share fall; `ring_attention_replay(trace,
# phase="backward")` on the trace above for the backward's ring; section
# 4's table with `heads=8` (Ulysses stops at 8 ranks) or with a shorter
# context (the ring's messages stop hiding sooner).
