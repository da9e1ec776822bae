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
# # Lesson 10: model parallel, rows against columns, and the hybrid
#
# Data parallelism gives every worker the whole model and a slice of the
# batch. Model parallelism does the opposite: every worker gets the **whole
# batch** and a **slice of the model**. The course's example (Tim Dettmers,
# "Model Parallelism in Deep Learning", 2014): on 4 workers, a
# 1000 x 1000 weight matrix becomes four 1000 x 250 blocks. Each worker now
# holds a quarter of the weights, so a layer too big for one memory fits on
# four, but after every matrix product the workers must put their partial
# results together, forward and backward.
#
# This chapter:
#
# 1. splits the 1000 x 1000 matrix into four blocks by columns and by rows,
#    on 4 real processes, and checks both against the unsplit layer;
# 2. runs Dettmers' 1000 x 500 layer at batch 128 on 2 processes and prints
#    the shapes of every product: the row split *adds* partial results, the
#    column split *stacks* pieces, and in backward the two swap;
# 3. counts the bytes: data parallel sends the 500,000-value weight
#    gradient, a split sends 128,000 or 160,000 activations; the formula
#    (`split_bytes`) next to the trace of the run, and where the batch size
#    makes data parallel the cheaper one;
# 4. pairs a column split with a row split (Megatron-LM's MLP block): one
#    all_reduce per pass, and the digits MLP trained split;
# 5. DistBelief's version: every layer's units partitioned, activations
#    exchanged with all_to_all;
# 6. Krizhevsky's hybrid on the digits CNN: convolutions data parallel,
#    dense layers model parallel, with bytes and step times of the three
#    strategies at two batch sizes.
#
# The library code: `minidist/parallel/tensor/layers.py` (the split
# layers), `minidist/parallel/model/costs.py` (the formula),
# `minidist/parallel/model/distbelief.py` and `hybrid.py`.

# %%
import time

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
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
from minidist.lesson_timing import Load
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.model.costs import STRATEGIES, format_table, split_bytes
from minidist.parallel.model.distbelief import DistBeliefMLP, distbelief_bytes
from minidist.parallel.model.hybrid import (
    STRATEGY_NAMES,
    DenseModelParallel,
    HybridParallel,
    all_gather_batch,
    format_strategy_table,
    strategy_bytes,
)
from minidist.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from minidist.runtime.blas_threads import set_blas_threads
from minidist.train import build_model, evaluate

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
# One BLAS thread in this process, as each of its 2 workers has: on a busy
# machine a product split over two threads waits for the one without a core.
set_blas_threads(1)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

QUICK = quick()
OUT = output_dir()
#: matplotlib's tableau-colorblind10: the colour of rank r; hatches tell them apart too.
COLOURS = ("#006BA4", "#FF800E", "#ABABAB", "#595959")
HATCHES = ("", "//", "..", "xx")


def sent_in_region(events, rank, label):
    """Bytes of the send events of ``rank`` inside its region ``label`` (every
    message a collective sends is a send event in the trace)."""
    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and start <= e["start"] and e["end"] <= end)


def calls_in_region(events, rank, label):
    """The collective calls (their names, in order) ``rank`` made inside ``label``."""
    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    return [trace.label_info(e["label"])["collective"] for e in sorted(
        (e for e in events if e["rank"] == rank and e["kind"] == "collective"
         and start <= e["start"] and e["end"] <= end), key=lambda e: e["start"])]


def relative_error(actual, wanted):
    return float(np.abs(actual - wanted).max() / np.abs(wanted).max())


# %% [markdown]
# ## 1. Dettmers' picture: a 1000 x 1000 matrix on 4 workers
#
# Write a dense layer as Y = X A, with X the batch (B x in) and A the weight
# (in x out), as Dettmers and Megatron-LM do. (minidist's `nn.Linear`, like
# PyTorch's, stores W = A transposed, out x in; this lesson's shapes are A's,
# and its tables write the weight's gradient dA, in x out like A.)
# Here the layer is 1000 x 1000 and the batch B = 128 examples, so X is
# 128 x 1000. Two ways to cut A into 4:
#
# * **by columns**: worker r holds the columns 250 r .. 250 r + 249, a
#   1000 x 250 block, and the whole X. X A_r is its own 250 columns of Y;
#   nothing to add, the four pieces are **stacked** side by side:
#   Y = [X A_0 | X A_1 | X A_2 | X A_3].
# * **by rows**: worker r holds the rows 250 r .. 250 r + 249 (250 x 1000)
#   and needs only the matching 250 columns X_r of the input. X_r A_r is a
#   full-sized 128 x 1000 *partial* result; Y is their **sum**:
#   Y = X_0 A_0 + X_1 A_1 + X_2 A_2 + X_3 A_3.
#
# `ColumnParallelLinear.from_linear(layer)` and `RowParallelLinear.from_linear(layer)`
# keep this process's block of an existing layer. With `gather_output=True`
# the column layer stacks the pieces (an all_gather); with
# `input_is_parallel=False` the row layer takes its slice of a whole input
# and adds the partial results (an all_reduce). Four real processes, each
# with its block; the outputs, the input's gradient and the weight's
# gradient against the unsplit layer in one process:

# %%
SQUARE, SQUARE_BATCH = 1000, 128


def square_layer():
    return nn.Linear(SQUARE, SQUARE, rng=0)


def square_data():
    rng = np.random.default_rng(1)
    return (rng.normal(size=(SQUARE_BATCH, SQUARE)).astype(np.float32),
            rng.normal(size=(SQUARE_BATCH, SQUARE)).astype(np.float32))


def split_and_check():
    """Both splits of the same layer, forward and backward, on this rank."""
    full = square_layer()
    x, upstream = square_data()
    found = {}
    for name, layer in (("column", ColumnParallelLinear.from_linear(full, gather_output=True)),
                        ("row", RowParallelLinear.from_linear(full, input_is_parallel=False))):
        inputs = Tensor(x, requires_grad=True)
        y = layer(inputs)
        (y * Tensor(upstream)).sum().backward()  # a loss whose dY is `upstream`
        found[name] = dict(block=layer.weight.data.T.shape, shard=(layer.shard.start,
                                                                    layer.shard.stop),
                           y=y.data, x_grad=inputs.grad, w_grad=layer.weight.grad)
    return found


