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
# # Lesson 14: faster inference
#
# The LSML lecture "Распараллеливание нейросетей" (Large Scale Machine
# Learning, lecture 7) opens with the question every trained network meets:
# how to make its predictions fast. Four answers, each run and measured here:
#
# 1. **batch prediction is embarrassingly parallel**: split the examples
#    across worker processes, predict, gather in order;
# 2. **INT8**: store the weights (and compute) in 8-bit integers;
# 3. **teacher-student compression**: train a small student to imitate a
#    big teacher (Hinton, Vinyals and Dean, "Distilling the Knowledge in a
#    Neural Network", 2015; Romero et al., "FitNets: Hints for Thin Deep
#    Nets", 2014);
# 4. **mobile architectures**: MobileNet's depthwise-separable convolution
#    does a fraction of a standard convolution's multiply-adds.
#
# Library code: `minidist/parallel/data/inference.py` (`parallel_predict`),
# `minidist/nn/quantization.py` (`quantize`), `minidist/nn/distillation.py`
# (`DistillationLoss`, `HintRegressor`) with the experiment in
# `minidist/experiments/distillation.py`, `minidist/nn/mobile.py`
# (`DepthwiseSeparableConv2d`, the multiply-add counts).

# %%
import os
import time

import numpy as np

from minidist import Tensor, nn, no_grad
from minidist.data import load_digits
from minidist.experiments import distillation
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
from minidist.lesson_timing import Load, timed
from minidist.nn import mobile
from minidist.nn.quantization import model_size_bytes, quantize
from minidist.parallel.data.inference import parallel_predict, predict
from minidist.runtime.blas_threads import set_blas_threads
from minidist.runtime.oversubscription import cores
from minidist.train import evaluate, train_digits

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
# One BLAS thread in this process: on a busy machine a product split over
# two threads waits for the one without a core (this lesson took 4x as long).
set_blas_threads(1)
import matplotlib.pyplot as plt  # noqa: E402

QUICK = quick()
OUT = output_dir()
glue("form_note",
     "This is the quick form (MINIDIST_LESSON_QUICK=1): the CNN of sections 1 and 2 trains 4 "
     "epochs (the full form: 15, a better model), section 1 predicts the test digits 10 times "
     "over (the full form: 40 times), and section 3 trains the students at one budget, 200 "
     "labelled examples, with 3 seeds (the full form: budgets of 100, 200 and 400, 5 seeds "
     "each)." if QUICK else
     "This is the full form: the CNN trains 15 epochs, section 1 predicts the test digits 40 "
     "times over, and section 3 trains the students at budgets of 100, 200 and 400 labelled "
     "examples, 5 seeds each (the quick form, MINIDIST_LESSON_QUICK=1: 4 epochs, 10 copies, "
     "one budget of 200 with 3 seeds).")

# %% jupyter={"source_hidden": true}
say("""
{glue}`form_note`
""")

# %% [markdown]
# ## 1. Batch prediction on n processes
#
# Prediction needs no communication between examples: the batches are dealt
# to the workers in order (each takes a contiguous run of whole batches),
# each predicts its run, and the parent puts the runs back in order. The
# only costs are starting the processes and moving the results. First a
# model worth predicting with: the digits CNN.

# %%
trained = train_digits("cnn", epochs=4 if QUICK else 15, progress=False)
cnn = trained["model"]
x_train, y_train, x_test, y_test = load_digits(flatten=False)
copies = 10 if QUICK else 40
x_many = np.concatenate([x_test] * copies)      # a bigger set: the test digits, repeated
print(f"{len(x_many):,} images to predict, {os.cpu_count()} cores on this machine")

reference = predict(cnn, x_many, output="labels")
found = {}
load = Load.start()
# Each count twice, in the order 1 2 4 4 2 1 (load that comes or goes weighs
# on all alike); each keeps its faster run.
for workers in (1, 2, 4, 4, 2, 1):
    begin = time.perf_counter()
    labels = parallel_predict(cnn, x_many, world_size=workers, output="labels", progress=False)
    seconds = time.perf_counter() - begin
    best, same = found.get(workers, (float("inf"), True))
    found[workers] = (min(best, seconds), same and np.array_equal(labels, reference))
load = load.finish()
rows = [(workers, seconds, same) for workers, (seconds, same) in sorted(found.items())]
base = rows[0][1]
print(f"{'workers':>7} {'seconds':>8} {'images/s':>9} {'speed-up':>9}  same as one process")
for workers, seconds, same in rows:
    print(f"{workers:>7} {seconds:8.3f} {len(x_many) / seconds:9,.0f} {base / seconds:8.2f}x  {same}")
