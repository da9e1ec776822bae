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
from minidist.lesson import narrate, output_dir, quick, use_headless_matplotlib
from minidist.lesson_timing import timed
from minidist.parallel.data.ddp import DistributedDataParallel

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

QUICK = quick()
OUT = output_dir()
data = lb.digits_data()
x_train, y_train, x_test, y_test = data
N = len(x_train)
CONFIG = lb.configuration(full=not QUICK, dataset_size=N)
print(f"digits: {N} training images, {len(x_test)} test images; "
      f"{'reduced' if QUICK else 'full'} form of the experiment")

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

# %% [markdown]
# On the course's machine the batch of 1,024 went through about a hundred
# times more examples per second than a batch of one, and five to ten
# times more than a batch of 16 (the printout gives this machine's
# factors; they depend on the machine). On a GPU the gap is larger still: a batch of 16
# leaves most of its thousands of cores idle. With n workers the same
# argument holds per worker: each one needs a batch large enough to be
# efficient, and the global batch is n times that.
#
# ## 2. One process stands in for many workers
#
# `tests/parallel/test_data_parallel.py` proves, for SGD with momentum and Adam and 1
# to 4 workers with uneven last shards, that data parallel training ends with
# the weights of one process training on the global batch. So the rest of
# this chapter trains in one process, which is faster here. Once more, for
# the record, at one large-batch point of the experiment: global batch
# 256, the linear scaling rule with warm-up, 2 epochs, once by
# `lb.run_point` in this process and once by DDP on 2 workers, each taking
# half of every global batch from the experiment's own epoch order.

# %%
DDP_BATCH, DDP_EPOCHS = 256, 2


def ddp_large_batch(rule_name, batch_size, epochs):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = lb.make_model(seed=0)
    ddp = DistributedDataParallel(model)
    optimizer, scheduler = lb.RULES[rule_name].build(ddp.parameters(), batch_size,
                                                     lb.BASE_BATCH, N)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        order = lb.epoch_order(N, 0, epoch)
        for start in range(0, N, batch_size):
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
print(f"{single['updates']} updates at batch {DDP_BATCH} (peak rate {single['peak_lr']:.2f}): "
      f"max |w_ddp - w_single| = {np.abs(workers[0] - single_weights).max():.1e}, "
      f"ranks identical: {np.array_equal(workers[0], workers[1])}")

# %% [markdown]
# The weights agree to float32 rounding. A batch of 256 on 2 workers, or
# 32 on each of 8, or 1 on each of 256: the arithmetic of the update is the
# same, so the experiment below holds for any way of splitting the batch.
#
# ## 3. Test accuracy against the batch size
#
# Every run trains the same MLP (64 -> 64 -> ReLU -> 10, momentum 0.9) from
# the same initial weights, on the same shuffled order of examples, for the
# same number of epochs. Only the batch size and the learning-rate rule
# change. The base rate 0.01 was chosen at batch B0 = 16 (rates 0.01 to 0.05
# all give about 97 % there) and never retuned:
#
# * **constant**: the rate stays 0.01 whatever the batch;
# * **linear**: `lr = 0.01 * B / 16` (Goyal et al., 2017). Reason: k small
#   steps move the weights by about lr times the sum of k gradients; one
#   step on a k times larger batch averages those k gradients, so it needs
#   k lr to move as far;
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
      f"test accuracy (%) at the end, mean +- std over seeds:")
print(lb.format_summary(summary))
print("\nfinal training loss (mean over seeds):")
print(f"{'batch':>6}  " + "  ".join(f"{rule:>13}" for rule in summary))
for row_index, size in enumerate(row["batch_size"] for row in summary["constant"]):
    print(f"{size:>6}  " + "  ".join(f"{rows[row_index]['train_loss']:>13.3f}"
                                      for rows in summary.values()))
picture = lb.plot_sweep(records, OUT / "large_batch_accuracy.png")
print("saved", picture)

# %% [markdown]
# What the full form showed (5 seeds; `--full`; the reduced form runs one
# seed on every second batch size, so its numbers wobble more):
#
# | batch | updates | constant | linear | linear_warmup | lars |
# |---:|---:|---:|---:|---:|---:|
# | 16 | 1820 | 97.1 | 97.1 | 97.1 | 97.1 |
# | 128 | 240 | 92.4 | 97.5 | 97.5 | 96.9 |
# | 512 | 60 | 74.4 | 97.3 | 97.4 | 96.3 |
# | 1024 | 40 | 59.4 | 96.7 | 97.0 | 95.3 |
# | 1442 | 20 | 31.1 | 91.6 | 87.2 | 89.4 |
#
# Reading it:
#
# * **Constant rate: the large-batch problem.** Accuracy falls steadily,
#   from 97 % to about 31 % at the full batch. The training loss says why:
#   at the full batch it ends near 2.2, hardly below the 2.3 (ln 10) of a
#   model that guesses. The model is not overfitting, it is *undertrained*:
#   it made 20 small steps where the small batch made 1,820.
# * **Linear scaling fixes it over a wide range.** Up to a batch of 1,024,
#   64 times the base, accuracy stays within the seed-to-seed spread of the
#   small batch's. The update count fell 45-fold, and a larger step made up
#   for it.
# * **It breaks at the end.** At the full batch the rule asks for a rate of
#   0.9 with 20 updates, and accuracy drops to about 90 % with a large
#   spread between seeds. Two limits meet here. A rate cannot grow past
#   what the curvature of the loss allows (with base rate 0.05, try it, the
#   linear rule already diverges at batch 1,024). And 20 steps are 20 steps:
#   the linear rule's argument assumes the gradient hardly changes over
#   the k small steps it replaces, which is false when k is the whole
#   epoch. Goyal et al. met the same wall on ImageNet beyond about 8k
#   examples per batch.
# * **Warm-up does not help here.** Below the full batch the curves with
#   and without warm-up agree within noise. At the full batch, warm-up costs
#   accuracy, because 2 of the 20 updates run at a lower rate. Warm-up
#   protects deep networks (ResNets) from the first, violent updates at a
#   large rate; this two-layer MLP has nothing of the kind to protect.
# * **LARS does not beat linear scaling on this model.** It holds up far
#   better than the constant rate, and it is a little below plain SGD with
#   the linear rule at most sizes. Section 4 shows why: what LARS corrects
#   barely differs between this model's layers.
#
# So the effect that motivates the rules is there and large, linear scaling
# is the fix that matters on this problem, and its breakdown is visible at
# the largest batch. The effects that motivate warm-up and LARS do not
# appear on a model this small. They need depth.