per_rank = minidist.launch(split_and_check, world_size=4, transport="shm")

reference = square_layer()
x, upstream = square_data()
inputs = Tensor(x, requires_grad=True)
(reference(inputs) * Tensor(upstream)).sum().backward()
whole_y = reference(Tensor(x)).data
for name, axis, what in (("column", 0, "columns"), ("row", 1, "rows")):
    blocks = [r[name]["block"] for r in per_rank]
    # Put the four weight gradients back together: the column blocks are rows
    # of W (axis 0), the row blocks its columns (axis 1).
    w_grad = np.concatenate([r[name]["w_grad"] for r in per_rank], axis=axis)
    shards = ", ".join(f"{start}:{stop}" for start, stop in (r[name]["shard"] for r in per_rank))
    print(f"{name} split: ranks 0-3 hold A's {what} {shards}, blocks "
          f"{' '.join(f'{a}x{b}' for a, b in blocks)}")
    print(f"   largest relative difference from the unsplit layer: "
          f"Y {max(relative_error(r[name]['y'], whole_y) for r in per_rank):.1e}, "
          f"dX {max(relative_error(r[name]['x_grad'], inputs.grad) for r in per_rank):.1e}, "
          f"dW {relative_error(w_grad, reference.weight.grad):.1e}")
    assert relative_error(w_grad, reference.weight.grad) < 1e-4

# %% [markdown]
# The column split's blocks are Dettmers' 1000 x 250; the row split's are
# 250 x 1000. Every rank ends with the whole Y and the whole dX, equal to the
# unsplit layer's up to float32 rounding (the sums are taken in another
# order), and the four weight gradients put back together are the unsplit
# weight gradient (the column split's 1000 x 250 blocks side by side, the row
# split's 250 x 1000 blocks one above the other): each worker computed the gradient of its own block, and
# never needs anyone else's. That is the first difference from data
# parallelism: there is **no gradient to all-reduce**.
#
# The picture of the two splits:

# %%
def draw_split():
    figure, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for axis, name in zip(axes, ("column", "row")):
        for rank in range(4):
            if name == "column":
                box = Rectangle((250 * rank, 0), 250, 1000)
                centre = (250 * rank + 125, 500)
            else:  # row indices grow downwards, as in a printed matrix
                box = Rectangle((0, 250 * rank), 1000, 250)
                centre = (500, 250 * rank + 125)
            box.set(facecolor=COLOURS[rank], hatch=HATCHES[rank], edgecolor="black", alpha=0.85)
            axis.add_patch(box)
            size = "1000\nx 250" if name == "column" else "250 x 1000"
            axis.text(*centre, f"rank {rank}\n{size}",
                      ha="center", va="center", fontsize=9,
                      bbox=dict(facecolor="white", edgecolor="none", alpha=0.8))
        axis.set_xlim(0, 1000)
        axis.set_ylim(1000, 0)
        axis.set_aspect("equal")
        axis.set_xlabel("out (columns of A)")
        axis.set_ylabel("in (rows of A)")
        axis.set_title("by columns: Y = [X A_0 | ... | X A_3]\npieces stacked" if name == "column"
                       else "by rows: Y = X_0 A_0 + ... + X_3 A_3\npartial sums added",
                       fontsize=10)
    figure.suptitle("a 1000 x 1000 weight matrix A on 4 workers (Y = X A)")
    figure.tight_layout()
    return figure


show_figure(draw_split(), "model_parallel_split.png")

# %% [markdown]
# ## 2. Dettmers' layer, 1000 x 500 at batch 128: what one pass adds, the other stacks
#
# Backward needs the gradient of the layer's input, dX = dY A^T, to carry on
# into the layers below. With A split, this product is split too, and the
# roles swap:
#
# * the **row** split's forward adds (every worker's X_r A_r is a whole
#   128 x 500), but its backward dX_r = dY A_r^T is worker r's own 500
#   columns of dX: **stacked**;
# * the **column** split's forward stacks, but its backward
#   dY_r A_r^T is a whole 128 x 1000 *partial* dX: **added**.
#
# Two processes run both splits of Dettmers' layer (in = 1000, out = 500,
# batch 128). Each prints the shapes of its own products, read from the
# tensors it computed:

# %%
LAYER_IN, LAYER_OUT, LAYER_BATCH = 1000, 500, 128
#: Batch sizes at which the bytes are measured (section 3's picture).
BYTES_BATCHES = (32, 128, 512)


def seed_layer():
    return nn.Linear(LAYER_IN, LAYER_OUT, bias=False, rng=0)


def seed_data(batch):
    rng = np.random.default_rng(batch)
    return (rng.normal(size=(batch, LAYER_IN)).astype(np.float32),
            rng.normal(size=(batch, LAYER_OUT)).astype(np.float32))


