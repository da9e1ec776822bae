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
# # Lesson 6: large batches, and the rules that make them work
#
# Lesson 5 ended with a promise kept: n workers with b examples each train
# exactly like one process with batch n b. Read it the other way round and
# it is a problem. Adding workers *is* enlarging the batch, and "it all
# comes down to the batch size: will it still converge with a large one?"
# (the LSML lecture "Распараллеливание нейросетей", Large Scale Machine
# Learning, lecture 7). Small batches are no answer either: they leave
# the hardware idle and allow few workers. Large ones change training: over
# a fixed number of epochs a batch k times larger makes k times fewer
# updates. With no other change, accuracy drops. The fixes that Hideki
# Tsunashima's slides (分散学習のあれこれ, 2019) name, with the papers they cite:
# scale the learning rate with the batch (linear scaling plus warm-up),
# give every layer its own rate (LARS), or grow the batch during training
# in place of decaying the rate. With these, Preferred Networks trained
# ImageNet with 32k-example batches (1,024 GPUs with 32 each).
#
# This chapter:
#
# 1. measures why we want large batches: examples per second against the
#    batch size;
# 2. checks that one process can stand in for many workers: DDP on 2
#    workers at a large batch gives the single-process weights;
# 3. trains the digits MLP at batch sizes from 16 to the whole training
#    set for a fixed number of epochs, with four learning-rate rules, and
#    plots test accuracy against batch size;
# 4. looks inside LARS: the per-layer ratio ||w|| / ||g|| it corrects for;
# 5. compares decaying the learning rate with growing the batch (Smith et
#    al.).
#
# The experiment lives in `minidist/experiments/large_batch.py` (run it on
# its own with `python -m minidist.experiments.large_batch --full`); this
# lesson calls it, with fewer seeds and batch sizes in its reduced form.

# %%
import time

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim
from minidist.experiments import large_batch as lb
from minidist.lesson import (
    glue,
    glued,
    narrate,
    output_dir,
    quick,
    say,
    show_file,
    use_headless_matplotlib,
)
from minidist.lesson_timing import timed
from minidist.parallel.data.ddp import DistributedDataParallel

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

QUICK = quick()
OUT = output_dir()
data = lb.digits_data()
x_train, y_train, x_test, y_test = data
TRAIN_SIZE = len(x_train)
CONFIG = lb.configuration(full=not QUICK, dataset_size=TRAIN_SIZE)
print(f"digits: {TRAIN_SIZE} training images, {len(x_test)} test images; "
      f"{'reduced' if QUICK else 'full'} form of the experiment")

# %% jupyter={"source_hidden": true}
if QUICK:
    say("""
*This is the quick form of the lesson* (the experiment's reduced form). Section
1 times 20 steps per batch size (the full form: 100); section 3 runs one seed
(the full form: five) at batch sizes 16, 64, 256, 1,024 and the whole
training set (the full form: every power of two from 16 to 1,024, and the
whole set); section 5 runs 15 epochs with milestones at 5 and 10 and one seed
(the full form: 30 epochs, milestones at 10 and 20, five seeds). With one
seed there is no spread between seeds to report.
""")

# %% [markdown]
# ## 1. Why large batches: the hardware wants them
#
# One forward and backward pass over a batch of B examples costs a fixed
# overhead (Python, launching each operation, on a GPU a kernel launch)
# plus work proportional to B. Small batches pay the overhead per few
# examples. We time one training step of the lesson's MLP at a few sizes,
# the sizes taking turns, keeping each one's fastest step (lesson 1 says
# why), on one BLAS thread.

# %%
def training_step(batch_size):
    """One SGD step of the MLP on the first ``batch_size`` images, as a function."""
    model = lb.make_model(seed=0)
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    xs, ys = Tensor(x_train[:batch_size]), y_train[:batch_size]

    def step():
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(xs), ys).backward()
        optimizer.step()
    return step


SIZES = (1, 16, 128, 1024)
timing = timed({size: training_step(size) for size in SIZES}, repeats=20 if QUICK else 100)
rates = {size: size / timing.best[size] for size in SIZES}
for batch_size in SIZES:
    print(f"batch {batch_size:>5}: {rates[batch_size]:>10,.0f} examples/s")
print(f"batch 1,024 against batch 1: {rates[1024] / rates[1]:.0f}x the examples per second; "
      f"against batch 16: {rates[1024] / rates[16]:.0f}x ({timing.load.describe()})")
