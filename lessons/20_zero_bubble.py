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
# # Lesson 20: pipelines without bubbles
#
# Lesson 9 left a pipeline of p stages and m micro-batches idle
# (p - 1)/(m + p - 1) of its time under 1F1B: the **bubble**, the time a
# stage waits for work during one batch. More micro-batches shrink it; they
# cannot remove it. This chapter removes most of it without more
# micro-batches, by cutting each stage's backward in two:
#
# * **I**, the *input half*: the gradient of the stage's input, which the
#   stage before waits for;
# * **W**, the *weight half*: the gradients of the stage's weights, which
#   nobody waits for until the optimizer step.
#
# Run I as soon as possible and W wherever a stage would otherwise wait, and
# the bubble fills with W's (Qi, Wan, Huang, Lin, "Zero Bubble Pipeline
# Parallelism", ICLR 2024; their letter for our I is B). The letters of the
# charts: **F** a forward, **B** a whole backward (B = I + W), **I** and
# **W** its halves, each of one micro-batch on one stage.
#
# 1. the split by hand on one Linear layer, then by minidist's
#    `backward_input` / `backward_weight`: the same bits, and what each half
#    computes and keeps;
# 2. the bubble on the simulator's clock: 1F1B against ZB-H1, ZB-H2, ZB-V
#    and DualPipeV, next to the papers' formulas, with equal and unequal
#    costs; the V placement of ZB-V and DualPipeV;
# 3. the same schedules on real processes, equal to one process, the
#    measured bubble next to the formula and to the simulator's replay;
# 4. when the split does not pay: a W too small to fill anything, and the
#    memory every waiting W holds;
# 5. what to try.
#
# Library code: `minidist/split_backward.py` (the two halves),
# `minidist/parallel/pipeline/zero_bubble.py` (the schedules as data),
# `simulate.py` (the virtual clock), `steps.py` and `executor.py` (the
# runtime: an I and a W are two steps), `ledger.py` (the memory ledger);
# the drawings are `viz/pipeline_chart.py`.
#
# Symbols as in `lessons/NOTATION.md`: p stages (ranks), m micro-batches, i
# a stage's index; F, B, I, W are both the chart letters and, in a formula,
# the time one of them takes.
#
# **Quick and full form.** The quick form (`MINIDIST_LESSON_QUICK=1`) times
# section 1's halves 8 times each (the full form: 25), runs 6 steps of each
# schedule on 2 processes in section 3 (full: 10), leaves out section 3's
# run on 4 processes, and measures section 4's block at T = 64 and 512
# (full: 64 and 1024). The simulated numbers of section 2 are the same in
# both.

# %%
import os
import time
from fractions import Fraction

import numpy as np

import minidist
from minidist import Tensor, nn, optim, trace
from minidist.lesson import (
    glue,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    use_headless_matplotlib,
)
from minidist.lesson_timing import Load, machine_load
from minidist.memory import split_backward_bytes
from minidist.model_gap import CLOSE, RunFacts, compare
from minidist.models.gpt import Block, GPTConfig
from minidist.parallel.pipeline import (
    Pipeline,
    bubble_fraction,
    make_schedule,
    peak_live_microbatches,
    simulate_schedule,
)
from minidist.parallel.pipeline.schedules import UNIT_NS
from minidist.runtime.blas_threads import limit as blas_limit
from minidist.split_backward import backward_input

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

import matplotlib.pyplot as plt  # noqa: E402

from viz.pipeline_chart import schedule_comparison_figure  # noqa: E402

QUICK = quick()
OUT = output_dir()
#: The schedules compared, in the order they are taught.
NAMES = ("1f1b", "zb_h1", "zb_h2", "zbv", "dualpipev")
TITLES = {"1f1b": "1F1B", "zb_h1": "ZB-H1", "zb_h2": "ZB-H2", "zbv": "ZB-V",
          "dualpipev": "DualPipeV"}
#: matplotlib's tableau-colorblind10 (the course's colours).
COLOURS = ("#006BA4", "#FF800E", "#ABABAB", "#595959", "#5F9ED1")
WORK = ("F", "B", "I", "W")


def table(rows, header):
    """Rows under a header, right-aligned."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(f"{str(h):>{w}}" for h, w in zip(header, widths))]
    lines += ["  ".join(f"{str(c):>{w}}" for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def work_regions(events):
    """The F, B, I, W regions among trace events (real or simulated)."""
    for event in events:
        if event["kind"] == "compute":
            info = trace.label_info(event["label"])
            if info.get("pipeline") in WORK:
                yield event, info


def rank_idles(events, ranks):
    """Each rank's idle time between its first and its last work region, in
    the simulator's units (ms for a real run): the papers' bubble is the
    largest of them."""
    idles = []
    for rank in range(ranks):
        mine = [event for event, _ in work_regions(events) if event["rank"] == rank]
        span = max(e["end"] for e in mine) - min(e["start"] for e in mine)
        idles.append(Fraction(span - sum(e["end"] - e["start"] for e in mine), UNIT_NS))
    return idles


def makespan(events):
    """First work region's start to the last one's end, all ranks."""
    regions = [event for event, _ in work_regions(events)]
    return Fraction(max(e["end"] for e in regions) - min(e["start"] for e in regions), UNIT_NS)


def show_comparison(events_by_name, p, m, titles, file_name, caption, **header):
    """The schedules' Gantt charts on one time axis (viz.pipeline_chart), each
    panel titled with this lesson's own numbers (``titles``: name -> text)."""
    traces = {name: (trace.make_header(p, **header, **make_schedule(name, p, m).header()),
                     events) for name, events in events_by_name.items()}
    figure = schedule_comparison_figure(traces)
    gantt_axes = figure.axes[0:2 * len(traces):2]   # each Gantt panel, then its memory bars
    for axis, name in zip(gantt_axes, traces):
        axis.set_title(titles[name], fontsize=8, loc="left")
    show_figure(figure, file_name, caption, dpi=80)


def units(value):
    """A time on the simulator's clock, as a fraction when it is one."""
    value = Fraction(value)
    return str(value) if value.denominator == 1 else f"{float(value):.1f}"


# %% [markdown]
# ## 1. The backward in two halves, by hand
#
# One Linear layer computes Y = X Wᵀ + b: X is the batch's inputs (a row
# per example), W the weight matrix (out x in, PyTorch's layout), b the
# bias. (In this section W is the matrix; everywhere else it is the weight
# half.) Given dY, the gradient of the loss with respect to Y, the backward
# computes three things:
#
#     dX = dY W        the input's gradient: what the layer before needs
#     dW = dYᵀ X       the weights' gradient
#     db = Σ dY        the bias's gradient: dY summed over the batch
#
# The first is the input half I, the other two the weight half W. They share
# nothing but dY: dX does not need dW, and dW does not need dX. So nothing
# forces them to run together, only the habit of one `backward()`.
#
# The layer is the one lesson 10 ran (after Tim Dettmers, "Model Parallelism
# in Deep Learning", 2014): 1000 inputs, 500 outputs, a batch of 128, in
# float32. First the three products in plain NumPy; then the layer's plain
# `backward()`; then the same backward split, by minidist's
# `backward_input(y, dY, inputs=[x])`, which runs I (the gradient reaches
# the inputs named) and returns W still to run, the *pending* W (its
# `nbytes`: what it keeps until then), and its `backward_weight()`, W.

# %%
LAYER_IN, LAYER_OUT, LAYER_BATCH = 1000, 500, 128
nn.init.manual_seed(0)
layer = nn.Linear(LAYER_IN, LAYER_OUT)
data = np.random.default_rng(0)
X = data.normal(size=(LAYER_BATCH, LAYER_IN)).astype(np.float32)
dY = data.normal(size=(LAYER_BATCH, LAYER_OUT)).astype(np.float32)
weight = layer.weight.data

dX_hand = dY @ weight           # (128, 500) x (500, 1000)
dW_hand = dY.T @ X              # (500, 128) x (128, 1000)
db_hand = dY.sum(axis=0)        # (500,)
print(f"dX = dY W:    {dY.shape} x {weight.shape} -> {dX_hand.shape}")
print(f"dW = dY^T X:  {dY.T.shape} x {X.shape} -> {dW_hand.shape}")
print(f"db = sum dY:  {dY.shape} -> {db_hand.shape}")


def fresh_forward():
    """The layer's forward again, on a fresh input leaf, no gradient held."""
    for parameter in layer.parameters():
        parameter.grad = None
    x = Tensor(X, requires_grad=True)
    return x, layer(x)


x, y = fresh_forward()
y.backward(dY)                                              # the plain backward
plain = {"dX": x.grad.copy(), "dW": layer.weight.grad.copy(), "db": layer.bias.grad.copy()}

x, y = fresh_forward()
# I: x.grad now; returns the weight half still to run, the *pending* W
pending = backward_input(y, dY, inputs=[x])
after_input = {"dX": x.grad is not None, "dW": layer.weight.grad is not None,
               "db": layer.bias.grad is not None}
pending_bytes = pending.nbytes
print(f"\nafter I: x.grad set {after_input['dX']}, weight.grad set {after_input['dW']}, "
      f"bias.grad set {after_input['db']}; the pending W keeps {pending_bytes:,} bytes")
pending.backward_weight()                                   # W
split = {"dX": x.grad, "dW": layer.weight.grad, "db": layer.bias.grad}
hand = {"dX": dX_hand, "dW": dW_hand, "db": db_hand}

rows = [(name, np.array_equal(split[name], plain[name]), np.array_equal(hand[name], plain[name]),
         f"{float(np.abs(hand[name] - plain[name]).max()):.1e}") for name in plain]
print(table(rows, ("gradient", "I + W == backward()", "NumPy == backward()",
                   "largest |NumPy - backward()|")))
kept_formula = LAYER_BATCH * (LAYER_IN + LAYER_OUT) * X.itemsize
print(f"W keeps {pending_bytes:,} bytes; batch x (in + out) x itemsize = "
      f"{LAYER_BATCH} x ({LAYER_IN} + {LAYER_OUT}) x {X.itemsize} = {kept_formula:,}")

# %% jupyter={"source_hidden": true}
split_equal = all(np.array_equal(split[name], plain[name]) for name in plain)
hand_equal = all(np.array_equal(hand[name], plain[name]) for name in plain)
glue("split_equal", split_equal)
glue("split_verdict", "the same bits as the plain backward, for all three (np.array_equal "
     "on every one)" if split_equal else "not the same bits as the plain backward for "
     + ", ".join(name for name in plain if not np.array_equal(split[name], plain[name])))
glue("hand_equal", hand_equal)
glue("hand_verdict", "equal bit for bit too: the library runs the same three NumPy "
     "expressions" if hand_equal else "within the rounding shown in the last column, not "
     "bit for bit: the library's products are not written exactly as these")
