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
# # Lesson 2: messages, and what they cost
#
# Every distributed algorithm in this course, from the ring all-reduce to
# pipeline parallelism, is made of one thing: **a message** from one process
# to another. If we know what one message costs, we can predict what a whole
# algorithm costs before running it, and choose between algorithms on paper.
#
# The model the whole course uses is the simplest one that works:
#
# $$ t(N) = \alpha + N\beta $$
#
# In words: **time = latency + size / bandwidth.** Every message pays a fixed
# price $\alpha$ (the latency: waking the receiver, handing over a header,
# checking what arrived), then a price per byte $\beta$ (one over the
# bandwidth: how fast the bytes themselves move), $N$ times for a message of
# $N$ bytes. Small messages are ruled by
# $\alpha$, large ones by $\beta$; the size where both parts are equal,
# $n_{1/2} = \alpha / \beta$, is where one turns into the other.
#
# In this chapter we
#
# 1. send an array from one worker process to another;
# 2. time messages of many sizes (a *ping-pong*) on two transports;
# 3. fit $\alpha$ and $\beta$ to the measurements;
# 4. use them to predict a ring all-reduce, and check the prediction.
#
# Run it as a script (`python lessons/02_messages_and_cost.py`) or open it as
# a notebook (`jupytext --to notebook lessons/02_messages_and_cost.py`).

# %%
import dataclasses
import os
import time

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
from minidist.model_gap import RunFacts, explain

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()
import matplotlib.pyplot as plt  # noqa: E402

QUICK = quick()
OUT = output_dir()
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"{CORES} cores; quick mode: {QUICK}")
if QUICK:
    print("quick form: the ping-pong times 6 sizes from 8 bytes to 4 MiB (the full form 11, "
          "up to 64 MiB) with fewer round trips, and the ring all-reduce runs on 2 ranks at "
          "256 KiB to 4 MiB (the full form: 2 and 4 ranks, 1 to 64 MiB)")

# %% [markdown]
# ## 1. Two processes, one message
#
# `minidist.launch(worker, world_size=2)` starts two worker processes, runs
# `worker()` in each, and returns what each returned, by rank. Inside,
# `dist.get_rank()` says which process we are. Rank 0 fills an array and
# sends it; rank 1 receives it *into an array it prepared* (same shape and
# dtype): no copy is made that we did not ask for.
#
# The `transport` says how the bytes travel: `"pipe"` through operating-system
# pipes (every byte is copied into the kernel and out again), `"shm"` through
# shared memory (the sender copies into a buffer both processes can see, the
# receiver copies out).

# %%
def hello():
    rank = dist.get_rank()
    data = np.zeros(5, np.float32)
    if rank == 0:
        data[:] = [1, 2, 3, 4, 5]
        dist.send(data, dst=1)
        return "sent"
    dist.recv(data, src=0)
    return data


print(minidist.launch(hello, world_size=2, transport="shm"))

# %% [markdown]
# ## 2. Ping-pong: timing a message
#
# A single message is too short to time on its own, and the two processes have
# no common "start" moment. The classic answer is a **ping-pong**: rank 0
# sends $N$ bytes, rank 1 sends them back, many times over. Rank 0's clock
# measures whole round trips, so the time of one message is
# round trip / 2.
#
# Two habits of every careful benchmark are in the function `pingpong` in
# this section's code (the notebook shows it; in the script, see the
# lesson's file): a **warm-up**
# round trip that is not counted (the first touch of fresh memory is slow),
# and timing every round trip on its own and keeping the **best** (the
# machine is shared with other programs: a round trip during which either
# process waited for a core is slower, never faster, so the fastest one is
# the least disturbed). Rank 0 decides when it has enough, by count or by
# time, and tells rank 1 in the first byte of its message: on a busy
# machine a round trip can take milliseconds instead of microseconds, and a
# fixed count of a thousand round trips for every size would take minutes.

# %%
KIB, MIB = 1 << 10, 1 << 20
if QUICK:
    SIZES = [8, 1 * KIB, 16 * KIB, 256 * KIB, 1 * MIB, 4 * MIB]
    TRIPS, SECONDS = 200, 0.1      # per size: at most this many round trips, or this long
else:
    SIZES = [8, 256, 1 * KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB,
             16 * MIB, 64 * MIB]
    TRIPS, SECONDS = 1000, 0.5