if timing.load.busy:
    print(timing.load.note("each rate is the fastest of its steps, so the order holds if one "
                           "step of each ran undisturbed"))

glue("rate_1024_vs_1", rates[1024] / rates[1], ".0f")
glue("rate_1024_vs_16", rates[1024] / rates[16], ".0f")
glue("timing_load", timing.load.describe())
glue("rate_verdict", "grew with the batch at every size" if
     all(rates[a] < rates[b] for a, b in zip(SIZES, SIZES[1:])) else
     "did not grow at every size this time (a busy machine: each rate is one fastest step)")

# %% jupyter={"source_hidden": true}
say("""
Here the batch of 1,024 went through {glue}`rate_1024_vs_1` times more
examples per second than a batch of one, and {glue}`rate_1024_vs_16` times
more than a batch of 16; the rate {glue}`rate_verdict` ({glue}`timing_load`;
the factors depend on the machine; the load is the load average, the number of
processes ready to run, before and after the timing, against the machine's
cores). On a GPU the gap is larger still: a batch
of 16 leaves most of its thousands of cores idle. With n workers the same
argument holds per worker: each one needs a batch large enough to be
efficient, and the global batch is n times that.
""")

# %% [markdown]
# ## 2. One process stands in for many workers
#
# `tests/parallel/test_data_parallel.py` proves, for SGD with momentum and Adam and 1
# to 4 workers with uneven last shards, that data parallel training ends with
# the weights of one process training on the global batch. So the rest of
# this chapter trains in one process, which is faster here. Once more, for
# the record, at one large-batch point of the experiment: global batch
# 256, the linear scaling rule with warm-up, 2 epochs, once by
# `run_point` of `minidist/experiments/large_batch.py` (imported as `lb`)
# in this process and once by DDP on 2 workers, each taking
# half of every global batch from the experiment's own epoch order.

# %%
DDP_BATCH, DDP_EPOCHS = 256, 2


def ddp_large_batch(rule_name, batch_size, epochs):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = lb.make_model(seed=0)
    ddp = DistributedDataParallel(model)
    optimizer, scheduler = lb.RULES[rule_name].build(ddp.parameters(), batch_size,
                                                     lb.BASE_BATCH, TRAIN_SIZE)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        order = lb.epoch_order(TRAIN_SIZE, 0, epoch)
        for start in range(0, TRAIN_SIZE, batch_size):
            mine = order[start:start + batch_size][rank::world]   # my half of the global batch
            optimizer.zero_grad(set_to_none=False)
            loss_fn(ddp(Tensor(x_train[mine])), y_train[mine]).backward()
            optimizer.step()
            scheduler.step()
    return np.concatenate([p.data.reshape(-1) for p in model.parameters()])


single = lb.run_point(lb.RULES["linear_warmup"], DDP_BATCH, DDP_EPOCHS, seed=0, data=data)
single_weights = np.concatenate([p.data.reshape(-1) for p in single["model"].parameters()])
workers = minidist.launch(ddp_large_batch, world_size=2, transport="shm",
                          args=("linear_warmup", DDP_BATCH, DDP_EPOCHS))
ddp_gap = np.abs(workers[0] - single_weights).max()
print(f"{single['updates']} updates at batch {DDP_BATCH} (peak rate {single['peak_lr']:.2f}): "
      f"max |w_ddp - w_single| = {ddp_gap:.1e}, "
      f"ranks identical: {np.array_equal(workers[0], workers[1])}")
glue("ddp_gap", ddp_gap, ".1e")
glue("ddp_verdict", "agree to float32 rounding" if ddp_gap < 1e-4 else "do not agree")

# %% jupyter={"source_hidden": true}
say("""
The weights {glue}`ddp_verdict` (largest difference {glue}`ddp_gap`).
""")