glue("input_only", after_input["dX"] and not after_input["dW"] and not after_input["db"])
glue("pending_bytes", pending_bytes, ",")
glue("kept_formula", kept_formula, ",")
glue("kept_verdict", "exactly" if pending_bytes == kept_formula else
     ("more than" if pending_bytes > kept_formula else "less than"))
say("""
Splitting the backward changes nothing in the result: I then W gave
{glue}`split_verdict`. The NumPy products by hand are {glue}`hand_verdict`.

After I the input's gradient was there and neither the weight's nor the bias's
(the line above the table: `x.grad set True`, `weight.grad set False`). What the pending W keeps is
what dW and db are made of, dY and X: {glue}`pending_bytes` bytes,
{glue}`kept_verdict` batch x (in + out) x 4 bytes = {glue}`kept_formula`. The weight
matrix itself is not counted: the model keeps it anyway.
""")

# %% [markdown]
# **What each half costs.** dX and dW are one product each of the same size
# (128 x 500 x 1000 multiply-adds), db a sum. So I and W should each take
# about half of the whole backward. The times below are each part's fastest
# of several runs, on one BLAS thread (a run the operating system
# interrupted is longer, never shorter), the variants taking turns:

# %%
TIMING_REPEATS = 8 if QUICK else 25


def time_halves(forward, repeats, gradient):
    """Every timed forward, whole backward, I and W of ``forward()``'s graph
    (s): {"F": [...], "B": [...], "I": [...], "W": [...]}."""
    best = {"F": [], "B": [], "I": [], "W": []}
    with blas_limit(1):
        for repeat in range(repeats + 1):     # the first round warms up
            for variant in (("whole", "split") if repeat % 2 else ("split", "whole")):
                start = time.perf_counter()
                x, y = forward()
                middle = time.perf_counter()
                if variant == "whole":
                    y.backward(gradient)
                    end = time.perf_counter()
                    if repeat:
                        best["F"].append(middle - start)
                        best["B"].append(end - middle)
                else:
                    waiting = backward_input(y, gradient, inputs=[x])
                    between = time.perf_counter()
                    waiting.backward_weight()
                    end = time.perf_counter()
                    if repeat:
                        best["I"].append(between - middle)
                        best["W"].append(end - between)
    return best


def fastest(samples):
    return {letter: min(times) for letter, times in samples.items()}


def timing_noise(samples):
    """How far these timings move from run to run: the median's distance from
    the fastest, for the whole backward and for the two halves together (s)."""
    split_times = [i + w for i, w in zip(samples["I"], samples["W"])]
    return (float(np.median(samples["B"])) - min(samples["B"])
            + float(np.median(split_times)) - min(split_times))


layer_load = Load.start()
layer_samples = time_halves(fresh_forward, TIMING_REPEATS, dY)
layer_times, layer_noise = fastest(layer_samples), timing_noise(layer_samples)
layer_load = layer_load.finish()
gemm_flops = 2 * LAYER_BATCH * LAYER_IN * LAYER_OUT
rows = [(part, f"{1e3 * layer_times[part]:.3f}", what) for part, what in (
    ("F", "Y = X W^T + b: one product"), ("B", "dX, dW and db"), ("I", "dX: one product"),
    ("W", "dW (one product) and db"))]
print(table(rows, ("part", "ms", "what it computes")))
print(f"one product: 2 x {LAYER_BATCH} x {LAYER_IN} x {LAYER_OUT} = {gemm_flops / 1e6:.0f} "
      f"Mflop; I / B = {layer_times['I'] / layer_times['B']:.2f}, "
      f"W / B = {layer_times['W'] / layer_times['B']:.2f}, "
      f"(I + W) / B = {(layer_times['I'] + layer_times['W']) / layer_times['B']:.2f}")
print(f"I + W - B = {1e3 * (layer_times['I'] + layer_times['W'] - layer_times['B']):+.3f} ms; "
      f"the timings' noise (median minus fastest, of B and of I + W): {1e3 * layer_noise:.3f} ms")
print(f"({layer_load.describe()})")
if layer_load.busy:
    print(layer_load.note("the flops above are what the halves do, whatever the clock says"))

# %% jupyter={"source_hidden": true}
i_share = layer_times["I"] / layer_times["B"]
w_share = layer_times["W"] / layer_times["B"]
both_share = (layer_times["I"] + layer_times["W"]) / layer_times["B"]
glue("i_share", i_share, ".2f")
glue("w_share", w_share, ".2f")
glue("both_share", both_share, ".2f")
glue("gemm_mflop", gemm_flops / 1e6, ".0f")
halves = 0.35 <= i_share <= 0.65 and 0.35 <= w_share <= 0.65
glue("halves_verdict", "each about half of the whole backward, as one product each predicts"
     if halves else
     "not each about half of the whole backward here (the prediction is 0.5 each): on "
     "a machine this small one product's time is not its flops alone")
layer_overhead = layer_times["I"] + layer_times["W"] - layer_times["B"]
glue("layer_overhead", 1e3 * layer_overhead, "+.3f")
glue("layer_noise", 1e3 * layer_noise, ".3f")
glue("overhead_verdict", "more than the whole backward by more than the timings' noise; the "
     "split's extra work shows here, a second walk of the graph to find which side each node "
     "is on (a Python step per node)" if layer_overhead > layer_noise else
     "no more than the whole backward beyond the timings' noise; the split's extra work, a "
     "second walk of the graph to find which side each node is on (a Python step per node), "
     "is too small to see next to two products of this size")
glue("one_product", "it took about one product's time, not two" if halves else
     "its time here does not tell it as clearly")
say("""
I took {glue}`i_share` and W {glue}`w_share` of the whole backward's time:
{glue}`halves_verdict` ({glue}`gemm_mflop` Mflop each). Together they took
{glue}`both_share` of it, I + W - B = {glue}`layer_overhead` ms against a noise of
{glue}`layer_noise` ms: {glue}`overhead_verdict`. That I computes no dW is known from
the weight's `.grad`, still empty after it; and {glue}`one_product`.
""")

# %% [markdown]
# ## 2. The bubble on the virtual clock
#
# In 1F1B (lesson 9) a stage runs B = I + W as one block, and the stage
# before waits for all of it. Split, the stage before waits only for I, and
# each W can go later, where the stage would have idled. Four schedules do
# this, each written as data in `zero_bubble.py`:
#
# * **ZB-H1** (Qi et al.): 1F1B's order with the backward split, and on
#   rank i the W's run i rounds late (a *round* is one F + I slot of 1F1B's
#   steady state), the last of them in its cool-down. Every rank then holds
#   p micro-batches' activations, 1F1B's first rank's peak;
# * **ZB-H2** (Qi et al.): twice the warm-up forwards and the W's 2i rounds
#   late: up to 2p - 1 micro-batches held, no idle inside a rank when
#   F = I = W;
# * **ZB-V** (Qi et al.): the model cut into 2p pieces laid out in a V
#   (below), two on each rank, F, I and W of a piece each half a rank's;
#   no idle inside a rank when F = I = W, p ranks' worth of activations
#   held;
# * **DualPipeV** (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, and
#   their DualPipe repository: DualPipe cut in half, after Penghui Qi,
#   Xinyi Wan, Guangxing Huang, Min Lin, "DualPipe Could Be Better without
#   the Dual", Sea AI Lab blog, 2025): the same V, and in the middle of the
#   batch a forward paired with another micro-batch's backward, which a GPU
#   runs overlapped (one's computation hides the other's messages). Each
#   simulated rank, like a CPU process, runs the two one after the other.
#
# In this section and the next a *rank* is one process of the pipeline and
# a *piece* one of the model's parts; 1F1B, ZB-H1 and ZB-H2 give each rank
# one piece (lesson 9's stage), ZB-V and DualPipeV two. The papers'
# formulas for the bubble are for a rank's idle time between its first and
# its last work of the batch, the largest over the ranks, with every rank
# costing the same F, I, W and free messages. Written in
# this course's letters (Qi et al. write B for I; DualPipe's table writes B
# for the whole backward I + W and F&B for a pair, F + B on one process):
#
#     1F1B       (p-1)(F + I + W)
#     ZB-H1      (p-1)(F + I - W)                      (m >= p, W <= F and W <= I)
#     ZB-H2      (p-1)(F + I - 2W)                     (m >= 2p-1, same conditions)
#     ZB-V       0 when F = I = W                      (m >= 2p-1)
#     DualPipeV  (p-1)(F&B + B - 3W), each a piece's   (m >= 2p, F = I, W <= F)
#
# (DualPipe's README writes PP/2 - 1 for p - 1: its PP counts the 2p
# pieces, on p ranks.) A piece of ZB-V or DualPipeV costs half a rank's,
# so DualPipeV's formula in a rank's F, I, W is (p-1)(F + 2I - W)/2.
# ZB-V with W halved has no formula. The peak memory is counted in a
# rank's activations of one micro-batch, one piece holding half of that.
# Its formulas: p for 1F1B (its first rank), ZB-H1 and ZB-V; 2p - 1 for
# ZB-H2; for DualPipeV 2p + 1 pieces (the DualPipe README's PP + 1), that
# is p + 1/2.
#
# The simulator plays each schedule with exactly these costs. Its clock
# counts whole nanoseconds and one unit of time here is 10^6 of them,
# which the charts' axes and section 3 call a millisecond (one unit = one ms =
# 10^6 ns of the clock), so every time below is exact, and the code checks
# each against its formula for equality. First p = 4, m = 8, then p = 2,
# m = 4 (the shape section 3 runs), each with F = I = W = 1 and with
# F = I = 2, W = 1 (W half as long as F and I). In the tables, *bubble* is
# that idle time of the busiest rank; *makespan* the batch's time, from its
# first work to its last, on any rank; *idle share* lesson 9's bubble, the
# idle part of p x makespan.

# %%
SHAPES = ((4, 8), (2, 4))
RATIOS = ((1, 1, 1), (2, 2, 1))


def plan(name, p, m, F, I, W):  # noqa: E741 - I: the input half
    """``name`` on p ranks, m micro-batches, a stage's F, I, W; a piece of
    a V costs half; 1F1B runs B = I + W whole."""
    schedule = make_schedule(name, p, m)
    v = schedule.virtual_stages
    if name == "1f1b":
        return schedule, simulate_schedule(schedule, F, I + W)
    return schedule, simulate_schedule(schedule, Fraction(F, v), Fraction(I + W, v),
                                       weight_time=Fraction(W, v))