def run_seed_layer(batches):
    """One forward and backward per strategy and batch, each pass a traced
    region; returns rank 0's shapes at batch 128."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full = seed_layer()
    layers = {"column": ColumnParallelLinear.from_linear(full, gather_output=True),
              "row": RowParallelLinear.from_linear(full, input_is_parallel=False),
              "column_split_output": ColumnParallelLinear.from_linear(full),
              "row_split_input": RowParallelLinear.from_linear(full)}
    shapes = {}

    def own(array):  # this rank's columns of a (batch, features) array
        width = array.shape[-1] // world
        return np.ascontiguousarray(array[:, rank * width:(rank + 1) * width])

    for batch in batches:
        x, upstream = seed_data(batch)
        for name in STRATEGIES:
            if name == "data_parallel":  # the whole layer, 1/n of the batch
                rows = np.array_split(np.arange(batch), world)[rank]
                layer, inputs, grad = full, x[rows], upstream[rows]
            else:
                layer = layers[name]
                inputs = own(x) if name == "row_split_input" else x
                grad = own(upstream) if name == "column_split_output" else upstream
            inputs = Tensor(inputs, requires_grad=True)  # a layer below wants dX
            with trace.region(f"{name} b={batch} forward"):
                y = layer(inputs)
            with trace.region(f"{name} b={batch} backward"):
                (y * Tensor(grad)).sum().backward()
                if name == "data_parallel":
                    dist.all_reduce(full.weight.grad, algorithm="ring")
                    full.weight.grad = None
            if batch == LAYER_BATCH and name in ("column", "row"):
                block = layer.weight.data.T.shape  # A_r, in x out
                local_in = (batch, block[0])
                dy_local = (batch, block[1])
                shapes[name] = dict(forward=(local_in, block, (batch, block[1])),
                                    backward=(dy_local, block[::-1], (batch, block[0])),
                                    y=y.shape, x_grad=inputs.grad.shape)
    return shapes


bytes_trace = OUT / "model_parallel_layer.trace.jsonl"
layer_results = minidist.launch(run_seed_layer, world_size=2, transport="shm",
                                args=(BYTES_BATCHES,), trace=str(bytes_trace))
events = trace.read_jsonl(bytes_trace).events


def product(shapes):
    (a, b), (_, c), (d, e) = shapes
    return f"{a} x {b} times {b} x {c} = {d} x {e}"


print("standard:     forward  128 x 1000 times 1000 x 500 = 128 x 500; "
      "backward 128 x 500 times 500 x 1000 = 128 x 1000")
for name, word_forward, word_backward in (("row", "add", "stack"), ("column", "stack", "add")):
    mine = layer_results[0][name]
    print(f"{name + ' split:':<13} forward  {product(mine['forward'])} -> {word_forward}; "
          f"backward {product(mine['backward'])} -> {word_backward}")
    print(f"{'':13} every rank ends with Y {mine['y'][0]} x {mine['y'][1]} and dX "
          f"{mine['x_grad'][0]} x {mine['x_grad'][1]}"
          + ("" if name == "column" else " (each rank's 500 columns of dX, stacked by "
             "an all_gather)"))

# %% [markdown]
# These are Dettmers' six lines, measured: the row split multiplies
# 128 x 500 by 500 x 500 forward (partial sums, added) and backward (pieces
# of dX, stacked); the column split 128 x 1000 by 1000 x 250 forward
# (pieces, stacked) and 128 x 250 by 250 x 1000 backward (partial dX, added).
#
# ## 3. Bytes: data parallel against the two splits
#
# Data parallel on 2 workers sends the layer's weight gradient once per
# step: 1000 x 500 = **500,000** values. A split sends activations, forward
# and backward: the row split 128 x 500 (Y) + 128 x 500 (its half of dX) =
# **128,000**; the column split 128 x 250 (its half of Y) + 128 x 1000 (the
# partial dX) = **160,000**.
#
# What a worker actually sends depends on the collective's algorithm; with
# the ring, on 2 ranks, each sends exactly the values it contributes.
# `split_bytes` gives the counts for any size and world; the last column is
# what the trace of the run above counted (send events inside each
# strategy's two regions, per rank):

# %%
def traced_bytes(batch):
    """Strategy -> bytes each rank sent in its forward and backward regions."""
    return {name: [sum(sent_in_region(events, rank, f"{name} b={batch} {part}")
                       for part in ("forward", "backward")) for rank in range(2)]
            for name in STRATEGIES}


layer_table = split_bytes(LAYER_IN, LAYER_OUT, LAYER_BATCH, world_size=2)
measured = traced_bytes(LAYER_BATCH)
print(format_table(layer_table, measured))
for row in layer_table.rows:
    assert tuple(measured[row.name]) == row.bytes_per_rank, row.name
print("\nthe trace equals the formula on every rank, for every strategy")
dp_over_row = glue("dp_over_row", layer_table["data_parallel"].payload
                   / layer_table["row"].payload, ".1f")
dp_over_column = glue("dp_over_column", layer_table["data_parallel"].payload
                      / layer_table["column"].payload, ".1f")
print(f"data parallel / row split: {dp_over_row} times the values, data parallel / column "
      f"split: {dp_over_column} times")

# %% jupyter={"source_hidden": true}
glue("column_lean", layer_table["column_split_output"].payload, ",")
glue("row_lean", layer_table["row_split_input"].payload, ",")
say('''
Formula and trace agree to the byte: data parallel sends {glue}`dp_over_row` times
the row split's values and {glue}`dp_over_column` times the column split's,
Dettmers' "about 4 times less". (Megatron-LM's defaults, `gather_output=False`
and `input_is_parallel=True`, send less still, {glue}`column_lean` and
{glue}`row_lean` values, for the price of an output or an input left split:
section 4 pairs them.)
''')

# %% [markdown]
# But the split's bytes grow with the batch and data parallel's do not:
# the weight gradient is 1000 x 500 whatever the batch. The row split sends
# B (500 + 500) values, the column split B (250 + 1000); they cross data
# parallel's 500,000 at B = 500 and B = 400. The same run measured batches
# 32 and 512 too (the markers in the picture below):

# %%
batches = np.arange(8, 1025, 8)


def crossing_batch(name):
    """The batch at which the split's values reach data parallel's (split_bytes)."""
    return next(b for b in range(1, 4097) if split_bytes(LAYER_IN, LAYER_OUT, b, 2)[name].payload
                >= split_bytes(LAYER_IN, LAYER_OUT, b, 2)["data_parallel"].payload)



figure, axis = plt.subplots(figsize=(7.5, 4.2))
styles = {"data_parallel": ("-", "o"), "column": ("--", "s"), "row": (":", "^")}
for name, (line, marker) in styles.items():
    formula = [split_bytes(LAYER_IN, LAYER_OUT, int(b), 2)[name].bytes_per_rank[0] / 1e6
               for b in batches]
    axis.plot(batches, formula, line, label=split_bytes(8, 8, 8, 2)[name].description)
    traced = [traced_bytes(b)[name][0] / 1e6 for b in BYTES_BATCHES]
    axis.plot(BYTES_BATCHES, traced, marker, color=axis.lines[-1].get_color())
for name, crossing in (("column", crossing_batch("column")), ("row", crossing_batch("row"))):
    axis.axvline(crossing, color="black", alpha=0.3)
    axis.annotate(f"{name} = DP at B = {crossing}", (crossing, 2.0),
                  xytext=(crossing + 15, 0.9 if name == "row" else 3.0), fontsize=9,
                  arrowprops=dict(arrowstyle="->", alpha=0.5))
axis.axvline(LAYER_BATCH, color="grey", linestyle="-.", alpha=0.5)
axis.text(LAYER_BATCH + 10, 1.3, "Dettmers'\nbatch 128", fontsize=9)
axis.set_xlabel("batch B")
axis.set_ylabel("MB sent per rank per step")
axis.set_title("the 1000 x 500 layer on 2 ranks: lines the formula, markers the trace")
axis.grid(alpha=0.3)
axis.legend(fontsize=8, loc="upper left")
figure.tight_layout()
show_figure(figure, "model_parallel_bytes.png")

# %% [markdown]
# Below the crossing, model parallel moves less; above it, data parallel
# does. For a dense layer the rule is: weights per layer (in x out) against
# activations per layer (B x in plus B x out): **wide layers and small
# batches favour model parallel, small layers and large batches data
# parallel**, or in Dettmers' words, data parallel suits small networks and
# model parallel large ones.
#
# Bytes are not the whole story. Data parallel sends once per step, after
# backward, and can start while backward still runs (lesson 5's overlap).
# A split sends after *every* product, and the next layer cannot start
# until the pieces have arrived: the worker has only part of the result for
# the whole batch. Model parallel cannot hide its communication behind
# compute; each message is on the critical path.
#
# ## 4. Column then row: Megatron's MLP block, one all_reduce per pass
#
# Two layers in a row, Linear, ReLU, Linear. Split the first by columns and
# do *not* stack its output (`gather_output=False`): each worker holds its
# columns of the hidden layer, and ReLU works column by column, so it needs
# nothing else. Those columns are exactly the slice of the input a row split
# wants (`input_is_parallel=True`). So the second layer's forward all_reduce
# is the only message forward, and the first layer's backward all_reduce of
# the partial dX the only one backward.
#
# The block 1000 -> 500 -> 1000 at batch 128, both ways: the pair, and each
# layer stacking its own result. Calls and bytes from the trace:

# %%
def block_layers():
    return nn.Linear(LAYER_IN, LAYER_OUT, rng=2), nn.Linear(LAYER_OUT, LAYER_IN, rng=3)


def run_block():
    first, second = block_layers()
    x, _ = seed_data(LAYER_BATCH)
    upstream = np.random.default_rng(4).normal(size=(LAYER_BATCH, LAYER_IN)).astype(np.float32)
    blocks = {"paired": nn.Sequential(ColumnParallelLinear.from_linear(first), nn.ReLU(),
                                      RowParallelLinear.from_linear(second)),
              "each stacked": nn.Sequential(
                  ColumnParallelLinear.from_linear(first, gather_output=True), nn.ReLU(),
                  RowParallelLinear.from_linear(second, input_is_parallel=False))}
    found = {}
    for name, block in blocks.items():
        inputs = Tensor(x, requires_grad=True)
        with trace.region(f"{name} forward"):
            y = block(inputs)
        with trace.region(f"{name} backward"):
            (y * Tensor(upstream)).sum().backward()
        found[name] = (y.data, inputs.grad)
    return found


block_trace = OUT / "model_parallel_block.trace.jsonl"
block_results = minidist.launch(run_block, world_size=2, transport="shm",
                                trace=str(block_trace))
block_events = trace.read_jsonl(block_trace).events
first, second = block_layers()
x, _ = seed_data(LAYER_BATCH)
inputs = Tensor(x, requires_grad=True)
upstream = np.random.default_rng(4).normal(size=(LAYER_BATCH, LAYER_IN)).astype(np.float32)
wanted_y = nn.Sequential(first, nn.ReLU(), second)(inputs)
(wanted_y * Tensor(upstream)).sum().backward()
pair_formula = (split_bytes(LAYER_IN, LAYER_OUT, LAYER_BATCH, 2)["column_split_output"],
                split_bytes(LAYER_OUT, LAYER_IN, LAYER_BATCH, 2)["row_split_input"])
print(f"{'block':<13}  {'pass':<8}  {'collectives (trace)':<24}  {'bytes per rank':>14}")
for name in ("paired", "each stacked"):
    for part in ("forward", "backward"):
        calls = calls_in_region(block_events, 0, f"{name} {part}")
        sent = [sent_in_region(block_events, rank, f"{name} {part}") for rank in range(2)]
        print(f"{name:<13}  {part:<8}  {', '.join(calls):<24}  {sent[0]:>14,}")
    y, x_grad = block_results[0][name]
    print(f"{'':13}  vs one process: Y {relative_error(y, wanted_y.data):.1e}, "
          f"dX {relative_error(x_grad, inputs.grad):.1e}")
formula_bytes = sum(row.bytes_per_rank[0] for row in pair_formula)
print(f"split_bytes for the pair (the table's \"{pair_formula[0].description}\" then "
      f"\"{pair_formula[1].description}\"): {formula_bytes:,} bytes per rank")
assert formula_bytes == sum(sent_in_region(block_events, 0, f"paired {part}")
                            for part in ("forward", "backward"))

# %% [markdown]
# The pair makes one all_reduce forward and one backward; stacking each
# layer's result makes two collectives per pass and sends a quarter more
# bytes (the all_gathers' 128,000 a pass on top of the all_reduces'
# 512,000), for the same numbers. This is how Megatron-LM splits a transformer's MLP
# (and, with the heads, its attention): the split tensors stay split between
# the two layers.
#
# The same pair trains the course's digits MLP (64 -> 128 -> ReLU -> 10):
# every process sees the same batches and holds half of each weight matrix,
# with its own optimizer for its own halves. The first layer is fed with
# data, which needs no gradient, so its backward all_reduce does not even
# run: the only message of a step is the B x 10 logits' all_reduce. Against
# one process trained on the same batches:

# %%
EPOCHS = 2 if QUICK else 10
DIGITS_BATCH, DIGITS_LR = 64, 0.1
x_train, y_train, x_test, y_test = load_digits()


def train_mlp(model):
    optimizer = optim.SGD(model.parameters(), lr=DIGITS_LR, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    order = np.random.default_rng(0)  # the same batches on every rank
    for _ in range(EPOCHS):
        permutation = order.permutation(len(x_train))
        for start in range(0, len(x_train), DIGITS_BATCH):
            rows = permutation[start:start + DIGITS_BATCH]
            optimizer.zero_grad()
            loss_fn(model(Tensor(x_train[rows])), y_train[rows]).backward()
            optimizer.step()
    return evaluate(model, x_test, y_test)


def train_split_mlp():
    first, _, second = build_model("mlp")
    return train_mlp(nn.Sequential(ColumnParallelLinear.from_linear(first), nn.ReLU(),
                                   RowParallelLinear.from_linear(second)))


alone = train_mlp(build_model("mlp"))
split = minidist.launch(train_split_mlp, world_size=2, transport="shm")
print(f"digits MLP, {EPOCHS} epochs: test accuracy {alone:.4f} in one process, "
      f"{split[0]:.4f} and {split[1]:.4f} on the 2 ranks of the split")

# %% jupyter={"source_hidden": true}
glue("epochs", EPOCHS, "d")
glue("epochs_note", f" (This is the quick form: {EPOCHS} epochs, where the full form, without "
     "MINIDIST_LESSON_QUICK, trains 10: this accuracy is a shorter training's; the "
     "comparison, one process against the split on the same batches, is the same.)" if QUICK else "")
glue("same_accuracy", "The same accuracy" if alone == split[0] == split[1] else
     "Not quite the same accuracy (a sum taken in another order moved a prediction "
     "across a boundary)")
say('''
{glue}`same_accuracy`: the split computes the same function, up to the order of
float32 sums.{glue}`epochs_note` (`minidist demo model-parallel` runs this training, prints its
bytes per step next to the formula and steps through the messages of its last
step.)
''')

# %% [markdown]
# ## 5. DistBelief: every layer partitioned, all_to_all between layers
#
# DistBelief (Dean et al., 2012; the LSML lecture's "model-parallel in
# DistBelief") cuts the *network*: worker r owns a slice of the units of
# every layer with their incoming weights, sees the whole batch, and sends
# its units' activations to the workers whose units read them. In a fully connected net every unit of the
# next layer reads every unit of this one, so after each layer the workers
# exchange their activations with an **all_to_all**; backward, each
# worker's partial gradient of the previous layer is cut by owner and sent
# back the same way. `DistBeliefMLP` is that, for a deeper net on the same
# digits, 64 -> 128 -> 128 -> 10 (one hidden layer more than section 4's MLP,
# so that two hidden layers exchange), on 2 workers, one SGD step against one
# process:

# %%
SIZES = (64, 128, 128, 10)
DB_BATCH = 64


def distbelief_linears():
    return [nn.Linear(a, b, rng=20 + i) for i, (a, b) in enumerate(zip(SIZES, SIZES[1:]))]


def unsplit_net(linears):
    layers = []
    for linear in linears:
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def distbelief_step():
    model = DistBeliefMLP.from_linears(distbelief_linears())
    optimizer = optim.SGD(model.parameters(), lr=DIGITS_LR)
    with trace.region("distbelief step"):
        loss = nn.CrossEntropyLoss()(model(Tensor(x_train[:DB_BATCH])), y_train[:DB_BATCH])
        loss.backward()
        optimizer.step()
    return float(loss.item()), [layer.weight.data for layer in model.layers]


db_trace = OUT / "distbelief.trace.jsonl"
db_results = minidist.launch(distbelief_step, world_size=2, transport="shm",
                             trace=str(db_trace))
db_events = trace.read_jsonl(db_trace).events
single = unsplit_net(distbelief_linears())
single_optimizer = optim.SGD(single.parameters(), lr=DIGITS_LR)
single_loss = nn.CrossEntropyLoss()(single(Tensor(x_train[:DB_BATCH])), y_train[:DB_BATCH])
single_loss.backward()
single_optimizer.step()
weights = [np.concatenate([r[1][i] for r in db_results]) for i in range(len(SIZES) - 1)]
linears = [layer for layer in single if isinstance(layer, nn.Linear)]
print(f"loss {db_results[0][0]:.6f} (one process {single_loss.item():.6f}); weights after the "
      f"step, largest relative difference "
      f"{max(relative_error(w, lin.weight.data) for w, lin in zip(weights, linears)):.1e}")
db_formula = distbelief_bytes(SIZES, DB_BATCH, 2)
db_sent = sent_in_region(db_events, 0, "distbelief step")
print("collectives of one step:", ", ".join(calls_in_region(db_events, 0, "distbelief step")))
print(f"bytes per worker per step: trace {db_sent:,}, distbelief_bytes {db_formula.bytes:,}; "
      f"data parallel on the same net would send {db_formula.data_parallel_values * 4:,}")
assert db_sent == db_formula.bytes

# %% jupyter={"source_hidden": true}
glue("db_weights", db_formula.data_parallel_values, ",")
glue("db_hidden", DB_BATCH * sum(SIZES[1:-1]), ",")
glue("db_sent", db_sent, ",")
glue("db_dp_bytes", db_formula.data_parallel_values * 4, ",")
glue("db_verdict", "less than" if db_sent < db_formula.data_parallel_values * 4 else
     "no less than")
say('''
Four all_to_alls (two hidden layers, forward and backward) and one all_gather
of the logits; the bytes are the formula's. At batch 64 this net's
{glue}`db_weights` weights and biases outnumber its {glue}`db_hidden` hidden activations
(64 x 256), so DistBelief sends {glue}`db_verdict` data parallel would
({glue}`db_sent` bytes against {glue}`db_dp_bytes`), the same trade as in section 3.
Compared with Megatron's pair it exchanges after every layer, not every second
one; what it buys is that no layer has to be paired with another.
''')

# %% [markdown]
# ## 6. The hybrid: convolutions data parallel, dense layers model parallel
#
# Krizhevsky ("One weird trick for parallelizing convolutional neural
# networks", 2014) looked at where a CNN's weights and activations are. A
# convolution has few weights (a 3 x 3 kernel per channel pair) and large
# activations (every pixel of every channel); a dense layer the opposite.
# So: convolutions **data parallel** (each worker its part of the batch,
# the small convolution gradients all-reduced) and dense layers **model
# parallel** (the features of the whole batch gathered, the big weight
# matrices split). `strategy_bytes` counts, per layer of the digits CNN,
# weights against activations and what each strategy sends, at batch 64 on
# 2 ranks:

# %%
CNN_INPUT = (1, 8, 8)
cnn_table = strategy_bytes(build_model("cnn"), CNN_INPUT, 64, 2)
print(cnn_table)

# %% jupyter={"source_hidden": true}
convs = [layer for layer in cnn_table.layers if layer.kind == "conv"]
dense = [layer for layer in cnn_table.layers if layer.kind == "dense"]
glue("conv_ratios", " and ".join(f"{layer.weights / layer.activations:.2f}" for layer in convs))
glue("dense_big_ratio", dense[0].weights / dense[0].activations, ".2f")
glue("dense_last_ratio", dense[-1].weights / dense[-1].activations, ".2f")
glue("dense_big_share", dense[0].weights / sum(layer.weights for layer in cnn_table.layers),
     ".0%")
say('''
The ratio column says it: the convolutions have {glue}`conv_ratios` weights per
activation, the 512 -> 64 dense layer {glue}`dense_big_ratio` and the last one
{glue}`dense_last_ratio` at this batch. Data parallel sends every weight's gradient
(the dense 512 -> 64 layer is {glue}`dense_big_share` of them); pure model parallel
(`DenseModelParallel`: the convolutions replicated, every rank running them
on the whole batch) sends activations only; the hybrid (`HybridParallel`)
sends the convolutions' small gradients and the dense layers' activations.
''')

# %% [markdown]
# Now the measured experiment: the three strategies trained on the digits
# for a few steps on 2 processes, at batch 16 and 128 (below and above the
# batch where model parallel's activations outgrow data parallel's
# gradient). Per strategy and batch: the bytes of one traced step next to
# the formula, and the step time: the strategies take turns, a short window
# of steps each, window after window, so that load beside the lesson hits
# them alike; a window's time is its slower rank's, and each strategy keeps
# its fastest window (a window the scheduler interrupted is slower, never
# faster). Each rank runs one BLAS thread, and the load is read before and
# after.

# %%
CNN_BATCHES = (16, 128)
WINDOWS, STEPS = (8, 2) if QUICK else (20, 4)
CNN_LR = 0.05


def cnn_steppers(batch):
    """Strategy -> a function doing one SGD step of it on the index-th batch."""
    rank, share = dist.get_rank(), batch // dist.get_world_size()
    x, y = load_digits(flatten=False)[:2]
    data = [(np.ascontiguousarray(x[i * batch:(i + 1) * batch], np.float32),
             y[i * batch:(i + 1) * batch]) for i in range(4)]
    loss_fn = nn.CrossEntropyLoss()

    def own(array):  # this rank's share of the batch
        return array[rank * share:(rank + 1) * share]

    ddp = DistributedDataParallel(build_model("cnn"), algorithm="ring")
    split = DenseModelParallel(build_model("cnn"))
    hybrid = HybridParallel(build_model("cnn"))
    forwards = {
        "data_parallel": (ddp, lambda xb, yb: (ddp(Tensor(own(xb))), own(yb))),
        "model_parallel": (split, lambda xb, yb: (split(Tensor(xb)), yb)),
        "hybrid": (hybrid, lambda xb, yb: (hybrid(Tensor(own(xb))), all_gather_batch(own(yb)))),
    }
    steppers = {}
    for name, (model, forward) in forwards.items():
        optimizer = optim.SGD(model.parameters(), lr=CNN_LR)

        def step(index, forward=forward, optimizer=optimizer):
            xb, yb = data[index % len(data)]
            optimizer.zero_grad(set_to_none=False)
            logits, labels = forward(xb, yb)
            loss_fn(logits, labels).backward()
            optimizer.step()

        steppers[name] = step
    return steppers


def cnn_experiment(batches, windows, steps):
    found = {}
    for batch in batches:
        steppers = cnn_steppers(batch)
        for name in STRATEGY_NAMES:  # one traced step each, for the bytes
            with trace.region(f"{name} b={batch}"):
                steppers[name](0)
        for name in STRATEGY_NAMES:  # warm-up: first calls allocate and fill caches
            for index in range(2):
                steppers[name](index + 1)
        times = {name: [] for name in STRATEGY_NAMES}
        for window in range(windows):
            order = STRATEGY_NAMES[window % 3:] + STRATEGY_NAMES[:window % 3]
            for name in order:
                dist.barrier()
                start = time.perf_counter()
                for index in range(steps):
                    steppers[name](index + 1)
                times[name].append((time.perf_counter() - start) / steps)
        found[batch] = times
    return found


cnn_trace = OUT / "model_parallel_cnn.trace.jsonl"
cnn_load = Load.start()
cnn_results = minidist.launch(cnn_experiment, world_size=2, transport="shm",
                              args=(CNN_BATCHES, WINDOWS, STEPS), trace=str(cnn_trace),
                              timeout=300)
cnn_load = cnn_load.finish()
cnn_events = trace.read_jsonl(cnn_trace).events


def int64_calls(events, rank, label):
    """Calls of 8-byte values (DDP's example count): strategy_bytes leaves them out."""
    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    return {trace.label_info(e["label"]).get("call") for e in events
            if e["rank"] == rank and e["kind"] == "collective" and start <= e["start"]
            and e["end"] <= end and trace.label_info(e["label"]).get("itemsize") == 8}


def float_bytes(events, rank, label):
    skip = int64_calls(events, rank, label)
    start, end = next((e["start"], e["end"]) for e in events if e["rank"] == rank
                      and e["kind"] == "compute" and e["label"] == label)
    return sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
               and start <= e["start"] and e["end"] <= end
               and trace.label_info(e["label"]).get("call") not in skip)


