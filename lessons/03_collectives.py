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
# # Lesson 3: collectives, their algorithms, and what they cost
#
# A *point-to-point* message involves two processes. A *collective* involves a
# whole group at once: everybody calls the same function, and together they
# move data in a pattern with a name.
#
# | collective | before | after |
# |---|---|---|
# | broadcast | the root has x | everybody has x |
# | scatter | the root has [x0, x1, ...] | rank i has xi |
# | gather | rank i has xi | the root has [x0, x1, ...] |
# | reduce | rank i has xi | the root has x0 + x1 + ... |
# | all_reduce | rank i has xi | everybody has x0 + x1 + ... (= reduce + broadcast) |
# | all_gather | rank i has xi | everybody has [x0, x1, ...] |
# | reduce_scatter | rank i has [xi0, xi1, ...] | rank j has x0j + x1j + ... |
# | all_to_all | rank i has [xi0, xi1, ...] | rank j has [x0j, x1j, ...] |
# | barrier | rank i reaches the call | no rank leaves it before every rank has reached it (no data moves) |
#
# Data-parallel training needs exactly one of them, all_reduce, once per step,
# to add up the gradients of all workers. How fast that is decides how well
# training scales, so this chapter looks at *how* a collective is done: each
# has several algorithms, all written in minidist on plain sends and receives,
# and the cost model of lesson 2 ($t = \alpha + N\beta$ for a message of $N$
# bytes) tells which one wins.
#
# 1. call every collective on four real processes and look at the result;
# 2. list the algorithms, count their messages, and compare with the formula;
# 3. time the all_reduce algorithms against the cost model's prediction;
# 4. simulate up to 1,024 ranks (the quick form stops at 256): the ring's
#    time grows only a little as the world grows, reduce + broadcast's grows
#    with log n.

# %%
import os
import re

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import costmodel
from minidist.lesson import (
    glue,
    narrate,
    output_dir,
    quick,
    say,
    show_figure,
    use_headless_matplotlib,
)
from minidist.lesson_timing import Load, timed
from minidist.model_gap import RunFacts, compare

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
import matplotlib.pyplot as plt  # noqa: E402

QUICK = quick()
OUT = output_dir()
if QUICK:
    print("quick form: section 3 times the all_reduce algorithms on 2 ranks at 4 KiB and "
          "1 MiB (the full form: 4 ranks, 4 KiB to 16 MiB), with fewer tries; section 4 "
          "simulates up to 256 ranks (the full form: 1,024)")

# %% [markdown]
# ## 1. Every collective, on four processes
#
# Each rank starts with its own small array (rank r holds values 10r, 10r+1,
# ...) so that the result shows where every number came from. The calls
# follow torch.distributed: they work *in place* on the arrays passed, and the
# root of the rooted ones is a rank number. Broadcast, reduce, all_reduce,
# reduce_scatter and all_to_all work on the whole 4-element arrays; the
# pieces of the other three are one element each, to keep the rows short:
# scatter cuts rank 0's array, [0 1 2 3], into one element per rank, and
# gather and all_gather collect each rank's first element, 10r.

# %%
def tour():
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = np.arange(n, dtype=np.int64) + 10 * rank
    seen = {"start": mine.copy()}

    x = mine.copy()
    dist.broadcast(x, src=0)
    seen["broadcast from 0"] = x

    piece = np.zeros(1, np.int64)
    dist.scatter(piece, [mine[i:i + 1].copy() for i in range(n)] if rank == 0 else None, src=0)
    seen["scatter from 0"] = piece

    pieces = [np.zeros(1, np.int64) for _ in range(n)] if rank == 0 else None
    dist.gather(mine[:1].copy(), pieces, dst=0)
    seen["gather to 0"] = np.concatenate(pieces) if rank == 0 else "-"

    x = mine.copy()
    dist.reduce(x, dst=0)
    seen["reduce to 0"] = x if rank == 0 else "-"

    x = mine.copy()
    dist.all_reduce(x)
    seen["all_reduce"] = x

    gathered = np.zeros(n, np.int64)
    dist.all_gather_into_tensor(gathered, mine[:1].copy())
    seen["all_gather"] = gathered

    out = np.zeros(1, np.int64)
    dist.reduce_scatter_tensor(out, mine.copy())
    seen["reduce_scatter"] = out

    exchanged = np.zeros(n, np.int64)
    dist.all_to_all_single(exchanged, mine.copy())
    seen["all_to_all"] = exchanged
    return seen


