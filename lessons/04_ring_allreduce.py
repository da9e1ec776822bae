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
# # Lesson 4: the ring all-reduce, step by step
#
# Lesson 3 showed that the ring's all_reduce time grows only a little as the
# world grows, where reduce + broadcast's grows with log n. This chapter looks inside it. We run a real ring all_reduce
# on four processes with a trace, and replay what moved, chunk by chunk:
#
# 1. run it and step through the trace, one frame per algorithm step;
# 2. watch the same replay as an animation;
# 3. measure its time on 2, 3 and 4 processes, then simulate up to 1,024
#    ranks (the quick form: 128), next to reduce + broadcast.
#
# The algorithm (`ring` in `minidist/distributed/collectives/all_reduce.py`):
# cut each rank's array into n chunks. **Reduce-scatter**, n - 1 steps: in
# each step every rank sends one chunk to its right neighbour, which adds it
# to its own copy of that chunk. After n - 1 steps every rank holds one
# chunk summed over all ranks. **Allgather**, n - 1 steps: the finished
# chunks travel around the ring once more, copied this time. Every rank sends
# $2(n-1)$ messages of $N/n$ bytes, $2\frac{n-1}{n}N$ bytes in all: less than
# $2N$, whatever $n$ is. It receives as many, and adds $\frac{n-1}{n}N$ of
# them into its own array.

# %%
import os
import time
from pathlib import Path

import numpy as np
from rich.console import Console

import minidist
import minidist.distributed as dist
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
from minidist.lesson_timing import Load

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
import matplotlib.pyplot as plt  # noqa: E402

from viz.animate import animate, save_gif  # noqa: E402
from viz.replay import replays  # noqa: E402
from viz.terminal import render_frame  # noqa: E402

QUICK = quick()
OUT = output_dir()
if QUICK:
    print("quick form: section 3 times 5 calls of 1 MiB per algorithm (the full form: 10 "
          "calls of 8 MiB) and simulates up to 128 ranks (the full form: 1,024)")

# %% [markdown]
# ## 1. A real ring all_reduce, traced
#
# Each rank starts with small integers (rank r holds 10 r, 10 r + 1, ...) so
# that the sums are easy to check by eye.

# %%
N_RANKS = 4


def ring_once():
    rank = dist.get_rank()
    x = np.arange(2 * N_RANKS, dtype=np.int64) + 10 * rank
    dist.all_reduce(x, algorithm="ring")
    return x


trace_path = OUT / "ring_allreduce.trace.jsonl"
results = minidist.launch(ring_once, world_size=N_RANKS, transport="shm", trace=str(trace_path))
print("every rank ends with", results[0], "- the sum of the four starting arrays, computed "
      "here with NumPy:", sum(np.arange(8) + 10 * r for r in range(4)))

ring = replays(trace_path)[0]
print(f"{ring.collective} {ring.algorithm}: {ring.steps} steps = 2 (n - 1), "
      f"and step 0 before any message")
# The trace's path as a terminal here can use it: relative below this folder, else whole.
shown = os.path.relpath(trace_path) if trace_path.resolve().is_relative_to(Path.cwd().resolve()) \
    else str(trace_path)
print(f"the trace: {shown}; in a terminal, `minidist viz {shown}` replays it, moving with the keys")

# %% [markdown]
# Each frame shows the ranks on their ring, each rank's array as its four
# chunks, and the messages of the step. A cell's symbol says whose data it
# holds so far ("2": rank 2's alone, "Σ2": a partial sum of two ranks' data,
# "A": all of them; the key under each frame names the symbols that frame
# draws); the arrows give the bytes sent and whether the receiver adds them
# (`combine`) or just copies them (`copy`). In a terminal, `minidist viz`
# with the trace's path, printed above, lets you move with the keys.
#
# The `cost` line is lesson 2's formula for the ring: $\alpha$ per message,
# $\beta$ per byte sent, $\gamma$ per byte added. One more symbol appears,
# $\beta_x$: the price per byte of a step in which every rank sends *and*
# receives at once, which is every step of the ring. A network card does both
# at full speed, so there $\beta_x = \beta$; on one machine each rank's own CPU
# copies the bytes out and in, so a step costs about twice a one-way message:
# $\beta_x \approx 2\beta$. (Lesson 2's ping-pong measures $\beta$, one message
# at a time; `benchmarks/bench_p2p.py` measures $\beta_x$ as well. The
# simulator below has full-duplex links: $\beta_x = \beta$.)

# %%
console = Console(width=80, color_system=None)
for index in range(len(ring.frames)):
    console.print(render_frame(ring, index, color=False, width=80))