SHORT = {"data_parallel": "DP", "model_parallel": "MP", "hybrid": "hybrid"}
cnn_measured = {}
print(f"{'batch':>5}  {'strategy':<8}  {'step time':>9}  {'vs DP':>6}  {'bytes (trace)':>13}  "
      f"{'bytes (formula)':>15}  {'vs DP':>6}")
for batch in CNN_BATCHES:
    table = strategy_bytes(build_model("cnn"), CNN_INPUT, batch, 2)
    step_time = {name: min(max(r[batch][name][w] for r in cnn_results) for w in range(WINDOWS))
                 for name in STRATEGY_NAMES}
    traced = {name: float_bytes(cnn_events, 0, f"{name} b={batch}") for name in STRATEGY_NAMES}
    cnn_measured[batch] = (step_time, traced)
    for name in STRATEGY_NAMES:
        assert traced[name] == table.bytes(name), (batch, name)
        print(f"{batch:>5}  {SHORT[name]:<8}  {step_time[name] * 1e3:>6.2f} ms  "
              f"{step_time[name] / step_time['data_parallel']:>5.2f}x  {traced[name]:>13,}  "
              f"{table.bytes(name):>15,}  {table.bytes(name) / table.bytes('data_parallel'):>5.2f}x")
print(f"(step time: the fastest of {WINDOWS} interleaved windows of {STEPS} steps, slower rank; "
      f"one BLAS thread per rank; {cnn_load.describe()})")