# %% [markdown]
# A batch of 256 on 2 workers, or
# 32 on each of 8, or 1 on each of 256: the arithmetic of the update is the
# same, so the experiment below holds for any way of splitting the batch.
#
# ## 3. Test accuracy against the batch size
#
# Every run trains the same MLP (64 -> 64 -> ReLU -> 10, momentum 0.9) from
# the same initial weights, on the same shuffled order of examples, for the
# same number of epochs. Only the batch size and the learning-rate rule
# change. The base rate 0.01 was chosen at batch B0 = 16 (rates from 0.01 to
# 0.05 did about equally well there) and never retuned:
#
# * **constant**: the rate stays 0.01 whatever the batch;
# * **linear**: η = 0.01 B / 16, η the learning rate (Goyal et al., 2017).
#   Reason: k small steps move the weights by about η times the sum of k
#   gradients; one step on a k times larger batch averages those k
#   gradients, so it needs k η to move as far;
# * **linear_warmup**: the same, reached by a linear ramp from 0.01 over
#   the first 2 epochs' updates (Goyal et al. ramp over 5 of 90 epochs: the
#   scaled rate is too large while the early gradients change fast);
# * **lars**: LARS (You et al., 2017), with `trust_coefficient` 0.001, a
#   global rate 1.0 at B0 that grows as sqrt(B / 16), and the same warm-up.
#
# A fixed number of epochs means a fixed amount of computation: at the
# full batch of 1,442 examples, 20 epochs are 20 updates.

# %%
started = time.perf_counter()
records = lb.run_sweep(data=data, **CONFIG["sweep"])
summary = lb.summarise(records)
print(f"{len(records)} runs in {time.perf_counter() - started:.1f} s, "
      "test accuracy (%) at the end, "
      + ("mean +- std over seeds:" if len(CONFIG["sweep"]["seeds"]) > 1 else
         "one seed (so every +- is 0.0: there is no spread to measure):"))
print(lb.format_summary(summary))
print("\nfinal training loss (mean over seeds):")
print(f"{'batch':>6}  " + "  ".join(f"{rule:>13}" for rule in summary))
for row_index, size in enumerate(row["batch_size"] for row in summary["constant"]):
    print(f"{size:>6}  " + "  ".join(f"{rows[row_index]['train_loss']:>13.3f}"
                                      for rows in summary.values()))
show_file(lb.plot_sweep(records, OUT / "large_batch_accuracy.png"))

# The same point with a base rate of 0.05: how far the linear rule can go.
hot = lb.run_point(lb.Rule("linear05", "sgd", "linear", base_lr=0.05), 1024, 20, seed=0,
                   data=data)
print(f"linear rule from base rate 0.05, batch 1,024: test accuracy "
      f"{100 * hot['test_accuracy']:.1f} %, final training loss {hot['train_loss']:.3f}")

# %%
# What the text below says of the sweep, chosen from its numbers.
row = {rule: {r["batch_size"]: r for r in rows} for rule, rows in summary.items()}
sizes = sorted(row["constant"])
small, full, below = sizes[0], sizes[-1], [size for size in sizes if size < TRAIN_SIZE]
points = lambda rule: [100 * row[rule][size]["mean"] for size in sizes]  # noqa: E731
shown = lambda rule, size: round(100 * row[rule][size]["mean"], 1)  # noqa: E731  as the table prints it
SEEDS = len(CONFIG["sweep"]["seeds"])
glue("seeds", SEEDS, "{} seeds" if SEEDS != 1 else "{} seed")
glue("sizes_run", ", ".join(f"{size:,}" for size in sizes))
constant = points("constant")
glue("constant_verdict", "falls steadily" if all(a > b for a, b in zip(constant, constant[1:]))
     else "falls, though not at every size")
glue("constant_small", constant[0], "{:.1f} %")
glue("constant_full", constant[-1], "{:.1f} %")
glue("constant_full_loss", row["constant"][full]["train_loss"], ".2f")
glue("constant_loss_verdict", "hardly below" if row["constant"][full]["train_loss"] > 2.0
     else "well below")
glue("updates_small", row["constant"][small]["updates"], ",")
glue("updates_full", row["constant"][full]["updates"], ",")
glue("updates_1024", row["linear"][1024]["updates"], ",")
glue("update_fold", row["linear"][small]["updates"] / row["linear"][1024]["updates"], ".0f")
linear_small = 100 * row["linear"][small]["mean"]
linear_drop = max(shown("linear", small) - shown("linear", size) for size in below)
spread = 100 * max(row["linear"][size]["std"] for size in below)
glue("linear_small", linear_small, "{:.1f} %")
glue("linear_drop", max(linear_drop, 0.0), ".1f")
glue("linear_drop_text", "no lower than" if linear_drop < 0.05 else
     "within " + glued("linear_drop") + " points of")