def idle_formula(name, p, F, I, W):  # noqa: E741
    """The papers' bubble in a stage's F, I, W (None where they give none)."""
    F, I, W = Fraction(F), Fraction(I), Fraction(W)  # noqa: E741
    return {"1f1b": (p - 1) * (F + I + W), "zb_h1": (p - 1) * (F + I - W),
            "zb_h2": (p - 1) * (F + I - 2 * W), "zbv": Fraction(0) if F == I == W else None,
            "dualpipev": (p - 1) * (F + 2 * I - W) / 2}[name]


def memory_formula(name, p):
    """Peak activations held, in a stage's of one micro-batch (m large enough)."""
    return {"1f1b": Fraction(p), "zb_h1": Fraction(p), "zb_h2": Fraction(2 * p - 1),
            "zbv": Fraction(p), "dualpipev": Fraction(2 * p + 1, 2)}[name]


planned = {}   # (p, m, ratio, name) -> the numbers of one row
for p, m in SHAPES:
    for ratio in RATIOS:
        F, I, W = ratio  # noqa: E741
        print(f"\np = {p}, m = {m}, F = {F}, I = {I}, W = {W} (work per stage m(F+I+W) = "
              f"{m * (F + I + W)})")
        rows = []
        for name in NAMES:
            schedule, events = plan(name, p, m, F, I, W)
            idle = max(rank_idles(events, p))
            formula = idle_formula(name, p, F, I, W)
            if formula is not None:
                assert idle == formula, (name, p, m, ratio, idle, formula)
            peak = Fraction(max(peak_live_microbatches(events).values()), schedule.virtual_stages)
            assert peak == memory_formula(name, p), (name, peak)
            row = dict(idle=idle, formula=formula, makespan=makespan(events),
                       share=bubble_fraction(events, p), peak=peak, events=events)
            planned[(p, m, ratio, name)] = row
            rows.append((TITLES[name], units(idle), "-" if formula is None else units(formula),
                         units(row["makespan"]), f"{row['share']:.3f}", units(peak),
                         units(memory_formula(name, p))))
        print(table(rows, ("schedule", "bubble", "formula", "makespan", "idle share",
                           "peak memory", "formula")))


def row(p, m, ratio, name):
    return planned[(p, m, ratio, name)]


def rank_bounds(events, ranks):
    """Each rank's first work's start and last work's end."""
    regions = [event for event, _ in work_regions(events)]
    origin = min(e["start"] for e in regions)
    return ([Fraction(min(e["start"] for e in regions if e["rank"] == r) - origin, UNIT_NS)
             for r in range(ranks)],
            [Fraction(max(e["end"] for e in regions if e["rank"] == r) - origin, UNIT_NS)
             for r in range(ranks)])


EQUAL, UNEQUAL = RATIOS
h2_starts, h2_ends = rank_bounds(row(4, 8, EQUAL, "zb_h2")["events"], 4)
print("\nZB-H2, p = 4, m = 8, F = I = W = 1, each rank's first start and last end: "
      + "; ".join(f"rank {r} {units(a)} to {units(b)}" for r, (a, b)
                  in enumerate(zip(h2_starts, h2_ends))))

# %% jupyter={"source_hidden": true}
glue("shapes_checked", len(SHAPES) * len(RATIOS) * len(NAMES), "d")
glue("formulas_checked", sum(r["formula"] is not None for r in planned.values()), "d")
glue("h1_equal_makespan", float(row(4, 8, EQUAL, "zb_h1")["makespan"]), "g")
glue("h2_equal_makespan", float(row(4, 8, EQUAL, "zb_h2")["makespan"]), "g")
glue("f1b_equal_makespan", float(row(4, 8, EQUAL, "1f1b")["makespan"]), "g")
glue("v_equal_makespan", float(row(4, 8, EQUAL, "zbv")["makespan"]), "g")
glue("dp_equal_makespan", float(row(4, 8, EQUAL, "dualpipev")["makespan"]), "g")
glue("h2_unequal_makespan", float(row(4, 8, UNEQUAL, "zb_h2")["makespan"]), "g")
glue("h1_unequal_makespan", float(row(4, 8, UNEQUAL, "zb_h1")["makespan"]), "g")
glue("v_unequal_idle", float(row(4, 8, UNEQUAL, "zbv")["idle"]), "g")
h2_vs_h1_equal = row(4, 8, EQUAL, "zb_h2")["makespan"] - row(4, 8, EQUAL, "zb_h1")["makespan"]
glue("h2_vs_h1_equal", "the same as" if h2_vs_h1_equal == 0 else
     "shorter than" if h2_vs_h1_equal < 0 else "longer than")
h2_vs_h1_unequal = (row(4, 8, UNEQUAL, "zb_h2")["makespan"]
                    - row(4, 8, UNEQUAL, "zb_h1")["makespan"])
glue("h2_vs_h1_unequal", "the same as" if h2_vs_h1_unequal == 0 else
     "shorter than" if h2_vs_h1_unequal < 0 else "longer than")
shortest = {ratio: min(NAMES, key=lambda name: row(4, 8, ratio, name)["makespan"])
            for ratio in RATIOS}
glue("shortest_equal", TITLES[shortest[EQUAL]])
glue("shortest_unequal", TITLES[shortest[UNEQUAL]])
glue("v_unequal_makespan", float(row(4, 8, UNEQUAL, "zbv")["makespan"]), "g")
if shortest[EQUAL] == shortest[UNEQUAL] == "zbv":
    glue("shortest_text", "**the V is the shortest**: ZB-V's batch took the least time with "
         f"both ratios ({units(row(4, 8, EQUAL, 'zbv')['makespan'])} and "
         f"{units(row(4, 8, UNEQUAL, 'zbv')['makespan'])} units). Its pieces cost half a stage, "
         "so its slant is half as long, and it holds p stages' activations, as 1F1B's first "
         "stage does")
else:
    glue("shortest_text", f"**the shortest** was {TITLES[shortest[EQUAL]]} with equal costs and "
         f"{TITLES[shortest[UNEQUAL]]} with W halved, not the V every time")
glue("h2_equal_idle", float(row(4, 8, EQUAL, "zb_h2")["idle"]), "g")
glue("v_equal_idle", float(row(4, 8, EQUAL, "zbv")["idle"]), "g")
glue("dp_peak", float(row(4, 8, EQUAL, "dualpipev")["peak"]), "g")
glue("v_peak", float(row(4, 8, EQUAL, "zbv")["peak"]), "g")
glue("f1b_peak", float(row(4, 8, EQUAL, "1f1b")["peak"]), "g")
glue("all_makespans", {f"{p},{m},{ratio[0]}{ratio[1]}{ratio[2]},{name}":
                       float(planned[(p, m, ratio, name)]["makespan"])
                       for (p, m, ratio, name) in planned})
glue("h2_starts", [float(v) for v in h2_starts])
glue("h2_ends", [float(v) for v in h2_ends])
glue("h2_last_start", float(h2_starts[-1]), "g")
glue("h2_first_end", float(h2_ends[0]), "g")
glue("h2_last_end", float(h2_ends[-1]), "g")
h2_slant = all(h2_starts[r] == r and h2_ends[r] == h2_ends[0] + r for r in range(4))
glue("h2_slant", "starts r units after rank 0 and ends r units after it" if h2_slant else
     "does not start and end r units after rank 0")
dp_vs_h1 = row(4, 8, EQUAL, "dualpipev")["makespan"] - row(4, 8, EQUAL, "zb_h1")["makespan"]
glue("dp_vs_h1", "the same as" if dp_vs_h1 == 0 else
     "shorter than" if dp_vs_h1 < 0 else "longer than")
glue("dp_unequal_makespan", float(row(4, 8, UNEQUAL, "dualpipev")["makespan"]), "g")
dp_vs_h1_unequal = (row(4, 8, UNEQUAL, "dualpipev")["makespan"]
                    - row(4, 8, UNEQUAL, "zb_h1")["makespan"])
glue("dp_vs_h1_unequal", "the same as" if dp_vs_h1_unequal == 0 else
     "shorter than" if dp_vs_h1_unequal < 0 else "longer than")
say("""
Every bubble that has a formula equals it exactly ({glue}`formulas_checked` of the
{glue}`shapes_checked` rows have one), and every peak its memory formula (all
{glue}`shapes_checked`; the code asserts each). Three things the table says
that the formulas alone do not:

* **the makespan is what a step costs**, and it counts more than the bubble inside
  a stage. With F = I = W at p = 4, ZB-H2 has no bubble at all, yet its batch took
  {glue}`h2_equal_makespan` units, {glue}`h2_vs_h1_equal` ZB-H1's {glue}`h1_equal_makespan`
  (1F1B: {glue}`f1b_equal_makespan`). Its rank r {glue}`h2_slant` (the line under the
  tables: rank 0 ends at {glue}`h2_first_end`, rank 3 starts at {glue}`h2_last_start` and
  ends at {glue}`h2_last_end`): the batch is a parallelogram, and its slant is idle time
  of the step (the "idle share" column, lesson 9's bubble). Qi et al. fill it with the
  next batch's forwards, by not waiting for the optimizer step to be synchronised
  (their "post-validation"); a schedule with a synchronous step, as here, keeps
  it. With W half of F and I, ZB-H2's {glue}`h2_unequal_makespan` is
  {glue}`h2_vs_h1_unequal` ZB-H1's {glue}`h1_unequal_makespan`.
* {glue}`shortest_text`. With unequal costs ZB-V idles
  ({glue}`v_unequal_idle` units on its busiest rank), and the paper has no formula
  for it (Qi et al. then build the V from the measured times).
* **DualPipeV, each rank running a pair's two halves one after the other**, took
  {glue}`dp_equal_makespan` units with F = I = W, {glue}`dp_vs_h1` ZB-H1's, and
  {glue}`dp_unequal_makespan` with W halved, {glue}`dp_vs_h1_unequal` ZB-H1's
  {glue}`h1_unequal_makespan`: it is built for a GPU, where a pair's forward and
  backward overlap and F&B is less than F + B. Here F&B = F + B, and what is left is
  its V and its memory, half a rank's more than ZB-V's.
""")

# %% [markdown]
# The charts of p = 4, m = 8, with F = I = W and with W halved: one row per
# rank (the charts' rows are labelled "stage" for a rank), each box a
# forward (in its micro-batch's colour), a whole backward, an input half I or
# a weight half W (their own two colours, so the eye finds where the W's
# went); DualPipeV's pairs are framed. The column on the right is each
# rank's peak of live activations (micro-batches, or pieces for the V).

