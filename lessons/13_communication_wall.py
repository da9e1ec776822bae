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
# # Lesson 13: the communication wall
#
# The zhihu article on distributed training ("深度模型常见加速训练策略架构篇(一)",
# zhuanlan.zhihu.com) names the wall: training is split across nodes, but it is still
# one task, so the pieces must be aggregated, and *iterative training
# updates so often that the network cannot keep up with the accelerators*.
# Can we just buy more bandwidth? The article says no: the protocol stack eats
# part of it. The Greek course slides ("Παράλληλη και κατανεμημένη εκπαίδευση
# βαθιών νευρωνικών δικτύων", Data Science and Machine Learning, 2019-20)
# give the two remedies, both about the *messages*:
#
# * **quantisation**: fewer bits for each value (less storage per
#   parameter, less precision);
# * **sparsification**: fewer values, "some parameters are not exchanged
#   when their change is not significant (does not exceed a threshold)";
#
# and the zhihu article adds a third lever, **overlapping communication with
# computation**. This chapter builds each compressor as a DDP
# *communication hook* (torch's `register_comm_hook`), trains the digits with
# every one of them, and measures what they buy (bytes, from the trace) and
# what they cost (test accuracy, compute):
#
# 1. the wall in numbers: what DDP sends per step;
# 2. a communication hook, and the identity hook that changes nothing;
# 3. fewer bits: fp16, bfloat16, int8, one bit;
# 4. fewer values: threshold, top-k, random-k, and why a sparse all-reduce
#    cannot use the ring as it is;
# 5. low rank: PowerSGD;
# 6. every compressor trained: bytes against accuracy on one plot;
# 7. error feedback on and off;
# 8. overlap: the timeline of a step with and without a compressor;
# 9. when compression pays: the crossover bandwidth.
#
# Library code: `minidist/parallel/data/compression.py` (the hooks, in this
# order), `minidist/parallel/data/powersgd.py` (PowerSGD's low rank),
# `minidist/parallel/data/hooks.py` (all of them by name),
# `minidist/parallel/data/ddp.py` (`register_comm_hook`),
# `minidist/parallel/data/buckets.py` (`GradBucket`),
# `minidist/experiments/compression.py` (the runs of part 6).

# %%
import time

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import load_digits
from minidist.experiments import compression as experiment
from minidist.lesson import (
    glue,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    show_file,
    use_headless_matplotlib,
)
from minidist.parallel.data import compression as C
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.hooks import HOOKS
from minidist.parallel.data.powersgd import PowerSGDState
from minidist.runtime.blas_threads import set_blas_threads
from minidist.train import build_model

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
# One BLAS thread in this process: on a busy machine a product split over
# two threads waits for the one without a core (this lesson took 4x as long).
set_blas_threads(1)
import matplotlib.pyplot as plt  # noqa: E402

from viz.timeline import save_timeline  # noqa: E402

QUICK = quick()
OUT = output_dir()
glue("form_note",
     "This is the quick form (MINIDIST_LESSON_QUICK=1): part 6 trains every compressor for "
     "12 epochs with one seed (the full form: 30 epochs, three seeds, whose mean and spread "
     "decide what part 6 and part 7 conclude), and part 9 times each codec 20 times (the full "
     "form: 100)." if QUICK else
     "This is the full form: part 6 trains every compressor for 30 epochs with three seeds, "
     "and part 9 times each codec 100 times (the quick form, MINIDIST_LESSON_QUICK=1: 12 "
     "epochs, one seed, 20 timings).")

# %% jupyter={"source_hidden": true}
say("""
{glue}`form_note`
""")

# %% [markdown]
# ## 1. The wall in numbers
#
# A data-parallel step all-reduces the whole gradient. With the ring, each
# of the n ranks sends $2 \frac{n-1}{n} N$ bytes for a gradient of N bytes:
# about 2N, whatever n is. The dense layer of Dettmers' "Model Parallelism in
# Deep Learning" (2014; 1000 inputs, 500 outputs) has 500,500 parameters,
# 2 MB in float32 (the table adds a 10-way output layer to train it); the
# digits MLP 9,610 (38 KB). A link that takes β seconds per byte (a bandwidth
# of 1/β) sends one rank's share of the ring in $2 \frac{n-1}{n} N β$ (the
# gradient once, N β, would be about half of it); the table gives those ring
# bytes for n = 8 ranks and their time on two links, next to the compute time
# of one step, measured here:

# %%
def dense_step_seconds(layer_in, layer_out, batch, repeats=5):
    """Forward + backward + SGD of one Linear(in, out) + ReLU + Linear(out, 10) step."""
    nn.init.manual_seed(0)
    model = nn.Sequential(nn.Linear(layer_in, layer_out), nn.ReLU(), nn.Linear(layer_out, 10))
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    x = np.random.default_rng(0).standard_normal((batch, layer_in)).astype(np.float32)
    y = np.arange(batch) % 10
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(Tensor(x)), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - begin)
    return float(np.median(times)), model.num_parameters()


print(f"{'model':<28} {'params':>9} {'compute/step':>13} {'ring bytes (n=8)':>17} "
      f"{'1 Gbit/s':>9} {'10 Gbit/s':>10}")
