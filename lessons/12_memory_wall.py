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
# # Lesson 12: the memory wall
#
# The zhihu article "深度模型常见加速训练策略架构篇(一)---分布式训练介绍" (an
# introduction to distributed training, zhuanlan.zhihu.com) names three
# walls a training run hits: **compute**, **memory** and **communication**. Data parallelism answers the compute wall: more workers,
# more examples per second. It does nothing for memory: every worker keeps a
# whole copy of the *model states*, and, for its own batch, the *activations*
# the backward needs. The article names the problem only; this chapter measures
# it and runs the two answers of the DeepSpeed/FSDP literature:
#
# 1. the bytes one rank holds, by category, for DDP and ZeRO stages 1, 2, 3
#    with Adam, measured by the ledger next to the formula;
# 2. what sharding costs on the wire: the bytes each rank sends per step,
#    from the trace, next to the formula (stage 3: 1.5 times DDP's, in
#    ZeRO's paper);
# 3. memory per rank over one step, side by side, from the trace's memory
#    events;
# 4. recomputation: the activations kept with and without
#    `CheckpointedSequential`, and the compute it costs;
# 5. a per-rank memory cap that DDP cannot train under and stage 3 can.
#
# Library code: `minidist/memory.py` (the ledger), `minidist/parallel/data/zero.py`
# (ZeRO), `minidist/nn/recompute.py` (recomputation).

# %%
import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, memory, nn, optim, trace
from minidist.data import load_digits
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
from minidist.nn.recompute import CheckpointedSequential, kept_for_backward
from minidist.parallel.data import zero_stages
from minidist.parallel.data.costs import zero_bytes_per_step, zero_model_state_bytes

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

import matplotlib.pyplot as plt  # noqa: E402

QUICK = quick()
OUT = output_dir()
METHODS = ("DDP", "stage 1", "stage 2", "stage 3")
CATEGORIES = memory.CATEGORIES
glue("form_note",
     "This is the quick form (MINIDIST_LESSON_QUICK=1): sections 1-3 run on n = 2 ranks only "
     "(the full form also on n = 4, which shows the padding of section 1 and a second table in "
     "section 2), and section 4 times a batch of 128 examples, 30 repeats each (the full form: "
     "512 examples, 100 repeats)." if QUICK else
     "This is the full form: sections 1-3 run on n = 2 and n = 4 ranks, section 4 times a batch "
     "of 512 examples, 100 repeats each (the quick form, MINIDIST_LESSON_QUICK=1, runs n = 2 "
     "only, a batch of 128 and 30 repeats).")

# %% jupyter={"source_hidden": true}
say("""
{glue}`form_note`
""")

# %% [markdown]
# ## 1. Model states: 16 bytes per parameter, on every rank
#
# Training in fp32 with Adam keeps, per parameter, the weight (4 bytes), its
# gradient (4) and Adam's two moments (8): **16 bytes**, 16Ψ for a model of
# Ψ parameters. Under DDP every one of the n ranks holds all of it. ZeRO
# gives each rank one n-th to own:
#
# | method | shards | bytes per parameter per rank |
# |---|---|---|
# | DDP | nothing | 4 + 4 + 8 = 16 |
# | stage 1 (`ZeroRedundancyOptimizer`) | optimizer state | 4 + 4 + 8/n |
# | stage 2 (`FSDP "SHARD_GRAD_OP"`) | + gradients | 4 + (4 + 8)/n |
# | stage 3 (`FSDP "FULL_SHARD"`) | + parameters | 16/n |
#
# (ZeRO's paper, Rajbhandari, Rasley, Ruwase and He, "ZeRO: Memory
# Optimizations Toward Training Trillion Parameter Models", writes Ψ for the
# parameters, as here, and N_d for the data-parallel degree, this course's n;
# it trains in mixed precision, where the same 16 bytes split differently:
# 2 + 2 for the fp16 weights and gradients, 12 for the optimizer's fp32 copy
# of the weights and its two moments.)
#
# The experiment: the digits MLP (64 -> 256 -> 256 -> 10), Adam, a few steps
# on n processes. A `memory.Ledger` on every rank samples what exists at three
# labelled points of each step (after forward, after backward, after the
# optimizer step); every sample is also a `memory` event in the trace. The
# ledger walks the arrays, it does not use the formula: a view counts as the
# memory it keeps alive, and each byte once.