print(f"(the faster of two runs each; {load.describe()})")
beyond = [w for w, seconds, _ in rows if base / seconds > 1.1 * min(w, cores())]
if beyond or load.busy:
    print("  not speed-ups to trust: " + (f"above the {cores()} cores' limit for "
          f"{', '.join(map(str, beyond))} workers; " if beyond else "")
          + (load.note("`python benchmarks/bench_inference.py` measures them with interleaved "
                       "repeats") if load.busy else "the machine's load changed between runs"))

figure, axis = plt.subplots(figsize=(5, 3.2))
axis.bar([str(w) for w, _, _ in rows], [len(x_many) / s for _, s, _ in rows], color="#006BA4")
axis.set_xlabel("worker processes")
axis.set_ylabel("images per second")
axis.set_title(f"parallel prediction of the digits CNN ({os.cpu_count()} cores)")
figure.tight_layout()
show_figure(figure, "inference_throughput.png")
assert all(same for _, _, same in rows)
glue("cores", cores())
best_workers, best_seconds, _ = min(rows, key=lambda row: row[1])
glue("best_speedup", base / best_seconds, "{:.2f}x")
glue("best_workers", best_workers)
glue("most_workers", rows[-1][0])
glue("cores_verdict", "no more than the cores allow" if base / best_seconds <= 1.1 * cores()
     else "more than the cores allow: a number not to trust")

# %% jupyter={"source_hidden": true}
say("""
The predictions are the same bits as one process's, in order, for any
number of workers (the tests check n = 1..4 and sizes that n does not
divide), and on any BLAS kernel: every batch is computed in the same shape,
at the same place, on one BLAS thread, in one process as on n (on some
kernels a row's last bits depend on all three; the module docstring of
`minidist/parallel/data/inference.py` says why). The speed-up is bounded by
the number of cores: {glue}`most_workers` workers on {glue}`cores` cores take
turns. The best here, {glue}`best_speedup` with {glue}`best_workers` workers,
is {glue}`cores_verdict`. Each run includes starting the processes, so small
data sets gain less; `benchmarks/bench_inference.py` measures throughput with
interleaved repeats.
""")

# %% [markdown]
#
# ## 2. INT8
#
# Post-training quantisation: each output channel's weights get one scale
# (`max |w_c| / 127`) and become int8; each layer's input gets a scale from
# a few *calibration* batches run through the float model. A layer then
# multiplies int8 by int8, adds in int32, and rescales by σ_x σ_w: σ_x the
# input's scale, σ_w the output channel's weight scale (this course writes
# them σ, as s is bytes per value in lessons/NOTATION.md).
# `quantize(model, calibration_data)` returns a quantised copy:

# %%
calibration = x_train[:256]
quantized = quantize(cnn, calibration)
float_bytes, int8_bytes = model_size_bytes(cnn), model_size_bytes(quantized)
float_weights = model_size_bytes(cnn, weights_only=True)
int8_weights = model_size_bytes(quantized, weights_only=True)
accuracy_float, accuracy_int8 = evaluate(cnn, x_test, y_test), evaluate(quantized, x_test, y_test)


def forward_seconds(model, x, repeats=5):
    times = []
    with no_grad():
        for _ in range(repeats):
            begin = time.perf_counter()
            model(Tensor(x))
            times.append(time.perf_counter() - begin)
    return float(np.median(times))


batch = x_test[:256]
with no_grad():  # the two take turns, the fastest of 3 repeats each
    forwards = timed({"float32": lambda: cnn(Tensor(batch)),
                      "int8": lambda: quantized(Tensor(batch))}, repeats=3)
print(f"{'':<8} {'test acc':>9} {'weights':>9} {'model':>9} {'forward of 256':>15}")
print(f"{'float32':<8} {100 * accuracy_float:8.2f}% {float_weights:9,} {float_bytes:9,} "
      f"{1e3 * forwards.best['float32']:12.2f} ms")
print(f"{'int8':<8} {100 * accuracy_int8:8.2f}% {int8_weights:9,} {int8_bytes:9,} "
      f"{1e3 * forwards.best['int8']:12.2f} ms")
print(f"weights {float_weights / int8_weights:.1f}x smaller, whole model "
      f"{float_bytes / int8_bytes:.1f}x (biases and scales stay float32)")
glue("weights_smaller", float_weights / int8_weights, "{:.1f} times")
accuracy_gap = 100 * abs(accuracy_float - accuracy_int8)
glue("accuracy_gap", accuracy_gap, "{:.2f} points")
glue("accuracy_verdict", "the same accuracy to within a point" if accuracy_gap <= 1
     else "an accuracy that differs by more than a point")
int8_slower = forwards.best["int8"] / forwards.best["float32"]
glue("int8_slower", int8_slower, "{:.0f} times")
glue("int8_verdict", "*slower* here" if int8_slower > 1 else "no slower here, this time")