glue("linear_spread", spread, ".1f")
glue("linear_spread_verdict",
     "there is one seed in this form, so no seed-to-seed spread to compare that with (the "
     "full form runs five)" if SEEDS == 1 else
     "that is within the seed-to-seed spread ({} points at most)".format(glued("linear_spread"))
     if linear_drop <= spread else
     "that is about the seed-to-seed spread ({} points at most)".format(glued("linear_spread"))
     if linear_drop <= 2 * spread else
     "that is more than the seed-to-seed spread ({} points at most)".format(
         glued("linear_spread")))
linear_full, linear_1024 = 100 * row["linear"][full]["mean"], 100 * row["linear"][1024]["mean"]
glue("linear_full", linear_full, "{:.1f} %")
glue("linear_full_std", 100 * row["linear"][full]["std"], ".1f")
glue("linear_full_spread", "" if SEEDS == 1 else
     " (spread between seeds " + glued("linear_full_std") + " points)")
glue("linear_1024", linear_1024, "{:.1f} %")
glue("linear_full_lr", row["linear"][full]["peak_lr"], ".2f")
glue("breaks_verdict", "It breaks at the end." if linear_full < linear_1024 - 1 else
     "It bends at the end, barely, in this run.")
glue("hot_accuracy", 100 * hot["test_accuracy"], "{:.1f} %")
glue("hot_verdict", "the linear rule breaks down already at batch 1,024"
     if hot["test_accuracy"] < row["linear"][1024]["mean"] - 0.1 else
     "the linear rule still held at batch 1,024 in this run")
warm_gap = max(abs(shown("linear_warmup", size) - shown("linear", size)) for size in below)
glue("warm_gap", warm_gap, ".1f")
glue("warm_full", 100 * row["linear_warmup"][full]["mean"], "{:.1f} %")
glue("warm_verdict", "costs accuracy" if row["linear_warmup"][full]["mean"] <
     row["linear"][full]["mean"] else "does not cost accuracy in this run")
lars_below = sum(shown("lars", size) < shown("linear", size) for size in sizes)
lars_level = sum(shown("lars", size) == shown("linear", size) for size in sizes)
glue("lars_below", lars_below, "d")
glue("lars_level", lars_level, "d")
glue("lars_level_text", "" if lars_level == 0 else
     " and level with it at " + glued("lars_level"))
glue("lars_headline", "LARS does not beat linear scaling on this model." if 2 * lars_below >=
     len(sizes) else "LARS and linear scaling are about even on this model.")
glue("warm_headline", "Warm-up does not help here." if row["linear_warmup"][full]["mean"] <=
     row["linear"][full]["mean"] else "Warm-up helps only a little here.")
glue("sizes_count", len(sizes), "d")
glue("lars_full", 100 * row["lars"][full]["mean"], "{:.1f} %")
glue("lars_verdict", "far better than" if row["lars"][full]["mean"] >
     row["constant"][full]["mean"] + 0.2 else "no better than")