# %%
HIDDEN = 256
STEPS = 3
BATCH_PER_RANK = 32


def digits_mlp(hidden=HIDDEN, seed=0):
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, 10))


STAGE_OF = {"DDP": 0, "stage 1": 1, "stage 2": 2, "stage 3": 3}


def wrap(method, model):
    """(the module to call, the optimizer, extra buffers to track) for a method."""
    wrapped, optimizer = zero_stages.wrap(model, STAGE_OF[method], optim.Adam, algorithm="ring",
                                   lr=1e-3)
    if method == "stage 1":
        return wrapped, optimizer, [optimizer.shard.grad]   # its slice's gradient scratch
    return wrapped, optimizer, []


def train_one(method, x, y, steps, limit_bytes=None, hidden=HIDDEN):
    """Train ``steps`` steps under ``method`` with a ledger sampling three
    points of each step. Returns the samples, this method's trace events and
    the losses; or the MemoryLimitError's message if the cap was hit."""
    recorder = trace.current()
    first = len(recorder.events) if recorder is not None else 0
    model = digits_mlp(hidden)
    wrapped, optimizer, scratch = wrap(method, model)
    ledger = memory.Ledger(wrapped, optimizer, limit_bytes=limit_bytes, rank=dist.get_rank())
    for array in scratch:
        ledger.track("buffers", array)
    # Stage 3 only: a second ledger that sees the layers' gathered full weights
    # (`track_memory` counts them as buffers), to tell them apart from the
    # activations among which the first ledger finds them after forward.
    gathered = None
    if method == "stage 3":
        gathered = memory.Ledger()
        wrapped.track_memory(gathered)
    loss_fn = nn.CrossEntropyLoss()
    losses, gathered_after_forward = [], []
    try:
        for step in range(steps):
            with trace.region(f"step {step}", kind="step"):
                optimizer.zero_grad()
                loss = loss_fn(wrapped(Tensor(x)), y)
                after_forward = ledger.sample("forward", graph=loss)
                if gathered is not None:
                    gathered_after_forward.append(min(gathered.measure()["buffers"],
                                                      after_forward.bytes["activations"]))
                loss.backward()
                ledger.sample("backward")
                optimizer.step()
                ledger.sample("step")
            losses.append(float(loss.data))
    except memory.MemoryLimitError as error:
        return {"error": str(error), "losses": losses}
    events = [dict(zip(trace.FIELDS, e)) for e in recorder.events[first:]] if recorder else []
    return {"samples": [(s.label, s.bytes) for s in ledger.samples], "events": events,
            "losses": losses, "gathered": gathered_after_forward}


def all_methods(steps):
    rank = dist.get_rank()
    x, y = load_digits()[:2]
    lo = rank * BATCH_PER_RANK
    xs, ys = x[lo:lo + BATCH_PER_RANK], y[lo:lo + BATCH_PER_RANK]
    return {method: train_one(method, xs, ys, steps) for method in METHODS}


WORLDS = (2,) if QUICK else (2, 4)
runs = {}
for world in WORLDS:
    runs[world] = minidist.launch(all_methods, world_size=world, transport="shm",
                                  args=(STEPS,), trace=str(OUT / f"zero{world}.trace.jsonl"))

model_for_count = digits_mlp()
PSI = sum(p.data.size for p in model_for_count.parameters())
NUMELS = [sum(p.data.size for p in layer.parameters(recurse=False))
          for layer in model_for_count.modules() if list(layer.parameters(recurse=False))]
