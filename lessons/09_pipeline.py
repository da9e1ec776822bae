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
# # Lesson 9: pipeline parallel, the bubble and the memory it costs
#
# Data parallelism keeps a whole model on every worker. When the model does
# not fit, cut it instead: the first layers on process 0, the next ones on
# process 1, and so on. Each process is a *stage*; the activations flow
# forward from stage to stage and their gradients flow back. The price is
# idle time, and this chapter measures it:
#
# 1. the naive split (one batch through p stages) idles (p-1)/p of the time;
# 2. cutting the batch into m micro-batches shrinks that *bubble* to
#    (p-1)/(m+p-1), checked exactly on the simulator;
# 3. ... and measured on a real run of 2 processes;
# 4. GPipe (all forwards, then all backwards) and 1F1B (one forward, one
#    backward) have the same bubble, but GPipe holds the activations of all
#    m micro-batches and 1F1B at most p - i at stage i, read from the
#    runtime's memory ledger;
# 5. recomputation keeps only each stage's input and recomputes the rest
#    during backward: memory for compute, both measured;
# 6. interleaving (several model chunks per process) shrinks the bubble
#    again, for more messages;
# 7. pipeline x data parallel in two lines.
#
# The library code is `minidist/parallel/pipeline/`: `schedules.py`
# (schedules as data), `simulate.py` (the simulator, the bubble),
# `steps.py` (the runtime's loop, one short step per kind of action) and
# `executor.py` (`Pipeline`), with `held_activations.py` (what a stage keeps
# for its backward, recomputation) and `ledger.py` (the memory ledger); the
# drawings are `viz/pipeline_chart.py`.

# %%
import os
from fractions import Fraction

import numpy as np
from rich.console import Console

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.lesson import (
    glue,
    narrate,
    output_dir,
    quick,
    say,
    show_file,
    use_headless_matplotlib,
)
from minidist.lesson_timing import Load, machine_load
from minidist.model_gap import RunFacts, compare
from minidist.parallel.pipeline import (
    Pipeline,
    bubble_fraction,
    make_schedule,
    peak_live_microbatches,
    simulate_schedule,
)
from minidist.parallel.pipeline.schedules import UNIT_NS

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

from viz.pipeline_chart import (  # noqa: E402
    draw_planned_comparison,
    pipeline_chart,
    render_pipeline_frame,
    save_pipeline_gantt,
)

QUICK = quick()
OUT = output_dir()
console = Console(width=110, color_system=None, force_jupyter=False, highlight=False)


def show_last_frame(chart):
    """The terminal step-through's last frame: every time slot of the batch."""
    console.print(render_pipeline_frame(chart, chart.slots - 1, color=False, width=110))


def formula(p, m, v=1):
    return Fraction(p - 1, v * m + p - 1)


# %% [markdown]
# ## 1. The naive split idles
#
# A schedule is plain data: for each rank, the ordered list of what it does.
# Here is GPipe with p = 4 stages and a single micro-batch (the whole batch),
# then the same schedule run by the simulator: no processes, a virtual clock
# on which a forward costs 1 ms and a backward 2 ms on every stage, and
# messages are free.

# %%
naive = make_schedule("gpipe", 4, 1)
print(naive)
naive_events = simulate_schedule(naive, forward_time=1.0, backward_time=2.0)
naive_chart = pipeline_chart(naive_events, schedule="gpipe")
show_last_frame(naive_chart)
print(f"bubble: {bubble_fraction(naive_events, 4):.3f}, (p-1)/p = {3 / 4:.3f}")

# %% jupyter={"source_hidden": true}
glue("naive_slots", naive_chart.slots, "d")
glue("naive_ms", naive_chart.end / UNIT_NS, "{:g} ms")
say("""
How to read the chart. In the charts of this lesson **F**, **B** and **R** are the
forward, the backward and the recomputation (section 5) of one micro-batch on one
stage, F0 the forward of micro-batch 0 (not the batch size B of the other
lessons); `st` is the optimizer step, `..` idle, `--` a box still running. A
column is a *time slot*, not a fixed length of time: a new column begins when a
box starts after some box has ended, so a column lasts as long as the work that
fills it, and a 2 ms backward takes one column or two depending on whether
another box ends while it runs. Here {glue}`naive_slots` columns cover
{glue}`naive_ms`. The header counts the columns ("slot k of n": the k-th of n, and
the time at which it begins), and its "started:" line lists the boxes that
begin in that column: in the last one, stage 0's optimizer step (`st`).
""")