# %% jupyter={"source_hidden": true}
say("""
This run's table is printed above ({glue}`seeds`, batches of
{glue}`sizes_run`; the reduced form runs one seed at every second power of two
from 16 and at the whole training set, so its numbers wobble more than the full
form's five seeds). Reading it:

* **Constant rate: the large-batch problem.** Accuracy {glue}`constant_verdict`,
  from {glue}`constant_small` at batch 16 to {glue}`constant_full` at the full
  batch. The training loss says why: at the full batch it ends at
  {glue}`constant_full_loss`, {glue}`constant_loss_verdict` the 2.3 (ln 10) of a
  model that guesses. The model is not overfitting, it is *undertrained*: it
  made {glue}`updates_full` small steps where the small batch made
  {glue}`updates_small`.
* **Linear scaling fixes it over a wide range.** Up to a batch of 1,024, 64
  times the base, accuracy stays {glue}`linear_drop_text` the small batch's
  {glue}`linear_small`; {glue}`linear_spread_verdict`. The update count
  fell {glue}`update_fold`-fold ({glue}`updates_small` to {glue}`updates_1024`),
  and a larger step made up for it.
* **{glue}`breaks_verdict`** At the full batch the rule asks for a rate of
  {glue}`linear_full_lr` with {glue}`updates_full` updates, and accuracy is
  {glue}`linear_full`{glue}`linear_full_spread`,
  against {glue}`linear_1024` at batch 1,024. Two limits meet here. A rate cannot
  grow past what the curvature of the loss allows: from a base rate of 0.05,
  {glue}`hot_verdict` ({glue}`hot_accuracy`, printed above). And 20 steps are 20
  steps: the linear rule's argument assumes the gradient hardly changes over the
  k small steps it replaces, which is false when k is the whole epoch. Goyal et
  al. met the same wall on ImageNet beyond about 8k examples per batch.
* **{glue}`warm_headline`** Below the full batch the accuracies with and
  without warm-up differ by {glue}`warm_gap` points at most. At the full batch
  warm-up {glue}`warm_verdict` ({glue}`warm_full` against {glue}`linear_full`),
  since 2 of the 20 updates run at a lower rate. Warm-up protects deep networks
  (ResNets) from the first, violent updates at a large rate; this two-layer MLP
  has nothing of the kind to protect.
* **{glue}`lars_headline`** It holds up
  {glue}`lars_verdict` the constant rate ({glue}`lars_full` at the full batch),
  and it is below plain SGD with the linear rule at {glue}`lars_below`
  of the {glue}`sizes_count` sizes{glue}`lars_level_text` (as the table rounds them). Section 4 shows why: what LARS corrects barely
  differs between this model's layers.

So the effect that motivates the rules is there and large, and linear scaling
is the fix that matters on this problem. The effects that motivate warm-up and
LARS do not appear on a model this small. They need depth.
""")

# %% [markdown]
# ## 4. Inside LARS: one trust ratio per layer
#
# LARS scales each tensor's step by `c ||w|| / ||g||`, with w the tensor,
# g its gradient, ||.|| their lengths (Euclidean norms) and c the trust
# coefficient (`trust_coefficient`, 0.001 here), so that every
# layer moves by the same *fraction* of its weights whatever its gradient's
# scale. That matters when the ratio `||w|| / ||g||` differs widely between
# tensors: You et al. found it varying by orders of magnitude between
# AlexNet's layers, and between weights and biases, so that one global
# rate cannot suit them all. Here:

# %%
trust_ratios = {}
for batch_size in (16, TRAIN_SIZE):
    model = lb.make_model(seed=0)
    nn.CrossEntropyLoss()(model(Tensor(x_train[:batch_size])), y_train[:batch_size]).backward()
    ratios = [np.linalg.norm(p.data) / np.linalg.norm(p.grad) for p in model.parameters()]
    print(f"batch {batch_size:>5}, ||w|| / ||g|| per tensor (W1, b1, W2, b2): "
          + ", ".join(f"{ratio:6.1f}" for ratio in ratios))
    trust_ratios[batch_size] = ratios
spreads = [max(r) / min(r) for r in trust_ratios.values()]
glue("ratio_spread_least", min(spreads), ".1f")
glue("ratio_spread_most", max(spreads), ".1f")
glue("ratio_verdict", "also grow with the batch" if all(
    large > small for small, large in zip(trust_ratios[16], trust_ratios[TRAIN_SIZE]))
    else "do not all grow with the batch, though most")

# %% jupyter={"source_hidden": true}
say("""
The largest ratio is {glue}`ratio_spread_least` to {glue}`ratio_spread_most`
times the smallest between this MLP's tensors, not a factor of 1,000. For a
network this shallow one global rate is nearly as good as one rate per layer,
which is what the sweep found. (The ratios {glue}`ratio_verdict`: a larger
batch averages away more of the gradient noise, so `||g||` shrinks. LARS's step
stays `η c ||w||` regardless, which is one reason LARS's global rate can grow
more slowly than linearly.)
""")

# %% [markdown]
# ## 5. Don't decay the learning rate, increase the batch size
#
# Smith, Kindermans, Ying and Le (2017) look at SGD's noise. Each step's
# gradient is an average over B of the training set's examples. Their
# *noise scale*, `η (N_train / B - 1) / (1 - momentum)`, with η the learning
# rate and N_train the training set's size (1,442 images here), sets how far
# the weights jiggle around a minimum. While B is much smaller than N_train
# it is about `η N_train / (B (1 - momentum))`. The usual step decay of the
# rate lowers it to let training settle. Multiplying the batch by the same
# factor lowers it at least as much (a little more, because of the "- 1"),
# and it makes fewer, larger steps, which is what data parallelism wants.
# `optim.BatchSizeSchedule` turns a rate schedule's milestones into batch
# sizes. Past a largest batch (here 80, standing for what the workers hold)
# the remaining decays fall back to the rate: the "hybrid" schedule.
#
# Four runs from rate 0.15 and batch 16, momentum 0.9: no decay at all, the
# rate divided by 5 at two milestones, the batch multiplied by 5 there
# instead, and the hybrid.