print(f"digits MLP 64-{HIDDEN}-{HIDDEN}-10: Ψ = {PSI:,} parameters "
      f"(layers {', '.join(f'{n:,}' for n in NUMELS)})")

# %% [markdown]
# After the optimizer step (the moment the model states are all there:
# weights, gradients, Adam's moments), rank 0's bytes by category, in bytes
# per parameter, next to the formula:

# %%
MODEL_STATES = ("parameters", "gradients", "optimizer_state")


def after_step(result):
    label, held = result["samples"][-1]
    assert label == "step"
    return held


for world in WORLDS:
    print(f"\nn = {world} ranks, rank 0, after the step (bytes; per parameter in brackets)")
    print(f"{'method':8} {'weights':>16} {'gradients':>16} {'Adam m, v':>16} {'buffers':>14}"
          f" {'model states':>14} {'formula':>14}")
    for stage, method in enumerate(METHODS):
        held = after_step(runs[world][0][method])
        states = sum(held[c] for c in MODEL_STATES)
        formula = zero_model_state_bytes(PSI, world, stage)
        cells = " ".join(f"{held[c]:>9,} ({held[c] / PSI:4.1f})" for c in MODEL_STATES)
        print(f"{method:8} {cells} {held['buffers']:>14,} {states:>7,} ({states / PSI:4.1f})"
              f" {formula:>7,.0f} ({formula / PSI:4.1f})")
        # The measure next to the formula: equal but for the padding (at most
        # n - 1 elements of 16 bytes per flat buffer).
        assert formula <= states <= formula + 16 * len(NUMELS) * (world - 1)
padding = {world: max(sum(after_step(runs[world][0][m])[c] for c in MODEL_STATES)
                      - zero_model_state_bytes(PSI, world, stage)
                      for stage, m in enumerate(METHODS)) for world in WORLDS}
uneven = {world: [f"{n:,}" for n in NUMELS if n % world]
          + ([f"{PSI:,} (stage 1's one buffer of all of them)"] if PSI % world else [])
          for world in WORLDS}
if not any(padding.values()):
    glue("padding_note",
         f"In this run every model-state cell equals the formula: each layer's "
         f"{', '.join(f'{n:,}' for n in NUMELS)} elements split evenly in n = "
         f"{' and '.join(str(w) for w in WORLDS)}, so no buffer needs padding (the full form's "
         "n = 4 table shows some).")
else:
    shown = [w for w in WORLDS if padding[w]]
    glue("padding_note",
         "The extras above the formula are padding: every flat buffer is padded to a multiple "
         "of n (at most n - 1 elements per buffer); at n = "
         + " and ".join(f"{w} the buffers of {' and '.join(uneven[w])} elements do not "
                        f"split evenly: up to {padding[w]:,.0f} bytes more" for w in shown)
         + (f", while at n = {', '.join(str(w) for w in WORLDS if not padding[w])} every layer "
            "splits evenly and every cell equals the formula" if len(shown) < len(WORLDS) else "")
         + ".")

# %% [markdown]
# Read the columns: stage 1 leaves weights and gradients alone and divides
# Adam's 8 bytes by n; stage 2 also keeps only its slice of the gradient
# (each layer's full gradient lives from its backward to its reduce_scatter);
# stage 3 keeps only its slice of everything: 16/n. The table is measured,
# not formula: DDP's and stage 1's gradients are views into DDP's buckets,
# and stage 1 keeps a scratch gradient of its slice (the *buffers* column,
# left out of "model states").

# %% jupyter={"source_hidden": true}
say("""
{glue}`padding_note`
""")

# %% [markdown]
# ## 2. The price: bytes on the wire
#
# Sharding is not free. Each rank must receive what it no longer keeps:
# stage 2 reduce_scatters the gradients (each rank gets the sum of its slice)
# and all_gathers the updated weights; stage 3 gathers every layer's weights
# twice, before its forward and again before its backward. Bytes rank 0 sent
# per step, counted in the trace's `send` events (ring algorithms), next to
# `zero_bytes_per_step`:


# %%
def sent_per_step(events, rank, collective, steps):
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and e["label"].startswith(collective + " ")
               and trace.label_info(e["label"]).get("call") is not None) / steps


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
volume = {}
for world in WORLDS:
    print(f"\nn = {world}: bytes rank 0 sends per step (measured / formula)")
    print(f"{'method':8} " + " ".join(f"{c:>24}" for c in COLLECTIVES) + f" {'total':>10}"
          f" {'x DDP':>6}")
    ddp_total = None
    for stage, method in enumerate(METHODS):
        events = [e for r in runs[world] for e in r[method]["events"]]
        formula = zero_bytes_per_step(PSI if stage < 2 else NUMELS, world, stage)
        measured = {c: sent_per_step(events, 0, c, STEPS) for c in COLLECTIVES}
        total = sum(measured.values())
        ddp_total = ddp_total or total
        volume[(world, method)] = total
        print(f"{method:8} " + " ".join(f"{measured[c]:>11,.0f} / {formula[c]:>10,}"
                                        for c in COLLECTIVES)
              + f" {total:>10,.0f} {total / ddp_total:>6.2f}")

world = WORLDS[-1]
glue("world", world)
# The FSDP rows' only all_reduce is the example count (one int64) each step
# sums; DDP's all_reduce carries it too, beside the gradient bucket.
count_bytes = {}
for w in WORLDS:
    events = [e for r in runs[w] for e in r["stage 2"]["events"]]
    count_bytes[w] = sent_per_step(events, 0, "all_reduce", STEPS)
    algorithms = {e["label"].split()[1].rstrip(":") for e in events
                  if e["rank"] == 0 and e["kind"] == "send" and e["label"].startswith("all_reduce ")}
    ddp_events = [e for r in runs[w] for e in r["DDP"]["events"]]
    ddp_ar = sent_per_step(ddp_events, 0, "all_reduce", STEPS)
    ddp_formula = zero_bytes_per_step(PSI, w, 0)["all_reduce"]
    unpadded = 2 * (w - 1) * PSI * 4 / w
    print(f"n = {w}: the example count's all_reduce ({', '.join(sorted(map(str, algorithms)))}) "
          f"sends {count_bytes[w]:,.0f} bytes a step; DDP's all_reduce {ddp_ar:,.0f} = the count "
          f"{count_bytes[w]:,.0f} + the gradients {ddp_ar - count_bytes[w]:,.0f}"
          f" (2 (n-1)/n of the unpadded 4Ψ: {unpadded:,.0f}; the formula pads 4Ψ to a multiple "
          f"of n: {ddp_formula:,})")
glue("count_note", "; ".join(f"at n = {w}, {count_bytes[w]:,.0f} bytes" for w in WORLDS))
glue("count_algorithm", ", ".join(sorted(map(str, algorithms))))
ddp_events = [e for r in runs[world] for e in r["DDP"]["events"]]
glue("ddp_extra", sent_per_step(ddp_events, 0, "all_reduce", STEPS)
     - zero_bytes_per_step(PSI, world, 0)["all_reduce"], ",.0f")
glue("ddp_pad", zero_bytes_per_step(PSI, world, 0)["all_reduce"] - 2 * (world - 1) * PSI * 4 / world,
     ",.0f")
glue("stage1_volume", volume[(world, "stage 1")] / volume[(world, "DDP")], ".2f")
glue("stage2_volume", volume[(world, "stage 2")] / volume[(world, "DDP")], ".2f")
glue("stage3_volume", volume[(world, "stage 3")] / volume[(world, "DDP")], ".2f")

