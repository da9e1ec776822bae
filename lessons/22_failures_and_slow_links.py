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
# # Lesson 22: when ranks die, and when links are slow
#
# Every run of the course so far ended when one rank failed: minidist
# noticed within seconds, named the rank and stopped the others (lesson 3's
# failures). That is the right answer for a laptop, and the wrong one for a
# job of thousands of processes that runs for weeks, where some process
# fails every few hours. This lesson runs the three answers the field
# gives, on real processes, and measures what each costs:
#
# 1. **elastic restarts** (torchrun's `--max-restarts`): every rank is
#    ended, the script is started again and resumes from its last
#    checkpoint; the steps since that checkpoint are lost and done again.
#    DDP on 4 ranks with a rank killed, for several checkpoint intervals;
#    the final weights against an unbroken run's; a restart on one rank
#    fewer;
# 2. **fault-tolerant data parallel** (torchft's `Manager`): the replicas
#    agree every step on who is alive (a *quorum*), all-reduce over the
#    live ones and divide by their count; a replica that dies is dropped
#    within a step, the others go on at 3 of 4, and a spare takes its place
#    at a step boundary, receiving the weights and the optimizer's state
#    from a live replica. The weights against one process that replays the
#    same quorums;
# 3. what each costs: the time from a failure to the next step done,
#    measured, and the steps lost;
# 4. **slow links**: local SGD (every rank steps alone, the weights averaged
#    every K steps) and DiLoCo (Douillard et al., "DiLoCo: Distributed
#    Low-Communication Training of Language Models", 2023: K inner AdamW
#    steps, then an outer Nesterov step on the averaged change of the
#    weights) against DDP: the bytes from the trace, the loss per byte, and
#    the link bandwidth below which each wins, from the cost model next to
#    the measured points.
#
# Library code: `minidist/runtime/restarts.py` (what `minidist run
# --max-restarts` decides after a failure: restart, on how many ranks, or
# give up), `minidist/parallel/resilience/` (`elastic_resume.py`: the
# checkpoint every few steps and the resume; `global_batches.py`: a step's
# global batch whatever the world size; `quorum.py`,
# `fault_tolerant_ddp.py`, `recovery.py`: fault-tolerant DP; `replay.py`:
# its one-process check), `minidist/parallel/data/local_sgd.py` and
# `diloco.py`, and the experiment `minidist/experiments/low_communication.py`.
# Pictures: `viz/timeline.py` (with `viz/attempts.py`'s dashed line where a
# restart began) and `viz/quorum_timeline.py`.
#
# Symbols as in `lessons/NOTATION.md`: n ranks in a group, N the bytes of
# the parameters, β the price of a byte on the link (1 / bandwidth), K the
# steps between two syncs of local SGD or DiLoCo (the DiLoCo paper's H:
# here H is a transformer's heads).
#
# **Quick and full form.** The quick form (`MINIDIST_LESSON_QUICK=1`) runs
# section 1 for two checkpoint intervals (so section 3's table has two
# elastic rows) and section 4's experiment in its small form: a GPT of 1
# layer and width 32, 128 steps, K of 4 and 16. The full form runs three
# intervals, and the experiment with a GPT of 2 layers and width 64, 512
# steps, K of 4, 16 and 64 (a few minutes). Section 2 is the same in both.
#
# Attempts are counted from 1 (the first attempt, the second ...) and
# restarts from 0, as torchrun's `TORCHELASTIC_RESTART_COUNT`: the second
# attempt is restart 1.

# %%
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import minidist
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

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

from viz.quorum_timeline import draw_quorum_timeline, quorum_cells  # noqa: E402
from viz.timeline import draw_timeline  # noqa: E402

QUICK = quick()
OUT = output_dir()
#: the checkpoints and weights the runs write, removed at the end of the lesson
WORK = tempfile.TemporaryDirectory(prefix="lesson22_")


def find_root() -> Path:
    """The repository's root (where examples/ is): the folder above the
    minidist package this lesson imported (a notebook may run anywhere)."""
    for folder in (Path(minidist.__file__).resolve().parents[1], Path.cwd(), *Path.cwd().parents):
        if (folder / "examples" / "elastic_training.py").exists():
            return folder
    raise FileNotFoundError("examples/elastic_training.py not found beside the minidist "
                            "package: run the lesson from a checkout of the repository")