busy = cnn_load.note("the bytes are counts and hold; for the times, the model below (pure model "
                     "parallel does twice the convolution work, the hybrid makes 5 collectives "
                     "a step that the next layer waits for, data parallel 2) is what to go by")
if busy:
    print(busy)
print()
print(format_strategy_table(strategy_bytes(build_model("cnn"), CNN_INPUT, 128, 2),
                            {name: cnn_measured[128][1][name] for name in STRATEGY_NAMES}))

# %%
sizes = np.array([4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256])
figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
markers = {"data_parallel": "o", "model_parallel": "s", "hybrid": "^"}
for name in STRATEGY_NAMES:
    left.plot(sizes, [strategy_bytes(build_model("cnn"), CNN_INPUT, int(b), 2).bytes(name) / 1e3
                      for b in sizes], label=SHORT[name])
    left.plot(CNN_BATCHES, [cnn_measured[b][1][name] / 1e3 for b in CNN_BATCHES],
              markers[name], color=left.lines[-1].get_color())
dp_line = strategy_bytes(build_model("cnn"), CNN_INPUT, 16, 2).bytes("data_parallel")
crossing = next(int(b) for b in range(2, 512, 2)
                if strategy_bytes(build_model("cnn"), CNN_INPUT, b, 2).bytes("model_parallel")
                > dp_line)