# %%
for ratio, file_name, words in ((EQUAL, "zero_bubble_equal.png", "F = I = W = 1"),
                                (UNEQUAL, "zero_bubble_unequal.png", "F = I = 2, W = 1")):
    titles = {}
    for name in NAMES:
        r = row(4, 8, ratio, name)
        formula = "no formula" if r["formula"] is None else f"formula {units(r['formula'])}"
        titles[name] = (f"{TITLES[name]}: the busiest rank idles {units(r['idle'])} ({formula}), "
                        f"makespan {units(r['makespan'])}, idle share {r['share']:.3f}")
    show_comparison({name: row(4, 8, ratio, name)["events"] for name in NAMES}, 4, 8, titles,
                    file_name, f"1F1B, ZB-H1, ZB-H2, ZB-V, DualPipeV, p = 4, m = 8, {words}, "
                    "planned (time in ms of the clock: 1 unit = 1 ms)")

# %% [markdown]
# The bubble, the makespan and the memory per schedule, both ratios, on one
# picture:

# %%
figure, axes = plt.subplots(1, 3, figsize=(12, 3.6))
positions = np.arange(len(NAMES))
for offset, ratio, label in ((-0.2, EQUAL, "F = I = W = 1"), (0.2, UNEQUAL, "F = I = 2, W = 1")):
    for axis, key in zip(axes[:2], ("idle", "makespan")):
        axis.bar(positions + offset, [float(row(4, 8, ratio, name)[key]) for name in NAMES],
                 width=0.4, label=label, color=COLOURS[0 if ratio == EQUAL else 1])
axes[2].bar(positions, [float(row(4, 8, EQUAL, name)["peak"]) for name in NAMES], width=0.5,
            color=COLOURS[3])
titles = ("bubble: the busiest rank's idle time\n(ms of the clock)",
          "makespan: one batch\n(ms of the clock)",
          "peak activations\n(a rank's for one micro-batch)")
for axis, title in zip(axes, titles):
    axis.set_xticks(positions, [TITLES[name] for name in NAMES], fontsize=8)
    axis.set_title(title, fontsize=9)
axes[0].legend(fontsize=8)
figure.suptitle("p = 4 ranks, m = 8 micro-batches, on the simulator", fontsize=10)
figure.tight_layout()
show_figure(figure, "zero_bubble_bars.png", "bubble, makespan and peak memory per schedule")

# %% [markdown]
# **The V placement.** ZB-V and DualPipeV cut the model into 2p pieces
# (numbered 0 .. 2p - 1 along the model; the code calls this number the
# piece's "stage") and give rank r two of them: pieces r and 2p - 1 - r.
# Rank 0 holds the first and the last piece; the last rank, p - 1, holds
# pieces p - 1 and p, the two in the middle. A micro-batch goes
# down the ranks through the first half of the model and comes back up
# through the second: the bottom of the V is the last rank, which hands its
# activation from one of its pieces to the other in memory, without a
# message. Rank 0 starts the forward and ends it with the loss, so the
# backward starts on the rank where the forward began. Where each rank's
# pieces sit, for p = 4, then the schedule's printout for p = 2, m = 4 (its
# header's "stages" are ranks, and it calls a rank's two pieces its
# "virtual stages"):

# %%
v_schedule = make_schedule("zbv", 4, 8)
for rank in range(4):
    stages = [v_schedule.stage_of(rank, chunk) for chunk in range(2)]
    print(f"rank {rank}: its piece 0 = piece {stages[0]} of the model, "
          f"its piece 1 = piece {stages[1]}")
print()
print(make_schedule("zbv", 2, 4))

# %% [markdown]
# The printout is ZB-V with p = 2, m = 4: each rank's actions in order.
# `F0` is micro-batch 0's forward on the rank's piece 0, `F0c1` on its piece
# 1; `send_act(0)->1` sends that activation to rank 1, `recv_grad(0)<-1`
# waits for a gradient from it. Rank 1 runs `F0` (piece 1 of the model) and
# at once `F0c1` (piece 2) with no message between them: the turn of the V.
# Rank 0's `F0c1` is piece 3, the last, so its `I0c1` needs no message to
# start. The
# W's come where a rank would wait: rank 1 ends with three W's left while
# rank 0 finishes.
#
# ## 3. On real processes
#
# Now the same five schedules run on 2 processes by `Pipeline`, which
# executes each rank's list of actions: an I is `backward_input` on the
# stage's graph, its W the pending `backward_weight()`, and the gradient
# goes to the stage before right after the I. The model is four 1024 x 1024
# Linear layers with ReLUs between them, in float64, cut into two stages of
# two layers (four pieces of one layer for the V); a batch of 512 random
# examples in m = 4 micro-batches, a few SGD steps per schedule (the
# schedules taking turns, step after step, so that the machine's other work
# slows them alike) and every step's trace kept. The same steps on one
# process give the reference weights.

# %%
WIDTH, BATCH, M_REAL, LAYERS = 1024, 512, 4, 4
STEPS = 6 if QUICK else 10
LR = 0.05


def make_mlp(layers=LAYERS, width=WIDTH, seed=0):
    """``layers`` width x width Linears, ReLU between them, float64."""
    nn.init.manual_seed(seed)
    modules = []
    for index in range(layers):
        modules.append(nn.Linear(width, width))
        if index + 1 < layers:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules).to(np.float64)


def synthetic_batch(width=WIDTH, batch=BATCH):
    rng = np.random.default_rng(0)  # the same batch on every rank
    return rng.normal(size=(batch, width)), rng.integers(0, width, batch)


def run_schedules(names, microbatches, steps, layers=LAYERS, width=WIDTH, batch=BATCH):
    """Every schedule of ``names`` on this launch's ranks: each step's trace
    events of this rank, and the weights at the end by name."""
    recorder = trace.current()
    x, y = synthetic_batch(width, batch)
    models = {name: make_mlp(layers, width) for name in names}
    pipes = {name: Pipeline(models[name], name, microbatches) for name in names}
    optimizers = {name: optim.SGD(pipes[name].parameters(), lr=LR) for name in names}
    per_step = {name: [] for name in names}
    # The schedules take turns, step after step: a burst of the machine's
    # other work then slows all of them, not the one that ran during it.
    for step in range(steps):
        for name in names[step % len(names):] + names[:step % len(names)]:
            first = len(recorder.events)
            pipes[name].step(x, y, nn.CrossEntropyLoss(), optimizers[name])
            per_step[name].append([dict(zip(trace.FIELDS, e)) for e in recorder.events[first:]])
    kept = {}
    for name in names:
        names_of = {id(p): n for n, p in models[name].named_parameters()}
        kept[name] = dict(steps=per_step[name], weights={names_of[id(p)]: p.data.copy()
                                                         for p in pipes[name].parameters()})
    return kept


def one_process(steps, layers=LAYERS, width=WIDTH, batch=BATCH):
    model = make_mlp(layers, width)
    optimizer = optim.SGD(model.parameters(), lr=LR)
    x, y = synthetic_batch(width, batch)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(Tensor(x)), y).backward()
        optimizer.step()
    return {name: p.data for name, p in model.named_parameters()}


real_start = time.perf_counter()
real = minidist.launch(run_schedules, world_size=2, args=(NAMES, M_REAL, STEPS),
                       trace=OUT / "zero_bubble_p2.jsonl", timeout=600)
real_seconds = time.perf_counter() - real_start
real_load = Load(trace.read_jsonl(OUT / "zero_bubble_p2.jsonl").header.get("load")
                 or machine_load(), machine_load(), len(os.sched_getaffinity(0)))


def largest_differences(results, reference, names):
    """Per schedule, the largest difference of any weight from one process's."""
    differences = {}
    for name in names:
        found = {}
        for per_rank in results:
            found.update(per_rank[name]["weights"])
        assert set(found) == set(reference), name
        differences[name] = max(float(np.abs(found[n] - reference[n]).max()) for n in reference)
    return differences


differences = largest_differences(real, one_process(STEPS), NAMES)
print("largest weight difference against one process, after "
      f"{STEPS} steps: " + ", ".join(f"{TITLES[n]} {differences[n]:.1e}" for n in NAMES))

# %% jupyter={"source_hidden": true}
worst_difference = max(differences.values())
glue("worst_difference", worst_difference, ".1e")
glue("real_steps", STEPS, "d")
glue("difference_verdict", "the same weights as one process to float64's rounding"
     if worst_difference < 1e-10 else "weights further from one process's than float64's "
     "rounding explains")
glue("why_not_zero", "(Not zero: one process adds the whole batch's gradient in one product, "
     "the pipeline adds the micro-batches' gradients one after the other, in another order of "
     "rounding.)" if worst_difference > 0 else "(Zero: the same bits.)")
say("""
All five schedules end with {glue}`difference_verdict`: the largest difference over
every weight, after {glue}`real_steps` steps, is {glue}`worst_difference`.
{glue}`why_not_zero`
""")


# %% [markdown]
# **The bubble, measured.** Three numbers per schedule of the papers' bubble
# (the busiest rank's idle time between its first and its last work of the
# batch), each the median over the steps after the first, which also pays
# for starting up:
#
# * the **formula**, with every stage costing the same F, I, W (B for
#   1F1B): in each step the mean over this run's stages, the first left
#   out, since its I computes nothing (below), a piece's for the V; the
#   median of those over the steps is printed next to the formula, which
#   is computed from exactly these costs (DualPipeV's in a piece's costs,
#   (p-1)(F + 2I - W), since a pair is F + I + W on one process). Then
#   whether the formula's conditions hold for those costs: 1F1B's has none;
#   where the others' do not, ZB-H1's, ZB-H2's and DualPipeV's formula is
#   only a lower bound, shown as 0 when it falls below, and ZB-V has no
#   formula at all ("-");
# * the **replay**: the simulator playing the same schedule with every
#   forward, I and W lasting what it lasted in the run, messages free: what
#   the schedule alone allows with these real, unequal costs;
# * the **measured** idle time of the real trace.
#
# And the makespan, the time the batch took: replayed and measured (the
# medians), and the fastest step measured, which the comparison of the
# schedules uses (a step the machine's other work interrupted is longer,
# never shorter), with its noise: how far the second fastest step lay
# above it. The second table gives the costs per stage; the third, where
# the busiest rank's idle time went in the median step (by idle time), each
# part from that one step, so that they add up to its idle.

# %%
def durations(events):
    """(letter, stage, micro-batch) -> duration in the simulator's units (ms)."""
    return {(info["pipeline"], info["stage"], info["mb"]): (event["end"] - event["start"])
            / UNIT_NS for event, info in work_regions(events)}


def replay(schedule, measured):
    """The schedule on the simulator, each action lasting what it lasted."""
    def whole(stage, mb):
        if ("B", stage, mb) in measured:
            return measured[("B", stage, mb)]
        return measured[("I", stage, mb)] + measured[("W", stage, mb)]

    def weight(stage, mb):
        return measured.get(("W", stage, mb), whole(stage, mb) / 2)

    return simulate_schedule(schedule, lambda s, mb: measured[("F", s, mb)], whole,
                             weight_time=weight)