ROOT = find_root()
EXAMPLE = ROOT / "examples" / "elastic_training.py"


def table(rows, header):
    """Rows under a header, right-aligned."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(f"{str(h):>{w}}" for h, w in zip(header, widths))]
    lines += ["  ".join(f"{str(c):>{w}}" for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


# %% [markdown]
# ## 1. Elastic restarts: the job dies, and starts again from its checkpoint
#
# `examples/elastic_training.py` trains a small MLP (float64) with DDP. Its
# batches come from a `GlobalBatchSampler`: step s trains on the same
# global batch whatever the number of ranks, each rank taking its slice.
# Every few steps an `ElasticCheckpointer` saves the model, the momentum
# and the step with `minidist.distributed.checkpoint` (lesson 21's dcp: a
# restart on fewer ranks reads the same files). On the first attempt one
# rank is killed with SIGKILL at a chosen step.
#
# It is started by `minidist run --max-restarts 1 -n 4`: when the rank
# dies, `minidist run` ends the other three (as in every run of the
# course), names the rank, and starts all four again with torchrun's
# variable `TORCHELASTIC_RESTART_COUNT=1`. The script reads its latest
# checkpoint and goes on from there. The steps it had done after that
# checkpoint are lost: done once, thrown away, done again.
#
# The run below kills rank 2 at the same step for each checkpoint
# interval, and saves the final weights, next to an unbroken run of the
# same script.

# %%
STEPS = 40
KILL_STEP = 38
INTERVALS = [5, 20] if QUICK else [5, 10, 20]


def run_example(*options, ranks="4", restarts=1, trace=None):
    """``minidist run --max-restarts R -n RANKS examples/elastic_training.py OPTIONS``;
    returns (exit status, what rank 0 printed, the launcher's lines, the time notes)."""
    folder = Path(tempfile.mkdtemp(dir=WORK.name))
    times = folder / "times.jsonl"
    command = [sys.executable, "-m", "minidist.cli", "run", "--max-restarts", str(restarts),
               "-n", ranks, "--transport", "pipe"]
    if trace:
        command += ["--trace", str(trace)]
    command += [str(EXAMPLE), "--steps", str(STEPS), "--checkpoint-dir",
                str(folder / "checkpoints"), "--times", str(times), *options]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                          cwd=ROOT)
    notes = [json.loads(line) for line in times.read_text().splitlines()] if times.exists() else []
    return done.returncode, done.stdout, done.stderr, notes, folder


unbroken_out = Path(tempfile.mkdtemp(dir=WORK.name)) / "final.npz"
unbroken_status, _, _, _, _ = run_example("--every", "10", "--out", str(unbroken_out))
with np.load(unbroken_out) as saved:
    unbroken = {name: saved[name] for name in saved.files}

rows, runs = [], {}
for every in INTERVALS:
    out = Path(tempfile.mkdtemp(dir=WORK.name)) / "final.npz"
    trace = OUT / f"elastic_every_{every}.jsonl"
    status, printed, launcher, notes, folder = run_example(
        "--every", str(every), "--kill-rank", "2", "--kill-step", str(KILL_STEP),
        "--fault", "sigkill", "--out", str(out), trace=trace)
    resumed = re.search(r"attempt 2 \(restart 1\) on (\d+) ranks: resumed at step (\d+) from checkpoint of "
                        r"step (\d+); (\d+) steps? lost", printed)
    fault = next(note["t"] for note in notes if note["event"] == "fault")
    again = next(note["t"] for note in notes
                 if note["event"] == "first_step" and note["attempt"] == 1)
    with np.load(out) as saved:
        same = all(np.array_equal(saved[name], unbroken[name]) for name in unbroken)
    runs[every] = {"status": status, "resumed_at": int(resumed.group(2)),
                   "lost": int(resumed.group(4)), "recovery_s": (again - fault) / 1e9,
                   "same": same, "launcher": launcher, "trace": trace}
    rows.append((every, KILL_STEP, resumed.group(2), resumed.group(4),
                 f"{(again - fault) / 1e9:.2f} s", "yes" if same else "NO"))

print(table(rows, ["checkpoint every", "killed at step", "resumed at", "steps lost",
                   "fault -> next step", "weights = unbroken run's"]))