# %% jupyter={"source_hidden": true}
say("""
Stage 1 and stage 2 move what DDP moves in theory (an all_reduce *is* a
reduce_scatter followed by an all_gather): stage 2 sends {glue}`stage2_volume`
times DDP's bytes at n = {glue}`world`. Stage 1 here sits beside DDP's full
all_reduce, as torch's `ZeroRedundancyOptimizer` does, so it adds an
all_gather: {glue}`stage1_volume` times. Stage 3 gathers the weights twice:
**{glue}`stage3_volume` times DDP's volume** (ZeRO's paper: 1.5, 3Ψ values
against 2Ψ), the price of 16/n bytes per parameter.

The all_reduce column of the FSDP rows is the example count (one 8-byte
integer) each step sums, which the formula leaves out: the automatic choice of
algorithm sends so small a message by `{glue}`count_algorithm``, the whole
array straight to each of the n - 1 others, (n - 1) × 8 bytes
({glue}`count_note`), where a ring's many steps would cost more latency than
its bytes save. DDP and stage 1 sum it too, beside the gradients; and
their ring all_reduce does not pad the gradient bucket, which the formula
does ({glue}`ddp_pad` bytes at n = {glue}`world`). Together: DDP's
all_reduce is {glue}`ddp_extra` bytes above its formula at n = {glue}`world`,
as the lines under the table itemize.
""")

# %% [markdown]
# ## 3. Memory over one step, per rank
#
# The ledger's samples are `memory` events in the trace; `memory_timeline`
# reads them back per rank. The last step of each method, on every rank, at
# the three labelled points; a rank's peak below is the largest of its three
# samples. `optimizer.zero_grad()` here drops the gradients (`set_to_none`,
# torch's default), so after forward no bar holds any: they appear in
# backward. (`minidist demo memory` zeroes them in place instead,
# `set_to_none=False`, so its samples after forward hold the gradients and the
# activations together, and its peaks are higher by the gradients' bytes.)

# %%
LABELS = ("forward", "backward", "step")
COLOURS = {"parameters": "tab:blue", "gradients": "tab:orange", "optimizer_state": "tab:green",
           "buffers": "tab:purple", "activations": "tab:red", "gathered weights": "tab:pink"}


def last_step(events, rank):
    """The last three memory samples of ``rank``: forward, backward, step."""
    return [held for _, held in memory.memory_timeline(events)[rank][-len(LABELS):]]


figure, axes = plt.subplots(1, len(METHODS), figsize=(3.2 * len(METHODS), 3.4), sharey=True)
top = 0
for axis, method in zip(axes, METHODS):
    events = [e for r in runs[world] for e in r[method]["events"]]
    width = 0.8 / world
    for rank in range(world):
        bottom = np.zeros(len(LABELS))
        held = last_step(events, rank)
        where = np.arange(len(LABELS)) + (rank - (world - 1) / 2) * width
        for category in CATEGORIES:
            values = np.array([h[category] for h in held]) / 1e6
            if category == "activations" and method == "stage 3":
                # the gathered weights among the activations, drawn apart
                gathered = np.array([runs[world][rank][method]["gathered"][-1]
                                     if label == "forward" else 0 for label in LABELS]) / 1e6
                axis.bar(where, gathered, width * 0.9, bottom=bottom,
                         color=COLOURS["gathered weights"],
                         label="gathered weights" if rank == 0 else None)
                bottom += gathered
                values = values - gathered
            axis.bar(where, values, width * 0.9, bottom=bottom, color=COLOURS[category],
                     label=category if rank == 0 else None)
            bottom += values
        top = max(top, bottom.max())
    axis.set_xticks(range(len(LABELS)), [f"after\n{label}" for label in LABELS])
    axis.set_title(f"{method} ({world} ranks)")
axes[0].set_ylabel("MB held per rank")
axes[-1].legend(fontsize=7, loc="upper right")
figure.suptitle(f"one step of the digits MLP with Adam: bars = ranks 0..{world - 1}")
figure.tight_layout()
show_figure(figure, "memory_per_rank.png", dpi=90)

peaks = {}
for method in METHODS:
    events = [e for r in runs[world] for e in r[method]["events"]]
    peaks[method] = [max(sum(h.values()) for h in last_step(events, rank))
                     for rank in range(world)]
    print(f"{method:8} peak per rank over the step: "
          + ", ".join(f"rank {r} {p / 1e6:.2f} MB" for r, p in enumerate(peaks[method])))