# %% [markdown]
# Stage 1 cannot start before stage 0 has
# finished its forward, and stage 0 cannot run its backward before the
# gradient has come back through every other stage: at any moment one stage
# works and p - 1 wait. The **bubble** is the idle share of the pipeline's
# time, measured from the events:
#
#     bubble = 1 - (sum of the F/B compute time of all ranks) / (ranks x makespan)
#
# over one batch (makespan: first forward's start to last backward's end).
# With one micro-batch it is (p - 1)/p: four processes do the work of one.
#
# ## 2. Micro-batches, and the bubble formula
#
# Cut the batch into m micro-batches: stage 0 forwards micro-batch 0, hands
# it over and goes on with micro-batch 1 while stage 1 works on 0. The
# pipeline fills for p - 1 slots, runs full, and drains for p - 1 slots.
# With equal stage costs the forward pass takes m + p - 1 slots of which
# each stage works m, and the same for the backward, so
#
#     bubble = (p - 1) / (m + p - 1)
#
# The gradients of the micro-batches add up (each micro-batch's loss is
# scaled by its share of the batch), so one optimizer step per batch gives
# exactly the update of one process on the whole batch; `tests/parallel/test_pipeline.py`
# checks that to 1e-10 for every schedule.
#
# The simulator against the formula. The simulator's clock counts whole
# nanoseconds (a forward of 1 ms is 1,000,000 of them), so every time it
# computes is an integer and its bubble an exact fraction, which the code
# below compares with the formula for equality, not within a tolerance:

# %%
P = 4
print(f"{'m':>3}  {'gpipe':>8}  {'1f1b':>8}  {'(p-1)/(m+p-1)':>14}")
for m in (1, 2, 4, 8, 16, 32):
    measured = {}
    for name in ("gpipe", "1f1b"):
        events = simulate_schedule(make_schedule(name, P, m))
        measured[name] = bubble_fraction(events, P)
        assert measured[name] == float(formula(P, m)), (name, m)
    print(f"{m:>3}  {measured['gpipe']:>8.4f}  {measured['1f1b']:>8.4f}  "
          f"{str(formula(P, m)):>8} = {float(formula(P, m)):.4f}")

planned = make_schedule("1f1b", 4, 8)
planned_chart = pipeline_chart(simulate_schedule(planned), schedule="1f1b")
show_last_frame(planned_chart)
show_file(save_pipeline_gantt(planned_chart, OUT / "pipeline_1f1b_planned.png"),
          "1F1B, p = 4, m = 8, planned on the simulator's clock")

# %% [markdown]
# Equal to the formula for every m, both schedules. (Above, the last frame
# of the terminal step-through of 1F1B with m = 8, and the same batch as a
# Gantt chart: one bar per forward and backward on the simulator's clock.) More micro-batches
# shrink the bubble, but each is smaller: on a real machine a small matrix
# product runs less efficiently, and every micro-batch costs two messages per
# link. GPipe's paper (Huang et al., "GPipe: Efficient Training of Giant
# Neural Networks using Pipeline Parallelism", 2019) takes m >= 4p as the
# rule of thumb.
#
# ## 3. The bubble of a real run
#
# Now real processes: `Pipeline` cuts a Sequential into balanced stages (by
# parameter count here), one per process, and each process executes its
# list of actions of the same schedule over point-to-point messages. Two
# stages of two 512 x 512 layers each, a batch of 1,024 random examples; for
# each m a few steps, and every step's trace kept. (The same launch also runs
# the recomputation cases of section 5.)
#
# Three numbers per m: the **formula** (equal costs, free messages); the
# **replay**, the simulator running the same schedule with the durations
# this run measured for each forward and backward but free messages (what
# the schedule alone allows with these real, slightly unequal costs); and
# the **measured** bubble of the real trace (the median over the steps after
# the first, which also pays for starting up).

# %%
WIDTH, BATCH = 512, 1024
MICROBATCHES = (1, 2, 4, 8) if QUICK else (1, 2, 4, 8, 16)
STEPS = 4 if QUICK else 8
RECOMPUTE_M = 4