# %% [markdown]
# Two numberings meet in the frames: a frame's title counts the steps of
# the whole call from 1 ("step 1 of 6"), a message's label counts the steps
# of its phase from 0 ("reduce-scatter step 0" is frame step 1, "allgather
# step 0" is frame step n = 4). Here, as in the titles, step k is frame
# step k. Read the reduce-scatter frames diagonally: in step k each rank
# passes on the chunk it summed in step k - 1, so a partial sum grows by one
# rank per step. After step n - 1 (the last of the reduce-scatter) each rank
# holds exactly one complete chunk ("A"), and the allgather, steps n to
# 2(n - 1), copies those around.
#
# ## 2. The same replay, animated
#
# In a notebook the animation plays inline (a JavaScript player with a
# slider); the GIF is saved next to the lesson's other outputs.

# %%
gif = save_gif(ring, OUT / "ring_allreduce.gif", fps=1)
if in_notebook():  # the player, inline; a script has the GIF
    display(animate(ring))  # noqa: F821 - IPython's, in a notebook
    print("saved", gif)
else:
    show_file(gif, "the ring all_reduce, one frame per step")

# %% [markdown]
# ## 3. Does the time level off? Measured, then simulated
#
# On this machine we can run 2, 3 and 4 processes. The ring's formula,
# $2(n-1)\alpha + 2\frac{n-1}{n}N\beta + \frac{n-1}{n}N\gamma$, levels off:
# its bytes grow from $N\beta$ at n = 2 to $1.5 N\beta$ at n = 4 and never
# pass $2N\beta$; its additions grow from $N\gamma / 2$ to $0.75 N\gamma$ and
# never pass $N\gamma$; only its latencies, $2(n-1)\alpha$, keep growing.
# Reduce + broadcast sends the whole array $\lceil\log_2 n\rceil$ times up,
# adding it each time, and as many times down:
# $2\lceil\log_2 n\rceil(\alpha + N\beta) + \lceil\log_2 n\rceil N\gamma$.
#
# An honest caveat: with more ranks than CPU cores the processes take turns
# on the CPU, and a rank that is not running cannot answer its neighbour, so
# measured times grow with n for a reason the model leaves out.

#
# Each call is timed after a barrier and lasts as long as its slowest rank;
# the two algorithms take turns, and the fastest of the calls is kept (the
# one least disturbed by other programs).

# %%
SIZE = (1 << 20) if QUICK else (8 << 20)
REPEATS = 5 if QUICK else 10
ALGORITHMS = ("ring", "reduce_broadcast")