def pingpong(sizes, trips, seconds):
    """One-way time of each size: the fastest of up to ``trips`` round trips
    (fewer if they take longer than ``seconds``), each timed on its own."""
    rank = dist.get_rank()
    peer = 1 - rank
    best = {}
    for size in sizes:
        message = np.ones(size, np.uint8)
        dist.barrier()
        began = time.perf_counter()
        for trip in range(trips + 1):  # trip 0 is the warm-up
            if rank == 0:
                # The first byte says "another round trip after this one" (1) or "stop" (0).
                last = trip == trips or (trip >= 3 and time.perf_counter() - began > seconds)
                message[0] = 0 if last else 1
                start = time.perf_counter()
                dist.send(message, dst=peer)
                dist.recv(message, src=peer)
                if trip > 0:
                    one_way = (time.perf_counter() - start) / 2
                    best[size] = min(best.get(size, one_way), one_way)
            else:
                dist.recv(message, src=peer)
                last = message[0] == 0
                dist.send(message, dst=peer)
            if last:
                break
    return best


load = Load.start()
measured = {}
for transport in ("shm", "pipe"):
    measured[transport] = minidist.launch(pingpong, world_size=2, transport=transport,
                                          args=(SIZES, TRIPS, SECONDS))[0]
load = load.finish()

print(f"{'bytes':>10} | {'shm':>24} | {'pipe':>24}")
for size in SIZES:
    cells = []
    for transport in ("shm", "pipe"):
        seconds = measured[transport][size]
        cells.append(f"{seconds * 1e6:9.1f} us {size / seconds / 1e9:6.2f} GB/s")
    print(f"{size:>10,} | {cells[0]:>24} | {cells[1]:>24}")
if load.busy:
    print(load.note("even the fastest of many round trips may have waited"))

shm_times = measured["shm"]
glue("shm_pingpong", [[size, seconds] for size, seconds in sorted(shm_times.items())])
glue("pipe_pingpong", [[size, seconds] for size, seconds in sorted(measured["pipe"].items())])
# The small sizes, where an undisturbed run shows a floor: up to 4 KiB, whose
# bytes cost well under a microsecond at a few GB/s.
FLOOR_SIZES = [size for size in SIZES if size <= 4 * KIB]
glue("floor_sizes", FLOOR_SIZES)
small_times = [shm_times[size] for size in FLOOR_SIZES]
listing = ", ".join(f"{shm_times[size] * 1e6:.1f} us at {size:,} bytes" for size in FLOOR_SIZES)
idle_alpha = costmodel.PARAMS["shm"].alpha
if max(small_times) < 1.5 * min(small_times):
    high = (f"; at {min(small_times) / idle_alpha:.0f} times the {idle_alpha * 1e6:.1f} us the "
            "course machine fits idle, it is mostly the wait for the receiver's process to be "
            f"given a core ({load.describe()})" if min(small_times) > 10 * idle_alpha else "")
    glue("floor_verdict", f"hardly changes with the size (on shm, {listing}: that floor is "
                          f"the latency{high})")
elif (all(b >= a for a, b in zip(small_times, small_times[1:]))
      and max(small_times) < 10 * min(small_times)):
    glue("floor_verdict", f"already grows with the size on this run (on shm, {listing}), "
                          "where an undisturbed run shows a floor, the latency: a 4 KiB "
                          "message costs little more than an 8-byte one")
else:
    # Up and down, or jumps far bigger than a few KiB of bytes can cost.
    glue("floor_verdict", f"shows no floor on this run: on shm, {listing}, jumps no number "
                          "of bytes this small explains. These messages waited for a core, "
                          f"not for their bytes ({load.describe()}); an undisturbed run shows "
                          "a floor, the latency: a 4 KiB message costs little more than an "
                          "8-byte one")
# The two largest sizes: does the time grow in proportion to the size?
before, largest = SIZES[-2], SIZES[-1]
growth = shm_times[largest] / shm_times[before]
glue("size_step", largest / before, "{:.0f} times")
glue("largest_size", largest / MIB, "{:.0f} MiB")
glue("time_step", growth, "{:.1f} times")
glue("proportion_verdict", "about in proportion to the size"
     if 0.7 < growth / (largest / before) < 1.4 else "not in proportion to the size")