def stage_costs(measured, stage):
    """One stage's median F, B, I, W over its micro-batches (nan: none ran)."""
    found = {}
    for letter in WORK:
        values = [d for (kind, s, _), d in measured.items() if kind == letter and s == stage]
        found[letter] = float(np.median(values)) if values else float("nan")
    return found


def equal_stage_costs(measured):
    """F, B, I, W as the formulas want them, one for every stage: the mean
    over the stages but the first."""
    found = {}
    for letter in WORK:
        values = [d for (kind, s, _), d in measured.items() if kind == letter and s > 0]
        found[letter] = float(np.mean(values)) if values else float("nan")
    return found


def real_formula(name, costs, p):
    """The papers' bubble with one F, B, I, W for every stage (a piece's for
    the V), never below 0 (an idle time), and whether its conditions hold
    (None: 1F1B's has none). ZB-V's is None where its conditions fail: no
    formula then."""
    value, holds = _real_formula(name, costs, p)
    if value is None:
        return None, holds
    return max(value, 0.0), holds


#: What each formula is made of, in the costs it is printed with.
FORMULA_TEXT = {"1f1b": "(p-1)(F + B)", "zb_h1": "(p-1)(F + I - W)",
                "zb_h2": "(p-1)(F + I - 2W)", "zbv": "0 if F = I = W",
                "dualpipev": "(p-1)(F + 2I - W)"}


def _real_formula(name, costs, p):
    F, B, I, W = (costs[letter] for letter in WORK)  # noqa: E741
    about = lambda a, b: abs(a - b) <= 0.1 * max(a, b)  # equal within a tenth
    if name == "1f1b":
        return (p - 1) * (F + B), None
    if name == "zb_h1":
        return (p - 1) * (F + I - W), W <= F and W <= I
    if name == "zb_h2":
        return (p - 1) * (F + I - 2 * W), W <= F and W <= I
    if name == "zbv":
        holds = about(F, I) and about(I, W) and about(F, W)
        return (0.0 if holds else None), holds
    # DualPipeV: a pair is F + B on one process, B = I + W a whole backward:
    # (p-1)(F&B + B - 3W) = (p-1)(F + 2I - W), in a piece's costs
    return (p - 1) * (F + 2 * I - W), about(F, I) and W <= F


def step_events(results, name, step):
    return [event for per_rank in results for event in per_rank[name]["steps"][step]]


def idle_parts(events, rank):
    """Where a rank's idle time went between its first and last work, in ms:
    each moment of a gap between two work regions is in a receive (waiting
    for a message, then copying it in), else in a send (copying one out; an
    isend's event runs until it completes, often under later work, which is
    not counted), else between actions (the runtime's own Python)."""
    regions = sorted((e["start"], e["end"]) for e, _ in work_regions(events) if e["rank"] == rank)
    mine = [e for e in events if e["rank"] == rank]
    receives = sorted((e["start"], e["end"]) for e in mine if e["kind"] == "recv")
    sends = sorted((e["start"], e["end"]) for e in mine if e["kind"] == "send")
    found = dict(receives=0, sends=0, between=0)
    for (_, a), (b, _) in zip(regions, regions[1:]):
        if b <= a:
            continue
        cuts = sorted({a, b} | {t for start, end in receives + sends for t in (start, end)
                                if a < t < b})
        for left, right in zip(cuts, cuts[1:]):
            middle = (left + right) / 2
            if any(start <= middle <= end for start, end in receives):
                found["receives"] += right - left
            elif any(start <= middle <= end for start, end in sends):
                found["sends"] += right - left
            else:
                found["between"] += right - left
    return {key: ticks / UNIT_NS for key, ticks in found.items()}


