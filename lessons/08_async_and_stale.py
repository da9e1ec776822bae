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
# # Lesson 8: asynchronous and stale updates
#
# Lesson 7 ended with idle workers: in BSP every step waits for the slowest
# one. The answer of the LSML lecture ("Распараллеливание нейросетей",
# Large Scale Machine Learning, lecture 7): "vary the consistency of the
# parameters, so that the computation can run asynchronously". A worker that does not wait
# computes its next gradient on weights that other workers have since
# changed: its gradient is **stale**. This chapter measures the trade:
#
# 1. five consistency modes of the same parameter server on the digits'
#    MLP, with and without a straggler: BSP, SSP with a small and a larger
#    bound on the staleness, asynchronous (Downpour), and asynchronous with stale pushes
#    dropped. Loss against time and against the gradients computed;
# 2. the staleness of every push, from the server's log;
# 3. Hogwild: no server at all, one shared array, no locks; its loss
#    against serial SGD, and the updates lost to races, counted;
# 4. D2P, the LSML lecture's delayed block proximal gradient: what a delay bound
#    costs in objective.
#
# Staleness is τ, as in `lessons/NOTATION.md`: how many updates old the
# weights a gradient was computed from are. A *bound* on it is τ_max. The
# code calls that bound `tau` (`ssp(tau=1)`, `drop(tau=3)`, D2P's `tau`), and
# so do the printouts and the pictures' legends: read every "tau" there as
# τ_max.
#
# The library code: `minidist/parallel/parameter_server/shard.py` (the
# consistency modes), `server.py`, `hogwild.py` and `delayed_proximal.py`.

# %%
import time

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, trace
from minidist.data import load_digits, make_sparse_logistic
from minidist.examples.parameter_server import digits_accuracy, digits_mlp, split_rows
from minidist.lesson import (
    glue,
    glued,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    use_headless_matplotlib,
)
from minidist.parallel.parameter_server import delayed_proximal as d2p
from minidist.parallel.parameter_server import hogwild
from minidist.parallel.parameter_server.layout import flat_parameters, load_flat_parameters
from minidist.parallel.parameter_server.server import ParameterServer
from minidist.runtime.blas_threads import set_blas_threads
from minidist.tensor import no_grad

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
# One BLAS thread in this process: the replay below computes the training
# loss after every hundredth update, and on a busy machine a product split
# over two threads waits for the one without a core.
set_blas_threads(1)
import matplotlib.pyplot as plt  # noqa: E402

QUICK = quick()
OUT = output_dir()
x_train, y_train, x_test, y_test = load_digits()

# %% jupyter={"source_hidden": true}
if QUICK:
    say("""
*This is the quick form of the lesson.* Each worker computes 40 gradients in
sections 1, 1b and 2 (the full form: 150), Hogwild makes 16,000 updates in
section 3 (the full form: 80,000) and D2P runs 120 steps in section 4 (the
full form: 400). The modes and the sizes of the problems are the same; the
losses reached are higher, and the counts smaller.
""")

# %% [markdown]
# ## 1. Five modes, with and without a straggler
#
# One server, four workers, the MLP of lesson 7, batches of 32, plain SGD
# with learning rate 0.3. The modes (the docstring has the details):
#
# * **bsp**: the server averages the four pushes of a step, then updates;
# * **ssp(τ_max)**, *stale synchronous parallel* (Ho et al., "More
#   Effective Distributed ML via a Stale Synchronous Parallel Parameter
#   Server", 2013): the same averaged steps, but a worker may run up to
#   τ_max steps ahead of the slowest, on weights up to τ_max versions old;
# * **async** (Downpour SGD, from Dean et al.'s DistBelief system, "Large
#   Scale Distributed Deep Networks", 2012): every push is applied the
#   moment it arrives, whatever weights it was computed on;
# * **drop(τ_max)**: as async, but a push more than τ_max versions stale is
#   thrown away ("throw away the gradients that lag behind", as the zhihu
#   article on distributed training puts it).
#
# To see the algorithms and not the 2 cores of this machine, a worker's
# compute is made to last: each one sleeps 4 ms per gradient, as if the
# model were bigger (sleeping takes no CPU), and in the straggler runs
# worker 0 sleeps 4 times as long.
#
# What we plot needs the server's weights after every update. The server
# keeps each applied gradient (`keep_gradients=True`); replaying them with
# SGD from the initial weights gives every intermediate state, and the
# trace's `update` regions on the server say *when* each was applied.

# %%
WORKERS = 4
STEPS = 40 if QUICK else 150       # gradients per worker
LR = 0.3
COMPUTE = 0.004
SLOWDOWN = 4
MODES = [("bsp", {}), ("ssp", {"tau": 1}), ("ssp", {"tau": 4}), ("async", {}),
         ("drop", {"tau": 3})]


def mode_name(mode, options):
    return f"{mode}(tau={options['tau']})" if "tau" in options else mode