left.axvline(crossing, color="black", alpha=0.3)
left.annotate(f"MP sends more than DP\nfrom batch {crossing}", (crossing, dp_line / 1e3),
              xytext=(crossing + 20, dp_line / 1e3 * 0.35), fontsize=9,
              arrowprops=dict(arrowstyle="->", alpha=0.5))
left.set_xlabel("global batch")
left.set_ylabel("kB sent per rank per step")
left.set_title("digits CNN, 2 ranks: lines formula, markers trace", fontsize=10)
left.grid(alpha=0.3)
left.legend()
width = 0.25
for index, name in enumerate(STRATEGY_NAMES):
    right.bar(np.arange(len(CNN_BATCHES)) + (index - 1) * width,
              [cnn_measured[b][0][name] * 1e3 for b in CNN_BATCHES], width, label=SHORT[name],
              hatch=HATCHES[index], edgecolor="black")
right.set_xticks(np.arange(len(CNN_BATCHES)))
right.set_xticklabels([f"batch {b}" for b in CNN_BATCHES])
right.set_ylabel("step time (ms): fastest window, slower rank")
right.set_title(f"measured on this machine, 2 processes\n{cnn_load.describe()}", fontsize=10)
right.legend()
figure.tight_layout()
print(f"model parallel's bytes pass data parallel's at batch {crossing}")
show_figure(figure, "model_parallel_hybrid.png",
            "left: bytes sent per rank and step; right: the step times of this run")