# %%
growth_config = CONFIG["growth"]
started = time.perf_counter()
growth = lb.run_batch_growth(data=data, **growth_config)
print(f"ran in {time.perf_counter() - started:.1f} s")
first, last = growth_config["milestones"][0], growth_config["epochs"] - 1
print(f"noise scale = η ({TRAIN_SIZE} / B - 1) / (1 - 0.9), at epochs 1, {first + 1} "
      f"and {last + 1}:")
noise_scales = {}
for name, runs in growth.items():
    history = runs[0]
    noise = [optim.noise_scale(history[epoch]["lr"], TRAIN_SIZE, history[epoch]["batch_size"],
                             0.9)
             for epoch in (0, first, last)]
    finals = [run[-1]["test_accuracy"] for run in runs]
    noise_scales[name] = noise
    spread = f" +- {100 * np.std(finals):.1f}" if len(runs) > 1 else ""
    print(f"{name:>10}: (η, B) = " + " -> ".join(
              f"({history[epoch]['lr']:.3g}, {history[epoch]['batch_size']})"
              for epoch in (0, first, last))
          + f"; noise scale {noise[0]:.1f} -> {noise[1]:.1f} -> {noise[2]:.1f}; "
          f"test accuracy {100 * np.mean(finals):.1f}{spread} % after "
          f"{history[-1]['updates']:>5} updates")

# What the text below says of these runs, chosen from their numbers.
accuracy = {name: 100 * lb.mean_curve(runs) for name, runs in growth.items()}
final = {name: curve[-1] for name, curve in accuracy.items()}
updates = {name: runs[0][-1]["updates"] for name, runs in growth.items()}
glue("final_no_decay", final["no_decay"], "{:.1f} %")
glue("final_decay_lr", final["decay_lr"], "{:.1f} %")
glue("final_grow_batch", final["grow_batch"], "{:.1f} %")
glue("final_hybrid", final["hybrid"], "{:.1f} %")
glue("updates_decay_lr", updates["decay_lr"], ",")
glue("updates_grow_batch", updates["grow_batch"], ",")
glue("updates_hybrid", updates["hybrid"], ",")
glue("growth_seeds", len(growth_config["seeds"]),
     "{} seeds" if len(growth_config["seeds"]) != 1 else "{} seed")
glue("growth_epochs", growth_config["epochs"], "d")
glue("growth_milestones", " and ".join(str(m) for m in growth_config["milestones"]))
final = {name: round(value, 1) for name, value in final.items()}  # as printed
lower = final["decay_lr"] - final["no_decay"]
glue("no_decay_lower", lower, ".1f")
glue("decay_verdict", "The decay is needed." if lower > 0.5 else
     "The decay helps little in this run.")
after = accuracy["no_decay"][first:]
glue("zigzag", np.abs(np.diff(after)).max(), ".1f")
behind = accuracy["decay_lr"] - accuracy["grow_batch"]      # per epoch, epoch 1 first
glue("growth_gap_end", final["decay_lr"] - final["grow_batch"], ".1f")
glue("growth_gap_most", behind.max(), ".1f")
glue("growth_gap_epoch", int(behind.argmax()) + 1, "d")
glue("growth_gap_where", ", the first epoch of a larger batch"
     if int(behind.argmax()) in growth_config["milestones"] else "")
glue("growth_verdict", "Growing the batch nearly replaces it."
     if final["decay_lr"] - final["grow_batch"] < 1 else
     "Growing the batch replaces only part of it in this run.")
seed_noise = 100 * max(np.std([run[-1]["test_accuracy"] for run in runs])
                       for runs in growth.values())
glue("growth_noise", seed_noise, ".1f")
glue("growth_noise_text", "one seed in this form, so no spread between seeds to compare with"
     if len(growth_config["seeds"]) == 1 else
     "the final accuracies' spread between seeds is up to " + glued("growth_noise") + " points")