# Stage 3's peak, on rank 0: the sample after forward, when the gathered weights are alive.
held = last_step([e for r in runs[world] for e in r["stage 3"]["events"]], 0)
at_peak = max(range(len(LABELS)), key=lambda i: sum(held[i].values()))
gathered = runs[world][0]["stage 3"]["gathered"][-1] if LABELS[at_peak] == "forward" else 0
print(f"stage 3, rank 0, after {LABELS[at_peak]}: activations {held[at_peak]['activations']:,} "
      f"bytes, of which the layers' gathered weights {gathered:,}")
spread = max(max(p) - min(p) for p in peaks.values())
glue("ranks_spread", spread)
glue("ranks_verdict", "Every rank holds the same amount: ZeRO divides evenly." if spread == 0
     else f"The ranks' peaks differ by up to {spread:,} bytes: ZeRO divides the model states "
          "evenly, not everything else each rank holds.")
peak2, peak3 = peaks["stage 2"][0], peaks["stage 3"][0]
glue("peak2", peak2 / 1e6, "{:.2f} MB")
glue("peak3", peak3 / 1e6, "{:.2f} MB")
glue("peak3_vs_2", "above" if peak3 > peak2 else "not above")
glue("peak3_label", LABELS[at_peak])
glue("gathered3", gathered / 1e6, "{:.2f} MB")
glue("activations3", held[at_peak]["activations"] / 1e6, "{:.2f} MB")
glue("peak3_without", (peak3 - gathered) / 1e6, "{:.2f} MB")
glue("without_vs_2", "below" if peak3 - gathered < peak2 else "still not below")

# %% jupyter={"source_hidden": true}
say("""
{glue}`ranks_verdict` The red part, the activations, is what the batch costs, and no stage shards
it: each rank keeps the activations of its own examples.

Stage 3 shards the most, yet its peak per rank ({glue}`peak3`) is
{glue}`peak3_vs_2` stage 2's ({glue}`peak2`). Its peak comes after
{glue}`peak3_label`, and of the {glue}`activations3` the ledger counts as
activations there, {glue}`gathered3` are the layers' gathered weights (pink in
the picture, a category of their own): minidist's `Linear`
keeps its weight array in the backward closure, so each layer's full
weights stay alive from its forward to its backward, and stage 3 refills
that same array before the layer's backward (real FSDP frees it after
forward and allocates again). Without them stage 3's peak would be
{glue}`peak3_without`, {glue}`without_vs_2` stage 2's. `minidist demo memory`
says the same of its smaller MLP.
""")

# %% [markdown]
#
# ## 4. Recomputation: fewer activations, more compute
#
# For activations the answer is recomputation (gradient checkpointing): run
# segments of the network without recording, keep only each segment's input,
# and run the segment's forward again in backward.
# `CheckpointedSequential(model, every=k)` cuts the Sequential's modules (a
# `Linear` and a `ReLU` are two) into runs of k in a row and recomputes every
# run but the last; below, "every=2" and "every=4" are k = 2 and k = 4. A deeper MLP on one
# process, the activations the ledger counts after forward (and
# `kept_for_backward`, which counts the arrays the graph keeps outside the
# parameters), and the time of one forward + backward:

# %%
DEPTH, WIDTH, BATCH = 8, 256, 128 if QUICK else 512
REPEATS = 30 if QUICK else 100


def deep_mlp():
    nn.init.manual_seed(0)
    layers = [nn.Linear(64, WIDTH), nn.ReLU()]
    for _ in range(DEPTH - 2):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


x_all, y_all = load_digits()[:2]
xb, yb = np.resize(x_all, (BATCH, 64)).astype(np.float32), np.resize(y_all, BATCH)