# %% jupyter={"source_hidden": true}
say("""
{glue}`weights_smaller` smaller weights, {glue}`accuracy_verdict`
({glue}`accuracy_gap` apart). But {glue}`int8_verdict`: the int8 forward took
{glue}`int8_slower` as long as float32's. NumPy has no integer matrix product
in BLAS, so an int32 matmul is a plain loop without cache blocking, far
slower than float32 BLAS. On hardware with int8 instructions (x86's VNNI,
Vector Neural Network Instructions, or a GPU's tensor cores) the integer
product is faster than float32's; in NumPy int8 buys memory, not speed.
(`benchmarks/bench_inference.py` shows that the same integer product done in
float32 BLAS runs as fast as float32, and is exact while each dot product
sums at most 1,040 products of two int8 values: 1,040 × 127 × 127 still fits
float32's 24-bit mantissa.)
`minidist predict --int8` says the same when it prints its times.
""")

# %% [markdown]
#
# ## 3. Teacher and student
#
# A big teacher (64-256-256-10, 85,002 parameters, trained on all the
# training digits) and a student 70 times smaller (64-16-10). The student
# sees only a limited budget of labelled examples, where soft targets
# matter most. Five methods, with the same seeds, two students:
#
# * `hard`: the small student on the hard labels alone;
# * `hinton`: the small student with Hinton's `DistillationLoss`: the
#   teacher's outputs softened by a temperature (written θ here, as T is the
#   sequence length in lessons/NOTATION.md), given a weight λ against the
#   labels' 1 - λ (Hinton's paper writes α, which this course keeps for
#   latency), times θ^2 so their gradient keeps its size as θ changes;
# * FitNets (Romero et al.) needs a *thinner, deeper* student (64-16-16-16-10):
#   `fitnets` first trains its middle layer, through a `HintRegressor`, to
#   predict the teacher's hidden layer (the hint), then distils it as
#   `hinton` does; to tell what the hint adds, the same thin, deep student is
#   also trained on hard labels (`fitnets_hard`) and distilled without the
#   hint stage (`deep_hinton`).

# %%
budgets = (200,) if QUICK else (100, 200, 400)
seeds = (0, 1, 2) if QUICK else tuple(range(5))
teacher = distillation.train_teacher(load_digits(flatten=True), seed=0)
all_results = [distillation.run(seeds=seeds, budget=b, teacher=teacher) for b in budgets]
for results in all_results:
    print(distillation.format_table(results))
    print()
picture = distillation.plot(all_results, OUT / "distillation.png")
show_file(picture)
for results in all_results:
    beats = results["mean"]["hinton"] > results["mean"]["hard"]
    print(f"budget {results['budget']}: Hinton {'beats' if beats else 'does not beat'} hard "
          f"labels on the mean of {len(seeds)} seeds: {100 * results['mean']['hinton']:.2f} % "
          f"against {100 * results['mean']['hard']:.2f} %")
wins = [r["mean"]["hinton"] > r["mean"]["hard"] for r in all_results]
for method in ("hard", "hinton", "deep_hinton", "fitnets"):   # kept for the checks
    glue(f"{method}_means", [100 * r["mean"][method] for r in all_results])
glue("budgets", " and ".join(", ".join(str(r["budget"]) for r in all_results).rsplit(", ", 1)))
glue("budget_word", "a budget" if len(all_results) == 1 else "budgets")
glue("hinton_verdict", ("beats" if all(wins) else "does not beat" if not any(wins) else
                        "beats at some budgets, not all:")
     + ("" if len(all_results) == 1 else (" at every budget" if all(wins) else "")))
glue("hinton_vs_hard", "; ".join(
    f"{100 * r['mean']['hinton']:.1f} % against {100 * r['mean']['hard']:.1f} %"
    + ("" if len(all_results) == 1 else f" at {r['budget']}") for r in all_results))
helps = [r["mean"]["fitnets"] > r["mean"]["deep_hinton"] + 0.005 for r in all_results]
glue("hints_verdict", "added a little" + ("" if len(helps) == 1 else
                                          " at every budget" if all(helps) else " at some budgets")
     if any(helps) else "did not add anything")
glue("fitnets_vs_deep", "; ".join(
    f"{100 * r['mean']['fitnets']:.1f} % against {100 * r['mean']['deep_hinton']:.1f} %"
    + ("" if len(all_results) == 1 else f" at {r['budget']}") for r in all_results))

# %% jupyter={"source_hidden": true}
say("""
The soft targets carry what the teacher learned about which digits look
alike (a 7 that is a little like a 1), which hard labels cannot say: at
{glue}`budget_word` of {glue}`budgets` examples the distilled student
(`hinton`) {glue}`hinton_verdict` the same student on hard labels (`hard`) on
the mean of the seeds ({glue}`hinton_vs_hard`). FitNets' hints
{glue}`hints_verdict` over plain distillation of the same thin, deep student
on these 8x8 digits (`fitnets` against `deep_hinton`: {glue}`fitnets_vs_deep`):
a 3-hidden-layer MLP is not deep enough to need them (Romero et al. used 11-
to 19-layer convolutional students).
""")