print()
print("what minidist run said on the first of these runs:")
print("\n".join(line for line in runs[INTERVALS[0]]["launcher"].splitlines()
                if line.startswith("minidist run")))

first, last = runs[INTERVALS[0]], runs[INTERVALS[-1]]
glue("kill_step", KILL_STEP)
glue("all_same", all(run["same"] for run in runs.values()))
glue("same_text", "equal, bit for bit, to the unbroken run's" if all(
    run["same"] for run in runs.values()) else "NOT all equal to the unbroken run's")
glue("all_status_zero", all(run["status"] == 0 for run in runs.values()) and unbroken_status == 0)
glue("first_every", INTERVALS[0])
glue("first_lost", first["lost"])
glue("last_every", INTERVALS[-1])
glue("last_lost", last["lost"])
glue("lost_is_modulo", all(run["lost"] == KILL_STEP % every for every, run in runs.items()))
glue("first_recovery", first["recovery_s"], ".2f")
glue("cores", os.cpu_count())
glue("last_recovery", last["recovery_s"], ".2f")

# %% jupyter={"source_hidden": true}
say("""
Rank 2 was killed at step {glue}`kill_step` in every run, and every run
finished: the final weights are {glue}`same_text`. They can be equal bit
for bit because nothing that decides the weights depends on the attempt:
step s trains on the global batch the sampler gives for s, the 4 ranks
all-reduce in the same order on every attempt, and the checkpoint holds
every value the next step reads (the weights and the momentum, exactly, as
float64 in files).

The steps lost are the steps since the last checkpoint: with a checkpoint
every {glue}`first_every` steps, {glue}`first_lost` steps were done again;
every {glue}`last_every` steps, {glue}`last_lost`. A failure at a random
step loses half an interval on average. The time from the fault to the
first step of the next attempt ({glue}`first_recovery` s with the
shortest interval, {glue}`last_recovery` s with the longest) pays for
noticing the death and ending the other ranks, starting them again,
importing and reading the checkpoint; the steps lost come on top of it.
(This machine has {glue}`cores` cores for 4 ranks and the launcher, so
these times include the operating system's turns between them.)
""")

# %% [markdown]
# ### A rank that cannot come back: the job goes on with fewer
#
# torchrun's `--nnodes MIN:MAX` lets a job restart on fewer machines than
# it began with. On one machine `minidist run -n MIN:MAX` counts ranks:
# with `-n 3:4`, a rank whose slot is lost (its script called
# `minidist.runtime.restarts.mark_rank_lost()`, as torchrun's elastic
# agent, the process that watches a machine's ranks, reports a machine
# that will not come back) is not started again, and the next attempt runs
# on 3 ranks. The checkpoint written by 4 ranks loads on 3 (dcp reads
# whatever layout), and the sampler cuts the same global batch into 3
# slices. The weights are the same up to the last bits: the sum of the
# batch's gradients is now added in 3 pieces, not 4, and float addition
# depends on the order.

# %%
out = Path(tempfile.mkdtemp(dir=WORK.name)) / "final.npz"
lost_status, lost_printed, lost_launcher, _, _ = run_example(
    "--every", "10", "--kill-rank", "2", "--kill-step", str(KILL_STEP), "--fault", "lost",
    "--out", str(out), ranks="3:4")
with np.load(out) as saved:
    worst = max(float(np.max(np.abs(saved[name] - unbroken[name])
                             / np.maximum(np.abs(unbroken[name]), 1e-300))) for name in unbroken)
    bitwise = all(np.array_equal(saved[name], unbroken[name]) for name in unbroken)
print("\n".join(line for line in lost_launcher.splitlines() if line.startswith("minidist run")))
print("\n".join(line for line in lost_printed.splitlines() if line.startswith("attempt")))
print(f"largest relative difference from the unbroken 4-rank run: {worst:.1e}")
glue("lost_world", int(re.search(r"attempt 2 \(restart 1\) on (\d+) ranks", lost_printed).group(1)))
glue("lost_worst", worst, ".1e")
glue("lost_close", worst < 1e-12)
glue("lost_close_text", "within" if worst < 1e-12 else "NOT within")
glue("lost_bitwise_text", "equal bit for bit as well" if bitwise else "not equal bit for bit")