results = minidist.launch(tour, world_size=4, transport="shm")
for what in results[0]:
    print(f"{what:>18}: " + "   ".join(f"rank {rank}: {results[rank][what]}" for rank in range(4)))

# %% [markdown]
# Read the all_to_all row as a transpose: rank j ends with the j-th element of
# every rank. reduce_scatter is all_reduce with each rank keeping only its
# own part of the result; all_gather is its second half. That is exactly how
# the ring all-reduce is built: a reduce-scatter, then an all-gather.

# %% [markdown]
# ## 2. Algorithms, and the messages they send
#
# Every collective has several algorithms, all in
# `minidist/distributed/collectives/<collective>.py`, each a short function on
# `isend` / `irecv` (the non-blocking send and receive: they return at once,
# with a request to `wait()` on, so a rank can send and receive in the same
# step) whose docstring gives its cost. `dist.ALGORITHMS` lists them;
# `algorithm=` picks one, and the default `"auto"` asks the cost model. Below,
# each with the first sentence of its docstring (the docstring goes on with
# its cost).

# %%
def summary(function):
    """The first sentence of a docstring, on one line."""
    text = " ".join((function.__doc__ or "").split("Cost:")[0].split())
    return re.split(r"\.\s+(?=[A-Z])", text)[0].rstrip(".")


for collective, algorithms in dist.ALGORITHMS.items():
    print(f"{collective}:")
    for name, function in algorithms.items():
        print(f"  {name:>19}: {summary(function)}")

# %% [markdown]
# A trace records every message that really moved. For an all_reduce of $N$
# bytes on $n$ ranks, the ring sends $2(n-1)$ messages per rank, each of $N/n$
# bytes; the "coordinator" (everyone sends to rank 0, which sends the sum back)
# makes rank 0 receive and send $n-1$ whole arrays. The table compares what the
# trace counted with `costmodel.TRAFFIC`, the formula of each algorithm.

# %%
from minidist.trace import read_jsonl  # noqa: E402

N_RANKS, COUNT = 4, 1 << 16


def one_of_each():
    for algorithm in dist.ALGORITHMS["all_reduce"]:
        dist.all_reduce(np.ones(COUNT, np.float32), algorithm=algorithm)


trace_path = OUT / "all_reduce.trace.jsonl"
minidist.launch(one_of_each, world_size=N_RANKS, transport="shm", trace=str(trace_path))
events = read_jsonl(trace_path).events
print(f"traced: each all_reduce algorithm once, {N_RANKS} ranks on the shm transport, "
      f"N = {COUNT * 4 // 1024} KiB ({COUNT:,} float32) per rank")
print(f"{'algorithm':>20} {'messages':>9} {'formula':>8} {'MB sent':>8} {'formula':>8} "
      f"{'max MB by one rank':>19}")
busiest = {}  # algorithm -> the most one rank sent, in arrays of COUNT float32
for algorithm in dist.ALGORITHMS["all_reduce"]:
    sends = [e for e in events if e["kind"] == "send"
             and e["label"].startswith(f"all_reduce {algorithm}:")]
    messages, nbytes = costmodel.TRAFFIC["all_reduce"][algorithm](N_RANKS, COUNT, 4)
    per_rank = max(sum(e["bytes"] for e in sends if e["rank"] == r) for r in range(N_RANKS))
    print(f"{algorithm:>20} {len(sends):>9} {messages:>8} {sum(e['bytes'] for e in sends) / 1e6:>8.2f} "
          f"{nbytes / 1e6:>8.2f} {per_rank / 1e6:>19.2f}")
    busiest[algorithm] = per_rank / (COUNT * 4)   # in arrays

glue("ring_share", busiest["ring"], "{:.2f}")
glue("ring_bound", 2 * (N_RANKS - 1) / N_RANKS, "{:.2f}")
glue("coordinator_share", busiest["coordinator"], "{:.2f}")

# %% jupyter={"source_hidden": true}
say(r"""
The last column is the point of the ring: no rank sends more than
$2\frac{n-1}{n}$ of the array ({glue}`ring_bound` arrays on these 4 ranks; the
ring's busiest rank sent {glue}`ring_share`), less than twice its size whatever
$n$ is, while the coordinator's rank 0 sends $n-1$ whole arrays
({glue}`coordinator_share`).
""")