def make_mlp(stages, width=WIDTH, dtype=np.float32, seed=0):
    """Two width x width layers per stage, ReLU between them."""
    nn.init.manual_seed(seed)
    layers = []
    for index in range(2 * stages):
        layers.append(nn.Linear(width, width))
        if index + 1 < 2 * stages:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(dtype)


def synthetic_batch(width=WIDTH, batch=BATCH, dtype=np.float32):
    rng = np.random.default_rng(0)  # the same batch on every rank
    return rng.normal(size=(batch, width)).astype(dtype), rng.integers(0, width, batch)


def run_cases(cases, steps, width=WIDTH, batch=BATCH):
    """Every (schedule, m, recompute) case on this launch's ranks; per case,
    each step's trace events of this rank."""
    recorder = trace.current()
    x, y = synthetic_batch(width, batch)
    kept = {}
    for name, m, recompute in cases:
        pipe = Pipeline(make_mlp(dist.get_world_size(), width), name, m, recompute=recompute)
        optimizer = optim.SGD(pipe.parameters(), lr=1e-3)
        per_step = []
        for _ in range(steps):
            first = len(recorder.events)
            pipe.step(x, y, nn.CrossEntropyLoss(), optimizer)
            per_step.append([dict(zip(trace.FIELDS, e)) for e in recorder.events[first:]])
        kept[(name, m, recompute)] = per_step
    return kept


def step_events(results, case, step):
    """One step's events of every rank."""
    return [event for per_rank in results for event in per_rank[case][step]]


def durations(events):
    """(letter, stage, micro-batch) -> duration in the simulator's units."""
    found = {}
    for event in events:
        info = trace.label_info(event["label"]) if event["kind"] == "compute" else {}
        if info.get("pipeline") in ("F", "B", "R"):
            found[(info["pipeline"], info["stage"], info["mb"])] = \
                (event["end"] - event["start"]) / UNIT_NS
    return found


def replayed_bubble(schedule, events):
    measured = durations(events)
    replay = simulate_schedule(schedule, lambda s, mb: measured[("F", s, mb)],
                               lambda s, mb: measured[("B", s, mb)])
    return bubble_fraction(replay, schedule.stages)


cases_p2 = [("1f1b", m, False) for m in MICROBATCHES]
cases_p2 += [("gpipe", RECOMPUTE_M, False), ("gpipe", RECOMPUTE_M, True)]
results_p2 = minidist.launch(run_cases, world_size=2, args=(cases_p2, STEPS),
                             trace=OUT / "pipeline_p2.jsonl", timeout=300)
# The load when the launch began (in the trace's header) and now: a busy
# machine adds waits for a core to every bubble below, which the formula
# cannot know.
p2_header = trace.read_jsonl(OUT / "pipeline_p2.jsonl").header
p2_load = Load(p2_header.get("load") or machine_load(), machine_load(),
               len(os.sched_getaffinity(0)))

print(f"{'m':>3}  {'formula':>8}  {'replay':>8}  {'measured':>9}  {'measured - formula':>19}")
gaps, replays, bubbles = {}, {}, {}
for m in MICROBATCHES:
    case = ("1f1b", m, False)
    schedule = make_schedule("1f1b", 2, m)
    steps = [step_events(results_p2, case, step) for step in range(1, STEPS)]
    measured = float(np.median([bubble_fraction(events, 2) for events in steps]))
    replay = float(np.median([replayed_bubble(schedule, events) for events in steps]))
    gaps[m] = measured - float(formula(2, m))
    replays[m], bubbles[m] = replay, measured
    print(f"{m:>3}  {float(formula(2, m)):>8.3f}  {replay:>8.3f}  {measured:>9.3f}  "
          f"{gaps[m]:>+19.3f}")
print(f"({p2_load.describe()})")
if p2_load.busy:
    print(p2_load.note("so do the replay's durations, measured in the same run; only the "
                       "formula is free of them"))

# The chart's header carries the machine's cores and load, so that its
# verdict on the gap can name a busy machine as the cause.
run_header = trace.make_header(2, transport="shm", cores=p2_load.cores,
                               load=max(p2_load.before, p2_load.after),
                               **make_schedule("1f1b", 2, 4).header())
real_events = step_events(results_p2, ("1f1b", 4, False), STEPS - 1)
real_chart = pipeline_chart((run_header, real_events))
show_last_frame(real_chart)
show_file(save_pipeline_gantt(real_chart, OUT / "pipeline_1f1b_real_p2.png"),
          "the last step of 1F1B with m = 4 on 2 processes, as it ran")