# %% jupyter={"source_hidden": true}
say("""
The second attempt ran on {glue}`lost_world` ranks. Its final weights
differ from the unbroken run's by at most {glue}`lost_worst` of a value,
{glue}`lost_close_text` 1e-12 (float64 keeps about 16 digits); they are
{glue}`lost_bitwise_text`. Which strategies can resume exactly? Those
whose step is a function of the step number and the saved state alone: DDP
and FSDP with a global-batch sampler, as here. Local SGD and DiLoCo can, if
the checkpoint also holds every rank's own weights between syncs and the
world keeps its size. Hogwild and asynchronous parameter servers cannot:
their result depends on the order in which updates happened to arrive,
which no checkpoint records.
""")

# %% [markdown]
# ### The attempts on the timeline
#
# `minidist run --trace` writes both attempts into one trace: each event
# carries its attempt, and the timeline draws a dashed line where the
# launcher began the second attempt. Left of it: the first attempt, up to
# the kill; rank 2's row is empty there, because a rank killed outright
# never writes its part of the trace. Between the last events on the left
# and the line: the launcher noticing the death and ending ranks 0, 1 and
# 3. Between the line and the first events on the right: the new processes
# starting and importing. Then the ranks read the checkpoint and train the
# last steps (this script marks no compute regions: its compute is the
# gaps between the messages).

# %%
figure = draw_timeline(str(first["trace"]), max_steps=None)
show_figure(figure, "elastic_attempts.png",
            f"DDP on 4 ranks, checkpoint every {INTERVALS[0]} steps, rank 2 killed at step "
            f"{KILL_STEP}: the two attempts, the dashed line where the restart began")

# %% [markdown]
# ## 2. Fault-tolerant data parallel: the others go on
#
# A restart throws away every rank's work since the checkpoint, and
# stops every rank for the time of a restart, for the failure of one. Data
# parallel has a cheaper answer, because its replicas are copies: the
# survivors hold everything the dead one held. torchft's `Manager` makes
# the replicas agree, before each step's all_reduce, on which of them
# take part (the **quorum**), and the all_reduce runs over those alone:
#
# * the quorum: every live rank writes one row (its rank, its role, the
#   steps it has committed) into a small array, and one all_reduce gives
#   every rank every row; every rank then computes the same quorum from the
#   same rows. Who is alive comes from the runtime's status records (the
#   ones lesson 3's failures are named from);
# * the all_reduce: the gradients are summed over the quorum's members and
#   divided by their count, not by the world size: 3 live replicas' mean is
#   their sum over 3;
# * the commit: a step is applied only if its all_reduce completed with no
#   member lost. If a member dies in the middle of it, no rank applies the
#   step; the next quorum (without the dead rank) does the same step again,
#   from the same batches of the live replicas. No update is lost, none is
#   applied twice;
# * a replacement: minidist's transports link every rank when a run starts,
#   so the replacement is a *hot spare* started with the run, waiting. At
#   the next step boundary after a loss it joins the quorum, receives the
#   weights and the optimizer's state from the lowest live replica, and the
#   group is back at 4. (torchft starts a new process instead, which
#   connects then.)
#
# The run: 4 replicas and 1 spare (5 processes), a small linear regression
# in float64 (`RegressionProblem`), SGD with momentum; replica 2 is killed
# with SIGKILL at step 3. Every commit records its quorum: the step, the
# members, each member's batch. One process then replays those records,
# the optimizer applied to the mean of the members' gradients step after
# step, and every surviving rank's weights are compared with it.

# %%
from minidist.parallel.resilience import RegressionProblem, ReplicaFault, replay, train  # noqa: E402

PROBLEM = RegressionProblem(steps=8)
fault_time_file = Path(WORK.name) / "fault_time.txt"
FAULT = ReplicaFault(rank=2, step=3, kind="sigkill", time_file=str(fault_time_file))
results = minidist.launch(train, world_size=5, transport="pipe", args=(PROBLEM, 4, FAULT),
                          tolerate_failures=True, timeout=120, log_level="ERROR")
fault_time = float(fault_time_file.read_text())
survivor, _ = results[0]
reference = replay(PROBLEM, survivor.history)
agree = True
for rank, entry in enumerate(results):
    if rank == FAULT.rank:
        continue
    result, weights = entry
    for step, arrays in weights.items():
        agree &= all(np.allclose(got, want, rtol=1e-9, atol=1e-12)
                     for got, want in zip(arrays, reference[step]))