wall = {}
for label, (d_in, d_out, batch) in {"digits MLP 64-128-10, b=32": (64, 128, 32),
                                    "Dettmers' 1000x500, b=128": (1000, 500, 128)}.items():
    seconds, params = dense_step_seconds(d_in, d_out, batch)
    ring = experiment.dense_bytes(params, 8)
    wall[label] = (seconds, ring * 8 / 1e9)   # compute, and sending over 1 Gbit/s
    print(f"{label:<28} {params:>9,} {1e3 * seconds:>10.2f} ms {ring:>17,.0f} "
          f"{1e3 * ring * 8 / 1e9:>6.2f} ms {1e3 * ring * 8 / 1e10:>7.2f} ms")

compute, send = wall["Dettmers' 1000x500, b=128"]
dettmers_params = 1000 * 500 + 500 + 500 * 10 + 10
glue("dettmers_compute", 1e3 * compute, "{:.1f} ms")
glue("dettmers_send", 1e3 * send, "{:.1f} ms")
glue("dettmers_ring_bytes", experiment.dense_bytes(dettmers_params, 8), ",.0f")
glue("dettmers_once", 1e3 * 4 * dettmers_params * 8 / 1e9, "{:.1f} ms")
glue("send_verdict", "longer than that" if send > compute else
     "less than that on this machine, but a faster processor computes it sooner")

# %% jupyter={"source_hidden": true}
say("""
On this machine one step of Dettmers' layer computes in {glue}`dettmers_compute`;
its ring all-reduce over 8 ranks has each rank send {glue}`dettmers_ring_bytes`
bytes, which a 1 Gbit/s link takes {glue}`dettmers_send` to carry (its gradient
once, N β, would take {glue}`dettmers_once`), {glue}`send_verdict`. Faster accelerators shrink the compute column, not the
bytes: that is the wall.
""")

# %% [markdown]
# (On one machine, ranks talk through shared memory at
# gigabytes per second, so the runs below cannot *feel* the wall; they
# measure the bytes exactly, and part 9 turns bytes into time for slower
# links.)
#
# ## 2. A communication hook
#
# `DistributedDataParallel` packs gradients into buckets and all-reduces
# each. `ddp.register_comm_hook(state, hook)` replaces that all-reduce:
# DDP calls `hook(state, bucket)` where the all-reduce would start and
# writes what it returns back into the gradients. The bucket
# (`GradBucket`) gives `buffer()` (this rank's flat gradient, times its
# number of examples), `divisor()` (the examples of all ranks: the average
# is `sum over ranks of buffer / divisor`), `parameters()`, `index()`.
# The simplest hook all-reduces and divides, DDP's own path:
#
# ```python
# def allreduce_hook(state, bucket):
#     buffer = bucket.buffer()
#     dist.all_reduce(buffer, group=bucket.group, algorithm=bucket.algorithm)
#     buffer /= bucket.divisor()
#     return buffer
# ```
#
# Every compressor below has this shape: compress, communicate with the
# public collectives, decompress, return the averaged gradient. State
# objects (`TopKState`, `PowerSGDState`, ...) keep what must survive
# between steps. First, the identity hook gives DDP's weights bit for bit:

# %%
x_train, y_train, x_test, y_test = load_digits()


def few_steps(hook_name, steps=5):
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(build_model("mlp", seed=0), algorithm="ring")
    if hook_name is not None:
        ddp.register_comm_hook(None, HOOKS[hook_name])
    optimizer = optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        mine = slice((step * world + rank) * 32, (step * world + rank + 1) * 32)
        optimizer.zero_grad(set_to_none=False)
        nn.CrossEntropyLoss()(ddp(Tensor(x_train[mine])), y_train[mine]).backward()
        optimizer.step()
    return np.concatenate([p.data.ravel() for p in ddp.parameters()])


def identity_check():
    return few_steps(None), few_steps("allreduce"), few_steps("fp16")


plain, identity, half = minidist.launch(identity_check, world_size=2)[0]
print("identity hook == plain DDP, bit for bit:", np.array_equal(plain, identity))
print(f"fp16 hook after 5 steps: largest weight difference {np.abs(half - plain).max():.2e}")

# %% [markdown]
# ## 3. Fewer bits
#
# | hook | what travels | bytes per rank (Ψ values, n ranks) |
# |---|---|---|
# | `allreduce_hook` | float32, ring all-reduce | 2 (n-1)/n · 4Ψ |
# | `fp16_compress_hook` | float16, ring all-reduce | 2 (n-1)/n · 2Ψ |
# | `bf16_compress_hook` | bfloat16 (float32's top 16 bits), all-gather | (n-1) · 2Ψ |
# | `int8_hook` | int8 + one scale, all-gather | (n-1) · (Ψ + 8) |
# | `sign_hook` | 1 bit + one scale, all-gather | (n-1) · (Ψ/8 + 8) |
#
# (Ψ: the values in the bucket, here the whole gradient, one per parameter.)
#
# fp16 keeps 11 bits of precision and a small range (it overflows above
# 65,504, so the hook divides before it casts); bfloat16 keeps float32's
# range and 8 bits. NumPy has no bfloat16 arithmetic, and int8 cannot hold a
# sum, so those hooks all-gather the payloads and add in float32. int8 uses
# QSGD's *stochastic rounding* (Alistarh et al., "QSGD: Communication-Efficient
# SGD via Gradient Quantization and Encoding", 2017): round up with probability equal to the
# fraction, so the expected value is exact (unbiased). One bit keeps only
# the sign and one scale per bucket (Seide et al., "1-Bit Stochastic Gradient
# Descent and its Application to Data-Parallel Distributed Training of Speech
# DNNs", 2014): biased, so it needs
# error feedback (part 7). The round trip on a real gradient of the digits
# MLP:

# %%
def a_real_gradient():
    model = build_model("mlp", seed=0)
    nn.CrossEntropyLoss()(model(Tensor(x_train[:64])), y_train[:64]).backward()
    return np.concatenate([p.grad.ravel() for p in model.parameters()]).astype(np.float32)


g = a_real_gradient()
rng = np.random.default_rng(0)
q, scale = C.quantize_int8(g, rng)
round_trips = {
    "fp16": g.astype(np.float16).astype(np.float32),
    "bf16 (truncated)": C.expand_bf16(C.truncate_bf16(g)),
    "int8 (stochastic)": q.astype(np.float32) * np.float32(scale),
    "sign (1 bit)": C.compress_sign(g)[2],
}
print(f"gradient: {g.size:,} values, |g| max {np.abs(g).max():.3g}")
print(f"{'compressor':<20} {'bits/value':>10} {'relative error (L2)':>20}")
for (name, back), bits in zip(round_trips.items(), (16, 16, 8, 1)):
    print(f"{name:<20} {bits:>10} {np.linalg.norm(back - g) / np.linalg.norm(g):>20.2e}")
def int8_round_trip(values):
    q, scale = C.quantize_int8(values, rng)
    return q.astype(np.float64) * scale


draws = np.mean([int8_round_trip(g) for _ in range(200)], axis=0)
print(f"int8, mean of 200 draws: relative error {np.linalg.norm(draws - g) / np.linalg.norm(g):.2e}"
      " (unbiased: the mean converges to g)")

# %% [markdown]
# ## 4. Fewer values
#
# The Greek slides' own remedy: skip the parameters whose change is not
# significant. Three ways to choose what to send:
#
# * **threshold** (Strom, "Scalable Distributed DNN Training Using Commodity
#   GPU Cloud Computing", 2015): the entries whose *accumulated* change
#   exceeds a threshold (the rest keeps accumulating); the count varies per
#   step and per rank;
# * **top-k**: the k entries of largest magnitude (here k = 1 % of the Ψ
#   values: the *ratio* k/Ψ = 0.01 that `TopKState(0.01)` takes);
# * **random-k**: k entries at random.
#
# Each rank sends (index, value) pairs: 4 + 4 bytes per kept value. Why not
# a ring all-reduce of the sparse vectors? The ring adds chunks as they pass:
# rank A's 1 % and rank B's 1 % rarely share indices, so the sum has up to
# 2 %, then 3 %, ... the message *grows* at every hop and its size is
# unknown in advance (a reduce-scatter over chunks of indices only works if
# the non-zeros are spread evenly). The sparse hooks therefore all-gather:
# first the counts (they differ between ranks), then the pairs, padded to
# the largest count; every rank adds them up in rank order, so every rank
# holds identical bits. That costs (n - 1) · 8k bytes: it grows with n,
# while the ring's 2 (n-1)/n · 4Ψ does not. Sparse wins while k is below
# Ψ / n.

# %%
p = g.astype(np.float64)
k = C.TopKState(0.01).k(p.size)
norm_kept = {}
for name, (indices, values) in {
    "threshold 1e-2": C.compress_threshold(p, 1e-2, quantize=False),
    "top-k 1%": C.compress_topk(p, k),
    "random-k 1%": C.compress_randomk(p, k, np.random.default_rng(0)),
}.items():
    kept = C._scatter(indices, values, p.size, p.dtype)
    norm_kept[name] = np.linalg.norm(kept) ** 2 / np.linalg.norm(p) ** 2
    print(f"{name:<20} keeps {indices.size:>5} of {p.size:,} values, "
          f"{100 * norm_kept[name]:5.1f} % of the squared norm")
glue("topk_norm", norm_kept["top-k 1%"], ".1%")
glue("randomk_norm", norm_kept["random-k 1%"], ".1%")
glue("topk_verdict", "far more" if norm_kept["top-k 1%"] > 5 * norm_kept["random-k 1%"]
     else "more" if norm_kept["top-k 1%"] > norm_kept["random-k 1%"] else "no more")

# %% jupyter={"source_hidden": true}
say("""
Top-k keeps {glue}`topk_verdict` of the gradient than random-k for the same k
({glue}`topk_norm` of the squared norm against {glue}`randomk_norm`): a few
weights carry most of it. Random-k keeps, in expectation, k/Ψ of the squared
norm, the share of the values it sends: whatever it drops is lost unless
something remembers it (part 7).
""")