def activations_and_step(model):
    """The activations the ledger counts after forward, what the graph keeps,
    the gradients, and a function doing one forward + backward."""
    ledger = memory.Ledger(model)
    loss = nn.CrossEntropyLoss()(model(Tensor(xb)), yb)
    activations = ledger.sample("forward", graph=loss).bytes["activations"]
    kept = kept_for_backward(loss, exclude=list(model.parameters()))[1]

    def step():
        model.zero_grad()
        nn.CrossEntropyLoss()(model(Tensor(xb)), yb).backward()

    step()
    grads = [p.grad.copy() for p in model.parameters()]
    return activations, kept, grads, step


plain = deep_mlp()
recompute_rows = {"plain": activations_and_step(plain)}
for every in (2, 4):
    recompute_rows[f"every={every}"] = activations_and_step(
        CheckpointedSequential(deep_mlp(), every=every))
# The three take turns, repeat after repeat, on one BLAS thread, and each
# keeps its fastest repeat.
step_times = timed({name: row[3] for name, row in recompute_rows.items()}, repeats=REPEATS)
base = recompute_rows["plain"]
print(f"{DEPTH} Linear layers ({len(plain)} modules), width {WIDTH}, batch {BATCH}")
print(f"{'model':12} {'activations (ledger)':>21} {'kept_for_backward':>18} {'step ms':>8}"
      f" {'x time':>7}")
for name, (activations, kept, grads, _) in recompute_rows.items():
    same = all(np.array_equal(a, b) for a, b in zip(grads, base[2]))
    seconds = step_times.best[name]
    print(f"{name:12} {activations:>21,} {kept:>18,} {seconds * 1e3:>8.2f}"
          f" {seconds / step_times.best['plain']:>7.2f}  "
          f"{'same gradients' if same else 'GRADIENTS DIFFER'}")
    assert same
print(f"(fastest of {REPEATS} interleaved repeats, one BLAS thread; {step_times.load.describe()})")


def matmul_flops(modules):
    """Forward multiply-adds of the Linear layers among ``modules``, for the batch."""
    return sum(2 * BATCH * m.weight.data.size for m in modules if isinstance(m, nn.Linear))


modules = list(plain)
forward_flops = matmul_flops(modules)
expected = {"plain": 1.0}
for every in (2, 4):
    runs_of = [modules[i:i + every] for i in range(0, len(modules), every)]
    recomputed = matmul_flops([m for run in runs_of[:-1] for m in run])
    # backward is about two forwards: one step about three; the replay adds its share
    expected[f"every={every}"] = 1 + recomputed / (3 * forward_flops)
    print(f"every={every}: {len(runs_of)} runs, the first {len(runs_of) - 1} recomputed, "
          f"{recomputed / forward_flops:.0%} of the forward's multiply-adds: "
          f"the FLOP count says {expected[f'every={every}']:.2f} times plain")
busy = step_times.load.note("the FLOP count gives the ratios just above")
if busy:
    print(busy)
plain_bytes = recompute_rows["plain"][0]
times_of = {name: step_times.best[name] / step_times.best["plain"] for name in recompute_rows}
glue("kept_every2", recompute_rows["every=2"][0] / plain_bytes, ".0%")
glue("kept_every4", recompute_rows["every=4"][0] / plain_bytes, ".0%")
glue("time_every2", times_of["every=2"], ".2f")
glue("time_every4", times_of["every=4"], ".2f")
glue("flops_every2", expected["every=2"], ".2f")
glue("flops_every4", expected["every=4"], ".2f")
# Near: within 10 % of the FLOP count's ratio, for both.
deviation = {name: times_of[name] / expected[name] - 1 for name in ("every=2", "every=4")}
within = all(abs(d) <= 0.10 for d in deviation.values())
above = all(d > 0.10 for d in deviation.values())
glue("flops_verdict",
     "near what the FLOPs say (within 10 %)" if within else
     "not what the FLOPs say, and the machine was busy "
     f"({step_times.load.describe()}): with more processes than cores, even the fastest of "
     "the repeats can be a lucky or an unlucky one, for one row more than another, so these "
     "times do not decide; run the lesson on a quiet machine" if step_times.load.busy else
     "above what the FLOPs say: the replay also repeats the Python work of every operation "
     "(building the graph) and each recomputed run's bookkeeping (its state saved and "
     "restored), which a FLOP count does not see, and every=2 has more runs than every=4"
     if above else
     "not what the FLOPs say, on a quiet machine: one row is off by more than 10 %; run again")