rows = []
for attempt in survivor.attempts:
    rows.append((attempt.step, attempt.quorum_id, ", ".join(map(str, attempt.members)),
                 ", ".join(map(str, attempt.joining)) or "-", attempt.outcome))
print(table(rows, ["step", "quorum", "members", "joining", "outcome"]))
print(f"every survivor's weights after every step against the replay (rtol 1e-9): "
      f"{'equal' if agree else 'DIFFERENT'}")
print()
print("\n".join(survivor.events))
after = [t for t in survivor.commit_times if t > fault_time]
committed_sizes = [len(record.members) for record in survivor.history]
glue("ft_dead_rank", FAULT.rank)
glue("ft_fault_step", FAULT.step)
glue("ft_steps", PROBLEM.steps)
glue("ft_agree", agree)
glue("ft_agree_text", "equal the replay's" if agree else "DIFFER from the replay's")
failed_tries = sum(a.outcome == "failed" for a in survivor.attempts)
glue("ft_failed_once", failed_tries)
glue("ft_failed_text", "its first try failed" if failed_tries == 1 else
     f"{failed_tries} of its tries failed")
glue("ft_min_members", min(committed_sizes))
glue("ft_final_members", committed_sizes[-1])
short_steps = sum(size < 4 for size in committed_sizes)
glue("ft_short_steps", short_steps)
glue("ft_short_text", "One step" if short_steps == 1 else f"{short_steps} steps")
glue("ft_recovery", (after[0] - fault_time) if after else float("nan"), ".2f")
glue("ft_recovery_ms", ((after[0] - fault_time) * 1e3) if after else float("nan"), ".0f")
figure = draw_quorum_timeline(quorum_cells(survivor.attempts, 5))
show_figure(figure, "quorums.png",
            f"4 replicas and a spare (rank 4); replica {FAULT.rank} killed at step {FAULT.step}: "
            "L live, R recovering (the step redone), J joining, X dead, S spare")

# %% jupyter={"source_hidden": true}
say("""
At step 0 replicas 1, 2 and 3 are listed as joining: the first quorum
copies rank 0's weights to all (torchft's first sync), so that every
replica starts from the same ones. Replica {glue}`ft_dead_rank` died at
step {glue}`ft_fault_step`:
{glue}`ft_failed_text` (a member was lost inside the all_reduce), and no
rank applied it; the next quorum, without the dead rank, did it again.
{glue}`ft_short_text` ran at {glue}`ft_min_members` of 4 replicas; then
the spare joined, received the weights and the momentum,
and the last steps ran at {glue}`ft_final_members`. Every survivor's
weights after every step {glue}`ft_agree_text` (one process applying the
recorded quorums' mean gradients, rtol 1e-9). The group's next commit came
{glue}`ft_recovery_ms` ms after the fault: no rank was restarted, nothing
was read from disk.

What it costs when nothing fails: one more all_reduce per step (the
quorum's rows: a few integers per rank, so its time is latency, not
bandwidth), and a copy of the state before each step. The copy is for a
death at the very end of an all_reduce: a rank whose own part finished
may apply the step while another member's part failed. The next quorum
compares the steps every member has committed, and a rank that is one
ahead puts its copy back, so that all redo the step together.
Under `mpiexec` this is refused: MPICH ends the whole job when a rank dies
(MPI's fault-tolerance extension, ULFM, is what would allow it), so
there only elastic restarts apply.
""")

# %% [markdown]
# ## 3. What each answer costs
#
# A failure costs a restart the time to end and start every rank and read
# the checkpoint, plus the steps lost since it; it costs fault-tolerant DP
# the time to see the rank gone and agree on a new quorum, plus the one
# step it was in, done again. A failure at a random step loses half a
# checkpoint interval on average, so for a step of time t_step:
#
# * elastic restart: t_restart + (interval / 2) t_step per failure, and a
#   checkpoint's save every interval when nothing fails;
# * fault-tolerant DP: t_quorum + t_step per failure, and one small
#   all_reduce and a copy of the state every step when nothing fails; the
#   group trains on fewer replicas (a smaller global batch) until a spare
#   joins.
#
# The table puts the times measured above side by side.

# %%
rows = [(f"elastic restart, checkpoint every {every}", f"{run['recovery_s']:.2f} s",
         run["lost"], "4 of 4") for every, run in runs.items()]