bandwidth = {size: size / seconds for size, seconds in shm_times.items()}
peak = max(bandwidth, key=bandwidth.get)
glue("peak_bandwidth", bandwidth[peak] / 1e9, "{:.2f} GB/s")
glue("peak_size", peak / KIB, "{:,.0f} KiB")
last = glue("last_bandwidth", bandwidth[largest] / 1e9, "{:.2f} GB/s")
moved = f"; on this busy machine ({load.describe()}) the load moves it too" if load.busy else ""
# "Levels off" must hold at every size after the peak, not only at the last.
after = [size for size in SIZES if size > peak]
lowest = min(after, key=bandwidth.get) if after else None
if peak == largest:
    glue("bandwidth_verdict", "at the largest size: it has not levelled off yet")
elif all(bandwidth[size] >= 0.75 * bandwidth[peak] for size in after):
    glue("bandwidth_verdict", "and levels off near it: at every larger size it stays within "
                              f"a quarter of it (at the largest, {last})")
else:
    where = (f"at the largest size it is {last}" if lowest == largest else
             f"at {lowest / KIB:,.0f} KiB it is {bandwidth[lowest] / 1e9:.2f} GB/s, at the "
             f"largest size {last}")
    glue("bandwidth_verdict", "and falls again after it, as the messages outgrow the processor's "
                              f"caches (more on that below){moved}: {where}")

# %% jupyter={"source_hidden": true}
say(r"""
Read the table from the top: for small messages the time {glue}`floor_verdict`;
and the bandwidth column is tiny. For
large messages the time grows with the size: the largest message,
{glue}`largest_size`, is {glue}`size_step` the one before it and took
{glue}`time_step` as long on shm, {glue}`proportion_verdict`. The bandwidth
climbs to {glue}`peak_bandwidth` (at {glue}`peak_size`) {glue}`bandwidth_verdict`.
""")

# %% [markdown]
# ## 3. Fitting alpha and beta
#
# `costmodel.fit(sizes, seconds)` finds the $\alpha$ and $\beta$ for which
# $\alpha + N\beta$ is closest to the measurements (least squares, weighted so
# that the small messages count as much as the large ones, or $\alpha$ would be
# lost in the noise of the big ones).

# %%
fitted = {}
for transport in ("shm", "pipe"):
    sizes = np.array(sorted(measured[transport]))
    seconds = np.array([measured[transport][size] for size in sizes])
    fitted[transport] = costmodel.fit(sizes, seconds)
    params = fitted[transport]
    print(f"{transport:>4}: alpha = {params.alpha * 1e6:6.2f} us, "
          f"bandwidth = 1/beta = {params.bandwidth / 1e9:5.2f} GB/s, "
          f"n_1/2 = alpha/beta = {params.alpha / params.beta / KIB:7.1f} KiB")
    assert params.beta > 0 and params.alpha >= 0
if load.busy:
    idle = costmodel.PARAMS["shm"]
    side = "above" if fitted["shm"].alpha > idle.alpha else "below"
    print(load.note(f"the fit's alpha measures the scheduler too, and can land on either side "
                    f"of the latency: this run's shm alpha, {fitted['shm'].alpha * 1e6:.1f} us, "
                    f"is {side} the {idle.alpha * 1e6:.1f} us (and "
                    f"{idle.bandwidth / 1e9:.1f} GB/s) the course machine fitted idle "
                    "(costmodel.PARAMS)"))

glue("fits", [[name, fit.alpha, fit.beta] for name, fit in fitted.items()])
glue("shm_alpha", fitted["shm"].alpha * 1e6, "{:.1f} us")
glue("shm_bandwidth", fitted["shm"].bandwidth / 1e9, "{:.2f} GB/s")
glue("pipe_alpha", fitted["pipe"].alpha * 1e6, "{:.1f} us")
glue("pipe_bandwidth", fitted["pipe"].bandwidth / 1e9, "{:.2f} GB/s")
pipe_dearer = (fitted["pipe"].alpha > fitted["shm"].alpha, fitted["pipe"].beta > fitted["shm"].beta)
why_pipe = "each of its messages crosses into the kernel and back, and its bytes are copied twice"
# The fit is two numbers; the table has a row per size: where was the pipe faster?
pipe_faster = [size for size in SIZES if measured["pipe"][size] < shm_times[size]]
glue("pipe_faster", pipe_faster)
faster_text = ", ".join(f"{size:,} bytes ({measured['pipe'][size] * 1e6:.1f} against "
                        f"{shm_times[size] * 1e6:.1f} us)" for size in pipe_faster)