# %% [markdown]
#
# ## 5. Low rank: PowerSGD
#
# A layer's gradient is a matrix M (here 128 x 64 for the first layer's
# weights: 128 outputs, 64 inputs; a rows and c columns in general).
# PowerSGD (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank
# Gradient Compression for Distributed Optimization", 2019) sends an
# approximation of *matrix rank* r (r columns in each factor; not a rank in
# the sense of a process), U Y^T, with U of a x r and Y of c x r, found by one
# step of power iteration started from last step's Y (*warm start*). The paper
# calls the factors P and Q; this course writes U and Y, because P is lesson
# 16's attention probabilities (lessons/NOTATION.md):
#
# 1. every rank computes `U = M Y` from its own gradient M, and the ranks
#    all-reduce the Us;
# 2. orthogonalise U (a QR decomposition: U becomes r orthonormal columns;
#    same bits on every rank);
# 3. `Y = M^T U`, all-reduced;
# 4. the averaged gradient is `U Y^T`.
#
# Two all-reduces of small matrices: r (a + c) values instead of a c. Linear
# algebra, not thresholds, decides what to keep; and since U and Y are sums,
# the ring works as usual. With r = 2 the first layer sends 2 * (64 + 128)
# = 384 values instead of 8,192.

# %%
state = PowerSGDState(matrix_approximation_rank=2)
shapes = experiment.parameter_shapes("mlp")
for (_offset, size, n_rows, n_cols, r), shape in zip(state.layout(shapes), shapes):
    sent = r * (n_rows + n_cols) if r else size
    print(f"parameter {str(shape):<10} {size:>6} values -> sends {sent:>5} "
          f"({'matrix rank ' + str(r) if r else 'whole: too small to pay'})")

# %% [markdown]
# ## 6. Every compressor, trained: bytes against accuracy
#
# The experiment (`minidist/experiments/compression.py`): the digits MLP,
# 2 ranks, global batch 64, SGD with momentum and a cosine schedule, the
# same weights, data order and seeds for every compressor; only the hook
# differs. All runs happen in one launch, each in a traced region; the
# bytes per step are *read from the trace* (the 8-byte example count DDP
# all-reduces each step included) and set next to the formula. "EF" in the
# names is *error feedback* (part 7): "sign, no EF" is one bit with it
# switched off; the names without "no EF" keep it on.

# %%
SEEDS = (0,) if QUICK else (0, 1, 2)
# The trace of every run (13 compressors, every step: most of the bytes the
# course would write) is read for the bytes per step and not kept.
results = experiment.run(world_size=2, model="mlp", full=not QUICK, seeds=SEEDS)
print(f"MLP, 2 ranks, {results[0].steps} steps, mean over seeds {list(SEEDS)}:")
print(experiment.format_table(results, "mlp", 2))
picture = experiment.plot(results, OUT / "compression_bytes_vs_accuracy.png",
                          title="digits MLP, 2 ranks: bytes per step against test accuracy")
show_file(picture)

by_name = {r.name: r for r in results}
MLP_SHAPES = experiment.parameter_shapes("mlp")


def fewer(name, world_size=2):
    """How many times fewer bytes than the uncompressed run, by the formulas."""
    return (experiment.formula_bytes("none", MLP_SHAPES, world_size)
            / experiment.formula_bytes(name, MLP_SHAPES, world_size))


def points(name, against="none"):
    """Test accuracy of ``name`` minus ``against``'s, in points."""
    return 100 * (by_name[name].test_accuracy - by_name[against].test_accuracy)


same_bytes = all(abs(r.bytes_per_step - experiment.formula_bytes(r.name, MLP_SHAPES, 2)) < 0.5
                 for r in results if experiment.formula_bytes(r.name, MLP_SHAPES, 2) is not None)
assert same_bytes, "the bytes from the trace differ from the formulas"
glue("seeds", f"{len(SEEDS)} seed{'s' if len(SEEDS) > 1 else ''}")
glue("none_acc", 100 * by_name["none"].test_accuracy, "{:.1f} %")
glue("fp16_fewer", fewer("fp16"), "{:.1f}x")
glue("bf16_fewer", fewer("bf16"), "{:.1f}x")
glue("int8_fewer", fewer("int8"), "{:.1f}x")
glue("int8_fewer_at_4", fewer("int8", 4), "{:.1f}x")
glue("topk_fewer", fewer("top-k 1%"), "{:.1f}x")
glue("powersgd_fewer", fewer("PowerSGD r2"), "{:.1f}x")
cast_loss = max(0.0, max(-points(name) for name in ("fp16", "bf16", "int8")))
glue("cast_loss", cast_loss, ".1f")
glue("cast_verdict", f"lose nothing measurable ({cast_loss:.1f} points at most): gradient noise "
     "from the batch is larger than rounding at 8 to 16 bits" if cast_loss <= 0.5 else
     f"lose up to {cast_loss:.1f} points")
topk_gap = points("top-k 1%")
glue("topk_gap", abs(topk_gap), ".1f")
glue("topk_matches", "matches the uncompressed run" if abs(topk_gap) <= 0.5 else
     f"ends {abs(topk_gap):.1f} points {'below' if topk_gap < 0 else 'above'} the "
     "uncompressed run")