# %% [markdown]
# ## 3. Measured against predicted
#
# We time each all_reduce algorithm on real processes and compare with the
# cost model, $\alpha$ and $\beta$ fitted on this machine by a quick ping-pong
# (lesson 2 does it in detail), $\gamma$ from timing `np.add`. Every time is
# the fastest of many tries, each try after a barrier and as long as its
# slowest rank: on a shared machine the fastest try is the least disturbed.
#
# Expect agreement within a small factor on an idle machine, not to the
# microsecond. Where they differ, look at what the model leaves out: on one
# machine every "link" is a copy through the same memory bus, with more ranks
# than cores the processes take turns on the CPU, and each step costs
# Python's own bookkeeping on top of the message (the ping-pong's alpha
# includes some of it, not all).

# %%
import time  # noqa: E402


def pingpong(sizes, trips):
    """One-way seconds of each size: the fastest of ``trips`` round trips, each
    timed on its own (the first one, a warm-up, not counted)."""
    rank = dist.get_rank()
    times = []
    for size in sizes:
        buffer = np.zeros(size, np.uint8)
        dist.barrier()
        best = float("inf")
        for trip in range(trips + 1):
            start = time.perf_counter()
            if rank == 0:
                dist.send(buffer, 1)
                dist.recv(buffer, 1)
            else:
                dist.recv(buffer, 0)
                dist.send(buffer, 0)
            if trip:
                best = min(best, (time.perf_counter() - start) / 2)
        times.append(best)
    return times


load = Load.start()
fit_sizes = [1 << k for k in (3, 12, 16, 20, 22)]
fitted = costmodel.fit(fit_sizes, minidist.launch(pingpong, world_size=2, transport="shm",
                                                  args=(fit_sizes, 20 if QUICK else 100))[0])
a, b = np.ones(1 << 22, np.float32), np.ones(1 << 22, np.float32)
add = timed(lambda a=a, b=b: np.add(a, b, out=a), repeats=5).best[""]
params = costmodel.Params(fitted.alpha, fitted.beta, add / a.nbytes)
print(f"alpha = {params.alpha * 1e6:.1f} us, bandwidth = {params.bandwidth / 1e9:.2f} GB/s, "
      f"gamma = {params.gamma * 1e9:.3f} ns/B")