rows.append(("fault-tolerant DP", f"{after[0] - fault_time:.2f} s", 1, "1 of 4 (the dead one)"))
print(table(rows, ["answer", "fault -> next step", "steps done again", "ranks that stopped"]))
elastic_mean = float(np.mean([run["recovery_s"] for run in runs.values()]))
glue("elastic_mean", elastic_mean, ".2f")
glue("recovery_ratio", elastic_mean / (after[0] - fault_time), ".0f")

# %% jupyter={"source_hidden": true}
say("""
An elastic restart took {glue}`elastic_mean` s on average from the fault
to the next step here, {glue}`recovery_ratio` times the fault-tolerant
group's {glue}`ft_recovery` s, before counting the steps it redoes. On a
cluster the gap grows: a restart there waits for the scheduler, loads a
container, reads the checkpoint from a shared file system. What a restart
buys is generality: it works for every strategy (a pipeline, tensor
parallel, 3D) and under `mpiexec`, where a rank's death ends the job
whatever the script does; fault-tolerant DP works only where the replicas
are copies of each other, and only where the transport lets the others go
on.
""")

# %% [markdown]
# ## 4. Slow links: fewer messages instead of fewer bits
#
# Lesson 13 made each message smaller (fewer bits, fewer values). Local SGD
# sends the same all_reduce less often: every rank trains alone for K
# steps, then the ranks average their weights, N bytes all-reduced once in K
# steps: DDP's bytes divided by K. The replicas drift apart between two
# averages, so a step is worth less than DDP's; whether the saved bytes pay
# for that depends on the link. DiLoCo keeps local SGD's schedule and
# changes what is done with the average: the change of the averaged
# weights over the K inner steps (the *pseudo-gradient*, the weights at the
# last sync minus the average now) is handed to an outer optimizer, SGD
# with Nesterov momentum (the paper's learning rate 0.7 and momentum 0.9),
# which steps from the last sync's weights.
#
# The experiment (`minidist.experiments.low_communication`) trains DDP,
# local SGD and DiLoCo for each K from the same weights on the same
# batches, in one launch of 2 real processes per model: the small
# character-level GPT of lessons 16-18 and the digits CNN, AdamW inside. It
# counts the bytes every rank sent from the trace, and reads the held-out
# loss at the syncs. Then the model of time: a method that needs s steps to
# reach a target loss in `steps` steps takes steps × t_step of compute
# (t_step measured) and steps / K all_reduces of N bytes, each
# 2(n-1)α + 2(n-1)/n Nβ + (n-1)/n Nγ (lesson 4's ring, α and γ as
# measured for this machine's transport), so its time is a + b β with
# a = steps × t_step + (steps / K)(2(n-1)α + (n-1)/n Nγ) and
# b = (steps / K) 2(n-1)/n N: a straight line against β. Two methods take
# the same time at one β, their crossover; on a slower link (a larger β)
# the one that sends fewer bytes wins. The picture's right column draws
# these times against the bandwidth 1/β on log axes (where the lines are
# curves), the vertical dotted lines at the crossovers with DDP; a method
# that never reached the target has no line there. The horizontal dotted
# line in the other two columns is the target loss.

# %%
from minidist.experiments import low_communication as lowcomm  # noqa: E402

experiment = lowcomm.run(quick=QUICK, world_size=2, transport="shm")
# The target: DDP's held-out loss half-way through its run, so that the
# question is "how soon does each method get where DDP got in half its steps".
for model in experiment.models.values():
    ddp = model.runs["ddp"]
    half = min(ddp.steps, key=lambda step: abs(step - ddp.steps[-1] / 2))
    lowcomm.apply_target(model, ddp.loss[ddp.steps.index(half)])
    print(f"{model.model}: target loss {model.target_loss:.3f}, DDP's at step {half}")
print("this machine's link (shm), as measured:",
      lowcomm.format_bandwidth(experiment.models["gpt"].measured_bandwidth))
print(lowcomm.format_table(experiment))
picture = lowcomm.plot(experiment, OUT / "low_communication.png")
show_file(picture, "loss against steps, loss against the bytes the trace counted, and the "
                   "time to the target loss against the link's bandwidth (the model's lines, "
                   "the measured points)")