# %% jupyter={"source_hidden": true}
say("""
Recomputing in segments keeps about one input per segment plus, in backward,
one segment at a time: fewer bytes as the segments shrink in number (here
every=2 keeps {glue}`kept_every2` of the plain model's activations, every=4
{glue}`kept_every4`), for about one more forward of the recomputed runs: a
forward is about a third of a step, and each recomputes all its runs but the
last (the lines under the table: how much of the forward that is), so the FLOP count gives
{glue}`flops_every2` times the plain step for every=2 and {glue}`flops_every4`
for every=4. The three models take turns, repeat after repeat, on one BLAS
thread, and each keeps its fastest repeat, so that a slow moment of the
machine falls on all three alike, on average. In this run every=2 cost
{glue}`time_every2` times the plain step and every=4 {glue}`time_every4`,
{glue}`flops_verdict`. The gradients are the same bits: the replay does the
same operations on the same data.
""")

# %% [markdown]
#
# ## 5. A model that does not fit under DDP
#
# The ledger's `limit_bytes` is a per-rank memory cap: a sample over it
# raises `MemoryLimitError`. A wider digits MLP (64 -> 512 -> 512 -> 10)
# under a cap between what stage 3 needs and what DDP needs, on 2 ranks:

# %%
BIG = 512
big_psi = sum(p.data.size for p in digits_mlp(BIG).parameters())
CAP = int(14 * big_psi)     # DDP needs 16 bytes per parameter, stage 3 on 2 ranks 8 + activations


def capped(method, steps):
    rank = dist.get_rank()
    x, y = load_digits()[:2]
    lo = rank * BATCH_PER_RANK
    return train_one(method, x[lo:lo + BATCH_PER_RANK], y[lo:lo + BATCH_PER_RANK], steps,
                     limit_bytes=CAP, hidden=BIG)


print(f"64-{BIG}-{BIG}-10: {big_psi:,} parameters; cap {CAP:,} bytes per rank "
      f"({CAP / big_psi:.0f} bytes per parameter)")
for method in ("DDP", "stage 3"):
    results = minidist.launch(capped, world_size=2, transport="shm", args=(method, STEPS))
    if "error" in results[0]:
        print(f"\n{method}: MemoryLimitError after {len(results[0]['losses'])} steps:\n"
              f"  {results[0]['error']}")
    else:
        peak = max(sum(held.values()) for _, held in results[0]["samples"])
        print(f"\n{method}: trained {STEPS} steps under the cap, peak {peak:,} bytes "
              f"({peak / CAP:.0%} of the cap); losses "
              + ", ".join(f"{v:.3f}" for v in results[0]["losses"]))
    assert ("error" in results[0]) == (method == "DDP")
    if method == "DDP":   # what the text below says: at the first step, after the update
        assert not results[0]["losses"] and "at 'step'" in results[0]["error"]

# %% [markdown]
# DDP fails at the first optimizer step, when Adam allocates its two moments:
# the message names the rank, where, every category and what to do. Stage 3
# keeps a half of every model state on each of the 2 ranks and trains under
# the same cap; with n ranks the model states shrink as 16/n, and what is
# left is the activations, for which section 4 is the answer.
#
# **Try**: run with more ranks (`WORLDS`, the tuple of world sizes set after
# `all_methods` in section 1's code cell: `(2,)` quick, `(2, 4)` full) and
# watch stage 3's bar shrink as 1/n while DDP's stays; lower `CAP` (the cap in
# bytes, set at the top of section 5's code cell: 14 bytes per parameter)
# until stage 3 fails too, and find, from the error message, which category to
# attack next.