# %% jupyter={"source_hidden": true}
small_m = [m for m in MICROBATCHES if m <= 2]
last_m = MICROBATCHES[-1]
glue("p2_load", p2_load.describe())
glue("small_gap", max(abs(gaps[m]) for m in small_m), ".3f")
glue("last_m", last_m, "d")
glue("last_gap", gaps[last_m], "+.3f")
glue("replay_off", max(abs(replays[m] - float(formula(2, m))) for m in MICROBATCHES), ".3f")
extras = [bubbles[m] - replays[m] for m in MICROBATCHES]
glue("extras", extras)
glue("m_values", list(MICROBATCHES))
glue("quick_note", f"This is the quick form: m goes up to {last_m}, {STEPS} steps each; the "
     "full form (without MINIDIST_LESSON_QUICK) adds m = 16 and runs 8 steps per m. "
     if QUICK else "")
glue("extra_list", ", ".join(f"{extra:+.3f}" for extra in extras))
glue("m_list", ", ".join(str(m) for m in MICROBATCHES))
glue("extra_first", extras[0], "+.3f")
glue("extra_last", extras[-1], "+.3f")
# The verdict looks at every step from one m to the next, not only at the ends.
falls = [(MICROBATCHES[k], MICROBATCHES[k + 1]) for k in range(len(extras) - 1)
         if extras[k + 1] <= extras[k]]
if not falls:
    trend = "grew at every step, as these fixed costs predict"
elif extras[-1] > extras[0]:
    trend = ("grew overall, but not at every step (it fell from m = " + " and from m = ".join(
        f"{a} to {b}" for a, b in falls) + "): the fixed costs are not all that moves it; "
        "a wait for a core, which lands on one micro-batch or another, does too")
else:
    trend = ("did not grow: in this run something else (a wait for a core, most likely) "
             "decided")
glue("extra_trend", trend)
replay_list = [replays[m] for m in MICROBATCHES]
glue("replays", replay_list)
glue("replay_list", ", ".join(f"{value:.3f}" for value in replay_list))
replay_rises = [(MICROBATCHES[k], MICROBATCHES[k + 1]) for k in range(len(replay_list) - 1)
                if replay_list[k + 1] >= replay_list[k]]
glue("replay_trend", "fell at every step, as the formula does" if not replay_rises else
     "did not fall at every step (it rose from m = " + " and from m = ".join(
         f"{a} to {b}" for a, b in replay_rises) + "), though the schedule's bubble only "
     "falls with m: the smaller a micro-batch, the shorter its boxes, so one box slowed by a "
     "wait for a core (or a page fault) is a larger share of the batch's time, and in the "
     "replay the other stage waits for it as it did in the run")
measured_list = [bubbles[m] for m in MICROBATCHES]
measured_rises = [(MICROBATCHES[k], MICROBATCHES[k + 1]) for k in range(len(measured_list) - 1)
                  if measured_list[k + 1] >= measured_list[k]]
glue("measured", measured_list)
glue("measured_trend", "fell at every step: more micro-batches, less bubble, here as on the "
     "simulator" if not measured_rises else
     "did not fall at every step (it rose from m = " + " and from m = ".join(
         f"{a} to {b}" for a, b in measured_rises) + "): on this machine, past some m, more "
     "micro-batches cost more than the bubble they save")
glue("p2_busy", "was busy: the load above was over the cores, and the measured column also "
     "counts the stages' waits for a core. So does the replay: its durations are this run's "
     "boxes, and a box that waited for a core in the middle of its work is that much longer. "
     "Only the formula describes the schedule alone" if p2_load.busy else
     "was not busy (the load above stayed within the cores), so the measured column is the "
     "schedule's bubble plus the messages")