gpt, cnn = experiment.models["gpt"], experiment.models["cnn"]
small_k, large_k = min(r.sync_every for r in gpt.runs.values() if r.kind != "ddp"), \
    max(r.sync_every for r in gpt.runs.values())
ratios_exact = all(run.bytes_per_step * run.sync_every == model.runs["ddp"].ring_bytes_per_step
                   for model in experiment.models.values() for run in model.runs.values()
                   if run.kind != "ddp")
glue("small_k", small_k)
glue("large_k", large_k)
glue("bytes_exact", ratios_exact)
glue("bytes_exact_text", "exactly DDP's all_reduce bytes divided by K" if ratios_exact
     else "NOT DDP's bytes divided by K")
glue("gpt_ddp_extra", gpt.runs["ddp"].bytes_per_step - gpt.runs["ddp"].ring_bytes_per_step, ".0f")
glue("gpt_params", gpt.parameters, ",")
glue("gpt_target", gpt.target_loss, ".2f")
glue("cnn_target", cnn.target_loss, ".3f")


def display(name):
    """A method's name as the prose writes it: "local SGD every 16"."""
    return name.replace("local_sgd", "local SGD").replace("diloco", "DiLoCo").replace("ddp", "DDP")


def steps_text(run):
    return "never" if run.steps_to_target is None else f"{run.steps_to_target}"


def bytes_ratio(model, run):
    """Bytes to the target over DDP's, as the table writes it ("-": never got there)."""
    if run.bytes_to_target is None:
        return "-"
    return f"{run.bytes_to_target / model.runs['ddp'].bytes_to_target:.2f}"


def below(model, run):
    return "" if run.kind == "ddp" else lowcomm.format_bandwidth(model.beats_ddp_below.get(run.name))


# Every method of the run, as a Markdown table the prose shows whole.
steps_rows = ["| method | steps, GPT | steps, CNN | bytes to target / DDP's, GPT "
              "| beats DDP on the GPT below |", "|---|---|---|---|---|"]
for name, run in gpt.runs.items():
    steps_rows.append(f"| {display(name)} | {steps_text(run)} | {steps_text(cnn.runs[name])} "
                      f"| {bytes_ratio(gpt, run)} | {below(gpt, run)} |")
glue("steps_table", "\n".join(steps_rows))
never = [display(name) for model in experiment.models.values()
         for name, run in model.runs.items() if run.steps_to_target is None]
never_gpt = [display(name) for name, run in gpt.runs.items() if run.steps_to_target is None]
glue("never_count", len(never))


def listed(names):
    """"a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


glue("never_text", "every method reached the target on both models" if not never else
     ("on the GPT " if len(never) == len(never_gpt) else "") + listed(never)
     + " never reached the target")
glue("gpt_ddp_target_step", gpt.runs["ddp"].steps_to_target)
glue("cnn_ddp_target_step", cnn.runs["ddp"].steps_to_target)
glue("gpt_half", gpt.runs["ddp"].steps[-1] // 2)
glue("measured_link", lowcomm.format_bandwidth(gpt.measured_bandwidth))
fastest_here = [name for low, high, name in gpt.fastest if low <= gpt.measured_bandwidth < high]
glue("gpt_fastest_here", display(fastest_here[0]) if fastest_here else "none")
measured = gpt.measured_seconds_to_target
measured_best = min(measured, key=measured.get)
glue("gpt_measured_fastest", display(measured_best))
glue("model_agrees", bool(fastest_here) and measured_best == fastest_here[0])
glue("model_agrees_text", "the measured points agree" if bool(fastest_here)
     and measured_best == fastest_here[0] else
     "the measured points disagree: measured, " + display(measured_best) + " got there first")


def band(low, high, name, first, last):
    """One band of the fastest method: "DDP above 77 MB/s"."""
    if first and last:
        return f"{display(name)} at every bandwidth"
    if first:
        return f"{display(name)} below {lowcomm.format_bandwidth(high)}"
    if last:
        return f"{display(name)} above {lowcomm.format_bandwidth(low)}"
    return (f"{display(name)} from {lowcomm.format_bandwidth(low)} to "
            f"{lowcomm.format_bandwidth(high)}")


glue("bands_text", "; ".join(band(low, high, name, i == 0, i == len(gpt.fastest) - 1)
                             for i, (low, high, name) in enumerate(gpt.fastest)))
ddp_fewest = all(run.steps_to_target is None
                 or run.steps_to_target >= model.runs["ddp"].steps_to_target
                 for model in experiment.models.values() for run in model.runs.values())
more_steps = sum(run.steps_to_target is None
                 or run.steps_to_target > model.runs["ddp"].steps_to_target
                 for model in experiment.models.values() for run in model.runs.values()
                 if run.kind != "ddp")
others = sum(run.kind != "ddp" for model in experiment.models.values()
             for run in model.runs.values())
fewer_steps = sum(run.steps_to_target is not None
                  and run.steps_to_target < model.runs["ddp"].steps_to_target
                  for model in experiment.models.values() for run in model.runs.values())
glue("fewer_steps", fewer_steps)
glue("ddp_fewest", ddp_fewest)
glue("more_steps", more_steps)
glue("other_runs", others)
glue("steps_verdict", f"needs at least as many steps as DDP (more, or never got there, in "
     f"{more_steps} of the {others} runs here)" if ddp_fewest
     else f"usually needs more steps than DDP (more, or never got there, in {more_steps} of "
     f"the {others} runs here, fewer in {fewer_steps})")

# %% jupyter={"source_hidden": true}
say("""
**Bytes.** The trace's bytes per step (the run's bytes over its steps,
rounded in the table) are {glue}`bytes_exact_text`, on both models and
for every K; the formula column is 2(n-1)/n N / K. DDP sends
{glue}`gpt_ddp_extra` bytes a step more than its gradients, on both
models: the count of examples, one int64, that it all-reduces to average
over the global batch. The "vs DDP" columns are each method's bytes and
time per step over DDP's.