# %% [markdown]
#
# ## 4. Mobile convolutions
#
# A standard convolution with a square kernel f values wide (f x f; the
# letter f here, as k is top-k's in lessons/NOTATION.md) from C_in to C_out
# channels does f^2 C_in C_out multiply-adds per output pixel. MobileNet
# (Howard et al., "MobileNets: Efficient Convolutional Neural Networks for
# Mobile Vision Applications", 2017) splits it into a *depthwise* f x f
# convolution (one filter per channel, `groups=C_in`: f^2 C_in) and a
# *pointwise* 1 x 1 one (C_in C_out): the
# ratio is 1 / C_out + 1 / f^2: at f = 3 and C_out of 64 or more, about 8
# times fewer. The table: channels in -> out, and the image's height x width.

# %%
def conv_seconds(module, x, repeats=5):
    return forward_seconds(module, x, repeats)


shapes = [(32, 64, 28), (64, 128, 14), (128, 128, 14)]
print("batch of 8 images; multiply-adds per image, time per batch")
madd_ratios, time_ratios, depthwise_shares = [], [], []
print(f"{'C_in->C_out, hxw':<18} {'MAdds std':>11} {'MAdds sep':>11} {'ratio':>6} "
      f"{'ms std':>7} {'ms sep':>7} {'ratio':>6}")
for c_in, c_out, size in shapes:
    costs = mobile.compare_costs(c_in, c_out, 3, size, size)
    x = np.random.default_rng(0).standard_normal((8, c_in, size, size)).astype(np.float32)
    standard = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
    separable = mobile.DepthwiseSeparableConv2d(c_in, c_out, batch_norm=False).eval()
    t_standard, t_separable = conv_seconds(standard, x), conv_seconds(separable, x)
    t_depthwise = conv_seconds(separable.depthwise, x)
    madd_ratios.append(costs["multiply_add_ratio"])
    time_ratios.append(t_separable / t_standard)
    depthwise_shares.append(t_depthwise / t_separable)
    print(f"{f'{c_in}->{c_out}, {size}x{size}':<18} {costs['standard_multiply_adds']:11,} "
          f"{costs['separable_multiply_adds']:11,} {costs['multiply_add_ratio']:6.3f} "
          f"{1e3 * t_standard:7.2f} {1e3 * t_separable:7.2f} {t_separable / t_standard:6.2f}"
          f"  (depthwise {t_depthwise / t_separable:.0%} of it)")
depthwise_madds = [9 * c_in / (9 * c_in + c_in * c_out) for c_in, c_out, _ in shapes]
glue("madd_fewer_low", 1 / max(madd_ratios), "{:.1f}")
glue("madd_fewer_high", 1 / min(madd_ratios), "{:.1f}x")
glue("time_share_low", min(time_ratios), ".2f")
glue("time_share_high", max(time_ratios), ".2f")
glue("slower_somewhere", "; on one shape it was slower" if max(time_ratios) > 1 else "")
glue("time_verdict", "far less" if max(1 / r for r in time_ratios) < 0.75 / max(madd_ratios)
     else "less" if 1 / min(time_ratios) < 1 / max(madd_ratios) else "as much, here")
glue("depthwise_madds_low", min(depthwise_madds), ".0%")
glue("depthwise_madds_high", max(depthwise_madds), ".0%")
glue("depthwise_time_low", min(depthwise_shares), ".0%")
glue("depthwise_time_high", max(depthwise_shares), ".0%")
most = min(depthwise_shares) > 0.5
glue("depthwise_verdict", "most of the time" if most else
     "more of the time than of the arithmetic" if min(depthwise_shares) > max(depthwise_madds)
     else "a share of the time not far from its share of the arithmetic")

# %% jupyter={"source_hidden": true}
say("""
The multiply-adds fall {glue}`madd_fewer_low` to {glue}`madd_fewer_high`; the
time falls {glue}`time_verdict`: the separable block takes {glue}`time_share_low`
to {glue}`time_share_high` of the standard convolution's time, on one BLAS
thread{glue}`slower_somewhere` (`benchmarks/bench_mobile.py` measures forward
and backward with interleaved repeats). The depthwise half
does {glue}`depthwise_madds_low` to {glue}`depthwise_madds_high` of the
separable block's arithmetic but takes {glue}`depthwise_verdict`
({glue}`depthwise_time_low` to {glue}`depthwise_time_high`): 9 multiply-adds
per value it reads (memory bound), and products too small for BLAS to be
efficient. Counting operations predicts speed only where the arithmetic is
the bottleneck.
""")