# %% jupyter={"source_hidden": true}
small_batch, large_batch = CNN_BATCHES
small_bytes, large_bytes = (strategy_bytes(build_model("cnn"), CNN_INPUT, b, 2)
                            for b in CNN_BATCHES)
glue("bytes_dp_small", small_bytes.bytes("data_parallel"), ",")
glue("bytes_hybrid_small", small_bytes.bytes("hybrid"), ",")
glue("bytes_mp_small", small_bytes.bytes("model_parallel"), ",")
glue("hybrid_share_small", small_bytes.bytes("hybrid") / small_bytes.bytes("data_parallel"),
     ".2f")
glue("mp_share_small", small_bytes.bytes("model_parallel") / small_bytes.bytes("data_parallel"),
     ".2f")
glue("mp_share_large", large_bytes.bytes("model_parallel") / large_bytes.bytes("data_parallel"),
     ".2f")
glue("hybrid_share_large", large_bytes.bytes("hybrid") / large_bytes.bytes("data_parallel"),
     ".2f")
glue("cnn_crossing", crossing, "d")
glue("small_batch", small_batch, "d")
glue("large_batch", large_batch, "d")
# Krizhevsky's dense layers, 4096 x 4096: where a split of one stops sending less
glue("wide_crossing", next(b for b in range(1, 100_000) if split_bytes(4096, 4096, b, 2)["row"]
                           .payload >= split_bytes(4096, 4096, b, 2)["data_parallel"].payload),
     ",")