**Steps.** The target is DDP's held-out loss half-way through its run
(step {glue}`gpt_half`): {glue}`gpt_target` on the GPT
({glue}`gpt_params` parameters), {glue}`cnn_target` on the CNN. The loss
is read at the syncs only (a method that syncs every K steps can reach
the target at a multiple of K only), and it wobbles, so DDP itself may
reach its half-way loss earlier (at step {glue}`gpt_ddp_target_step` on
the GPT, {glue}`cnn_ddp_target_step` on the CNN). Every method:

{glue}`steps_table`

A method that syncs less often {glue}`steps_verdict`: its replicas drift
apart between syncs. But it needs far fewer bytes to get there, and that
is what a slow link charges for. The last column is the crossover of the
model of time: the bandwidth 1/β below which the method reaches the
target before DDP does. Band by band, the fastest on the GPT is:
{glue}`bands_text`. At this machine's shared memory (a measured
{glue}`measured_link`) the model says {glue}`gpt_fastest_here`; and
{glue}`model_agrees_text`. The model takes one compute time per step for
all methods (their median), and leaves out what DDP does besides sending
(its buckets and hooks); at a link this fast, such differences decide.
The DiLoCo paper syncs every 500 inner steps, and its outer learning rate
0.7 and momentum 0.9 are chosen for that; with K as small as here,
{glue}`never_text`.
""")

# %% [markdown]
# ## What to take away
#
# * An elastic restart is the answer that works for every strategy: the
#   job ends, starts again and resumes from its last whole checkpoint; it
#   costs the restart and the steps since the checkpoint, half an interval
#   on average. DDP with a global-batch sampler resumes to the same
#   weights, bit for bit on the same world size.
# * Fault-tolerant DP costs a small all_reduce a step and loses at most
#   the step in flight: the quorum tells the survivors who is left, they
#   divide by the live count, and a step whose all_reduce lost a member is
#   never applied.
# * On a slow link, sending the same all_reduce K times less often can
#   beat sending it every step, once the link's β is large enough; the
#   crossover is where the model's two lines, straight against β, meet.
#
# Try it: the exercise `minidist exercise start quorum_allreduce` asks you
# to write section 2's all_reduce over the live replicas and the step's
# verdict (a replica is killed while your code runs), and
# `minidist exercise start diloco_outer_step` DiLoCo's outer step; each
# tells the known mistakes apart. `minidist run --max-restarts 2 -n 2:4 examples/elastic_training.py
# --kill-rank 1 --kill-step 23 --fault lost` restarts on fewer ranks; and
# `python scripts/chaos_ftdp.py --runs 5` strikes random replicas.

# %%
WORK.cleanup()