noise_decay = [round(v, 1) for v in noise_scales["decay_lr"]]
noise_grow = [round(v, 1) for v in noise_scales["grow_batch"]]
glue("noise_decay_last", noise_decay[-1], ".1f")
glue("noise_grow_last", noise_grow[-1], ".1f")
glue("noise_factor_decay", noise_decay[0] / noise_decay[-1], ".0f")
glue("noise_factor_grow", noise_grow[0] / noise_grow[-1], ".0f")
glue("update_share", updates["grow_batch"] / updates["decay_lr"], ".0%")
glue("fewer_syncs", 1 - updates["grow_batch"] / updates["decay_lr"], ".0%")
glue("hybrid_verdict", "lands in between in updates" if
     updates["grow_batch"] < updates["hybrid"] < updates["decay_lr"] else
     "does not land between the two in updates")
glue("hybrid_gap", abs(final["hybrid"] - final["grow_batch"]), ".1f")
show_file(lb.plot_batch_growth(growth, OUT / "batch_growth.png"))

# %% jupyter={"source_hidden": true}
say("""
The runs ({glue}`growth_epochs` epochs, milestones at {glue}`growth_milestones`,
{glue}`growth_seeds`) ended at: no decay {glue}`final_no_decay`, rate
decay {glue}`final_decay_lr` after {glue}`updates_decay_lr` updates, batch
growth {glue}`final_grow_batch` after {glue}`updates_grow_batch` updates, hybrid
{glue}`final_hybrid` after {glue}`updates_hybrid` updates.

* **{glue}`decay_verdict`** Without it the rate of 0.15 keeps the weights
  jiggling: after the first milestone accuracy moves by up to {glue}`zigzag`
  points from one epoch to the next, and it ends {glue}`no_decay_lower` points
  below the rate decay (the lower left panel above).
* **{glue}`growth_verdict`** Accuracy per *epoch* comes back to the decay
  curve, because the noise scale drops at the same epochs, and as far or
  further (printed above: to {glue}`noise_decay_last` with the rate decay,
  {glue}`noise_factor_decay` times lower than at the start, and to
  {glue}`noise_grow_last` with batch growth, {glue}`noise_factor_grow` times
  lower: a 5 times larger B divides N_train / B by 5 but leaves the "- 1"): it
  ends {glue}`growth_gap_end` points below it
  ({glue}`growth_noise_text`), after falling furthest behind, by
  {glue}`growth_gap_most` points, in epoch
  {glue}`growth_gap_epoch`{glue}`growth_gap_where`. Per *update*, batch growth gets there with
  {glue}`update_share` of the updates (lower right). With one update per
  all_reduce, that is {glue}`fewer_syncs` fewer synchronisations, each with a
  larger per-worker batch.
* The hybrid, capped at batch 80, {glue}`hybrid_verdict`, and ends
  {glue}`hybrid_gap` points from batch growth.

(The rate 0.15 is deliberately high for this model: at 0.05 the noise is
smaller, and so is what the decay has to remove. Try it: in section 5's code
cell, the dictionary `growth_config` holds the arguments of
`lb.run_batch_growth` (`lb` is `minidist.experiments.large_batch`); set its
`"base_lr"` to 0.05.)
""")

# %% [markdown]
# ## Summary
#
# * A larger global batch, whether it comes from more workers or more
#   examples per worker, makes fewer updates per epoch. Left alone, the
#   learning rate is then too small, and accuracy falls.
# * Scale the rate with the batch (linear rule). It holds until the rate
#   meets the loss's stability limit or the updates become too few to
#   train at all. Warm-up and LARS push that limit out for deep networks.
#   A two-layer MLP does not show them at work.
# * Instead of decaying the rate, grow the batch: about the same accuracy
#   per epoch, far fewer updates.
#
# Try, in a cell after the first one (which imports
# `minidist.experiments.large_batch` as `lb` and loads `data =
# lb.digits_data()`):
# `lb.run_sweep([16, 256, 1024], rules=[lb.Rule("linear05", "sgd",
# "linear", base_lr=0.05)], epochs=20, data=data)` to see where linear
# scaling from a larger base rate breaks (section 3 ran its batch of
# 1,024); or `lb.run_sweep([1442], epochs=60, seeds=(0, 1, 2),
# data=data)` (1,442: the whole training set), to see the full batch
# recover once it gets enough updates.