def time_all_reduce(sizes, tries):
    """{(algorithm, size): [seconds of each try]} on this rank, each try after a barrier."""
    timings = {}
    for algorithm in dist.ALGORITHMS["all_reduce"]:
        for size in sizes:
            x = np.zeros(size // 4, np.float32)  # zeros: summing them again and again stays finite
            for _ in range(3):
                dist.all_reduce(x, algorithm=algorithm)  # warm up
            calls = []
            for _ in range(tries):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(x, algorithm=algorithm)
                calls.append(time.perf_counter() - start)
            timings[algorithm, size] = calls
    return timings


sizes = [4 << 10, 1 << 20] if QUICK else [4 << 10, 256 << 10, 4 << 20, 16 << 20]
world = 2 if QUICK else 4
measured = minidist.launch(time_all_reduce, world_size=world, transport="shm",
                           args=(sizes, 10 if QUICK else 30))
load = load.finish()
print(f"all_reduce on {world} ranks (shm): measured / predicted")
print(f"{'algorithm':>20} " + " ".join(f"{s // 1024:>9} KiB" for s in sizes))
gaps = []
for algorithm in dist.ALGORITHMS["all_reduce"]:
    cells = []
    for size in sizes:
        # A try lasts as long as its slowest rank; the fastest try is kept.
        tries = zip(*(timings[algorithm, size] for timings in measured))
        seconds = min(max(ranks) for ranks in tries)
        predicted = costmodel.predict("all_reduce", algorithm, world, size, params)
        cells.append(f"{seconds * 1e6:6.0f}/{predicted * 1e6:<6.0f}")
        gaps.append((seconds / predicted, seconds, predicted, algorithm, size))
    print(f"{algorithm:>20} " + " ".join(f"{c:>13}" for c in cells))
print("(microseconds; 'auto' would pick:",
      ", ".join(f"{s // 1024} KiB -> {costmodel.best('all_reduce', world, s, params=params)}"
                for s in sizes) + ")")
# The largest gap either way (measured above or below the model), and why
# this run gives it (computed from the run's facts).
ratio, seconds, predicted, algorithm, size = max(gaps, key=lambda gap: max(gap[0], 1 / gap[0]))
glue("gap_ratios", [[algorithm, size, ratio] for ratio, _, _, algorithm, size in gaps])
glue("largest_gap", [algorithm, size, ratio])
cores = len(os.sched_getaffinity(0))
why = compare(seconds, predicted, RunFacts(ranks=world, cores=cores, transport="shm",
                                           params="fitted", nbytes=size,
                                           load=max(load.before, load.after)))
# compare() advises fewer ranks; this run has no such rows to show that it holds.
why = why.replace(f"; the model holds with -n {cores})",
                  "; with one rank per core the turns go away, not the other reasons)")
print(f"largest gap, {algorithm} at {size // 1024} KiB: {why}")
if load.busy:
    idle = costmodel.Params(costmodel.PARAMS["shm"].alpha, costmodel.PARAMS["shm"].beta,
                            params.gamma)
    model = ", ".join(f"{s // 1024} KiB "
                      f"{costmodel.predict('all_reduce', 'ring', world, s, idle) * 1e6:.0f} us"
                      for s in sizes)
    print(load.note(f"the course machine's idle alpha and beta predict the ring at {model}"))

# Which algorithm was fastest, measured and predicted, at the smallest and the largest size.
table = {(algorithm, size): (seconds, predicted) for _, seconds, predicted, algorithm, size in gaps}
winners = {}
for size in (sizes[0], sizes[-1]):
    timed_here = {a: table[a, size][0] for a in dist.ALGORITHMS["all_reduce"]}
    winners[size] = (min(timed_here, key=timed_here.get),
                     costmodel.best("all_reduce", world, size, params=params))
glue("winners", [[size, *pair] for size, pair in winners.items()])
(small_won, small_pick), (large_won, large_pick) = winners[sizes[0]], winners[sizes[-1]]
glue("small_size", sizes[0] / 1024, "{:.0f} KiB")
glue("large_size", sizes[-1] / 1024, "{:,.0f} KiB")
glue("small_won", small_won)
glue("large_won", large_won)
glue("small_pick", small_pick)
glue("large_pick", large_pick)
glue("winners_verdict", "the run agrees with the model at both ends"
     if (small_won, large_won) == (small_pick, large_pick) else
     "where the run and the model disagree, look at the largest gap above and its reasons "
     f"({load.describe()}, {world} ranks): on a shared machine the order of close algorithms "
     "is a measurement of the moment")
# Which algorithms took less than the model at the largest size (see below).
below = [algorithm for algorithm in dist.ALGORITHMS["all_reduce"]
         if table[algorithm, sizes[-1]][0] < table[algorithm, sizes[-1]][1]]
glue("below_model", below)
# Where the bytes dominate: well above n_1/2 = alpha / beta of this run's fit.
n_half = params.alpha / params.beta
glue("n_half", n_half / 1024, "{:,.0f} KiB")
lean = ("ring", "rabenseifner", "two_shot")
glue("large_expect", f"at {sizes[-1] // 1024:,} KiB the model picks {large_pick}, one of them"
     if large_pick in lean else
     f"this run's largest size, {sizes[-1] // 1024:,} KiB, is not large enough for that on "
     f"its fit: the model still picks {large_pick} there")
glue("below_text", f"{', '.join(below)} took less than the model predicted (its beta is the "
     "ping-pong's above, on this machine as it was then)" if below else
     f"no algorithm took less than the model predicted: this run's waits ({load.describe()}) "
     "outweighed the copy saved")

# %% [markdown]
# %% jupyter={"source_hidden": true}
say(r"""
What to expect: on small arrays the algorithms with the fewest steps win
(each step costs at least $\alpha$, plus Python's own overhead per message
here); on arrays well above $n_{1/2} = \alpha/\beta$ ({glue}`n_half` on this
run's fit), where the bytes dominate, the ones that send the fewest bytes per
rank win: ring, Rabenseifner and two_shot. Here {glue}`large_expect`.

On this run the fastest at {glue}`small_size` was **{glue}`small_won`** (the
model's pick: {glue}`small_pick`), and at {glue}`large_size`
**{glue}`large_won`** (the model's pick: {glue}`large_pick`): {glue}`winners_verdict`.
""")

# %% [markdown]
# Two algorithms are made for ranks that share one machine. **one_shot**:
# everyone hands its whole array to everyone and each rank adds all n up, in
# rank order (one step; on the shm transport, untraced, no messages at all,
# only a shared slot per rank: one of the shortcuts gathered, with their
# switch `MINIDIST_FAST_PATHS=0`, in `distributed/fast_paths.py`; a traced
# run sends the messages instead, so that the trace shows them: the 12 of the
# table above). **two_shot**: the
# ring's reduce-scatter and allgather, but each done in one step with every
# rank talking to every other. And on shm, any message bigger than the shm
# transport's buffer (four slots of up to 1 MiB for each pair of ranks,
# lesson 2) is not copied through it: the receiver reads it straight out of
# the sender's memory (`transport/cma.py`), one copy instead of two. That is
# why an all_reduce whose pieces are bigger than that buffer (the full
# form's 16 MiB on 4 ranks) can cost less here than the model's two copies
# of every byte.

# %% jupyter={"source_hidden": true}
say(r"""
On this run, at {glue}`large_size`, {glue}`below_text`.
""")

# %% [markdown]
# ## 4. A thousand ranks, simulated
#
# This machine has a few cores; a cluster has thousands. The simulator runs
# the *same* algorithm code with every rank in one process and a virtual
# clock: a message of $N$ bytes sent at time $t$ arrives at $t + \alpha + N\beta$,
# and a rank that adds $N$ received bytes into its own spends $N\gamma$ more.
# Here: a 100 MB gradient, 5 us latency ($\alpha$), 10 GB/s links ($\beta$ =
# 1 / 10 GB/s) and ranks that add at 10 GB/s ($\gamma$ = 1 / 10 GB/s).
#
# The ring sends $2(n-1)$ messages of $N/n$ bytes and adds $n-1$ of them:
# its time, $2(n-1)\alpha + 2\frac{n-1}{n}N\beta + \frac{n-1}{n}N\gamma$,
# nears $2N\beta + N\gamma$ as $n$ grows, and stays there until its
# $2(n-1)$ latencies add up. Reduce + broadcast sends the whole array
# $\lceil\log_2 n\rceil$ times on the way up, adding it each time, and as
# many times on the way down:
# $2\lceil\log_2 n\rceil(\alpha + N\beta) + \lceil\log_2 n\rceil N\gamma$,
# which grows with log n.

# %%
from minidist.distributed import simulate  # noqa: E402

NBYTES = 100_000_000
worlds = [2, 4, 8, 16, 32, 64, 128, 256] + ([] if QUICK else [512, 1024])
ALPHA, BETA, GAMMA = 5e-6, 1e-10, 1e-10   # 5 us, 10 GB/s links, adding at 10 GB/s
curves = {}
model_gap = 0.0   # the largest |simulated - formula| / formula
for algorithm in ("ring", "reduce_broadcast", "rabenseifner"):
    curves[algorithm] = []
    for n in worlds:
        result = simulate("all_reduce", algorithm, world_size=n, nbytes=NBYTES,
                          alpha=ALPHA, beta=BETA, gamma=GAMMA)
        curves[algorithm].append(result.time)
        model_gap = max(model_gap, abs(result.time - result.predicted) / result.predicted)
    print(f"{algorithm:>18}: " + ", ".join(f"n={n}: {t * 1e3:.1f} ms"
                                           for n, t in zip(worlds, curves[algorithm])))

figure, axis = plt.subplots(figsize=(7, 4))
# Ring and Rabenseifner nearly coincide: different lines and markers, so both show.
apart = max(abs(r - q) / r for r, q in zip(curves["ring"], curves["rabenseifner"]))
styles = {"ring": ("o", "-", 9), "reduce_broadcast": ("s", "-", 6), "rabenseifner": ("x", "--", 7)}
for algorithm, times in curves.items():
    marker, line, size = styles[algorithm]
    label = algorithm
    if algorithm == "rabenseifner" and apart < 0.1:
        label = f"rabenseifner (within {apart:.0%} of the ring: dashed, over it)"
    axis.plot(worlds, np.array(times) * 1e3, marker=marker, linestyle=line, markersize=size,
              markerfacecolor="none" if algorithm == "ring" else None, label=label)
axis.set_xscale("log", base=2)
axis.set_xlabel("ranks (simulated)")
axis.set_ylabel("all_reduce of 100 MB (ms)")
axis.set_title("ring grows slowly, reduce + broadcast with log n")
axis.legend()
axis.grid(alpha=0.3)
figure.tight_layout()

ring = dict(zip(worlds, curves["ring"]))
steps = np.diff(curves["reduce_broadcast"])   # one per doubling of the world
glue("sim_curves", [[algorithm, list(zip(worlds, times))] for algorithm, times in curves.items()])
glue("ring_8", ring[8] * 1e3, "{:.1f} ms")
glue("ring_growth", ring[worlds[-1]] / ring[8] - 1, ".0%")
rb = dict(zip(worlds, curves["reduce_broadcast"]))
glue("rb_growth", rb[worlds[-1]] / rb[8], "{:.1f} times")
glue("ring_rab_apart", apart, ".1%")
glue("ring_last", ring[worlds[-1]] * 1e3, "{:.1f} ms")
glue("last_n", worlds[-1], "{:,}")
glue("ring_limit", (2 * NBYTES * BETA + NBYTES * GAMMA) * 1e3, "{:.0f} ms")
glue("ring_latency_last", 2 * (worlds[-1] - 1) * ALPHA * 1e3, "{:.1f} ms")
low, high = (f"{step * 1e3:.1f} ms" for step in (steps.min(), steps.max()))
glue("rb_step", low if low == high else f"{low} to {high}")
glue("rb_step_formula", (2 * (ALPHA + NBYTES * BETA) + NBYTES * GAMMA) * 1e3, "{:.1f} ms")
glue("model_gap", model_gap, ".1e")
glue("model_verdict", "exactly" if model_gap < 1e-9 else
     f"to within {model_gap:.1e} of their value")

# %% jupyter={"source_hidden": true}
say(r"""
In the picture below the ring went from {glue}`ring_8` at 8 ranks to
{glue}`ring_last` at {glue}`last_n` (up {glue}`ring_growth`, where reduce +
broadcast grew {glue}`rb_growth` over the same worlds): its bytes and additions near
$2N\beta + N\gamma$ = {glue}`ring_limit`, and its latencies,
$2(n-1)\alpha$, are {glue}`ring_latency_last` of it at {glue}`last_n` ranks.
Reduce + broadcast climbs by {glue}`rb_step` each time the world doubles: $2(\alpha + N\beta) + N\gamma$ = {glue}`rb_step_formula`.
""")

# %%
show_figure(figure, "all_reduce_scaling.png",
            f"ring (circles) and rabenseifner (crosses, dashed) are within {apart:.1%} of "
            "each other at every size: their lines nearly coincide" if apart < 0.1 else "")

# %% jupyter={"source_hidden": true}
say(r"""
The simulated times follow the formulas {glue}`model_verdict` (the simulator
charges each message $\alpha + N\beta$ and each addition $N\gamma$), which is what
lets a student check an algorithm's cost formula by running it. On the real
cluster, contention, topology and stragglers add to this: the model is the
floor, not the forecast.
""")

# %% [markdown]
# Try: `minidist simulate all_reduce -n 1024 --size 100MB --alpha 5us --bandwidth 10GB/s`
# prints every algorithm's simulated and predicted time; add
# `--trace ring.jsonl` to keep the messages for the visualiser.

# %% [markdown]
# ## When the ranks disagree
#
# A collective needs every rank of its group, in the same call. Two classic
# bugs break that: a rank that skips a call (an `if rank == ...` around it,
# or a `return` too early) and ranks that call different collectives. Neither
# is left to hang until the timeout: a rank asleep in a collective reads its
# peers' status records in the run's control block, and a peer that finished
# without this call, or that sleeps in the same call number of another
# collective, ends the run at once. The error's first line names the rank
# that caused it and the call each rank was in.

# %%
def rank_3_returns_early():
    if dist.get_rank() == 3:
        return "done already"
    dist.all_reduce(np.ones(1000, np.float32))


def ranks_disagree():
    values = np.ones(1000, np.float32)
    if dist.get_rank() == 0:
        dist.all_reduce(values)
    else:
        dist.broadcast(values, src=0)


for bug in (rank_3_returns_early, ranks_disagree):
    try:
        minidist.launch(bug, world_size=4)
    except dist.WorkerError as error:
        print(f"{bug.__name__}:\n  {str(error).splitlines()[0]}\n")

# %% [markdown]
# ## Your turn
#
# Write two of this chapter's algorithms yourself and have them checked on
# real processes and the simulator, against the reference:
#
#     minidist exercise start tree_broadcast
#     minidist exercise check tree_broadcast
#
# (`tree_broadcast` is broadcast's `binomial` algorithm, the tree of the
# list above)
# and the same for `recursive_doubling_allreduce`. A wrong answer names the
# first wrong rank and element and the step where your messages first differ
# from the reference's; a deadlock names who waits for whom.