glue("sign_points", -points("sign"), ".1f")
glue("sign_verdict", "costs" if points("sign") < 0 else "gains")
glue("randomk_acc", 100 * by_name["random-k 1%"].test_accuracy, "{:.1f} %")
glue("randomk_verdict", "fails" if points("random-k 1%") < -10 else "falls behind")

# %% jupyter={"source_hidden": true}
say("""
The picture above: bytes per step against test accuracy. What this run shows
on this model (mean over {glue}`seeds`; the uncompressed run reaches
{glue}`none_acc`):

* fp16, bfloat16 and int8 send {glue}`fp16_fewer`, {glue}`bf16_fewer` and
  {glue}`int8_fewer` fewer bytes and {glue}`cast_verdict`.
* top-k at 1 % sends {glue}`topk_fewer` fewer bytes and, with error feedback,
  {glue}`topk_matches`; PowerSGD of matrix rank 2 sends {glue}`powersgd_fewer` fewer.
* one bit {glue}`sign_verdict` {glue}`sign_points` points here; random-k at
  1 % {glue}`randomk_verdict` ({glue}`randomk_acc`): it keeps about k/Ψ of
  the gradient's squared norm per step.
* threshold's bytes depend on the data (the count over the threshold per step).

The measured bytes equal the formulas (the "formula" column), so they fall
by the factor each formula states: fp16 {glue}`fp16_fewer`; int8
{glue}`int8_fewer` at 2 ranks but {glue}`int8_fewer_at_4` at 4 (it
all-gathers, (n - 1) Ψ bytes against the ring's 2 (n - 1)/n · 4Ψ); sparse and
one-bit payloads also grow with n for the same reason.
""")

# %% [markdown]
# ## 7. Error feedback on and off
#
# A biased compressor drops part of every step's gradient. *Error
# feedback* keeps what was not sent in a residual and adds it to the next
# step's gradient: nothing is lost, only delayed (the sum of what was sent
# plus the residual equals the sum of the gradients; the tests check it).
# Each lossy state takes `use_error_feedback=` (torch's name). Accuracy
# per epoch, with and without:

# %%
pairs = [("top-k 1%", "top-k 1%, no EF"), ("PowerSGD r2", "PowerSGD r2, no EF"),
         ("sign", "sign, no EF"), ("random-k 1%", "random-k 1%, no EF")]
figure, axes = plt.subplots(1, len(pairs), figsize=(14, 4.4), sharey=True)
for axis, (with_ef, without) in zip(axes, pairs):
    for name, style in ((with_ef, "-"), (without, "--")):
        curve = 100 * np.mean(by_name[name].history, axis=0)
        axis.plot(np.arange(1, len(curve) + 1), curve, style,
                  label=f"{'with' if style == '-' else 'without'} EF: "
                        f"{100 * by_name[name].test_accuracy:.1f} %")
    curve = 100 * np.mean(by_name["none"].history, axis=0)
    axis.plot(np.arange(1, len(curve) + 1), curve, ":", color="grey", label="no compression")
    axis.set_title(with_ef)
    axis.set_xlabel("epoch")
    # under the panel, where it covers no curve
    axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
axes[0].set_ylabel("test accuracy (%)")
axes[0].set_ylim(0, 100)
figure.tight_layout()
show_figure(figure, "compression_error_feedback.png")
for with_ef, without in pairs:
    a, b = by_name[with_ef], by_name[without]
    print(f"{with_ef:<14} with EF {100 * a.test_accuracy:6.2f} %   without {100 * b.test_accuracy:6.2f} %"
          f"   ({100 * (a.test_accuracy - b.test_accuracy):+.2f} points)")
topk_ef = points("top-k 1%", "top-k 1%, no EF")
glue("topk_no_ef", "ends lower" if topk_ef > 0 else "ends no lower")
glue("topk_ef_points", abs(topk_ef), ".1f")
glue("powersgd_ef_points", points("PowerSGD r2", "PowerSGD r2, no EF"), "+.1f")
glue("sign_ef_points", points("sign", "sign, no EF"), "+.1f")
glue("randomk_ef", 100 * by_name["random-k 1%"].test_accuracy, "{:.1f} %")
glue("randomk_no_ef", 100 * by_name["random-k 1%, no EF"].test_accuracy, "{:.1f} %")
behind = max(points("random-k 1%"), points("random-k 1%, no EF")) < -10
glue("randomk_behind", "stays far behind with or without it" if behind else
     "does not stay far behind in this run")
glue("randomk_norm_share", np.sqrt(norm_kept["random-k 1%"]), ".0%")
glue("randomk_wait", 1 / 0.01, ".0f")


def ef_seeds(with_ef, without):
    """Per seed, with feedback minus without, in points."""
    return [100 * (a - b) for a, b in zip(by_name[with_ef].accuracies, by_name[without].accuracies)]


randomk_seeds = ef_seeds("random-k 1%", "random-k 1%, no EF")
randomk_ef_points = points("random-k 1%", "random-k 1%, no EF")
glue("randomk_ef_points", randomk_ef_points, "+.1f")
if len(SEEDS) == 1:
    glue("randomk_which", "In this run (one seed) feedback moved it by "
         f"{randomk_ef_points:+.1f} points; one seed cannot say which of the two is worse in "
         "general: the full form's three seeds decide")