say("""
{glue}`quick_note`In this run ({glue}`p2_load`) the measured bubble was within {glue}`small_gap` of
the formula at m = 1 and 2, and {glue}`last_gap` off it at m = {glue}`last_m` (the
table above). Two reasons, which the replay column separates:

* the stages do not cost exactly the same (the last one also computes the
  loss, and a micro-batch's time varies from one to the next): the replay
  already sits up to {glue}`replay_off` off the formula. Over m = {glue}`m_list` the
  replay was {glue}`replay_list`: it {glue}`replay_trend`;
* the rest, measured minus replay, is what the replay leaves out: every
  micro-batch's activation and gradient cross between processes, and a
  process waiting in `recv` still has to be woken and scheduled. With more
  micro-batches each one computes for less time, so these fixed costs weigh
  more. Here measured minus replay was {glue}`extra_list` at m = {glue}`m_list`:
  it {glue}`extra_trend`.

The measured bubble itself {glue}`measured_trend`.

So the tolerance to expect is not a fixed number: a few hundredths when
compute per micro-batch is large next to a message, growing as it shrinks.
The machine {glue}`p2_busy`.
""")

# %% [markdown]
# **Why use p = 2 here.** On a machine with 2 cores, p > 2 processes share the
# cores: while stage 2 computes, stage 0 may be ready but not running, and
# its time shows up as idle on top of the bubble of the schedule. Section 4
# measures this on 4 processes.
#
# ## 4. GPipe vs 1F1B: the same bubble, not the same memory
#
# A forward must keep its activations until the backward of the same
# micro-batch has used them. GPipe forwards all m micro-batches before the
# first backward, so every stage holds m of them at the turn. 1F1B starts
# backwards as soon as the last stage has a micro-batch: stage i (counted
# from 0) runs p - i - 1 warm-up forwards, then alternates one forward and
# one backward, so it never holds more than p - i. The runtime writes a **memory ledger**
# in the trace (bytes of parameters, gradients, optimizer state and held
# activations, and how many micro-batches they belong to) after every
# change; here is its peak per stage, for p = 4, m = 8, on 4 processes.

# %%
MEMORY_M = 8
MEMORY_WIDTH = 256
cases_p4 = [("gpipe", MEMORY_M, False), ("1f1b", MEMORY_M, False)]


def memory_and_grid(cases, steps):
    """The p = 4 cases; then, on the same 4 processes, 2 stages x 2 replicas (section 7)."""
    kept = run_cases(cases, steps, width=MEMORY_WIDTH, batch=256)
    return kept, pipeline_times_data_parallel()


def pipeline_times_data_parallel():
    rank = dist.get_rank()
    x, y = synthetic_batch(8, 24, np.float64)
    model = make_mlp(2, width=8, dtype=np.float64)
    pipe = Pipeline(model, "1f1b", 4, data_parallel=2)   # 2 stages x 2 replicas
    shard = np.array_split(np.arange(24), 2)[pipe.replica]
    pipe.step(x[shard], y[shard], nn.CrossEntropyLoss(), optim.SGD(pipe.parameters(), lr=0.1))
    names = {id(p): name for name, p in model.named_parameters()}
    return rank, {names[id(p)]: p.data.copy() for p in pipe.parameters()}


outcome_p4 = minidist.launch(memory_and_grid, world_size=4, args=(cases_p4, 2),
                             trace=OUT / "pipeline_p4.jsonl", timeout=300)
results_p4 = [kept for kept, _ in outcome_p4]


def peak_activation_bytes(events):
    peaks = {}
    for event in events:
        if event["kind"] == "memory":
            info = trace.label_info(event["label"])
            peaks[event["rank"]] = max(peaks.get(event["rank"], 0), info["activations"])
    return peaks


# "live micro-batches": those whose activations the stage holds at its peak
print(f"{'stage':>5}  {'gpipe: live micro-batches':>25}  {'bytes':>9}  "
      f"{'1f1b: live micro-batches':>24}  {'bytes':>9}  {'p - i':>5}")
ledger = {}
for name, m, recompute in cases_p4:
    events = step_events(results_p4, (name, m, recompute), 1)
    ledger[name] = (peak_live_microbatches(events), peak_activation_bytes(events))
for stage in range(4):
    print(f"{stage:>5}  {ledger['gpipe'][0][stage]:>25}  {ledger['gpipe'][1][stage]:>9,}  "
          f"{ledger['1f1b'][0][stage]:>24}  {ledger['1f1b'][1][stage]:>9,}  {4 - stage:>5}")
assert all(ledger["gpipe"][0][s] == MEMORY_M and ledger["1f1b"][0][s] == 4 - s
           for s in range(4))