if all(pipe_dearer) and not pipe_faster:
    glue("pipe_verdict", f"The pipe pays more on both counts: {why_pipe}.")
elif all(pipe_dearer):
    glue("pipe_verdict", f"The fit gives the pipe more on both counts, as expected ({why_pipe}), "
                         f"but the table has it faster at {faster_text}: on a busy machine "
                         f"({load.describe()}) one size's best round trip can still include a "
                         "wait for a core, on either transport.")
else:
    paid = {(True, False): "more latency, but not more per byte",
            (False, True): "more per byte, but not more latency",
            (False, False): "no more than shared memory on either count"}[pipe_dearer]
    table = f" The table has it faster at {faster_text}." if pipe_faster else ""
    glue("pipe_verdict", f"On this run the pipe paid {paid}, against the expectation that it "
                         f"pays more on both counts ({why_pipe}): a fit on a busy machine "
                         f"measures its waits for a core too ({load.describe()}).{table}")

# %% jupyter={"source_hidden": true}
say(r"""
Shared memory: $\alpha$ = {glue}`shm_alpha` and {glue}`shm_bandwidth`; the pipe:
$\alpha$ = {glue}`pipe_alpha` and {glue}`pipe_bandwidth`. {glue}`pipe_verdict`
""")

# %% [markdown]
# On a log-log plot the model is a flat line (latency) that bends into a line
# of slope one (bandwidth) around $n_{1/2}$. The dots in the picture below are
# the measurements.

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
smooth = np.logspace(np.log10(min(SIZES)), np.log10(max(SIZES)), 100)
for transport, marker, line, color in (("shm", "o", "-", "C0"), ("pipe", "s", "--", "C1")):
    sizes = np.array(sorted(measured[transport]))
    ax.plot(sizes, [measured[transport][s] * 1e6 for s in sizes], marker, color=color,
            label=f"{transport} measured")
    params = fitted[transport]
    ax.plot(smooth, (params.alpha + smooth * params.beta) * 1e6, line, color=color,
            label=f"{transport} fit: {params.alpha * 1e6:.1f} us + N / {params.bandwidth / 1e9:.1f} GB/s")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("message size N (bytes)")
ax.set_ylabel("one-way time (microseconds)")
ax.set_title("t(N) = alpha + N beta: measured ping-pong and the fit")
ax.legend(fontsize=8)
fig.tight_layout()
show_figure(fig, "02_pingpong_fit.png")

# %% [markdown]
# Real dots wander off the line, and for reasons worth knowing. Messages that
# fit in a core's cache move faster than ones that spill to memory. The shm
# transport copies a message through a *shared-memory buffer*: for every
# pair of ranks, four slots of up to 1 MiB in memory both processes see,
# which the sender fills and the receiver empties (`transport/shm.py`).
# Messages bigger than that buffer change protocol: from *eager* (the sender
# copies its message out at once, whether or not the receiver is ready, and
# the receiver copies it in: two copies) to *rendezvous* (the sender waits
# for the receiver, which then reads straight out of the sender's memory:
# one copy), as MPI libraries do. And the CPU itself
# has moods: on AMD Zen processors the copy instruction glibc uses runs ten
# times slower when the destination starts a few bytes after the source,
# modulo 4 KiB. A NumPy array starts 16 bytes into a page, so minidist's
# receives hit that case on every piece until
# `minidist/distributed/transport/memcopy.py` stepped around it
# (`benchmarks/results/p2p.md` gives the figures of the course's 2-core EPYC
# machine: a 1 MiB ping-pong went from 440-690 us to 137-172 us). Two
# numbers describe a transport well, never perfectly. Fit them on the machine
# as it is today, because a shared machine's speed drifts from hour to hour.