elif all(d > 0 for d in randomk_seeds) or all(d < 0 for d in randomk_seeds):
    glue("randomk_which", f"Feedback moved it by {randomk_ef_points:+.1f} points, the same way "
         f"in each of the {len(SEEDS)} seeds (" + ", ".join(f"{d:+.1f}" for d in randomk_seeds)
         + ")")
else:
    glue("randomk_which", f"Feedback moved it by {randomk_ef_points:+.1f} points on average, "
         "but not the same way in every seed (" + ", ".join(f"{d:+.1f}" for d in randomk_seeds)
         + "): which of the two is worse changes from seed to seed")
glue("ef_caution", "These are the numbers of one seed (the quick form): the full form's three seeds "
     "can move them by several points, even flip their sign" if len(SEEDS) == 1 else
     f"These are means over {len(SEEDS)} seeds")

# %% jupyter={"source_hidden": true}
say("""
Top-k without error feedback throws away 99 % of the coordinates every
step, and the small ones are never sent: training still works (the large
ones matter most) but {glue}`topk_no_ef` here ({glue}`topk_ef_points`
points between the two). With feedback, a small coordinate waits until it
has accumulated enough to be among the top k. Feedback moves PowerSGD by
{glue}`powersgd_ef_points` points on this MLP (the experiment's `--model cnn`
runs the same on the CNN).

Feedback is not a cure for everything. Random-k at 1 %
{glue}`randomk_behind` ({glue}`randomk_ef` with, {glue}`randomk_no_ef`
without, against {glue}`none_acc`): what it sends is about k/Ψ of the
gradient's *squared* norm ({glue}`randomk_norm` in part 4, about
{glue}`randomk_norm_share` of the norm itself), and with feedback each
coordinate waits about Ψ/k = {glue}`randomk_wait` steps (one over the ratio
of part 4) before it is sent, so what arrives is that many steps stale, and
momentum amplifies the stale kick. {glue}`randomk_which`. Feedback
moved one bit by {glue}`sign_ef_points` points in this run.
{glue}`ef_caution`.
Karimireddy et al. (2019, "Error Feedback Fixes SignSGD and other Gradient
Compression Schemes") prove EF-signSGD converges for plain SGD, not with
momentum on top. Measure before you believe.
""")

# %% [markdown]
# ## 8. Overlap, with and without a compressor
#
# DDP starts a bucket's communication as soon as the bucket is full, while
# backward still computes the earlier layers (lesson 5, part 4). A hook runs
# at the same moment; what changes is what the communication lane holds.
# With `overlap=False`, DDP starts nothing until the last gradient of the
# step is ready: then, still inside that last gradient's hook, it sends every
# bucket, one after the other, and `loss.backward()` returns only when they
# are done. So the trace's "backward" region holds the communication in both
# cases; what tells them apart is *when the first message leaves next to the
# moment the last gradient was ready*, which the step below records (a hook
# on every parameter, registered before DDP's, marks when its gradient is
# complete). One step of the digits CNN on 2 ranks with small buckets
# (several per step), with no hook and with PowerSGD; the compute lane shows
# forward, backward and the update, the send/recv lanes the messages.

# %%
def one_traced_step(hook_name, overlap):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load_digits(flatten=False)[:2]
    model = build_model("cnn", seed=0)
    for parameter in model.parameters():   # before DDP's hooks: marks when a gradient is complete
        parameter.register_post_accumulate_grad_hook(
            lambda tensor: trace.record("gradient", trace.now(), trace.now(),
                                        label="gradient ready"))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.02, algorithm="ring", overlap=overlap)
    if hook_name is not None:
        config = experiment.COMPRESSORS[hook_name]
        ddp.register_comm_hook(config.state(0), config.hook)
    optimizer = optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(3):
        mine = slice((step * world + rank) * 32, (step * world + rank + 1) * 32)
        with trace.region(f"step {step}", kind="step"):
            optimizer.zero_grad(set_to_none=False)
            with trace.region("forward"):
                loss = nn.CrossEntropyLoss()(ddp(Tensor(x[mine])), y[mine])
            with trace.region("backward"):
                loss.backward()
            with trace.region("update"):
                optimizer.step()
    return len(ddp.buckets)


def last_step(events):
    begin = min(e["start"] for e in events if e["kind"] == "step" and e["label"] == "step 2")
    return [e for e in events if e["start"] >= begin]