# %% [markdown]
# ## 4. Inside LARS: one trust ratio per layer
#
# LARS scales each tensor's step by `eta ||w|| / ||g||`, so that every
# layer moves by the same *fraction* of its weights whatever its gradient's
# scale. That matters when the ratio `||w|| / ||g||` differs widely between
# tensors: You et al. found it varying by orders of magnitude between
# AlexNet's layers, and between weights and biases, so that one global
# rate cannot suit them all. Here:

# %%
for batch_size in (16, N):
    model = lb.make_model(seed=0)
    nn.CrossEntropyLoss()(model(Tensor(x_train[:batch_size])), y_train[:batch_size]).backward()
    ratios = [np.linalg.norm(p.data) / np.linalg.norm(p.grad) for p in model.parameters()]
    print(f"batch {batch_size:>5}, ||w|| / ||g|| per tensor (W1, b1, W2, b2): "
          + ", ".join(f"{ratio:6.1f}" for ratio in ratios))

# %% [markdown]
# The ratios differ by a factor of 2 to 5 between this MLP's tensors, not
# by a factor of 1,000. For a network this shallow one global rate is
# nearly as good as one rate per layer, which is what the sweep found. (The
# ratios also grow with the batch: a larger batch averages away more of the
# gradient noise, so `||g||` shrinks. LARS's step stays `lr eta ||w||`
# regardless, which is one reason LARS's global rate can grow more slowly
# than linearly.)
#
# ## 5. Don't decay the learning rate, increase the batch size
#
# Smith, Kindermans, Ying and Le (2017) look at SGD's noise. Each step's
# gradient is an average over B of N examples. Their *noise scale*
# `g = lr N / (B (1 - momentum))` sets how far the weights jiggle around a
# minimum. The usual step decay of the rate lowers g to let training
# settle. Multiplying the batch by the same factor lowers g just as much,
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
for name, runs in growth.items():
    history = runs[0]
    noise = [optim.noise_scale(history[epoch]["lr"], N, history[epoch]["batch_size"], 0.9)
             for epoch in (0, first, last)]
    finals = [run[-1]["test_accuracy"] for run in runs]
    print(f"{name:>10}: noise scale {noise[0]:6.0f} -> {noise[1]:5.0f} -> {noise[2]:4.0f}; "
          f"test accuracy {100 * np.mean(finals):.1f} +- {100 * np.std(finals):.1f} % after "
          f"{history[-1]['updates']:>5} updates")
picture = lb.plot_batch_growth(growth, OUT / "batch_growth.png")
print("saved", picture)

# %% [markdown]
# The full form (30 epochs, milestones at 10 and 20, 5 seeds) gave:
# no decay 95.3 %, rate decay 97.3 % after 2,730 updates, batch growth
# 97.3 % after 1,140 updates, hybrid 97.4 % after 1,290 updates.
#
# * **The decay is needed.** Without it the rate of 0.15 keeps the weights
#   jiggling: accuracy zig-zags by a couple of percent from epoch to
#   epoch and ends about 2 points lower (the lower left panel).
# * **Growing the batch replaces it.** Accuracy per *epoch* follows the
#   decay curve within the seed noise, because the noise scale drops by
#   the same factor at the same epochs (printed above). Per *update*,
#   batch growth gets there with about 40 % of the updates (lower right).
#   With one update per all_reduce, that is 60 % fewer synchronisations,
#   each with a larger per-worker batch.
# * The hybrid, capped at batch 80, lands in between in updates, and at
#   the same accuracy.
#
# (The rate 0.15 is deliberately high for this model: at 0.05 the noise is
# small enough that the digits reach about 97.5 % with or without any decay,
# and then the comparison shows nothing. Try it: `growth_config` with
# `base_lr=0.05`.)
#
# ## Summary
#
# * A larger global batch, whether it comes from more workers or more
#   examples per worker, makes fewer updates per epoch. Left alone, the
#   learning rate is then too small, and accuracy falls.
# * Scale the rate with the batch (linear rule). It holds until the rate
#   meets the loss's stability limit or the updates become too few to
#   train at all. Warm-up and LARS push that limit out for deep networks.
#   A two-layer MLP does not show them at work.
# * Instead of decaying the rate, grow the batch: same accuracy per
#   epoch, fewer updates.
#
# Try: `lb.run_sweep([16, 256, 1024], rules=[lb.Rule("linear05", "sgd",
# "linear", base_lr=0.05)], epochs=20, data=data)` to see linear scaling
# break earlier (about 14 % at batch 1,024); or `lb.run_sweep([N],
# epochs=60, seeds=(0, 1, 2), data=data)`, to see the full batch recover
# once it gets enough updates (97.5 % for the linear rule, 72 % for the
# constant rate).