p4_bubble = bubble_fraction(step_events(results_p4, ("1f1b", MEMORY_M, False), 1), 4)
cores = len(os.sched_getaffinity(0))
print(f"\n1f1b on 4 processes and {cores} cores: bubble " + compare(
    p4_bubble, float(formula(4, MEMORY_M)),
    RunFacts(ranks=4, cores=cores, load=os.getloadavg()[0], ranks_option="p ="),
    formatter=lambda value: f"{value:.3f}", model_word="formula"))

# %% [markdown]
# The ledger says what the schedules promise: m = 8 micro-batches' worth of
# activations on every GPipe stage, 4, 3, 2, 1 on the 1F1B stages. 1F1B
# saves memory at no cost in bubble: same (p-1)/(m+p-1). (Stage 0 of 1F1B
# still holds p micro-batches, so its memory grows with the depth of the
# pipeline, not with m: m can grow to shrink the bubble without running out
# of memory. That is why 1F1B, "PipeDream-flush" (Narayanan et al.,
# "Memory-Efficient Pipeline-Parallel DNN Training", 2021), replaced GPipe's
# order.)

# %% jupyter={"source_hidden": true}
glue("p4_bubble", p4_bubble, ".3f")
glue("p4_formula", float(formula(4, MEMORY_M)), ".3f")
glue("p4_cores", cores, "d")
glue("p4_over", p4_bubble - float(formula(4, MEMORY_M)), "+.3f")
if cores < 4:
    glue("p4_why", f"four processes on {cores} core{'s' if cores != 1 else ''} means that at "
         f"most {cores} stage{'s' if cores != 1 else ''} run at once, whatever the schedule "
         "says. That is idle time of the machine, not of the schedule, which is why section 3 "
         "used p = 2")
else:
    glue("p4_why", f"this machine has {cores} cores, one for every stage, so what is left "
         "above the formula is the messages and the machine's other work (its load is in "
         "the line above)")
say('''
The measured bubble on 4 processes was {glue}`p4_bubble`, {glue}`p4_over` against the
formula's {glue}`p4_formula`: {glue}`p4_why`.
''')

# %% [markdown]
# ## 5. Recomputation: compute for memory
#
# The activations a stage keeps are every layer's output for every held
# micro-batch. With `recompute=True` a forward keeps only the stage's
# *input*; the backward first runs the forward again (an "R" region in the
# trace) and then the backward. This is GPipe's re-materialisation, so the
# run is GPipe's schedule (2 stages, m = 4), where every stage holds all m
# micro-batches. The ledger shows the bytes; the trace shows the extra
# compute.

# %%
lean_case, full_case = ("gpipe", RECOMPUTE_M, True), ("gpipe", RECOMPUTE_M, False)
print(f"{'stage':>5}  {'peak activations':>16}  {'with recompute':>14}  {'saved':>6}  "
      f"{'R / F time':>10}  {'R / (F+B) time':>14}")
recompute_rows = []   # per stage: (share of the bytes saved, R / F, R / (F+B), B / F)
for rank in range(2):
    full_peak, lean_peak = [], []
    # Each letter's fastest box over the steps and micro-batches: a box the
    # operating system interrupted (a busy machine) is longer, never shorter.
    fastest = {"F": [], "B": [], "R": []}
    for step in range(1, STEPS):
        full = step_events(results_p2, full_case, step)
        lean = step_events(results_p2, lean_case, step)
        full_peak.append(peak_activation_bytes(full)[rank])
        lean_peak.append(peak_activation_bytes(lean)[rank])
        for (letter, stage, _), seconds in durations(lean).items():
            if stage == rank:
                fastest[letter].append(seconds)
    f, b, r = (min(fastest[letter]) for letter in "FBR")
    recompute_rows.append((1 - max(lean_peak) / max(full_peak), r / f, r / (f + b), b / f))
    print(f"{rank:>5}  {max(full_peak):>16,}  {max(lean_peak):>14,}  "
          f"{1 - max(lean_peak) / max(full_peak):>6.0%}  {r / f:>10.2f}  {r / (f + b):>14.2f}")
print("(times: each box's fastest over the steps and micro-batches)")
if p2_load.busy:
    print(p2_load.note("R costs about one forward (the same work), so R / (F+B) about a third"))

lean_chart = pipeline_chart(({**run_header, **make_schedule("gpipe", 2, RECOMPUTE_M).header()},
                             step_events(results_p2, lean_case, STEPS - 1)))