seen = {}
for hook_name in (None, "PowerSGD r2"):
    for overlap in (True, False):
        path = OUT / f"overlap_{hook_name}_{overlap}.trace.jsonl"
        buckets = minidist.launch(one_traced_step, world_size=2, args=(hook_name, overlap),
                                  trace=str(path))[0]
        events = last_step(trace.read_jsonl(path).events)
        ready = max(e["start"] for e in events if e["rank"] == 0 and e["kind"] == "gradient")
        events = [e for e in events if e["kind"] != "gradient"]
        sent = sum(e["bytes"] for e in events if e["kind"] == "send" and e["rank"] == 0)
        backward = next(e for e in events if e["rank"] == 0 and e["label"] == "backward")
        sends = sorted(e["start"] for e in events if e["rank"] == 0 and e["kind"] == "send")
        where = "inside" if sends[0] < backward["end"] else "after"
        messages = len(sends)
        early = sum(1 for start in sends if start < ready)
        algorithms = sorted({e["label"].split()[1].rstrip(":") for e in events
                             if e["rank"] == 0 and e["kind"] == "send"})
        name = hook_name or "no hook"
        seen[(name, overlap)] = (where, sent, messages, sends[0] - ready, early, algorithms)
        print(f"{name:<12} overlap={overlap!s:<5} {buckets} buckets: rank 0 sent {sent:>7,} bytes "
              f"in {messages} messages ({', '.join(algorithms)}); first message "
              f"{abs(sends[0] - ready) / 1e3:,.0f} us {'before' if sends[0] < ready else 'after'} "
              f"the last gradient was ready, {early} of {messages} messages before it "
              f"(backward, communication included, lasted "
              f"{(backward['end'] - backward['start']) / 1e3:,.0f} us)")
        if overlap:   # the two pictures the text reads
            safe = name.replace(" ", "_")
            timeline = OUT / f"compression_timeline_{safe}_overlap_{overlap}.png"
            save_timeline(events, timeline,
                          title=f"one DDP step of the digits CNN, 2 ranks, {name}, overlap=True")
            show_file(timeline)
plain_seen, powersgd_seen = seen[("no hook", True)], seen[("PowerSGD r2", True)]
glue("plain_sent", plain_seen[1], "{:,}")
glue("powersgd_sent", powersgd_seen[1], "{:,}")
glue("plain_messages", plain_seen[2])
glue("powersgd_messages", powersgd_seen[2])
glue("bytes_verdict", "fewer" if powersgd_seen[1] < plain_seen[1] else "no fewer")
glue("messages_verdict", "more" if powersgd_seen[2] > plain_seen[2] else "no more")
# Without overlap DDP sends once backward has computed every gradient (still
# inside the backward region, which ends after DDP's last message).
NAMES = ("no hook", "PowerSGD r2")
waits = all(seen[(name, False)][3] >= 0 and seen[(name, False)][4] == 0 for name in NAMES)
ahead = all(seen[(name, True)][4] > 0 for name in NAMES)
glue("early_plain", seen[("no hook", True)][4])
glue("early_powersgd", seen[("PowerSGD r2", True)][4])
glue("overlap_verdict", "leave while backward still computes: some messages go before the "
     "last gradient is ready" if ahead else "do not all leave before the last gradient here")
glue("no_overlap_verdict", "no message leaves before the last gradient is ready, with or "
     "without the hook: the first one left " + " and ".join(
         f"{seen[(name, False)][3] / 1e3:,.0f} us after it ({name})" for name in NAMES)
     if waits else "a message left before the last gradient was ready, which overlap=False "
     "should not allow")
glue("count_algorithm", ", ".join(a for a in seen[("PowerSGD r2", True)][5] if a != "ring"))

# %% jupyter={"source_hidden": true}
say("""
The two timelines above are the same step, with overlap: the messages
{glue}`overlap_verdict` ({glue}`early_plain` of them without a hook,
{glue}`early_powersgd` with PowerSGD); PowerSGD's are {glue}`bytes_verdict` bytes
({glue}`powersgd_sent` against {glue}`plain_sent` from rank 0) but
{glue}`messages_verdict` messages ({glue}`powersgd_messages` against
{glue}`plain_messages`: two all-reduces per bucket), and its compute (the
matrix products and the orthogonalisation) sits between them. The first,
short span of each step, `all_reduce {glue}`count_algorithm``, is the example
count (one 8-byte integer) DDP sums before the first bucket: for so small a
message the automatic choice of algorithm sends the whole array straight to
the other rank in one message, where a ring would need more steps for nothing;
the buckets' sums, and PowerSGD's U and Y, use the ring (`all_reduce ring`).
With `overlap=False` {glue}`no_overlap_verdict`.
""")

# %% [markdown]
# What one machine cannot show is a speed-up: nothing in minidist communicates
# in the background, messages move only when backward hands DDP a gradient,
# and shared memory is so fast that there is little to hide. On a network,
# each bucket's transfer runs while the next layers compute, and
# compression shortens exactly the part overlap cannot hide.
#
# ## 9. When compression pays
#
# Compression trades bytes for compute. On a link of β seconds per byte a
# step of the uncompressed run that sends N bytes costs about
# compute + N β; a compressor adds its own compute (cast, sort, QR: its
# *codec*) and removes bytes. It wins when the link's bandwidth 1/β is below
# `bytes saved / codec time`. The codec
# time is measured on one process (world size 1: the hook runs, its
# collectives have nobody to talk to), the median of many calls on a bucket
# of the model's shapes; the bytes saved are the formulas' at n = 2 (which
# part 6 measured equal to the trace). For the digits MLP and for Dettmers'
# layer:

# %%
class TimingBucket:
    """The part of GradBucket a hook uses, for one process."""

    def __init__(self, shapes, rng):
        self.shapes = shapes
        self.values = rng.standard_normal(sum(int(np.prod(s)) for s in shapes)).astype(np.float32)
        self.group, self.world_size, self.rank, self.algorithm = None, 1, 0, "ring"

    def buffer(self):
        return self.values.copy()

    def divisor(self):
        return 1

    def index(self):
        return 0

    def is_last(self):
        return True

    def parameters(self):
        return [Tensor(np.zeros(shape, np.float32)) for shape in self.shapes]