def time_algorithms(size, repeats):
    """{algorithm: [seconds of each call]} on this rank, the algorithms taking turns."""
    x = np.zeros(size // 4, np.float32)
    calls = {algorithm: [] for algorithm in ALGORITHMS}
    for algorithm in ALGORITHMS:
        dist.all_reduce(x, algorithm=algorithm)  # warm up
    for _ in range(repeats):
        for algorithm in ALGORITHMS:
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(x, algorithm=algorithm)
            calls[algorithm].append(time.perf_counter() - start)
    return calls


worlds = [2, 3, 4]
measured = {}
load = Load.start()
for n in worlds:
    per_rank = minidist.launch(time_algorithms, world_size=n, transport="shm",
                               args=(SIZE, REPEATS))
    measured[n] = {algorithm: min(max(ranks) for ranks in zip(*(t[algorithm] for t in per_rank)))
                   for algorithm in ALGORITHMS}
    print(f"n={n}: ring {measured[n]['ring'] * 1e3:.2f} ms, "
          f"reduce+broadcast {measured[n]['reduce_broadcast'] * 1e3:.2f} ms "
          f"({SIZE >> 20} MiB, slowest rank, fastest of {REPEATS} calls)")
load = load.finish()
print(f"this machine has {load.cores} CPU cores: above that, ranks share them")
if load.busy:
    print(load.note("which algorithm wins here may change from run to run; the simulation "
                    "below shows the trend the formulas give"))

glue("measured", [[n, measured[n]["ring"], measured[n]["reduce_broadcast"]] for n in worlds])
glue("ring_first", measured[worlds[0]]["ring"] * 1e3, "{:.2f} ms")
glue("ring_final", measured[worlds[-1]]["ring"] * 1e3, "{:.2f} ms")
ring_grew = all(measured[large]["ring"] > measured[small]["ring"]
                for small, large in zip(worlds, worlds[1:]))
glue("ring_trend", "it grew with every process added, as the caveat above expects"
     if ring_grew else "it did not grow with every process added (the machine's load "
                       "moved more than the ranks did)")
won = [n for n in worlds if measured[n]["ring"] < measured[n]["reduce_broadcast"]]
lost = [n for n in worlds if n not in won]


def processes(ns):
    return " and ".join(str(n) for n in ns) + " processes"


# What each algorithm's formula sends and how many steps it takes, on these worlds:
# the busiest rank's bytes (in N) and the messages in a row (each paying alpha).
formula = {n: {"ring": (2 * (n - 1) / n, 2 * (n - 1)),
               "reduce_broadcast": (2 * int(np.ceil(np.log2(n))), 2 * int(np.ceil(np.log2(n))))}
           for n in worlds}
glue("formula_counts", [[n, *formula[n]["ring"], *formula[n]["reduce_broadcast"]] for n in worlds])
ratio_texts = [f"{formula[n]['reduce_broadcast'][0] / formula[n]['ring'][0]:.1f}" for n in worlds]
glue("bytes_ratios", ", ".join(ratio_texts[:-1]) + " and " + ratio_texts[-1] + " times")
glue("steps_text", "; ".join(
    f"n = {n}: {formula[n]['reduce_broadcast'][1]} steps against the ring's {formula[n]['ring'][1]}"
    for n in worlds))
fewer = [n for n in worlds if formula[n]["reduce_broadcast"][1] < formula[n]["ring"][1]]
glue("fewer_steps", "fewer steps only at " + processes(fewer).replace(" processes", " ranks")
     if fewer else "never fewer steps")
glue("ring_wins", "the ring was faster than reduce + broadcast on every world here"
     if not lost else "reduce + broadcast was as fast or faster on every world here"
     if not won else f"the ring was faster on {processes(won)}, reduce + broadcast as fast "
                     f"or faster on {processes(lost)}")

# %% jupyter={"source_hidden": true}
say(r"""
Look at the numbers before trusting the formula. On 2, 3 and 4 ranks the
formulas have reduce + broadcast send {glue}`bytes_ratios` the ring's bytes
($2\lceil\log_2 n\rceil N$ against $2\frac{n-1}{n}N$), but the ring pays
$\alpha$ in more steps as $n$ grows ({glue}`steps_text`: {glue}`fewer_steps`),
and each ring step here pays for processes being scheduled onto the cores,
several times per call. On an idle machine, at a MiB and more, the bytes
should decide; whether the ring wins on this machine is a measurement, not a
given.
""")

# %% jupyter={"source_hidden": true}
say(r"""
On this run the ring took {glue}`ring_first` on 2 processes and
{glue}`ring_final` on 4: {glue}`ring_trend`; {glue}`ring_wins`.
""")

# %% [markdown]
# What a few cores cannot show is the trend at scale: for that, the
# simulator, the same algorithm code on up to 1,024 ranks in one process, on
# a virtual clock, as in lesson 3: 5 us per message ($\alpha$), 10 GB/s
# links ($\beta$ = 1 / 10 GB/s, full duplex), ranks that add at 10 GB/s
# ($\gamma$ = 1 / 10 GB/s), a 100 MB array.

# %%
NBYTES = 100_000_000
ALPHA, BETA, GAMMA = 5e-6, 1e-10, 1e-10   # 5 us, 10 GB/s links, adding at 10 GB/s
sim_worlds = [2, 4, 8, 16, 32, 64, 128] + ([] if QUICK else [256, 512, 1024])
results = {algorithm: [simulate("all_reduce", algorithm, world_size=n, nbytes=NBYTES,
                                alpha=ALPHA, beta=BETA, gamma=GAMMA)
                       for n in sim_worlds]
           for algorithm in ("ring", "reduce_broadcast")}
simulated = {algorithm: [result.time for result in runs] for algorithm, runs in results.items()}
for algorithm, times in simulated.items():
    print(f"{algorithm:>17}: " + ", ".join(f"n={n}: {t * 1e3:.1f} ms"
                                          for n, t in zip(sim_worlds, times)))

figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for algorithm, marker in (("ring", "o"), ("reduce_broadcast", "s")):
    left.plot(worlds, [measured[n][algorithm] * 1e3 for n in worlds], marker=marker,
              label=algorithm)
    right.plot(sim_worlds, np.array(simulated[algorithm]) * 1e3, marker=marker, label=algorithm)
left.set_title(f"measured on shm, {SIZE >> 20} MiB")
left.set_xlabel("processes")
left.set_ylabel("all_reduce (ms)")
left.set_xticks(worlds)
right.set_title("simulated, 100 MB, 5 us, 10 GB/s")
right.set_xscale("log", base=2)
right.set_xlabel("ranks (simulated)")
right.set_ylabel("all_reduce (ms)")
for axis in (left, right):
    axis.grid(alpha=0.3)
    axis.legend()
figure.tight_layout()
show_figure(figure, "ring_flat.png")


def ring_terms(n):
    """The ring's formula, term by term: latencies, bytes, additions (seconds)."""
    return (2 * (n - 1) * ALPHA, 2 * (n - 1) / n * NBYTES * BETA, (n - 1) / n * NBYTES * GAMMA)


last = sim_worlds[-1]
ring_sim = dict(zip(sim_worlds, simulated["ring"]))
(alpha_8, beta_8, gamma_8), (alpha_last, beta_last, gamma_last) = ring_terms(8), ring_terms(last)
glue("ring_sim_8", ring_sim[8] * 1e3, "{:.1f} ms")
glue("ring_alpha_8", alpha_8 * 1e3, "{:.2f} ms")
glue("ring_beta_8", beta_8 * 1e3, "{:.1f} ms")
glue("ring_gamma_8", gamma_8 * 1e3, "{:.1f} ms")
glue("ring_model_8", sum(ring_terms(8)) * 1e3, "{:.1f} ms")
glue("ring_sim_last", ring_sim[last] * 1e3, "{:.1f} ms")
glue("ring_alpha_last", alpha_last * 1e3, "{:.2f} ms")
glue("ring_beta_last", beta_last * 1e3, "{:.1f} ms")
glue("ring_gamma_last", gamma_last * 1e3, "{:.1f} ms")
glue("ring_model_last", sum(ring_terms(last)) * 1e3, "{:.1f} ms")
glue("gamma_share_8", gamma_8 / ring_sim[8], ".0%")
glue("gamma_share_last", gamma_last / ring_sim[last], ".0%")
glue("alpha_share_last", alpha_last / ring_sim[last], ".0%")
glue("last_n", last, "{:,}")
glue("two_n_beta", 2 * NBYTES * BETA * 1e3, "{:.0f} ms")
gap = max(abs(result.time - result.predicted) / result.predicted
          for runs in results.values() for result in runs)
glue("sim_model_gap", gap, ".1e")
glue("sim_verdict", "the simulator charges exactly the formula" if gap < 1e-9
     else f"the simulator and the formula differ by up to {gap:.1%}")
steps = np.diff(simulated["reduce_broadcast"])   # one per doubling of the world
low, high = (f"{step * 1e3:.1f} ms" for step in (steps.min(), steps.max()))
glue("rb_step", low if low == high else f"{low} to {high}")
glue("rb_step_model", (2 * (ALPHA + NBYTES * BETA) + NBYTES * GAMMA) * 1e3, "{:.1f} ms")
glue("rb_last", simulated["reduce_broadcast"][-1] * 1e3, "{:.0f} ms")

# %% jupyter={"source_hidden": true}
say(r"""
In the picture above (right), the simulated ring took {glue}`ring_sim_8` at 8
ranks and {glue}`ring_sim_last` at {glue}`last_n`. Its formula,
$2(n-1)\alpha + 2\frac{n-1}{n}N\beta + \frac{n-1}{n}N\gamma$, gives
{glue}`ring_alpha_8` + {glue}`ring_beta_8` + {glue}`ring_gamma_8` =
{glue}`ring_model_8` at 8 ranks and {glue}`ring_alpha_last` +
{glue}`ring_beta_last` + {glue}`ring_gamma_last` = {glue}`ring_model_last` at
{glue}`last_n`: {glue}`sim_verdict`. So the ring is not $2N\beta$ =
{glue}`two_n_beta`: its additions, $\frac{n-1}{n}N\gamma$ (each rank adds
almost a whole array), are {glue}`gamma_share_8` of its time at 8 ranks and
{glue}`gamma_share_last` at {glue}`last_n`, and its latencies,
{glue}`alpha_share_last` at {glue}`last_n`, grow with $n$. What stays nearly
flat is the bytes and the additions: below $2N\beta + N\gamma$, whatever the
world. Reduce + broadcast climbs by {glue}`rb_step` every time
the world doubles, $2(\alpha + N\beta) + N\gamma$ = {glue}`rb_step_model`,
to {glue}`rb_last` at {glue}`last_n` ranks.
""")

# %% [markdown]
# That is why data-parallel training uses the ring all-reduce for big
# gradients (NCCL, the library on NVIDIA GPUs, also has trees: the double
# binary tree of lesson 3). Its weakness is the $2(n-1)\alpha$ term: on
# small arrays and many ranks the latency of $2(n-1)$ steps dominates, which
# is where recursive doubling and trees win (try
# `minidist simulate all_reduce -n 1024 --size 4KB`).
#
# Try: `minidist demo ring-allreduce -n 4` steps through a fresh run in the
# terminal; `minidist demo all_reduce --algorithm ring -n 64 --simulate`
# shows the summary view of a bigger ring.

# %% [markdown]
# ## Your turn
#
# Write the ring yourself: `minidist exercise start ring_allreduce`, fill
# in the two loops, then `minidist exercise check ring_allreduce`. When it
# is wrong, the check writes `ring_allreduce.replay.gif` (and `.html`): your
# run beside the reference's, step by step, with the first step where your
# messages differ marked. When it is right but wasteful, it says how many
# times the ring's bytes you send.