# %% [markdown]
# ## 4. From one message to an algorithm: predicting the ring all-reduce
#
# The ring all-reduce (lesson 4 takes it apart) cuts the array of $N$ bytes
# into $n$ chunks, one per rank, and runs $2(n-1)$ steps; in each step every
# rank sends one chunk of $N/n$ bytes to its right neighbour and receives one
# from its left. In the first $n-1$ steps the received chunk is also *added*
# to the rank's own, which costs $\gamma$ seconds per byte. Adding it up:
#
# $$ t_\text{ring} = 2(n-1)\,\alpha + 2\,\frac{n-1}{n}\,N\beta + \frac{n-1}{n}\,N\gamma $$
#
# The model has one more number, $\gamma$: how fast one core adds arrays. We
# measure it the same way, on a large array.

# %%
size_for_gamma = 4 * MIB if QUICK else 64 * MIB
a = np.ones(size_for_gamma // 4, np.float32)
b = np.ones_like(a)
gamma = timed(lambda a=a, b=b: np.add(a, b, out=a), repeats=5).best[""] / a.nbytes  # the fastest of 5
print(f"gamma: adding float32 arrays runs at {1 / gamma / 1e9:.1f} GB/s")
del a, b
shm = costmodel.Params(alpha=fitted["shm"].alpha, beta=fitted["shm"].beta, gamma=gamma)

# %% [markdown]
# Now the prediction, next to a measurement of minidist's own
# `dist.all_reduce(x, algorithm="ring")` on the shared-memory transport. The
# measurement is timed the way real benchmarks (nccl-tests) do: a warm-up
# call, a barrier so all ranks start together, and the time of the
# *slowest* rank (the collective is done when the last rank is). We time
# each call on its own, after its own barrier, and keep the fastest call:
# as in the ping-pong, the least disturbed.

# %%
if QUICK:
    RING_SIZES, RING_WORLDS, CALLS = [256 * KIB, 1 * MIB, 4 * MIB], [2], 10
else:
    RING_SIZES, RING_WORLDS, CALLS = [1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB], [2, 4], 20


def time_ring(sizes, calls):
    """{size: [seconds of each call]} on this rank, every call after a barrier."""
    times = {}
    for size in sizes:
        x = np.zeros(size // 4, np.float32)
        dist.all_reduce(x, algorithm="ring")  # warm-up
        times[size] = []
        for _ in range(calls):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(x, algorithm="ring")
            times[size].append(time.perf_counter() - start)
    return times


print(f"{'ranks':>5} {'size':>9} | {'predicted':>10} | {'measured':>10} | measured / predicted: "
      "why, on this run")
comparison = []
for world_size in RING_WORLDS:
    load = Load.start()
    per_rank = minidist.launch(time_ring, world_size=world_size, transport="shm",
                               args=(RING_SIZES, CALLS))
    load = load.finish()
    for size in RING_SIZES:
        # Each call's time is its slowest rank's; the fastest call is kept.
        measured_seconds = min(max(calls) for calls in zip(*(rank[size] for rank in per_rank)))
        predicted = costmodel.predict("all_reduce", "ring", world_size, size, params=shm)
        comparison.append((world_size, size, predicted, measured_seconds))
        # Why the two differ, from this run's facts (the fit above is this machine's).
        why = explain(measured_seconds, predicted,
                      RunFacts(ranks=world_size, cores=CORES, transport="shm", params="fitted",
                               nbytes=size, load=max(load.before, load.after)))
        # explain() advises fewer ranks than cores; this table has those rows: cite them.
        fewer = [(world, seconds / model) for world, _, model, seconds in comparison
                 if world <= CORES]
        advice = f"; the model holds with -n {CORES}"
        if world_size > CORES and advice in why and fewer:
            close = all(1 / 1.25 <= ratio <= 1.25 for _, ratio in fewer)
            ratios_text = ", ".join(f"{ratio:.2g}x" for _, ratio in fewer)
            why = why.replace(advice, f"; with one rank per core the turns go away, "
                                      f"{'and' if close else 'but'} the {CORES}-rank rows "
                                      f"above were {ratios_text}")
        print(f"{world_size:>5} {size // KIB:>5} KiB | {predicted * 1e3:>7.2f} ms | "
              f"{measured_seconds * 1e3:>7.2f} ms | {why}")
    if load.busy:
        idle = dataclasses.replace(costmodel.PARAMS["shm"], gamma=gamma)
        model = ", ".join(f"{size // KIB} KiB "
                          f"{costmodel.predict('all_reduce', 'ring', world_size, size, idle) * 1e3:.2f} ms"
                          for size in RING_SIZES)
        print(load.note(f"the course machine's idle alpha and beta predict {model}"))

ratios = {world_size: [measured_seconds / predicted
                       for world, _, predicted, measured_seconds in comparison if world == world_size]
          for world_size in RING_WORLDS}
glue("ring_ratios", [[world, size, seconds / predicted]
                     for world, size, predicted, seconds in comparison])
spans = []
for world_size, values in ratios.items():
    low = glue(f"ratio_low_{world_size}", min(values), "{:.2g}x")
    high = glue(f"ratio_high_{world_size}", max(values), "{:.2g}x")
    spans.append(f"from {low} to {high} on {world_size} ranks")
glue("ratio_spans", " and ".join(spans))
# The rows far from 1 (more than twice or less than half the prediction).
far = [(world, size, seconds / predicted) for world, size, predicted, seconds in comparison
       if not 0.5 <= seconds / predicted <= 2]
glue("far_rows", [[world, size, ratio] for world, size, ratio in far])
glue("far_text", "Every row is within a factor of 2 of its prediction." if not far else
     "The rows " + ", ".join(f"{world} ranks at {size // KIB:,} KiB ({ratio:.2g}x)"
                             for world, size, ratio in far)
     + " are far from 1: there the run did not do what the formula says, for the reasons in "
       "their last column.")
if len(RING_WORLDS) > 1:
    first, last = RING_WORLDS[0], RING_WORLDS[-1]
    grew = np.median(ratios[last]) > np.median(ratios[first])
    glue("ratio_verdict", f": it {'grew' if grew else 'did not grow'} with the number of "
                          f"ranks, on {CORES} cores")
else:
    glue("ratio_verdict", f" (the full form adds 4 ranks, on this machine's {CORES} cores)")

# %% [markdown]
# How close is it? The model assumes that every link works at full speed at
# the same time. On one machine the "links" are copies through the same
# memory, so when all ranks copy at once they share its bandwidth, and a
# world with more ranks than cores also waits for the operating system to
# give each rank its turn. Measured / predicted near 1 says the algorithm
# does what its formula says; a ratio that grows with the number of ranks is
# the shared memory bus (or the shared cores) showing through.

# %% jupyter={"source_hidden": true}
say(r"""
On this run measured / predicted went {glue}`ratio_spans`{glue}`ratio_verdict`.
{glue}`far_text`
""")

# %% [markdown]
# The same three numbers, $\alpha$, $\beta$ and $\gamma$, put into each
# algorithm's formula, already tell us which all-reduce to pick (the `"auto"`
# algorithm asks exactly this). Lesson 3 takes these algorithms apart and
# lesson 4 the ring; the first line of each one's docstring says what it does:

# %%
for name, function in dist.ALGORITHMS["all_reduce"].items():
    summary = " ".join((function.__doc__ or "").split("Cost:")[0].split())
    print(f"{name:>18}: {summary.split('. ')[0].rstrip('.')}")
print()
for size in (4 * KIB, 64 * KIB, 1 * MIB, 64 * MIB):
    times = costmodel.predict_all("all_reduce", 8, size, params=shm)
    fastest = min(times, key=times.get)
    listing = ", ".join(f"{name} {seconds * 1e6:,.0f} us" for name, seconds in times.items())
    print(f"8 ranks, {size // KIB:>6} KiB: fastest {fastest:>18}   ({listing})")

# %% [markdown]
# ## What to take away
#
# * A message costs **latency + size / bandwidth**: $t = \alpha + N\beta$.
#   Two numbers, measured once with a ping-pong, describe a transport.
# * Small messages are latency-bound: sending fewer of them matters more than
#   sending fewer bytes. Large ones are bandwidth-bound: the opposite.
# * An algorithm's cost is the sum over its steps, so the same two numbers
#   (and $\gamma$, for the additions of a reduction) predict every collective;
#   that is how algorithms are compared on paper and how `algorithm="auto"`
#   chooses.
#
# **Try it:** run `minidist bench collectives --quick` to see every algorithm
# measured next to its prediction and next to MPICH; change the constant
# `RING_SIZES` in the code of section 4 and find the size below which
# recursive doubling beats the ring.