def codec_seconds(shapes, names, repeats):
    """Median seconds of each hook on one rank, minus the plain all-reduce hook's."""
    bucket = TimingBucket(shapes, np.random.default_rng(0))
    out = {}
    for name in ["none"] + names:
        config = experiment.COMPRESSORS[name]
        state = config.state(0)
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            config.hook(state, bucket)
            times.append(time.perf_counter() - begin)
        out[name] = float(np.median(times))
    return {name: out[name] - out["none"] for name in names}


DETTMERS_LAYER = [(10,), (10, 500), (500,), (500, 1000)]  # 1000 -> 500 -> 10, bucket order
MODELS = {"digits MLP": experiment.parameter_shapes("mlp"), "Dettmers' 1000x500": DETTMERS_LAYER}
CODECS = ["fp16", "bf16", "int8", "sign", "top-k 1%", "random-k 1%", "PowerSGD r2"]
codecs = minidist.launch(lambda: {m: codec_seconds(s, CODECS, 20 if QUICK else 100)
                                  for m, s in MODELS.items()}, world_size=1)[0]
print(f"{'model':<18} {'compressor':<12} {'codec ms':>9} {'bytes saved':>12} {'wins below':>14}")
crossover = {}
for model_name, shapes in MODELS.items():
    dense = experiment.formula_bytes("none", shapes, 2)
    for name in CODECS:
        extra = codecs[model_name][name]
        saved = dense - experiment.formula_bytes(name, shapes, 2)
        verdict = "always" if extra <= 0 else f"{8 * saved / extra / 1e6:,.0f} Mbit/s"
        print(f"{model_name:<18} {name:<12} {1e3 * extra:9.3f} {saved:12,.0f} {verdict:>14}")
        crossover[(model_name, name)] = (extra, saved,
                                         float("inf") if extra <= 0 else 8 * saved / extra)

SMALL, LARGE = MODELS
cheap = ["fp16", "bf16", "top-k 1%"]
cheap_ms = max(1e3 * crossover[(SMALL, name)][0] for name in cheap)
cheap_bits = min(crossover[(SMALL, name)][2] for name in cheap)
glue("cheap_ms", cheap_ms, "{:.3f} ms")
glue("cheap_codec", "a fraction of a millisecond" if cheap_ms < 1 else "a millisecond or more")
glue("cheap_crossover", cheap_bits / 1e9, "{:.1f} Gbit/s")
glue("cheap_range", "in the gigabits per second" if cheap_bits >= 1e9 else
     "below a gigabit per second")
dearest = sorted(CODECS, key=lambda name: crossover[(SMALL, name)][2])[:2]
glue("dearest", " and ".join(dearest))
saved_ratio = np.median([crossover[(LARGE, n)][1] / crossover[(SMALL, n)][1] for n in CODECS])
work_ratio = np.median([crossover[(LARGE, n)][0] / crossover[(SMALL, n)][0] for n in CODECS
                        if crossover[(SMALL, n)][0] > 0])
glue("saved_ratio", saved_ratio, ".0f")
glue("work_ratio", work_ratio, ".0f")
glue("crossover_verdict", "so its crossovers stay in the same range: compression is a "
     "question of the link's speed against the processor's, not of the model's size"
     if 1 / 3 <= saved_ratio / work_ratio <= 3 else
     "so its crossovers lie " + ("lower" if work_ratio > saved_ratio else "higher")
     + ": on this CPU the codec's work did not grow in step with the bytes it saves, so the "
     "crossover depends on the model's size as well as on the link's speed against the "
     "processor's")

# %% jupyter={"source_hidden": true}
say("""
Read the last column as: on a link slower than this, the compressor's
step is faster than the uncompressed one (with the compute of a step
unchanged and the communication not hidden by overlap). On the digits MLP
the casts and top-k cost {glue}`cheap_codec` (at most {glue}`cheap_ms`) and
save most of the bytes, so their crossover lies {glue}`cheap_range` (the
lowest at {glue}`cheap_crossover`) on this CPU: a 1 Gbit/s Ethernet link is
slower than that, a 100 Gbit/s InfiniBand link faster. On the small model
{glue}`dearest` cost the most per byte saved. The larger layer saves
{glue}`saved_ratio` times more bytes for {glue}`work_ratio` times more codec
work (medians over the compressors), {glue}`crossover_verdict`. The benchmark (`benchmarks/bench_compression.py`) measures whole
steps with each compressor next to PyTorch's own hooks on gloo, and the
crossover with the cost model. (A GPU runs the codec far faster than these
CPU cores, which moves every crossover up.)
""")

# %% [markdown]
# What you can try: change the ratio of top-k (`TopKState(0.001)`), the matrix
# rank of PowerSGD (`PowerSGDState(matrix_approximation_rank=4)`), or the
# threshold (the names of part 6's runs are in `minidist/experiments/compression.py`); run `python -m minidist.experiments.compression
# --model cnn --world-size 4 --full` to see how the bytes of the all-gather
# compressors grow with n.