show_last_frame(lean_chart)
show_file(save_pipeline_gantt(lean_chart, OUT / "pipeline_recompute.png"),
          "GPipe with recomputation, m = 4 on 2 processes: an R before each B")

# %% jupyter={"source_hidden": true}
saved, r_over_f, r_share, b_over_f = zip(*recompute_rows)
glue("saved_first", saved[0], ".0%")
glue("saved_last", saved[1], ".0%")
glue("r_over_f_low", min(r_over_f), ".2f")
glue("r_over_f_high", max(r_over_f), ".2f")
glue("r_share_low", min(r_share), ".2f")
glue("r_share_high", max(r_share), ".2f")
glue("more_low", min(r_share), ".0%")
glue("more_high", max(r_share), ".0%")
glue("b_over_f_low", min(b_over_f), ".2f")
glue("b_over_f_high", max(b_over_f), ".2f")
glue("r_against_f", "no less than a forward on both stages, as it should be: the forward "
     "of a recomputing stage runs without building the autograd graph, R builds it"
     if min(r_over_f) >= 1 else
     "less than a forward on a stage, though R does the same work and builds the autograd "
     "graph as well: in this run that stage's forwards were all slower than its fastest R")
glue("b_against_2f", "less than" if max(b_over_f) < 2 else "more than" if min(b_over_f) > 2
     else "about")
glue("r_against_third", "more than" if min(r_share) > 1 / 3 else "less than"
     if max(r_share) < 1 / 3 else "about")
say("""
Here recomputation saved {glue}`saved_first` of stage 0's activation bytes at the
peak and {glue}`saved_last` of stage 1's. Without it a stage of 2 layers keeps 5
arrays per micro-batch (its input and the outputs of its Linear, ReLU, Linear
and ReLU), 4 micro-batches at GPipe's turn: 20 arrays. With it, 4 inputs plus
the outputs of the one micro-batch being recomputed: 8. (The last stage has
no ReLU after its last Linear: 16 arrays against 7.) The deeper the stage,
the larger the saving, since only the inputs stay.

The cost (F, B and R are one micro-batch's forward, backward and
recomputation on a stage, as in the charts; each box's fastest run, so that a
box the operating system interrupted does not count): R took {glue}`r_over_f_low` to {glue}`r_over_f_high` times a
forward, {glue}`r_against_f`; and {glue}`r_share_low` to {glue}`r_share_high` of the
F + B time: {glue}`more_low` to {glue}`more_high` more compute per stage for that
memory. With a backward costing twice a forward the textbook figure is a
third; here a backward cost {glue}`b_over_f_low` to {glue}`b_over_f_high` times a
forward ({glue}`b_against_2f` twice), and R came to {glue}`r_against_third` a third of
F + B. With 1F1B the saving is smaller: the last stage
holds one micro-batch at a time, the one being backpropagated, so there is
nothing to save there.
""")

# %% [markdown]
# ## 6. Interleaving: several chunks per process
#
# Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model
# Training on GPU Clusters Using Megatron-LM", 2021) gives each process v non-consecutive
# pieces of the model: with 4 processes and v = 2, process 0 holds pieces 0
# and 4, process 1 pieces 1 and 5, ... A micro-batch goes round the ranks v
# times, each pass 1/v of a stage's work, so filling and draining take 1/v as
# long: bubble (p - 1)/(v m + p - 1). The price: more messages, since each
# micro-batch now crosses p v - 1 links instead of p - 1, that is
# (p v - 1)/(p - 1) times as many (close to v only when p is large), and more
# (smaller) pieces of activations in flight.

# %%
print(f"{'v':>2}  {'bubble':>7}  {'(p-1)/(vm+p-1)':>15}  {'messages':>8}  "
      f"{'stage 0 holds at most':>21}")
interleaved = {}   # v -> (messages, stages' worth stage 0 holds at most)
for v in (1, 2, 4):
    # v = 1 is plain 1F1B; a piece is 1/v of a stage, so it costs 1/v
    schedule = make_schedule("interleaved_1f1b" if v > 1 else "1f1b", 4, 8, v)
    events = simulate_schedule(schedule, 1.0 / v, 2.0 / v)
    bubble = bubble_fraction(events, 4)
    assert bubble == float(formula(4, 8, v))
    messages = sum(event["kind"] == "send" for event in events)
    pieces = peak_live_microbatches(events)[0]
    interleaved[v] = (messages, pieces / v)
    print(f"{v:>2}  {bubble:>7.3f}  {str(formula(4, 8, v)):>8} = {float(formula(4, 8, v)):.3f}"
          f"  {messages:>8}  {pieces:>3} pieces = {pieces / v:.2f} stages' worth")