def train_with_pretend_compute(mode, options, straggler, lr=LR):
    model = digits_mlp()
    ps = ParameterServer(model, servers=1, mode=mode, lr=lr, keep_gradients=True, **options)
    rows = split_rows(len(y_train), ps.layout.workers)

    def gradient_fn(weights, worker, step):
        time.sleep(COMPUTE * (SLOWDOWN if straggler and worker == 0 else 1))
        mine = np.arange(rows[worker].start, rows[worker].stop)
        batch = mine[np.arange(step * 32, (step + 1) * 32) % len(mine)]
        load_flat_parameters(model, weights)
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(Tensor(x_train[batch])), y_train[batch])
        loss.backward()
        return np.concatenate([p.grad.reshape(-1) for p in model.parameters()]), len(batch)

    return ps.run(STEPS, gradient_fn)


EVALUATED = digits_mlp()


def train_loss(weights, model=EVALUATED):
    load_flat_parameters(model, weights)
    with no_grad():
        return float(nn.functional.cross_entropy(model(Tensor(x_train)), y_train).data)


def curves(server, events, lr=LR):
    """Per update: seconds since the first gradient, gradients received so far
    (dropped ones included), and the training loss of the server's weights."""
    t0 = min(e["start"] for e in events if e["kind"] == "compute"
             and e["label"].startswith("gradient"))
    applied = sorted(e["end"] for e in events if e["rank"] == 0 and e["kind"] == "compute"
                     and trace.label_info(e["label"]).get("kind") == "update"
                     and trace.label_info(e["label"]).get("accepted") == 1)
    received = {}
    for count, record in enumerate(server.pushes, start=1):
        if record.accepted:
            received[record.version] = count   # the last push of update `version`
    weights = flat_parameters(digits_mlp())
    losses, every = [train_loss(weights)], max(1, len(applied) // 100)
    for index, gradient in enumerate(server.applied_gradients):
        weights = weights - np.float32(lr) * gradient
        if index % every == 0 or index == len(applied) - 1:
            losses.append((index, train_loss(weights)))
    first = losses.pop(0)
    return {"time": np.array([0.0] + [(applied[i] - t0) / 1e9 for i, _ in losses]),
            "gradients": np.array([0] + [received[i] for i, _ in losses]),
            "loss": np.array([first] + [loss for _, loss in losses]),
            "accuracy": digits_accuracy(weights), "final": weights}


runs = {}
for straggler in (False, True):
    for mode, options in MODES:
        path = OUT / f"async_{mode_name(mode, options)}_{straggler}.trace.jsonl"
        results = minidist.launch(train_with_pretend_compute, world_size=1 + WORKERS,
                                  args=(mode, options, straggler), trace=str(path))
        server = results[0]
        found = curves(server, trace.read_jsonl(path).events)
        np.testing.assert_array_equal(found["final"], server.weights)   # the replay is exact
        runs[mode_name(mode, options), straggler] = (server, found)
        print(f"{'straggler' if straggler else 'no straggler':>12} {mode_name(mode, options):>11}: "
              f"{server.version:4} updates, {server.dropped:3} dropped, "
              f"{found['time'][-1]:5.2f} s, final loss {found['loss'][-1]:.3f}, "
              f"test accuracy {found['accuracy']:.3f}")

# %%
figure, axes = plt.subplots(2, 2, figsize=(12, 8), sharey=True)
for row, straggler in enumerate((False, True)):
    for mode, options in MODES:
        name = mode_name(mode, options)
        found = runs[name, straggler][1]
        axes[row, 0].plot(found["time"], found["loss"], label=name)
        axes[row, 1].plot(found["gradients"], found["loss"], label=name)
    which = f"worker 0 {SLOWDOWN}x slower" if straggler else "no straggler"
    axes[row, 0].set_title(f"loss vs time ({which})")
    axes[row, 1].set_title(f"loss vs gradients the server received ({which})")
    axes[row, 0].set_xlabel("seconds since the first gradient")
    axes[row, 1].set_xlabel("gradients received (4 per BSP step)")
    axes[row, 0].set_ylabel("training loss of the server's weights")
    for axis in axes[row]:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
figure.tight_layout()
show_figure(figure, "async_loss.png")


def largest_rise(loss):
    """How far a loss curve climbs back above its lowest point so far."""
    return float(np.max(loss - np.minimum.accumulate(loss)))


# What the text below says of these runs, chosen from their numbers.
final = {key: found["loss"][-1] for key, (_, found) in runs.items()}
seconds = {key: found["time"][-1] for key, (_, found) in runs.items()}
glue("steps", STEPS, "d")
glue("bsp_final", final["bsp", False], ".2f")
glue("ssp1_final", final["ssp(tau=1)", False], ".2f")
glue("ssp4_final", final["ssp(tau=4)", False], ".2f")
glue("ssp4_straggler_final", final["ssp(tau=4)", True], ".2f")
glue("async_final", final["async", False], ".2f")
glue("drop_final", final["drop(tau=3)", False], ".2f")
glue("async_verdict", "so they get further with the same gradients" if
     max(final["async", False], final["drop(tau=3)", False]) < final["bsp", False] else
     "yet this time they did not get further with the same gradients")
glue("ssp1_verdict", "SSP(1) follows BSP closely" if
     abs(final["ssp(tau=1)", False] - final["bsp", False]) < 0.25 * final["bsp", False] else
     "SSP(1) does not follow BSP closely this time")
rise = largest_rise(runs["ssp(tau=4)", False][1]["loss"])
glue("ssp4_rise", rise, ".2f")
glue("bsp_rise", largest_rise(runs["bsp", False][1]["loss"]), ".2f")
glue("ssp4_verdict", "its loss swings back up" if rise > 0.2 else
     f"in the reduced form's {STEPS} steps its loss does not swing back up (the full "
     "form's 150 give it the time)" if QUICK else
     "its loss does not swing back up in this run")
glue("ssp4_end_verdict", "ends well above" if final["ssp(tau=4)", False] >
     1.15 * final["bsp", False] else "ends close to")
calm_seconds = [round(seconds[mode_name(m, o), False], 2) for m, o in MODES]   # as printed
glue("calm_least_s", min(calm_seconds), "{:.2f} s")
glue("calm_most_s", max(calm_seconds), "{:.2f} s")
glue("compute_s", STEPS * COMPUTE, "{:.2f} s")
glue("compute_share", STEPS * COMPUTE / min(calm_seconds), ".0%")
glue("calm_verdict", ("all modes take about as long ({} to {})" if max(calm_seconds) <
                      1.3 * min(calm_seconds) else "the modes took {} to {}").format(
     glued("calm_least_s"), glued("calm_most_s"))
     + ": a worker's " + str(STEPS) + " gradients of 4 ms of \"compute\" each, "
     + glued("compute_s") + ", are the same in all of them, and are only "
     + glued("compute_share") + " of even the shortest run. The rest is the messages, the "
     "real forward and backward passes, the server's updates and the 5 processes taking turns "
     "on 2 cores; what differs between the modes is the waiting, and it changes from run to run")
glue("slow_factor", round(seconds["bsp", True], 2) / round(seconds["bsp", False], 2), ".2f")
glue("ssp_straggler_s", seconds["ssp(tau=4)", True], "{:.2f} s")
glue("bsp_straggler_s", seconds["bsp", True], "{:.2f} s")
glue("ssp4_help", ("SSP(4) does not help ({} against BSP's {}): a bound on how far ahead the "
     "others may run absorbs a *temporary* hiccup, not a worker that is always slower"
     if seconds["ssp(tau=4)", True] > 0.8 * seconds["bsp", True] else
     "SSP(4) finished sooner here ({} against BSP's {}), yet a bound on how far ahead the "
     "others may run only absorbs a *temporary* hiccup: with a worker that is always slower "
     "they reach the bound and then wait at its pace").format(glued("ssp_straggler_s"),
                                                               glued("bsp_straggler_s")))
async_run = runs["async", True][1]
reached = np.argmax(async_run["loss"] <= final["bsp", True])
glue("async_reach_share", async_run["time"][reached] / seconds["bsp", True]
     if async_run["loss"][reached] <= final["bsp", True] else 1.0, ".0%")

# %% jupyter={"source_hidden": true}
say("""
How to read the picture above, `async_loss.png` (asynchronous runs are not
repeatable: the details change from run to run; the numbers here are this
run's):

* **Per gradient** (right), BSP and SSP are smooth and slow: one step, averaged
  over 4 gradients (a batch of 128), per 4 gradients. Async and drop take a step
  per gradient, 4 small steps where BSP takes one, {glue}`async_verdict` (final
  loss {glue}`async_final` and {glue}`drop_final` against BSP's
  {glue}`bsp_final`), but with spikes: each spike is a stale gradient applied to
  weights that have moved since. {glue}`ssp1_verdict` ({glue}`ssp1_final`).
  SSP(4) takes the same averaged steps on weights up to 4 versions old, and at
  this rate that can be too old: {glue}`ssp4_verdict`, rising
  at most {glue}`ssp4_rise` above its lowest point so far (BSP: {glue}`bsp_rise`),
  and it
  {glue}`ssp4_end_verdict` BSP: {glue}`ssp4_final` against {glue}`bsp_final`
  ({glue}`ssp4_straggler_final` with the straggler). A gradient computed 4 steps
  ago keeps pushing the way the weights were going then: with a large enough
  step it overshoots, and the next stale gradients push back too late. Section
  1b doubles the step.
* **Per second without a straggler**, {glue}`calm_verdict`.
* **With the straggler**, BSP runs at its pace, {glue}`slow_factor` times as
  long for the same updates (its curve against gradients does not change).
  {glue}`ssp4_help`. Async and drop let the fast workers push their {glue}`steps`
  gradients first: async's loss is down to BSP's final one after
  {glue}`async_reach_share` of the time BSP takes, and the flat tail is the
  straggler finishing its own {glue}`steps` alone (every worker has a fixed
  number of steps here).
""")

# %% [markdown]
# ## 1b. A larger step
#
# Staleness is harmless while the weights change little between the moment
# a gradient is computed and the moment it is applied. Double the learning
# rate, to 0.6, and run the modes again (no straggler).

# %%
LARGE_LR = 0.6
large = {}
figure, axis = plt.subplots(figsize=(7, 4))
for mode, options in MODES:
    path = OUT / f"async_{mode_name(mode, options)}_large_lr.trace.jsonl"
    server = minidist.launch(train_with_pretend_compute, world_size=1 + WORKERS,
                             args=(mode, options, False, LARGE_LR), trace=str(path))[0]
    found = curves(server, trace.read_jsonl(path).events, LARGE_LR)
    large[mode_name(mode, options)] = found
    axis.plot(found["gradients"], found["loss"], label=mode_name(mode, options))
    print(f"lr {LARGE_LR}, {mode_name(mode, options):>11}: final loss {found['loss'][-1]:.3f}, "
          f"test accuracy {found['accuracy']:.3f}")
axis.set_xlabel("gradients received")
axis.set_ylabel("training loss of the server's weights")
axis.set_title(f"learning rate {LARGE_LR}, no straggler")
axis.grid(alpha=0.3)
axis.legend(fontsize=8)
figure.tight_layout()
show_figure(figure, "async_large_lr.png")

hot = {name: found["loss"][-1] for name, found in large.items()}
start_loss = large["bsp"]["loss"][0]
glue("hot_bsp", hot["bsp"], ".2f")
glue("hot_ssp1", hot["ssp(tau=1)"], ".2f")
glue("hot_ssp4", hot["ssp(tau=4)"], ".2f")
glue("hot_async", hot["async"], ".2f")
glue("hot_drop", hot["drop(tau=3)"], ".2f")
glue("start_loss", start_loss, ".1f")
glue("hot_bsp_verdict", "still converges" if hot["bsp"] < 0.5 * start_loss else
     "does not converge this time")
glue("hot_ssp_verdict", "SSP(1) ends nearer to it than SSP(4)" if
     abs(hot["ssp(tau=1)"] - hot["bsp"]) < abs(hot["ssp(tau=4)"] - hot["bsp"]) else
     "SSP(4) ends as near to it as SSP(1) this time")
glue("hot_async_verdict", "end far above BSP's loss" if
     min(hot["async"], hot["drop(tau=3)"]) > 2 * hot["bsp"] else
     "end not far above BSP's loss this time")
glue("drop_verdict", "Dropping pushes staler than 3 does not rescue them" if
     hot["drop(tau=3)"] > 2 * hot["bsp"] else
     "Dropping pushes staler than 3 helped this time, though it cannot help much")
async_staleness = [r.staleness for r in runs["async", False][0].pushes]
glue("async_staleness", np.mean(async_staleness), ".1f")

# %% jupyter={"source_hidden": true}
say("""
With the larger step BSP {glue}`hot_bsp_verdict` (final loss {glue}`hot_bsp`;
it is plain synchronous mini-batch SGD, on batches of 4 × 32 = 128), and {glue}`hot_ssp_verdict`
({glue}`hot_ssp1` and {glue}`hot_ssp4`). Async and drop spike and
{glue}`hot_async_verdict` ({glue}`hot_async` and {glue}`hot_drop`; the start is
{glue}`start_loss`), and where between the two they end changes from run to
run: a gradient 3 versions old is now 3 large steps old.
{glue}`drop_verdict`, since an asynchronous push is about n - 1 = 3 versions
stale anyway (the mean staleness of section 1's async run:
{glue}`async_staleness`). This is why asynchronous SGD is run with smaller
steps, or after a synchronous warm-up (`warmup_steps`; Dean et al. started
their Downpour runs from the training of a single replica for the same
reason).
""")

# %% [markdown]
# ## 2. Staleness, from the server's log
#
# Every push the server received is in `ServerResult.pushes`, with its
# staleness: the server's version when it was applied (or dropped) minus the
# version it was computed on.

# %%
figure, axes = plt.subplots(2, len(MODES), figsize=(15, 6), sharex=True)
largest = max(r.staleness for server, _ in runs.values() for r in server.pushes)
bins = np.arange(largest + 2) - 0.5
for row, straggler in enumerate((False, True)):
    for column, (mode, options) in enumerate(MODES):
        name = mode_name(mode, options)
        server = runs[name, straggler][0]
        groups = [[r.staleness for r in server.pushes if (r.worker == 0) == is_zero]
                  for is_zero in (True, False)]
        axis = axes[row, column]
        axis.hist(groups, bins=bins, stacked=True, color=["C3", "C0"],
                  label=["worker 0", "workers 1-3"])
        for record in server.pushes:
            if not record.accepted:
                axis.axvline(options["tau"] + 0.5, color="black", ls="--", lw=0.8)
                break
        axis.set_title(f"{name}, {'straggler' if straggler else 'no straggler'}", fontsize=9)
        if row == 1:
            axis.set_xlabel("staleness τ (versions)")
        if column == 0:
            axis.set_ylabel("pushes")
handles, labels = axes[0, 0].get_legend_handles_labels()
handles.append(plt.Line2D([], [], color="black", ls="--", lw=0.8))
labels.append("drop's bound τ_max (pushes right of it are dropped)")
figure.legend(handles, labels, loc="upper center", ncol=3, fontsize=9)
figure.tight_layout(rect=(0, 0, 1, 0.93))
show_figure(figure, "async_staleness.png")
for (name, straggler), (server, _) in runs.items():
    staleness = [r.staleness for r in server.pushes]
    print(f"{'straggler' if straggler else 'no straggler':>12} {name:>11}: staleness mean "
          f"{np.mean(staleness):4.1f}, max {max(staleness):2}; dropped "
          f"{server.dropped} of {len(server.pushes)}")

# What the text below says of the histograms, chosen from the servers' logs.
def pushes(name, straggler, slow=None):
    """The staleness of a run's pushes: all, worker 0's (slow=True) or the others'."""
    return [r.staleness for r in runs[name, straggler][0].pushes
            if slow is None or (r.worker == 0) == slow]


within = all(max(pushes(f"ssp(tau={tau})", straggler)) <= tau
             for tau in (1, 4) for straggler in (False, True))
glue("ssp_within", "stay within τ_max" if within else "do not all stay within τ_max")
piled = int(np.bincount(pushes("ssp(tau=4)", True, slow=False)).argmax())
glue("ssp_pile", piled, "d")
glue("ssp_pile_verdict", "pile up *at* τ_max" if piled == 4 else
     f"pile up below τ_max, most of them at {piled}")
fresh = all(np.mean(pushes(f"ssp(tau={tau})", True, slow=True)) <
            np.mean(pushes(f"ssp(tau={tau})", True, slow=False)) for tau in (1, 4))
glue("straggler_fresh", "are the fresh ones" if fresh else "are not the freshest this time")
glue("async_mean", np.mean(pushes("async", False)), ".1f")
slow_pushes = pushes("async", True, slow=True)
early = slow_pushes[:max(1, len(slow_pushes) // 3)]
glue("early_stale", [int(np.percentile(early, 10)), int(np.percentile(early, 90))],
     "{0[0]} to {0[1]}")
glue("early_median", float(np.median(early)), ".0f")
calm_mean = round(float(np.mean(pushes("async", False))), 1)    # as printed
glue("early_verdict", "far staler" if np.median(early) > 2 * calm_mean
     else "staler" if np.median(early) > calm_mean else "not staler")
glue("straggler_async_max", max(pushes("async", True)), "d")
glue("stalest_verdict", ("they also wait for the server's replies and share 2 cores, so fewer "
                         "come in (the stalest push of the run: {} versions)"
                         if max(pushes("async", True)) < 12 else
                         "the stalest push of the run, {} versions, shows them doing about "
                         "that").format(glued("straggler_async_max")))
late = slow_pushes[-max(1, len(slow_pushes) // 10):]
glue("late_stale", max(late), "d")
glue("late_verdict", "Its late pushes have staleness 0" if max(late) == 0 else
     f"Its late pushes are fresher, at most {max(late)} versions stale")
dropped = [r for r in runs["drop(tau=3)", True][0].pushes if not r.accepted]
glue("dropped_slow_share", np.mean([r.worker == 0 for r in dropped]) if dropped else 0.0, ".0%")
glue("dropped_verdict", "mostly the straggler's early ones" if dropped and
     np.mean([r.worker == 0 for r in dropped]) > 0.5 else "mostly the fast workers' ones")

# %% jupyter={"source_hidden": true}
say("""
BSP's pushes all have staleness 0, by construction. SSP's {glue}`ssp_within`,
and the fast workers' pushes {glue}`ssp_pile_verdict`: they run as far ahead as
they are allowed to, and wait there. With the straggler, its own pushes (red)
{glue}`straggler_fresh`: everybody else waits for it, so its weights are never
old.

Async is the other way round. Without a straggler a push is about n - 1 = 3
versions stale (the three others pushed meanwhile; the mean here:
{glue}`async_mean`). With the straggler, its early pushes are
{glue}`early_verdict`: {glue}`early_median` versions for the median one of its
first third (the middle 80 % of them: {glue}`early_stale`), against the mean
{glue}`async_mean` of every push without a straggler. In the time of one of its
gradients (4 × 4 ms) the three others could make up to 3 × 4 = 12 updates if
they did nothing but compute; {glue}`stalest_verdict`.
{glue}`late_verdict`: by then the others have finished and it runs alone.
`drop(tau=3)` drops exactly the pushes right of the dashed line:
{glue}`dropped_verdict` ({glue}`dropped_slow_share` of the dropped pushes are
worker 0's). It keeps the updates fresh at the price of wasting the slow
worker's work, and of learning less from the part of the data only that worker
holds.
""")

# %% [markdown]
# ## 3. Hogwild: no server, no locks
#
# Hogwild takes asynchrony to the end: the weights are one array in shared
# memory, every worker process reads and writes it directly, with no lock.
# On *sparse* data (each example touches few weights) two updates rarely
# touch the same weight, and when they do, one of them is lost (see the
# docstring of `minidist/parallel/parameter_server/hogwild.py`: a counter next to the weights counts the lost
# writes). We train logistic regression on `make_sparse_logistic` (5 of 100
# features nonzero per example) with the library's update, every worker
# taking a snapshot of the shared weights every 100 updates so that we can
# draw the loss along the way. In the straggler run, rank 0 sleeps 2 ms
# every 100 updates. An update writes one weight per nonzero feature of its
# example, so the counter counts 5 writes per update: the printed "counter
# writes" are 5 times the updates.

# %%
H_FEATURES, H_LABELS, _ = make_sparse_logistic(4000, 100, 5, seed=0, dtype=np.float64)
H_UPDATES = 16000 if QUICK else 80000
H_LR, EVERY = 0.05, 100


def hogwild_with_snapshots(updates, slow_rank, slow_seconds):
    """hogwild.hogwild_worker's loop, with a snapshot of the shared weights
    every EVERY updates: (time, updates done by this rank, weights)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = hogwild.SparseRows.from_dense(H_FEATURES)
    weights = dist.shared_array(hogwild.WEIGHTS)
    writes = dist.shared_array(hogwild.WRITES)
    mine = hogwild.updates_of_rank(updates, rank, world)
    # Every worker samples from all the data (a worker running alone at the
    # end would otherwise pull the weights towards its own part of it).
    per_pass = hogwild.pass_length_of_rank(len(H_LABELS), rank, world)
    order = hogwild.example_order(len(H_LABELS), mine, per_pass, np.random.default_rng([0, rank]))
    rates = hogwild.learning_rates(H_LR, 1.0, mine, per_pass)
    snapshots, intended = [], 0
    dist.barrier()
    for done, (i, rate) in enumerate(zip(order, rates)):
        if done % EVERY == 0:
            snapshots.append((trace.now(), done, weights.copy()))
            if rank == slow_rank:
                time.sleep(slow_seconds)
        columns, values = rows.row(i)
        hogwild.sgd_update(weights, writes, columns, values, H_LABELS[i], rate)
        intended += len(columns)
    snapshots.append((trace.now(), mine, weights.copy()))
    dist.barrier()
    return snapshots, intended, writes.sum() if rank == 0 else None


def progress_at(times, done, moment):
    """Updates a rank had made at ``moment``, from its snapshots (0 before its first)."""
    index = np.searchsorted(times, moment, side="right") - 1
    return done[index] if index >= 0 else 0


def hogwild_curve(world, slow_rank=None, slow_seconds=0.0):
    results = minidist.launch(hogwild_with_snapshots, world_size=world,
                              args=(H_UPDATES, slow_rank, slow_seconds),
                              shared_arrays=hogwild.shared_arrays(H_FEATURES.shape[1]))
    t0 = min(snaps[0][0] for snaps, _, _ in results)
    progress = [(np.array([t for t, _, _ in s]), np.array([d for _, d, _ in s]))
                for s, _, _ in results]
    points = []
    for snapshots, _, _ in results:
        for moment, _, weights in snapshots:
            total = sum(progress_at(times, done, moment) for times, done in progress)
            points.append(((moment - t0) / 1e9, total,
                           hogwild.logistic_loss(weights, H_FEATURES, H_LABELS)))
    points.sort()
    lost = sum(intended for _, intended, _ in results) - int(results[0][2])
    seconds = [(times[-1] - times[0]) / 1e9 for times, _ in progress]   # each rank's run
    return np.array(points), lost, sum(i for _, i, _ in results), seconds


hogwild_runs = {"serial SGD (1 process)": hogwild_curve(1),
                "Hogwild, 4 workers": hogwild_curve(4),
                "Hogwild, 4 workers, rank 0 slow": hogwild_curve(4, 0, 0.002)}
serial_final = hogwild.logistic_loss(
    hogwild.serial_sgd(H_FEATURES, H_LABELS, H_UPDATES, H_LR), H_FEATURES, H_LABELS)
for name, (points, lost, intended, _) in hogwild_runs.items():
    print(f"{name:>32}: final loss {points[-1, 2]:.4f} after {points[-1, 0]:.2f} s; "
          f"{lost} of {intended} counter writes lost to races ({lost / intended:.1%})")
print(f"{'hogwild.serial_sgd':>32}: final loss {serial_final:.4f} (the library's reference)")
print(f"{H_UPDATES:,} updates in each run, {hogwild_runs['serial SGD (1 process)'][2] // H_UPDATES}"
      " writes per update (the 5 nonzero features of an example)")
print("rank 0 slow: each rank's run took "
      + ", ".join(f"{t:.3f}" for t in hogwild_runs["Hogwild, 4 workers, rank 0 slow"][3])
      + " s (ranks 0 to 3)")

figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
for name, (points, _, _, _) in hogwild_runs.items():
    axes[0].plot(points[:, 0], points[:, 2], ".", ms=2, label=name)
    axes[1].plot(points[:, 1], points[:, 2], ".", ms=2, label=name)
axes[0].set_xlabel("seconds")
axes[1].set_xlabel("updates, all workers together")
axes[0].set_ylabel("logistic loss of the shared weights")
axes[0].set_title("Hogwild: loss vs time")
axes[1].set_title("Hogwild: loss vs updates")
for axis in axes:
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, markerscale=4)
figure.tight_layout()
show_figure(figure, "hogwild_loss.png")

# What the text below says of the runs, chosen from their numbers.
serial, free, slowed = (hogwild_runs[name] for name in hogwild_runs)
off = [abs(run[0][-1, 2] / serial_final - 1) for run in (free, slowed)]
glue("hogwild_off", max(off), ".1%")
glue("hogwild_verdict", "close to" if max(off) < 0.05 else "not close to")
shares = [run[1] / run[2] for run in (free, slowed)]
glue("lost_least", min(shares), ".1%")
glue("lost_most", max(shares), ".1%")
glue("hogwild_seconds", free[0][-1, 0], "{:.2f} s")
glue("serial_seconds", serial[0][-1, 0], "{:.2f} s")
glue("hogwild_speed", "faster than" if free[0][-1, 0] < serial[0][-1, 0] else
     "no faster than")
rank_seconds = [round(t, 3) for t in slowed[3]]          # as printed
glue("hogwild_slow_factor", rank_seconds[0] / np.mean(rank_seconds[1:]), ".1f")
glue("writes_per_update", serial[2] // H_UPDATES, "d")

# %% jupyter={"source_hidden": true}
say("""
Per update, Hogwild's points fall on serial SGD's curve (the right panel above),
and its final loss is {glue}`hogwild_verdict` the library's serial reference
(at most {glue}`hogwild_off` away; the slow rank's updates come in last, but
since every worker samples from all the data they do not pull the end towards
one part of it, as they would if each worker had a shard): the races cost
almost nothing, because each one loses a single term of a long sum. (Each
snapshot is read without a lock too, so a point may mix two writes; the curve
is still smooth.) The counter says how often a race struck:
{glue}`lost_least` to {glue}`lost_most` of the writes here; with denser data
or fewer features more updates collide. In time, 4 workers on 2 cores were
{glue}`hogwild_speed` one process ({glue}`hogwild_seconds` against
{glue}`serial_seconds`). The slow rank took {glue}`hogwild_slow_factor` times
as long as the mean of the others (each rank's time is printed above) for its
quarter of the updates, and delayed only that quarter:
nobody waits for it until the final barrier.
""")

# %% [markdown]
# ## 4. D2P: what a delay bound costs
#
# The LSML lecture's D2P (delayed block proximal gradient) is L1-regularised
# logistic regression on a PS: it minimises the objective
# F(w) = (mean logistic loss) + 0.01 ||w||₁, the coordinates are split into
# a few blocks (4 here), step i (i, the step's number) updates block
# i mod 4, and a worker may compute on weights up to τ_max steps old, the
# delay bound. `delayed_proximal_reference` runs it in one process with the
# worst delays the bound allows (every worker always τ_max steps behind), so
# the effect of the bound alone shows. Does a delay cost anything? The
# answer below is this problem's.

# %%
D_FEATURES, D_LABELS, _ = make_sparse_logistic(600, 40, 8, seed=1, dtype=np.float64)
D_WORKERS, D_BLOCKS, D_STEPS, D_L1 = 3, 4, 120 if QUICK else 400, 0.01
D_STEP = 0.5 * d2p.default_step_size(D_FEATURES)
figure, axis = plt.subplots(figsize=(7, 4))
d2p_objectives = {}
styles = {0: dict(lw=4, alpha=0.45), 1: dict(ls="--"), 4: dict(ls="-."), 8: dict(ls=":", lw=2)}
for tau in (0, 1, 4, 8):
    reference = d2p.delayed_proximal_reference(
        D_FEATURES, D_LABELS, D_WORKERS, D_BLOCKS, D_STEPS, D_STEP, D_L1,
        delays=d2p.max_delay_schedule(D_STEPS, D_WORKERS, tau))
    d2p_objectives[tau] = reference.objectives
    axis.plot(reference.objectives, label=f"tau = {tau}", **styles[tau])
d2p_final = {tau: round(float(objectives[-1]), 5) for tau, objectives in d2p_objectives.items()}
for tau in d2p_objectives:
    print(f"tau={tau}: final objective {d2p_final[tau]:.5f} "
          f"({(d2p_final[tau] / d2p_final[0] - 1):+.3%} from tau=0)")
process_run = minidist.launch(d2p.delayed_proximal_gradient, world_size=1 + D_WORKERS,
                              args=(D_FEATURES, D_LABELS, D_BLOCKS, D_STEPS, D_STEP, D_L1, 4))
delays = np.concatenate([worker["delays"] for worker in process_run[1:]])
print(f"on real processes with tau=4: delays seen {np.bincount(delays).tolist()} "
      f"(count of the {D_WORKERS} workers' gradients with delay 0, 1, ..., one per worker "
      f"and step: {D_WORKERS} x {D_STEPS} = {len(delays)}); objective "
      f"{d2p.objective(process_run[0]['weights'], D_FEATURES, D_LABELS, D_L1):.5f}")
axis.set_yscale("log")
axis.set_xlabel("step (one block each)")
axis.set_ylabel("objective F(w) = logistic loss + 0.01 ||w||₁")
axis.set_title("D2P with the largest delays the bound tau allows")
axis.grid(alpha=0.3)
axis.legend()
figure.tight_layout()
show_figure(figure, "d2p_delay.png")

# What the text below says of the curves, chosen from them.
ends = {tau: d2p_final[tau] / d2p_final[0] - 1 for tau in d2p_final}   # of the printed values
spread_end = max(d2p_final.values()) / min(d2p_final.values()) - 1
glue("d2p_apart", spread_end, ".3%")
glue("d2p_verdict", "end on top of each other" if spread_end < 1e-3
     else "do not end on top of each other")
glue("d2p_highest", max(d2p_final.values()), ".5f")
glue("d2p_lowest", min(d2p_final.values()), ".5f")
helped = [tau for tau in d2p_final if tau > 0 and d2p_final[tau] < d2p_final[0]]
glue("d2p_helped", ", ".join(f"τ_max = {tau}" for tau in helped))
glue("d2p_end_verdict",
     ("all end at " + glued("d2p_lowest") + ", the same to the five printed decimals: the "
      "delay cost nothing at the end") if len(set(d2p_final.values())) == 1 else
     ("the printed final objectives lie between " + glued("d2p_lowest") + " and "
      + glued("d2p_highest") + ", " + glued("d2p_apart") + " apart, and the delay cost nothing "
      "here: " + glued("d2p_helped") + " even end lower than τ_max = 0") if helped else
     ("the printed final objectives lie between " + glued("d2p_lowest") + " and "
      + glued("d2p_highest") + ", " + glued("d2p_apart") + " apart, τ_max = 0's the lowest: the "
      "delay cost that much"))
# the delayed curves against tau = 0, step by step
ahead = {tau: int(np.sum(np.asarray(d2p_objectives[tau]) < np.asarray(d2p_objectives[0])))
         for tau in (4, 8)}
glue("d2p_ahead_4", ahead[4], "d")
glue("d2p_ahead_8", ahead[8], "d")
glue("d2p_points", len(d2p_objectives[0]), "d")
glue("d2p_gradients", len(delays), "d")
middle = len(d2p_objectives[0]) // 2
gaps_middle = {tau: objectives[middle] / d2p_objectives[0][middle] - 1
               for tau, objectives in d2p_objectives.items() if tau > 0}
behind = max(gaps_middle.values())
glue("d2p_middle_tau", max(gaps_middle, key=gaps_middle.get), "d")
glue("d2p_middle", behind, "+.4%")
glue("d2p_middle_verdict", "the delayed ones are not even behind" if behind <= 0 else
     "the delayed ones are hardly behind" if behind < 1e-3 else "the delayed ones are behind")
glue("d2p_middle_step", middle, "d")
counts = np.bincount(delays, minlength=5)
glue("full_tau_share", counts[4] / counts.sum() if len(counts) > 4 else 0.0, ".0%")
glue("ahead_share", 1 - counts[0] / counts.sum(), ".0%")

# %% jupyter={"source_hidden": true}
say("""
With the largest delays allowed, the curves in the picture above
{glue}`d2p_verdict`: {glue}`d2p_end_verdict`. (τ_max = 0, the wide pale
line, and τ_max = 1 lie on top of each other.) Along the way, τ_max = 4 and 8
were below τ_max = 0 at {glue}`d2p_ahead_4` and {glue}`d2p_ahead_8` of the
{glue}`d2p_points` points of the curves, and at the middle step, step
{glue}`d2p_middle_step`, {glue}`d2p_middle_verdict` (the highest of them
there, τ_max = {glue}`d2p_middle_tau`, is {glue}`d2p_middle` from τ_max = 0;
positive means above it, behind). On this problem a block's gradient
hardly depends on the latest updates of the other blocks, and the step size is
half the safe one, so an old view of them costs nothing, and the slightly
different order of the updates can even come out ahead. The LSML lecture's
promise, "τ_max times fewer synchronisations; the slower convergence is paid
back by faster steps", is the trade: on real processes a worker waits only
when it is more than τ_max steps ahead, and the delays printed show how far
the workers ran ahead. They count one delay per worker and step
({glue}`d2p_gradients` in all, the 3 workers' gradients of every step, while
the curves above have one point per step): {glue}`ahead_share` of them had a
delay, {glue}`full_tau_share` the full τ_max = 4.
""")

# %% [markdown]
# Try: add `warmup_steps=10` to async in section 1b (with
# `("async", {"warmup_steps": 10})`) and see whether a synchronous start
# steadies it; give SSP a larger bound with the straggler (`("ssp",
# {"tau": 8})` in the list `MODES` of section 1's code cell); in
# section 3, make the data denser (`make_sparse_logistic(4000, 20, 10)`)
# and count the lost writes again.