say("""
What the tables show, every time (they are counts, and the trace equals the
formula): at batch {glue}`small_batch` the hybrid sends {glue}`hybrid_share_small` of data
parallel's bytes ({glue}`bytes_hybrid_small` against {glue}`bytes_dp_small`) and pure model
parallel {glue}`mp_share_small` ({glue}`bytes_mp_small`); at batch {glue}`large_batch` the dense
part's activations have outgrown its weights (model parallel passes data
parallel at batch {glue}`cnn_crossing` on 2 ranks), and model parallel and the hybrid
send {glue}`mp_share_large` and {glue}`hybrid_share_large` times data parallel's bytes. On
this small CNN the hybrid only pays at small batches; Krizhevsky's networks
had dense layers of 4096 x 4096, and `split_bytes` says a split of one such
layer on 2 ranks sends less than data parallel up to batch {glue}`wide_crossing`.
""")

# %% jupyter={"source_hidden": true}
step_times = {batch: cnn_measured[batch][0] for batch in CNN_BATCHES}


def against_dp(batch, name):
    return step_times[batch][name] / step_times[batch]["data_parallel"]


glue("cnn_load", cnn_load.describe())
glue("windows", WINDOWS, "d")
glue("windows_note", f" This is the quick form: {WINDOWS} windows of {STEPS} steps per strategy "
     "and batch, where the full form, without MINIDIST_LESSON_QUICK, takes 20 windows of 4; "
     "fewer windows give a busy machine fewer chances of a quiet one, so its times are "
     "rougher." if QUICK else "")
glue("mp_time_small", against_dp(small_batch, "model_parallel"), ".2f")
glue("mp_time_large", against_dp(large_batch, "model_parallel"), ".2f")
glue("hybrid_time_small", against_dp(small_batch, "hybrid"), ".2f")
glue("hybrid_time_large", against_dp(large_batch, "hybrid"), ".2f")
WORDS = {"data_parallel": "data parallel", "model_parallel": "pure model parallel",
         "hybrid": "the hybrid"}
fastest = {batch: min(STRATEGY_NAMES, key=lambda name: step_times[batch][name])
           for batch in CNN_BATCHES}
dp_fastest = all(name == "data_parallel" for name in fastest.values())
glue("fastest_verdict", "data parallel was the fastest at both batches" if dp_fastest else
     "the fastest was " + " and ".join(f"{WORDS[fastest[b]]} at batch {b}" for b in CNN_BATCHES)
     + (", not data parallel as the model below expects"))
glue("busy_verdict", "The machine was busy (more programs than cores, the line under the "
     "table): go by the model that follows, not by the ratios." if cnn_load.busy else
     "The machine was not busy (the load stayed within the cores).")
mp_grew = against_dp(large_batch, "model_parallel") > against_dp(small_batch, "model_parallel")
glue("mp_verdict", f"which is what shows at batch {large_batch}, where the convolutions "
     "dominate" if mp_grew else
     f"which should show most at batch {large_batch}, where the convolutions dominate; "
     "in this run its ratio was no larger there")
hybrid_fell = against_dp(small_batch, "hybrid") > against_dp(large_batch, "hybrid")
glue("hybrid_verdict", f"which weighs most on the short steps of batch {small_batch}, as "
     "here" if hybrid_fell else
     f"which should weigh most on the short steps of batch {small_batch}; in this run "
     "it did not")
say("""
What the step times show depends on the machine, and the numbers printed above
are this run's ({glue}`cnn_load`, each strategy keeping its fastest window):
{glue}`fastest_verdict`. Pure model parallel took {glue}`mp_time_small` times data
parallel's step at batch {glue}`small_batch` and {glue}`mp_time_large` times at batch
{glue}`large_batch`; the hybrid {glue}`hybrid_time_small` and {glue}`hybrid_time_large` times.
{glue}`busy_verdict`{glue}`windows_note` (A median of the windows would be worse: one window that
waited for a core can decide a median, and the fastest window is the one that
waited least.) A step here sends well under a
megabyte through shared memory, so its time is compute and the number of
collectives, not bytes. Pure model parallel runs the convolutions on the whole
batch on *both* ranks (twice the convolution work in all), {glue}`mp_verdict`.
The hybrid splits that work like data parallel, but makes five collectives a
step (convolution gradients, features, partial outputs, feature gradients,
labels), and the rank waits for each of them before it goes on (section 3:
a split cannot hide its messages behind compute). Data parallel
makes two: an all_reduce of one integer (the examples in the step, which its
`DistributedDataParallel` divides the summed gradient by) and one all_reduce
of the whole gradient, a single bucket for this small net, started without
blocking as soon as backward has filled it. Five calls against two is a fixed
cost, {glue}`hybrid_verdict`.
""")

# %% [markdown]
# The hybrid's saving in bytes pays where bytes are
# what is scarce: between machines, with a large dense layer and a small
# per-worker batch, as in Krizhevsky's 2014 runs on 8 GPUs.
# `benchmarks/bench_model_parallel.py` is the longer version of this
# experiment.
#
# ## What to remember
#
# * Model parallel: every worker the whole batch, a slice of the weights.
#   A column split stacks output pieces and adds partial input gradients; a
#   row split adds partial outputs and stacks input-gradient pieces.
# * It sends activations, data parallel sends gradients. Wide layers and
#   small batches favour the split; small layers and large batches data
#   parallel. Dettmers' 1000 x 500 layer at batch 128: 500,000 values
#   against 128,000 or 160,000.
# * Its messages sit between products and cannot be hidden behind compute.
# * Pair a column split with a row split and the block costs one all_reduce
#   per pass (Megatron); partition every layer and the layers exchange with
#   all_to_all (DistBelief).
# * The hybrid takes the cheaper way per layer: data parallel for the
#   convolutions (few weights), model parallel for the dense layers (few
#   activations).
#
# Try `minidist demo model-parallel -n 2` (and `--timeline step.png`) to
# train the split MLP and step through the messages of its last step, or
# change `CNN_BATCHES = (16, 128)`, the batch sizes section 6 measures (a
# constant at the top of that section's code cell), and watch the bytes cross.

# %% [markdown]
# ## Your turn
#
# Split a dense layer by columns and by rows yourself:
# `minidist exercise start tensor_parallel_linear`, then
# `minidist exercise check tensor_parallel_linear` (1 to 4 real processes,
# each given only its shard).