show_file(draw_planned_comparison(OUT / "pipeline_schedules.png",
                                  schedules=("gpipe", "1f1b", "interleaved_1f1b")),
          "GPipe vs 1F1B vs interleaved 1F1B (v = 2), p = 4, m = 8, planned")

# %% jupyter={"source_hidden": true}
glue("messages_v2", interleaved[2][0] / interleaved[1][0], "{:.2g}")
glue("messages_v4", interleaved[4][0] / interleaved[1][0], "{:.2g}")
glue("worth_v1", interleaved[1][1], "{:g}")
glue("worth_v2", interleaved[2][1], "{:g}")
glue("worth_v4", interleaved[4][1], "{:g}")
say('''
The table: v = 2 and 4 cut the bubble as the formula says, exactly on the
simulator, for {glue}`messages_v2` and {glue}`messages_v4` times the messages of 1F1B
((p v - 1) links' worth instead of p - 1); stage 0 holds more pieces,
{glue}`worth_v2` and {glue}`worth_v4` stages' worth instead of {glue}`worth_v1`.
''')

# %% [markdown]
# The picture above (`docs/pipeline_schedules.png` adds the zero-bubble
# schedules under it) puts the three schedules on one time axis for p = 4,
# m = 8: GPipe and 1F1B take the same time, 1F1B with far fewer activations
# held; interleaving with v = 2 ends
# earlier, holding more pieces (each half a stage's activations). With
# m a multiple of p the simulator matches the formula exactly; otherwise the
# schedule pads the last round and the bubble is larger.
#
# ## 7. Pipeline x data parallel, in two lines
#
# With 4 processes, `Pipeline(model, "1f1b", 4, data_parallel=2)` makes 2
# replicas of a 2-stage pipeline: ranks 0, 1 are replica 0's stages and 2, 3
# replica 1's; each replica trains on its half of the batch, and each stage
# all-reduces its gradient with the same stage of the other replica before
# the step. It ran in section 4's launch; its weights against one process
# on the whole batch, in float64:

# %%
x, y = synthetic_batch(8, 24, np.float64)
single = make_mlp(2, width=8, dtype=np.float64)
reference_optimizer = optim.SGD(single.parameters(), lr=0.1)
nn.CrossEntropyLoss()(single(Tensor(x)), y).backward()
reference_optimizer.step()
reference = dict(single.named_parameters())
difference = max(np.abs(weights - reference[name].data).max()
                 for _, (_, grid_weights) in outcome_p4
                 for name, weights in grid_weights.items())
print(f"2 stages x 2 replicas vs one process: largest weight difference {difference:.1e}")

# %% [markdown]
# ## What to remember
#
# * A pipeline of p stages with m micro-batches idles (p-1)/(m+p-1) of the
#   time with equal stage costs and free messages: more micro-batches, less
#   bubble. Real runs add the cost of every message and of waiting for a
#   core; on a small machine keep p at most the number of cores.
# * GPipe and 1F1B have the same bubble; 1F1B holds at most p - i
#   micro-batches' activations at stage i instead of m.
# * Recomputation trades about one more forward per micro-batch for
#   keeping only the stage's input.
# * Interleaving v chunks per process divides the fill and drain by v, for
#   (p v - 1)/(p - 1) times the messages: a micro-batch crosses p v - 1
#   links instead of p - 1 (with p = 4: 7/3 for v = 2, 5 for v = 4).
#
# Try `minidist demo pipeline --schedule 1f1b --stages 4 --microbatches 8`
# (and `--simulate`, `--timeline gantt.png`) to step through a run yourself.

# %% [markdown]
# ## Your turn
#
# Write 1F1B as data, each stage's order of forwards and backwards:
# `minidist exercise start one_f_one_b`, then `minidist exercise check
# one_f_one_b`. The checker runs it on the pipeline simulator, tells a
# deadlock or a schedule that holds more activations than 1F1B, and draws
# your Gantt chart above the reference's (`one_f_one_b.gantt.png`).