def measure_run(results, names, p, m, steps):
    """Per schedule: the medians over the steps after the first; the formula
    from the median costs (over the steps) it is printed with; where the
    busiest rank's idle went, all from the median step (by its idle time)."""
    found = {}
    for name in names:
        schedule = make_schedule(name, p, m)
        per_step = []
        for step in range(1, steps):
            events = step_events(results, name, step)
            measured = durations(events)
            replayed = replay(schedule, measured)
            idles = rank_idles(events, p)
            busiest = max(range(p), key=lambda r: idles[r])
            parts = idle_parts(events, busiest)
            per_step.append(dict(costs=equal_stage_costs(measured), busiest=busiest,
                                 in_sends=parts["sends"], in_receives=parts["receives"],
                                 between=parts["between"],
                                 replay=float(max(rank_idles(replayed, p))),
                                 measured=float(max(idles)),
                                 makespan=float(makespan(events)),
                                 replay_makespan=float(makespan(replayed)),
                                 share=bubble_fraction(events, p),
                                 replay_share=bubble_fraction(replayed, p),
                                 stages=[stage_costs(measured, s)
                                         for s in range(schedule.total_stages)]))
        row = {key: float(np.median([entry[key] for entry in per_step]))
               for key in ("replay", "measured", "makespan", "replay_makespan", "share",
                           "replay_share")}
        # Where the idle went: the median step's own parts, which add up to its idle.
        middle = sorted(per_step, key=lambda entry: entry["measured"])[(len(per_step) - 1) // 2]
        row.update(busiest=middle["busiest"], middle_idle=middle["measured"],
                   in_sends=middle["in_sends"], in_receives=middle["in_receives"],
                   between=middle["between"])
        # A step the machine's other work interrupted is longer, never shorter;
        # how far the second fastest lay above the fastest is this noise.
        spans = sorted(entry["makespan"] for entry in per_step)
        row["fastest"] = spans[0]
        row["fastest_noise"] = spans[1] - spans[0]
        row["costs"] = {letter: float(np.median([entry["costs"][letter] for entry in per_step]))
                        for letter in WORK}
        row["formula"], row["holds"] = real_formula(name, row["costs"], p)
        row["stages"] = [{letter: float(np.median([entry["stages"][s][letter]
                                                   for entry in per_step]))
                          for letter in WORK} for s in range(schedule.total_stages)]
        found[name] = row
    return found


def cost_text(name, costs):
    """The costs a formula uses, as printed next to it."""
    letters = ("F", "B") if name == "1f1b" else ("F", "I", "W")
    return ", ".join(f"{letter} {costs[letter]:.2f}" for letter in letters)


def measured_table(rows_by_name):
    rows = []
    for name, r in rows_by_name.items():
        rows.append((TITLES[name], FORMULA_TEXT[name], cost_text(name, r["costs"]),
                     "-" if r["formula"] is None else f"{r['formula']:.1f}",
                     "none" if r["holds"] is None else "hold" if r["holds"] else "do not",
                     f"{r['replay']:.1f}", f"{r['measured']:.1f}",
                     f"{r['measured'] - r['replay']:+.1f}", f"{r['replay_makespan']:.1f}",
                     f"{r['makespan']:.1f}", f"{r['fastest']:.1f}",
                     f"{r['fastest_noise']:.1f}"))
    return table(rows, ("schedule", "formula", "its costs (ms)", "=", "conditions", "replay",
                        "measured", "measured - replay", "makespan: replay", "measured",
                        "fastest", "noise"))


measured_p2 = measure_run(real, NAMES, 2, M_REAL, STEPS)
print("the bubble (ms): the busiest rank's idle time; the makespan (ms): the batch's time")
print(measured_table(measured_p2))
print("\neach stage's median costs (ms) in ZB-H1 and 1F1B:")
rows = []
for stage in range(2):
    split_costs = measured_p2["zb_h1"]["stages"][stage]
    whole_costs = measured_p2["1f1b"]["stages"][stage]
    rows.append((stage, f"{split_costs['F']:.2f}", f"{split_costs['I']:.2f}",
                 f"{split_costs['W']:.2f}", f"{whole_costs['B']:.2f}"))
print(table(rows, ("stage", "F", "I", "W", "B (1F1B)")))
print("\nthe busiest rank's idle time (ms) in the median step, where it went:")
rows = [(TITLES[name], r["busiest"], f"{r['middle_idle']:.1f}", f"{r['in_sends']:.1f}",
         f"{r['in_receives']:.1f}", f"{r['between']:.1f}") for name, r in measured_p2.items()]
print(table(rows, ("schedule", "rank", "idle", "in sends", "in receives", "between actions")))
print(f"({real_load.describe()}; the launch took {real_seconds:.1f} s)")
if real_load.busy:
    print(real_load.note("so do the replay's durations, measured in the same run"))
cores = len(os.sched_getaffinity(0))
activation_mib = (BATCH // M_REAL) * WIDTH * 8 / 2 ** 20


#: model_gap's words for a ratio under CLOSE, in this lesson's terms.
HOLDS = ("the model holds here", f"the replay (messages free) explains the measurement within "
         f"a factor {CLOSE:g}")


def messages_a_batch(name, p, m, rank):
    """Messages ``rank`` sends or receives in one batch: on each of its links
    an activation and a gradient per micro-batch; a rank of the V has two
    links to each neighbour (one per piece)."""
    links = (rank > 0) + (rank < p - 1)
    if make_schedule(name, p, m).placement == "v":
        links *= 2
    return 2 * m * links


def idle_notes(name, r, p, m):
    """model_gap's reasons of this run: where the busiest rank's idle went."""
    return (f"rank {r['busiest']} spent {r['in_sends']:.1f} ms in its sends and "
            f"{r['in_receives']:.1f} ms in its receives (its "
            f"{messages_a_batch(name, p, m, r['busiest'])} messages a batch, free in the replay)",
            f"{r['between']:.1f} ms between actions")


print()
for name in NAMES:
    r = measured_p2[name]
    print(f"{TITLES[name]:>9}: " + compare(
        r["measured"] / 1e3, r["replay"] / 1e3,
        RunFacts(ranks=2, cores=cores, load=max(real_load.before, real_load.after),
                 notes=idle_notes(name, r, 2, M_REAL)),
        measured_word="measured", model_word="replay").replace(*HOLDS))

last_step = {name: step_events(real, name, STEPS - 1) for name in NAMES}
titles = {name: (f"{TITLES[name]}, as it ran: the busiest rank idles "
                 f"{float(max(rank_idles(events, 2))):.1f} ms, makespan "
                 f"{float(makespan(events)):.1f} ms")
          for name, events in last_step.items()}
show_comparison(last_step, 2, M_REAL, titles, "zero_bubble_real_p2.png",
                f"the last step of each schedule on 2 processes, m = {M_REAL}, as it ran "
                "(one step: the table's medians and fastest steps are over all of them)",
                transport="shm", cores=cores, load=max(real_load.before, real_load.after))

# %% jupyter={"source_hidden": true}
zb_costs = measured_p2["zb_h1"]["stages"]
glue("stage0_i", zb_costs[0]["I"], ".2f")
glue("stage1_i", zb_costs[1]["I"], ".2f")
glue("stage0_w", zb_costs[0]["W"], ".2f")
glue("stage1_w", zb_costs[1]["W"], ".2f")
glue("m_real", M_REAL, "d")
real_makespans = {name: measured_p2[name]["fastest"] for name in NAMES}
replay_makespans = {name: measured_p2[name]["replay_makespan"] for name in NAMES}
glue("real_makespans", real_makespans)
glue("replay_makespans", replay_makespans)
fastest_real = min(NAMES, key=real_makespans.get)
fastest_replay = min(NAMES, key=replay_makespans.get)
glue("real_busy_flag", real_load.busy)
glue("fastest_real", TITLES[fastest_real])
glue("fastest_replay", TITLES[fastest_replay])
glue("fastest_agree", "it was the same schedule" if fastest_real == fastest_replay else
     f"not the same: the replay's fastest was {TITLES[fastest_replay]}")
def versus(rows_by_name, name, other):
    """``name``'s fastest step against ``other``'s: "shorter", "longer", or
    "equal" where the gap is no more than the noise of either (how far its
    second fastest step lay above its fastest)."""
    a, b = rows_by_name[name], rows_by_name[other]
    gap = a["fastest"] - b["fastest"]
    if abs(gap) <= max(a["fastest_noise"], b["fastest_noise"]):
        return "equal"
    return "shorter" if gap < 0 else "longer"


def beat_words(rows_by_name):
    """The zero-bubble schedules' fastest steps against 1F1B's, noise told apart."""
    groups = {word: [TITLES[n] for n in NAMES[1:] if versus(rows_by_name, n, "1f1b") == word]
              for word in ("shorter", "equal", "longer")}
    parts = []
    if groups["shorter"]:
        parts.append(f"shorter than 1F1B's by more than the noise for {', '.join(groups['shorter'])}")
    if groups["equal"]:
        parts.append(f"equal to 1F1B's within the noise for {', '.join(groups['equal'])}")
    if groups["longer"]:
        parts.append(f"longer by more than the noise for {', '.join(groups['longer'])}")
    return groups, "the fastest step was " + "; ".join(parts)


glue("fastest_noise_low", min(r["fastest_noise"] for r in measured_p2.values()), ".1f")
glue("fastest_noise_high", max(r["fastest_noise"] for r in measured_p2.values()), ".1f")
beat_groups, beat_text = beat_words(measured_p2)
glue("beat_groups", beat_groups)
glue("beat_verdict", beat_text)
glue("versus_1f1b", {n: versus(measured_p2, n, "1f1b") for n in NAMES[1:]})
glue("fastest_noise", {n: measured_p2[n]["fastest_noise"] for n in NAMES})
gaps = {name: measured_p2[name]["measured"] - measured_p2[name]["replay"] for name in NAMES}
glue("gaps", gaps)
glue("gap_low", min(gaps.values()), ".1f")
glue("gap_high", max(gaps.values()), ".1f")
glue("gap_most", TITLES[max(gaps, key=gaps.get)])
formula_off = {name: measured_p2[name]["replay"] - measured_p2[name]["formula"] for name in NAMES
               if measured_p2[name]["formula"] is not None}
glue("formula_off", formula_off)
glue("formula_off_most", TITLES[max(formula_off, key=lambda n: abs(formula_off[n]))])
glue("formula_off_value", max(formula_off.values(), key=abs), "+.1f")
above = [TITLES[name] for name in formula_off if formula_off[name] > 0]
below = [TITLES[name] for name in formula_off if formula_off[name] <= 0]
glue("formula_direction", "above the formula for every schedule that has one" if not below else
     f"above the formula for {', '.join(above) or 'none'} and not above it for "
     f"{', '.join(below)}")
holds = [TITLES[name] for name in NAMES if measured_p2[name]["holds"]]
glue("holds", {name: measured_p2[name]["holds"] for name in NAMES})
glue("holds_list", ", ".join(holds) if holds else "none")
later_w_over_i = float(np.mean([measured_p2["zb_h1"]["stages"][s]["W"]
                                / measured_p2["zb_h1"]["stages"][s]["I"] for s in range(1, 2)]))
glue("later_w_over_i", later_w_over_i, ".2f")
glue("later_w_over_i_value", later_w_over_i)
glue("w_sentence", f"On stage 1, ZB-H1's W took {later_w_over_i:.2f} times its I, longer "
     "than it: dW = dYᵀ X sums over only a micro-batch's rows and writes a whole weight "
     "matrix (and W adds db's sums), and on this machine that ran slower than dX = dY W of "
     "the same flops."
     if later_w_over_i > 1 else f"On stage 1, ZB-H1's W took {later_w_over_i:.2f} times its "
     "I, no longer than it.")
glue("fail_list", ", ".join(TITLES[name] for name in NAMES if measured_p2[name]["holds"] is False)
     or "none")
glue("real_load", real_load.describe())
glue("real_busy", "was busy (the load was over the cores): the measured column also counts "
     "waits for a core, and so do the replay's durations" if real_load.busy else
     "was not busy by the load average read before and after the launch (within the cores); "
     "during it, the launch's two ranks ran on top of whatever else the machine ran")
parts = {key: [measured_p2[name][key] for name in NAMES] for key in ("in_sends", "between")}
glue("sends_low", min(parts["in_sends"]), ".1f")
glue("sends_high", max(parts["in_sends"]), ".1f")
glue("between_low", min(parts["between"]), ".1f")
glue("between_high", max(parts["between"]), ".1f")
say("""
The first stage is not like the others: its I took {glue}`stage0_i` ms against stage
1's {glue}`stage1_i`, and its W {glue}`stage0_w` ms against {glue}`stage1_w`. Its input is
the data, which wants no gradient, so there is no dX to compute: I does nothing and W
is the whole backward. The formulas, which give every stage the same F, I, W, cannot
see that; the replay, which takes each action as it ran, can. So the replay sat
{glue}`formula_direction`, furthest from it for {glue}`formula_off_most` ({glue}`formula_off_value` ms). The formulas' conditions held,
with the costs of the stages past the first, for {glue}`holds_list` and not for
{glue}`fail_list` (where they do not, the formula is a lower bound).
{glue}`w_sentence`

Measured against the replay, the busiest rank idled {glue}`gap_low` to
{glue}`gap_high` ms longer (most for {glue}`gap_most`). Where its idle time went (the
second table): its sends took {glue}`sends_low` to {glue}`sends_high` ms and the
runtime's Python between actions {glue}`between_low` to {glue}`between_high` ms; the rest
was waiting in its receives, longer than the replay's free messages wait. A real
message is copied into shared memory and out of it again, the other rank's own sends
and Python delay what it sends next, and a rank asleep in its receive has to be woken.
The V sends twice as many messages. The machine ({glue}`real_load`)
{glue}`real_busy`.

What a step costs is the makespan. The noise of a fastest step is taken here as how far
each schedule's second fastest step lay above its fastest ({glue}`fastest_noise_low` to
{glue}`fastest_noise_high` ms, the last column); a gap no larger than the noise of either
schedule is called equal within the noise. So {glue}`beat_verdict`. The fastest,
measured, was {glue}`fastest_real`; in the replay (the medians) {glue}`fastest_agree`.
""")

# %% [markdown]
# **Four processes.** The full form (without `MINIDIST_LESSON_QUICK`) runs
# the five schedules again on 4 processes, p = 4 and m = 8 (eight layers,
# pieces of one layer for the V), for the weights and the bubble. A machine
# with fewer cores than ranks runs the ranks in turns: a rank ready to work
# may wait for a core, and that wait is idle time the schedule did not plan.

# %%
P4, M4, LAYERS4, BATCH4 = 4, 8, 8, 1024
if not QUICK:
    real_p4 = minidist.launch(run_schedules, world_size=P4,
                              args=(NAMES, M4, STEPS, LAYERS4, WIDTH, BATCH4),
                              trace=OUT / "zero_bubble_p4.jsonl", timeout=600)
    differences_p4 = largest_differences(real_p4, one_process(STEPS, LAYERS4, WIDTH, BATCH4),
                                         NAMES)
    print("4 processes, largest weight difference against one process: "
          + ", ".join(f"{TITLES[n]} {differences_p4[n]:.1e}" for n in NAMES))
    measured_p4 = measure_run(real_p4, NAMES, P4, M4, STEPS)
    print(measured_table(measured_p4))
    p4_load = max(os.getloadavg()[0], trace.read_jsonl(OUT / "zero_bubble_p4.jsonl")
                  .header.get("load") or 0.0)
    for name in NAMES:
        r = measured_p4[name]
        print(f"{TITLES[name]:>9}: " + compare(
            r["measured"] / 1e3, r["replay"] / 1e3,
            RunFacts(ranks=P4, cores=cores, load=p4_load, ranks_option="p =",
                     notes=idle_notes(name, r, P4, M4)),
            measured_word="measured", model_word="replay").replace(*HOLDS))
else:
    print("(the quick form leaves the 4-process run out)")

# %% jupyter={"source_hidden": true}
glue("cores", cores, "d")
if QUICK:
    glue("p4_text", "")
else:
    p4_worst = max(differences_p4.values())
    p4_fastest = min(NAMES, key=lambda name: measured_p4[name]["fastest"])
    p4_ratio = max(measured_p4[name]["measured"] / max(measured_p4[name]["replay"], 1e-9)
                   for name in NAMES)
    p2_ratio = max(measured_p2[name]["measured"] / max(measured_p2[name]["replay"], 1e-9)
                   for name in NAMES)
    glue("p4_worst", p4_worst, ".1e")
    glue("p4_ratio", p4_ratio, ".1f")
    glue("p2_ratio", p2_ratio, ".1f")
    if p4_ratio > p2_ratio:
        cause = (f", more than the {p2_ratio:.1f} times of the 2-process run: what the "
                 "messages cost there" + (f", and {P4} ranks taking turns on {cores} cores"
                                           if P4 > cores else "") + " add to it")
    else:
        cause = (f", no more than the {p2_ratio:.1f} times of the 2-process run, so the "
                 "messages' cost seen there explains it without the ranks' turns on the cores")
    p4_groups, p4_beat_text = beat_words(measured_p4)
    glue("p4_beat_groups", p4_groups)
    glue("p4_text", f"On 4 processes and {cores} cores the weights again matched one "
         f"process's (largest difference {p4_worst:.1e}); the measured bubble was up to "
         f"{p4_ratio:.1f} times the replay's{cause}. The fastest batch was "
         f"{TITLES[p4_fastest]}'s; against 1F1B's (the noise as above), {p4_beat_text}.")
say("""
{glue}`p4_text`
""")

# %% [markdown]
# ## 4. When the split does not pay
#
# **A weight half too small to fill anything.** Against 1F1B, ZB-H1 saves
# (p-1)(F + I + W) - (p-1)(F + I - W) = 2(p-1)W of bubble: the W's are what
# fills it, so the saving is as large as W. A stage whose W is small next
# to its I saves little. A transformer block at long sequences is such a
# stage: its attention (lesson 16) multiplies queries by keys and
# probabilities by values, products without weights, so all of their
# backward is I; its W is the weight products of its four Linear layers
# only, which grow with the sequence length T while attention grows with T²
# (lesson 18).
#
# One GPT block (width 64, 4 heads, a batch of 4 sequences, float32),
# measured at a short and at a long T. Then the simulator, p = 4 and m = 8,
# every stage one such block: 1F1B with the measured F and B, ZB-H1 with the
# same F and B, of which the measured W is the weight half. The makespans'
# difference is what the split saves when splitting costs nothing. It does
# cost something: I + W - B per micro-batch, the second walk of the graph,
# which by the same algebra as the formulas adds (m+p-1)(I+W-B) to ZB-H1's
# step; it is measured next to the noise of these timings (how far the
# median time of B, and of I + W, lay above the fastest).

# %%
BLOCK_T = (64, 512) if QUICK else (64, 1024)
BLOCK_BATCH, BLOCK_WIDTH, BLOCK_HEADS = 4, 64, 4
P_SIM, M_SIM = 4, 8


def gpt_block_costs(steps):
    config = GPTConfig(vocab_size=32, block_size=steps, n_embd=BLOCK_WIDTH, n_head=BLOCK_HEADS)
    block = Block(config, rng=0)
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(BLOCK_BATCH, steps, BLOCK_WIDTH)).astype(np.float32)
    gradient = rng.normal(size=inputs.shape).astype(np.float32)

    def forward():
        for parameter in block.parameters():
            parameter.grad = None
        x = Tensor(inputs, requires_grad=True)
        return x, block(x)

    samples = time_halves(forward, 6 if steps > 256 else 20, gradient)
    costs = {letter: 1e3 * seconds for letter, seconds in fastest(samples).items()}
    # How far these timings move from run to run: the median's distance from
    # the fastest, for the whole backward and for the two halves together.
    split_times = [i + w for i, w in zip(samples["I"], samples["W"])]
    noise = 1e3 * (float(np.median(samples["B"])) - min(samples["B"])
                   + float(np.median(split_times)) - min(split_times))
    return costs, noise, split_backward_bytes(block, inputs, gradient)


block_load = Load.start()
block_rows = {}
for steps in BLOCK_T:
    costs, noise, held = gpt_block_costs(steps)
    F, B, I, W = (costs[letter] for letter in WORK)  # noqa: E741
    whole_run = simulate_schedule(make_schedule("1f1b", P_SIM, M_SIM), F, B)
    # The same whole backward, its W part measured, the rest I: the split free.
    split_run = simulate_schedule(make_schedule("zb_h1", P_SIM, M_SIM), F, B, weight_time=W)
    saved = float(makespan(whole_run) - makespan(split_run))
    block_rows[steps] = dict(costs=costs, noise=noise, held=held, saved=saved,
                             predicted=2 * (P_SIM - 1) * W, whole=float(makespan(whole_run)),
                             share=saved / float(makespan(whole_run)),
                             conditions=W <= F and W <= B - W, overhead=I + W - B)
    # The split's own cost, taken at its word: (m+p-1)(I+W-B) on a stage's path.
    block_rows[steps]["cost"] = (M_SIM + P_SIM - 1) * (I + W - B)
    block_rows[steps]["net"] = saved - block_rows[steps]["cost"]
    block_rows[steps]["net_share"] = block_rows[steps]["net"] / float(makespan(whole_run))
block_load = block_load.finish()
rows = []
for steps, r in block_rows.items():
    c = r["costs"]
    rows.append((steps, f"{c['F']:.2f}", f"{c['B']:.2f}", f"{c['I']:.2f}", f"{c['W']:.2f}",
                 f"{c['W'] / c['I']:.2f}", f"{c['B'] / c['F']:.2f}", f"{r['saved']:.2f}",
                 f"{r['predicted']:.2f}", f"{r['share']:.1%}", f"{r['overhead']:+.3f}",
                 f"{r['noise']:.3f}", f"{r['cost']:+.2f}", f"{r['net']:+.2f}",
                 f"{r['net_share']:+.1%}"))
print(table(rows, ("T", "F ms", "B ms", "I ms", "W ms", "W / I", "B / F", "saved ms",
                   "2(p-1)W", "of 1F1B's step", "I + W - B", "noise", "(m+p-1)(I+W-B)",
                   "net ms", "net of step")))
print(f"({block_load.describe()})")
if block_load.busy:
    print(block_load.note("the simulator's saving uses these times, the formula too"))
rows = [(steps, f"{r['held']['forward']:,}", f"{r['held']['weights_pending']:,}",
         f"{r['held']['weights_pending'] / r['held']['forward']:.0%}")
        for steps, r in block_rows.items()]
print(table(rows, ("T", "forward keeps (bytes)", "a pending W keeps", "share")))

# %% jupyter={"source_hidden": true}
short_t, long_t = BLOCK_T
short, long = block_rows[short_t], block_rows[long_t]
glue("short_t", short_t, "d")
glue("long_t", long_t, "d")
glue("short_w_over_i", short["costs"]["W"] / short["costs"]["I"], ".2f")
glue("long_w_over_i", long["costs"]["W"] / long["costs"]["I"], ".2f")
glue("short_saved_share", short["share"], ".1%")
glue("long_saved_share", long["share"], ".1%")
glue("long_saved", long["saved"], ".2f")
glue("long_w", long["costs"]["W"], ".2f")
formula_agrees = all(abs(r["saved"] - r["predicted"]) <= 1e-5 * r["whole"]
                     and r["conditions"] for r in block_rows.values())
glue("formula_agrees", formula_agrees)
glue("formula_words", "equal to 2(p-1)W in both rows, to the simulator's rounding (W below "
     "F and below B - W, the formula's conditions)" if formula_agrees else
     "not equal to 2(p-1)W in every row: there W was not below both F and B - W, the "
     "formula's conditions")
PAYS_LITTLE = 0.05   # below a twentieth of the step saved, the split "pays little"


def pays(share):
    return "does not pay" if share <= 0 else "pays little" if share < PAYS_LITTLE else "pays"


def overhead_words(t, r):
    """The split's own cost per micro-batch against the timings' noise."""
    overhead, noise = r["overhead"], r["noise"]
    if abs(overhead) <= noise:
        where = "within these timings' noise"
    elif overhead > 0:
        where = "above the noise"
    else:
        where = "below zero by more than the noise"
    return (f"at T = {t}, I + W - B = {overhead:+.3f} ms a micro-batch, {where} "
            f"({noise:.3f} ms), {M_SIM + P_SIM - 1} of them on a stage's path "
            f"{r['cost']:+.2f} ms")


def net_words(t, r):
    return (f"{r['net']:+.2f} ms at T = {t} ({r['saved']:.2f} saved less {r['cost']:+.2f}, "
            f"{r['net_share']:+.1%} of 1F1B's step)")


glue("block_busy", block_load.busy)
glue("block_busy_text", f"The machine was busy while the block was timed ({block_load.describe()}): "
     "these times include waits for a core, and the verdicts rest on them."
     if block_load.busy else f"The machine was not busy by its load while the block was "
     f"timed ({block_load.describe()}).")
glue("short_pays", pays(short["net_share"]))
glue("long_pays", pays(long["net_share"]))
glue("short_net_share", short["net_share"], "+.1%")
glue("long_net_share", long["net_share"], "+.1%")
glue("short_net", net_words(short_t, short))
glue("long_net", net_words(long_t, long))
glue("w_shrinks", "smaller" if long["costs"]["W"] / long["costs"]["I"]
     < short["costs"]["W"] / short["costs"]["I"] else "not smaller")
glue("short_overhead", overhead_words(short_t, short))
glue("long_overhead", overhead_words(long_t, long))
unsure = [t for t, r in block_rows.items() if abs(r["overhead"]) <= r["noise"]]
glue("unsure_ts", unsure)
glue("noise_caveat", "Both costs lay within the timings' noise, so each net lies between "
     "the one printed and the saving itself; the verdicts take the cost at its word."
     if len(unsure) == 2 else f"At T = {unsure[0]} the cost lay within the timings' noise, "
     "so the net there lies between the one printed and the saving itself; the verdict "
     "takes the cost at its word." if unsure else "Both costs lay outside the timings' noise.")
grew = long["costs"]["W"] > short["costs"]["W"] and long["saved"] > short["saved"]
glue("w_grew", grew)
glue("w_grew_text", f"In milliseconds W and the saving grew with T (W {short['costs']['W']:.2f} "
     f"to {long['costs']['W']:.2f} ms); what shrank is W next to I and to the step"
     if grew else "W and the saving did not both grow with T here")
bf = [r["costs"]["B"] / r["costs"]["F"] for r in block_rows.values()]
glue("bf_low", min(bf), ".2f")
glue("bf_high", max(bf), ".2f")
glue("bf_values", bf)
glue("bf_text", "the backward took less time than the forward" if max(bf) < 1 else
     "the backward took no less time than the forward" if min(bf) >= 1 else
     "the backward took less time than the forward at one T and not at the other")
glue("overheads", [r["overhead"] for r in block_rows.values()])
glue("noises", [r["noise"] for r in block_rows.values()])
glue("pending_share_long", long["held"]["weights_pending"] / long["held"]["forward"], ".0%")
glue("pending_share_short", short["held"]["weights_pending"] / short["held"]["forward"], ".0%")
say("""
At T = {glue}`short_t` the block's W was {glue}`short_w_over_i` of its I; at T =
{glue}`long_t` it was {glue}`long_w_over_i`, {glue}`w_shrinks`, as attention's T² work
went to I. With the split free, ZB-H1 saved {glue}`short_saved_share` of 1F1B's step at
T = {glue}`short_t` and {glue}`long_saved_share` at T = {glue}`long_t`
({glue}`long_saved` ms, with a W of {glue}`long_w` ms): the saving was
{glue}`formula_words`. {glue}`w_grew_text`.

The split is not free. Its own cost: {glue}`short_overhead`; {glue}`long_overhead`.
The net, the saving less that cost, was {glue}`short_net` and {glue}`long_net`. So the
split {glue}`short_pays` at the short sequence and {glue}`long_pays` at the long one (a
twentieth of 1F1B's step is the line drawn here). {glue}`noise_caveat`
{glue}`block_busy_text`

In this table (B / F) {glue}`bf_text` ({glue}`bf_low` to {glue}`bf_high` of it), not
twice it as in sections 1 and 2. That count is of products' flops; at width 64 the
block's products are small, and its time goes to passes over every element: the
forward's attention masks the T x T scores, takes each row's maximum, its exp, its sum
and divides (the backward of the softmax makes about half as many passes), and its
GELU evaluates erf. The forward's time is taken after a warm-up round, with its graph
built, which is a few dozen Python nodes for a block.

It costs memory all the same: from its I to its W a micro-batch keeps what its W
needs, {glue}`pending_share_short` of its forward's activations at T =
{glue}`short_t`, {glue}`pending_share_long` at T = {glue}`long_t` (the last table,
measured by `split_backward_bytes`). ZB-H1 keeps p micro-batches on every stage
where 1F1B keeps p - i.
""")

# %% [markdown]
# **The memory the waiting W's hold.** Section 3's run wrote its memory
# ledger into the trace: after every F, B, I and W, each rank's bytes of
# held activations, how many micro-batches (or pieces) they belong to, and,
# for a split schedule, how many W's are pending and the bytes they keep
# (counted in the activations). The peaks of each rank, from the last step:

# %%
def ledger_peaks(events, rank):
    """The largest activations, live micro-batches and pending W bytes of ``rank``."""
    peaks = dict(activations=0, live=0, pending=0, pending_bytes=0)
    for event in events:
        if event["kind"] == "memory" and event["rank"] == rank:
            info = trace.label_info(event["label"])
            peaks["activations"] = max(peaks["activations"], info["activations"])
            peaks["live"] = max(peaks["live"], info["live_microbatches"])
            peaks["pending"] = max(peaks["pending"], info.get("weights_pending", 0))
            peaks["pending_bytes"] = max(peaks["pending_bytes"],
                                         info.get("weights_pending_bytes", 0))
    return peaks


memory_rows, memory_peaks = [], {}
for name in NAMES:
    events = step_events(real, name, STEPS - 1)
    pieces = make_schedule(name, 2, M_REAL).virtual_stages
    for rank in range(2):
        peaks = ledger_peaks(events, rank)
        memory_peaks[(name, rank)] = peaks
        memory_rows.append((TITLES[name], rank, f"{peaks['activations'] / 2 ** 20:.1f}",
                            f"{peaks['live']}" + (" pieces" if pieces > 1 else ""),
                            peaks["pending"], f"{peaks['pending_bytes'] / 2 ** 20:.1f}"))
print(table(memory_rows, ("schedule", "rank", "activations MiB", "live", "W's pending",
                          "their MiB")))

# %% jupyter={"source_hidden": true}
def peak_over_ranks(name, key="activations"):
    return max(memory_peaks[(name, rank)][key] for rank in range(2))


h2_over_h1 = peak_over_ranks("zb_h2") / peak_over_ranks("zb_h1")
h1_over_f1b = peak_over_ranks("zb_h1") / peak_over_ranks("1f1b")
v_over_h1 = peak_over_ranks("zbv") / peak_over_ranks("zb_h1")
glue("h2_over_h1", h2_over_h1, ".2f")
glue("h1_over_f1b", h1_over_f1b, ".2f")
glue("v_over_h1", v_over_h1, ".2f")
glue("h2_more", "more than" if h2_over_h1 > 1 else "no more than")
glue("f1b_rank1", memory_peaks[("1f1b", 1)]["activations"] / 2 ** 20, ".1f")
glue("h1_rank1", memory_peaks[("zb_h1", 1)]["activations"] / 2 ** 20, ".1f")
rank1_more = (memory_peaks[("zb_h1", 1)]["activations"]
              > memory_peaks[("1f1b", 1)]["activations"])
glue("rank1_more", "more" if rank1_more else "no more")
glue("rank1_text", "more: its W's wait" if rank1_more else "no more")
glue("h2_pending_mib", peak_over_ranks("zb_h2", "pending_bytes") / 2 ** 20, ".1f")
glue("h1_pending_mib", peak_over_ranks("zb_h1", "pending_bytes") / 2 ** 20, ".1f")
glue("h2_live", peak_over_ranks("zb_h2", "live"), "d")
glue("h1_live", peak_over_ranks("zb_h1", "live"), "d")
live0 = (memory_peaks[("1f1b", 0)]["live"], memory_peaks[("zb_h1", 0)]["live"])
glue("live0", list(live0))
# On the first rank each micro-batch's input is a slice (a NumPy view) of the
# whole input batch, and the ledger counts the memory a view keeps alive: the
# whole batch, once wherever any slice is held. Compare without it.
batch_mib = BATCH * WIDTH * 8 / 2 ** 20
record_mib = ((memory_peaks[("1f1b", 0)]["activations"] / 2 ** 20 - batch_mib)
              / memory_peaks[("1f1b", 0)]["live"])
pending_mib = (memory_peaks[("zb_h1", 0)]["pending_bytes"] / 2 ** 20
               / max(memory_peaks[("zb_h1", 0)]["pending"], 1) - batch_mib)
glue("record_mib", record_mib, ".2f")
glue("pending0_mib", pending_mib, ".2f")
glue("batch_mib", batch_mib, ".1f")
same_live = live0[0] == live0[1]
held_word = (f"Both hold {live0[0]} micro-batches at most on the first rank"
             if same_live else f"On the first rank 1F1B holds {live0[0]} micro-batches at most "
             f"and ZB-H1 {live0[1]}")
views = (f"There each micro-batch's input is a slice (a NumPy view) of the whole input batch, "
         f"and the ledger counts what a view keeps alive, the whole batch ({batch_mib:.1f} MiB), "
         "once wherever any slice is held; without it")
if pending_mib > record_mib:
    glue("first_rank_text", f"{held_word}. {views}, a pending W keeps more than a forward's "
         f"record of one micro-batch did ({pending_mib:.2f} MiB against {record_mib:.2f}, "
         f"{pending_mib - record_mib:.2f} MiB more, one {BATCH // M_REAL} x {WIDTH} float64 "
         f"array being {activation_mib:.2f} MiB): what the forward kept, and gradients "
         "of the way back, the stage's output's among them: the first stage's I frees "
         "nothing, everything there being on the weights' side.")
else:
    glue("first_rank_text", f"{held_word}. {views}, a pending W keeps no more than a forward's "
         f"record of one micro-batch did ({pending_mib:.2f} MiB against {record_mib:.2f}).")
h2_saved = real_makespans["1f1b"] - real_makespans["zb_h2"]
h1_saved = real_makespans["1f1b"] - real_makespans["zb_h1"]
glue("h2_saved_ms", h2_saved, ".1f")
glue("h1_saved_ms", h1_saved, ".1f")


def bought(name, saved):
    word = versus(measured_p2, name, "1f1b")
    return {"shorter": f"a fastest step {saved:.1f} ms shorter than 1F1B's",
            "equal": f"a fastest step {abs(saved):.1f} ms {'below' if saved > 0 else 'above'} "
                     "1F1B's, equal within the noise",
            "longer": f"a fastest step {-saved:.1f} ms longer than 1F1B's, nothing"}[word]


glue("h2_bought", bought("zb_h2", h2_saved))
glue("h1_bought", bought("zb_h1", h1_saved))
h2_h1 = versus(measured_p2, "zb_h2", "zb_h1")
glue("h2_vs_h1_word", h2_h1)
glue("h2_vs_h1_real", {"shorter": "a shorter step than", "equal": "a step equal within the "
                       "noise to", "longer": "a longer step than"}[h2_h1])
say("""
ZB-H2 held {glue}`h2_more` ZB-H1 at its peak, {glue}`h2_over_h1` times as much: up to
{glue}`h2_live` micro-batches at once against {glue}`h1_live`, and
{glue}`h2_pending_mib` MiB waiting for W's at its peak against {glue}`h1_pending_mib`.
That is ZB-H2's price for filling the bubble ZB-H1 leaves; in section 3's run it bought
{glue}`h2_bought`, where ZB-H1 bought {glue}`h1_bought`: its extra memory bought
{glue}`h2_vs_h1_real` ZB-H1's.
ZB-H1's own peak was {glue}`h1_over_f1b` times 1F1B's. {glue}`first_rank_text` The last rank,
which 1F1B lets hold one micro-batch ({glue}`f1b_rank1` MiB), held {glue}`h1_rank1` MiB
under ZB-H1, {glue}`rank1_text`. ZB-V held
{glue}`v_over_h1` times ZB-H1's peak in pieces of half a stage.
""")

# %% [markdown]
# ## What to remember
#
# * A backward is two independent halves: I, the input's gradient (the
#   stage before waits for it), and W, the weights' gradients (only the
#   optimizer step waits for them). Split, they give the same bits as one
#   backward, for about the same work.
# * Run the I's early and the W's where a stage would wait: ZB-H1 cuts
#   1F1B's bubble from (p-1)(F + I + W) to (p-1)(F + I - W) for the same
#   peak of micro-batches held on its first stage (p), now on every stage; ZB-H2 to (p-1)(F + I - 2W), none when
#   F = I = W, for up to 2p - 1 micro-batches held; the V placement (rank r
#   holds pieces r and 2p - 1 - r) halves the slant (warm-up and cool-down)
#   and holds p stages' activations. DualPipeV adds pairs of a forward and a backward, which pay
#   where a GPU overlaps them.
# * The makespan is what counts: with a synchronous optimizer step a
#   parallelogram's slant stays idle, whatever the bubble inside a stage.

# %% jupyter={"source_hidden": true}
say("""
* The split saves 2(p-1)W against 1F1B, less its own cost, (m+p-1)(I + W - B), a second
  walk of the graph. For section 4's block, the cost taken at its word, it
  {glue}`short_pays` at T = {glue}`short_t` (net {glue}`short_net_share` of 1F1B's step)
  and {glue}`long_pays` at T = {glue}`long_t` (net {glue}`long_net_share`). Every waiting
  W holds memory until it runs. A first stage has no I at all.
""")

# %% [markdown]
# ## Try
#
# * The exercise: `minidist exercise show zb_h1` prints it. You are given
#   1F1B's order on every rank with each backward split into its I and its
#   W, and you place the W's as ZB-H1 does; `minidist exercise start zb_h1`
#   copies the skeleton, `minidist exercise check zb_h1` runs your orders on
#   the simulator against ZB-H1 (with F = I = W and with F = I = 2, W = 1,
#   this chapter's two ratios), tells a slower placement by the idle gap a
#   W could fill, then runs them on real processes against one process.
# * `minidist demo pipeline --schedule zbv` runs ZB-V on real processes
#   over the digits and steps through its last batch in the terminal
#   (`--simulate` plans it on the virtual clock instead, `--stages 4
#   --microbatches 8` for section 2's shape, and `--schedule zb_h1`,
#   `zb_h2`, `dualpipev` the others).
# * In section 2's code, add a ratio with W a tenth of F and I to `RATIOS`
#   and watch ZB-H2's bubble grow; in section 4, give the block a longer T.
