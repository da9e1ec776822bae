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
# # Lesson 15: parallel hyper-parameter search
#
# Hideki Tsunashima's slides ("分散学習のあれこれ~データパラレルからモデルパラレルまで~")
# end their tour of distributed training (ChainerMN's data and model
# parallelism, from the 2019 Tokyo Tech distributed deep learning hackathon)
# with Optuna: the search for a learning rate, a width, a weight decay, run
# on many GPUs at once. Tsunashima did not get it running in time and left
# the links. This chapter runs it.
#
# There are two ways to spend n workers on a search. Tsunashima's Optuna
# example makes each *trial* data-parallel (the workers train one model
# together and aggregate its loss), which needs every collective of the
# earlier chapters. The other way needs none: run n *trials* at once, one per
# worker. Trial 7 (train with lr 0.03 and 64 hidden units) needs nothing
# from trial 8: the search is **embarrassingly parallel**. The workers share
# only two things: which trials are still to run, and what came out.
#
# 1. the objective: one trial trains the digits MLP and returns its
#    validation accuracy;
# 2. plain random search on n worker processes (no dependency): the results
#    table, and the trials over time per worker; the same seed gives the same
#    trials whatever the number of workers;
# 3. a trial that raises and a worker that dies in the middle of a trial;
# 4. the same objective with Optuna: one study in a journal file shared by
#    the workers, its TPE sampler (Tree-structured Parzen Estimator, Bergstra,
#    Bardenet, Bengio and Kégl, "Algorithms for Hyper-Parameter Optimization",
#    2011) learning from every worker's trials, the median pruner
#    stopping hopeless trials early, and what that saved;
# 5. a crash under Optuna: the trial marked FAIL, the study resumed;
# 6. the one number the test set is for.
#
# Library code: `minidist/search/` (`random_search.py`, `optuna_search.py`,
# `space.py`, `journal.py`, `objectives.py`, `plots.py`);
# `benchmarks/bench_search.py` measures the scaling.

# %%
import os
import time
import warnings
from collections import Counter

from minidist.distributed.launch import cores
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
from minidist.lesson_timing import Load
from minidist.runtime.errors import OversubscriptionWarning
from minidist.search import (
    Trial,
    optuna_available,
    optuna_search,
    random_search,
)
from minidist.search.objectives import DIGITS_SPACE, digits_split, train_digits_trial
from minidist.search.plots import plot_best_so_far, plot_trials_over_time
from minidist.search.space import sample_params, trial_seed

narrate()  # run as a script: the text below is printed between the outputs
use_headless_matplotlib()

import matplotlib.pyplot as plt  # noqa: E402

QUICK = quick()
OUT = output_dir()
WORKERS = min(cores(), 4)
N_RANDOM = 12 if QUICK else 48
N_OPTUNA = 24 if QUICK else 80
warnings.simplefilter("ignore", OversubscriptionWarning)
print(f"{WORKERS} workers on {os.cpu_count()} cores; {N_RANDOM} random trials, "
      f"{N_OPTUNA} Optuna trials{' (quick form)' if QUICK else ''}")
glue("form_note",
     f"This is the quick form (MINIDIST_LESSON_QUICK=1): {N_RANDOM} trials of random search and "
     f"{N_OPTUNA} of Optuna's (the full form: 48 and 80), so its tables and pictures are shorter "
     "and its counts (pruned trials, the best found) are one small run's." if QUICK else
     f"This is the full form: {N_RANDOM} trials of random search and {N_OPTUNA} of Optuna's (the "
     "quick form, MINIDIST_LESSON_QUICK=1: 12 and 24). Both counts are constants at the top of "
     "the lesson's first code cell, N_RANDOM and N_OPTUNA.")

# %% jupyter={"source_hidden": true}
say("""
{glue}`form_note`
""")

# %% [markdown]
# ## 1. One trial
#
# The search space is a dict of distributions, one per hyper-parameter. A
# learning rate is drawn *log-uniformly*: as likely between 0.001 and 0.01
# as between 0.1 and 1, because what matters is its order of magnitude.
# (The space also reaches 1e-4, too slow for ten epochs: a deliberately bad
# region, food for the pruner later.)

# %%
for name, distribution in DIGITS_SPACE.items():
    print(f"{name:>13}: {distribution}")

# %% [markdown]
# A trial trains `64 -> hidden -> 10` with momentum SGD on 80 % of the
# training digits for 10 epochs (batches of 8) and returns its accuracy on
# the other 20 %, the **validation** split. After each epoch it reports the
# accuracy so far (`trial.report(accuracy, epoch)`), which a pruner can read.
# The test set stays untouched until the very end: choosing the best of many
# trials by their test accuracy would make that number an optimistic guess.
#
# The parameters of the trial numbered i are drawn from a generator seeded
# with `(seed, i)`, and so is its `trial.seed` (the weights, the data order).
# One trial on its own: number 3 of the searches below (their seed is 0),
# which the search will give the same accuracy:

# %%
DATA = digits_split()


def objective(trial):
    return train_digits_trial(trial, epochs=10, batch_size=8, data=DATA)


def shown(params):
    """The parameters as printed: floats to 4 significant digits (a weight decay of 1.6e-06
    is not 0)."""
    return "{" + ", ".join(f"'{k}': {v:.4g}" if isinstance(v, float) else f"'{k}': {v}"
                           for k, v in params.items()) + "}"


params = sample_params(DIGITS_SPACE, seed=0, number=3)
started = time.perf_counter()
accuracy = objective(Trial(3, params, seed=trial_seed(0, 3), worker=0))
one_trial = time.perf_counter() - started
print(f"trial 3: {shown(params)}")
print(f"validation accuracy {accuracy:.4f} in {one_trial:.2f} s")

# %% [markdown]
# ## 2. Random search on n worker processes
#
# `random_search(objective, space, n_trials, n_workers, seed)` starts the
# workers with `minidist.launch`. Which worker runs which trial? A **shared
# counter** in the search's folder: a worker that is free locks it, takes the
# next number and runs that trial (dynamic assignment). Nobody waits while
# trials are left, however different their costs, and a dead worker's
# trials are simply taken by the others. Each worker appends a line to a
# journal (`trials.jsonl`) when a trial starts and when it ends: the
# search's whole state is in that file, not in any process.
#
# The same search with one worker, then with n:

# %%
searches = {}
walls = {count: [] for count in sorted({1, WORKERS})}
load = Load.start()
# Twice each, in the order 1, n, n, 1: a burst of other work, or load that
# grows or fades, weighs on both counts alike; each keeps its faster run.
for count in sorted(walls) + sorted(walls, reverse=True):
    search = random_search(objective, DIGITS_SPACE, N_RANDOM, n_workers=count, seed=0)
    if count not in searches or search.wall_time < searches[count].wall_time:
        searches[count] = search   # each count keeps its faster run: the one shown
    walls[count].append(search.wall_time)
load = load.finish()
for count in sorted(walls):
    print(f"{count} worker{'s' if count > 1 else ''}: runs of "
          + " and ".join(f"{w:.2f} s" for w in walls[count]) + "; the faster one:")
    print("  " + searches[count].summary())

one, many = searches[1], searches[WORKERS]
same = ([(t.params, t.value) for t in one.trials] == [(t.params, t.value) for t in many.trials])
print(f"\nsame parameters and values with 1 and {WORKERS} workers: {same}")
assert same
trial_3 = next(t for t in one.trials if t.number == 3)
print(f"trial 3 in the search: validation accuracy {trial_3.value:.4f}, "
      f"{'the same as' if trial_3.value == accuracy else 'NOT the same as'} on its own above")
assert trial_3.value == accuracy and trial_3.params == params
print(f"trials per worker: {many.trials_per_worker()}")
speedup = min(walls[1]) / min(walls[WORKERS])
limit = min(WORKERS, cores())   # n workers on C cores run at most min(n, C) trials at once
print(f"speed-up with {WORKERS} workers (the faster of two runs each, the workers' start "
      f"included): {min(walls[1]):.2f} s / {min(walls[WORKERS]):.2f} s = {speedup:.2f}x; "
      f"at most {limit}x on {cores()} cores ({load.describe()})")
if speedup > 1.1 * limit or load.busy:
    print("  not a speed-up to trust: "
          + ("above what the cores allow; " if speedup > 1.1 * limit else "")
          + (f"the machine was busy ({load.describe()}), and other programs took the cores "
             "from the two runs unequally. " if load.busy else "")
          + "`python benchmarks/bench_search.py` measures it with interleaved repeats")

# %% [markdown]
# The results, best first:

# %%
print(many.table(limit=None if not QUICK else 12))

# %% [markdown]
# Every trial over time, one row per worker (the number on each bar is the
# trial's): the workers are busy from start to end, each taking the next
# trial as soon as it is free.

# %%
figure, axes = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
plot_trials_over_time(one, ax=axes[0], title=f"1 worker: {one.wall_time:.1f} s")
plot_trials_over_time(many, ax=axes[1],
                      title=f"{WORKERS} workers: {many.wall_time:.1f} s, the same trials")
figure.tight_layout()
show_figure(figure, "search_random_gantt.png", dpi=90)
glue("workers", WORKERS)
glue("speedup", speedup, ".2f")
glue("limit", limit)
glue("time_share", 1 / speedup, ".0%")
glue("wall_one", min(walls[1]), "{:.2f} s")
glue("wall_many", min(walls[WORKERS]), "{:.2f} s")
glue("busy", load.busy)
glue("speedup_verdict",
     "more than the cores allow: a number not to trust" if speedup > 1.1 * limit
     else f"but the machine was busy ({load.describe()}): other programs took the cores from "
          "the runs unequally, so the number is not one to trust" if load.busy
     else "near 1/n of the time, as many workers as cores allow" if speedup >= 0.8 * limit
     else "more than 1/n of the time: the workers' start and the load beside the search "
          "take their share")

# %% jupyter={"source_hidden": true}
say("""
With as many workers as cores the same trials could take about 1/n of the
time. Here {glue}`workers` workers took {glue}`time_share` of one worker's
time ({glue}`wall_many` against {glue}`wall_one`, each count's faster run, the
ones printed above: a speed-up of {glue}`speedup`, at most {glue}`limit` on these cores):
{glue}`speedup_verdict`. The benchmark (`benchmarks/bench_search.py`)
measures it with trials of equal cost and interleaved repeats; more workers
than cores take turns and run no more trials per second than as many as the
cores.
""")

# %% [markdown]
#
# ## 3. When a trial fails, and when a worker dies
#
# Two different accidents. An objective that **raises** (a NaN loss, a
# configuration that does not fit) is caught in the worker: its trial is
# `failed` with the error, and the worker takes the next number. A worker
# **process that dies** in the middle of a trial (killed, out of memory, a
# crash in a library) cannot report anything. The runtime lets it go
# (`minidist.launch(..., tolerate_failures=True)`) and the search reads the
# journal: a trial with a start line and no end line is the one its worker
# died in.
#
# Both accidents are planted: `fragile` below is the same objective, except
# that trial 2 raises `FloatingPointError("the loss went to NaN")` before it
# trains (its parameters are harmless: section 2 trained the same trial 2 to
# completion) and trial 5's process exits on the spot, as if killed.

# %%
def fragile(trial):
    if trial.number == 2:
        raise FloatingPointError("the loss went to NaN")
    if trial.number == 5:
        os._exit(1)  # the process vanishes mid-trial, as if killed
    return objective(trial)


crashed = random_search(fragile, DIGITS_SPACE, 8, n_workers=WORKERS, seed=0)
print(crashed.summary())
print(crashed.table())
assert {t.number for t in crashed.by_state("failed")} == {2, 5}

# %% [markdown]
# The survivors ran every other trial; with one worker the search would stop
# at the crash (nobody is left to take the next number), with its journal
# intact.
#
# ## 4. The same objective with Optuna
#
# Random search ignores what it has learned. Optuna's TPE sampler
# (Tree-structured Parzen Estimator, Bergstra et al., 2011) proposes the next
# trial from the finished ones (it models where good results lie, and where
# bad ones do, and draws where the ratio favours the good),
# and its **median pruner** stops a trial whose accuracy so far is below
# the median of the other trials' at the same epoch. Both need every
# worker's results, so the workers share one *study* through a storage all
# of them open: here Optuna's journal file (`JournalFileStorage`: an
# append-only log of operations, locked for each write; a database URL like
# `sqlite:///search.db` works too). The parent creates the study; each
# worker runs `optuna.load_study(...)` and `study.optimize(...)`, one trial
# per ticket of the shared counter, with its own seed (the same seed in
# every worker would make them propose the same trials).
#
# Optuna is an optional extra of minidist. Without it, sections 4 and 5 are
# skipped (the cell below says how to install it); with it, the cell prints
# its version.

# %%
HAVE_OPTUNA = optuna_available()
if not HAVE_OPTUNA:
    print("Optuna is not installed, so sections 4 and 5 are skipped. To run them:\n"
          "    pip install -e '.[search]'      (or: pip install 'optuna>=4')")
else:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"Optuna {optuna.__version__}")

# %%
if HAVE_OPTUNA:
    journal = OUT / "digits_search.journal"
    journal.unlink(missing_ok=True)
    optuna_load = Load.start()
    tuned = optuna_search(objective, DIGITS_SPACE, N_OPTUNA, n_workers=WORKERS, seed=0,
                          storage=str(journal), sampler="tpe", pruner="median")
    optuna_load = optuna_load.finish()
    print(tuned.summary())
    print(tuned.table(limit=12))

# %% [markdown]
# What pruning saved: a complete trial trains 10 epochs; a pruned one stops
# at the epoch the pruner judged it hopeless.

# %%
if HAVE_OPTUNA:
    epochs_run = sum(len(t.intermediate) for t in tuned.trials)
    epochs_full = 10 * len(tuned.trials)
    busy = sum(t.duration for t in tuned.trials)
    pruned = tuned.by_state("pruned")
    print(f"{len(pruned)} of {len(tuned.trials)} trials pruned; epochs trained "
          f"{epochs_run} of {epochs_full} ({100 * (1 - epochs_run / epochs_full):.0f} % saved)")
    print(f"worker time per trial: {busy / len(tuned.trials):.3f} s, against "
          f"{sum(t.duration for t in many.trials) / len(many.trials):.3f} s for the random "
          "search's full trials")
    if pruned:
        stopped_at = Counter(len(t.intermediate) for t in pruned)
        print("pruned trials by the epochs they ran: "
              + ", ".join(f"{n} epochs: {stopped_at[n]}" for n in sorted(stopped_at) if n < 10)
              + (f"; and {stopped_at[10]} pruned at their last report, after all 10 epochs "
                 "(the pruner judges after every epoch, the last one too: nothing saved)"
                 if stopped_at[10] else "")
              + f"; their mean accuracy when stopped {sum(t.value for t in pruned) / len(pruned):.3f}")
    random_epoch = sum(t.duration for t in many.trials) / (10 * len(many.trials))
    tuned_epoch = busy / epochs_run
    hidden_random = sum(t.params["hidden"] for t in many.trials) / len(many.trials)
    hidden_tuned = sum(t.params["hidden"] for t in tuned.trials) / len(tuned.trials)
    print(f"worker time per epoch trained: Optuna {tuned_epoch:.3f} s, random {random_epoch:.3f} s;"
          f" mean hidden width: Optuna {hidden_tuned:.0f}, random {hidden_random:.0f}")
    random_best, tuned_best = many.best, tuned.best
    print(f"best validation accuracy: random {random_best.value:.4f}, "
          f"Optuna {tuned_best.value:.4f}")
    at_two = Counter(len(t.intermediate) for t in pruned)[2]
    glue("pruned", len(pruned))
    glue("trials", len(tuned.trials))
    glue("pruned_share", len(pruned) / len(tuned.trials), ".0%")
    glue("at_two", at_two)
    glue("two_verdict", "Most pruned trials stop" if 2 * at_two > len(pruned) else
         "Not most pruned trials stop, here, though many can")
    share = len(pruned) / len(tuned.trials)
    glue("half_verdict", ("a few of the trials are" if share < 0.15 else
                          "about a quarter of the trials are" if share < 0.29 else
                          "about a third of the trials are" if share < 0.42 else
                          "about half the trials are" if share < 0.58 else
                          "about two thirds of the trials are" if share < 0.71 else
                          "about three quarters of the trials are" if share < 0.85 else
                          "nearly all the trials are"))
    glue("tuned_per_trial", busy / len(tuned.trials), "{:.3f} s")
    glue("random_per_trial", sum(t.duration for t in many.trials) / len(many.trials),
         "{:.3f} s")
    saved = busy / len(tuned.trials) < sum(t.duration for t in many.trials) / len(many.trials)
    glue("tuned_epoch", tuned_epoch, "{:.3f} s")
    glue("random_epoch", random_epoch, "{:.3f} s")
    glue("hidden_tuned", hidden_tuned, ".0f")
    glue("hidden_random", hidden_random, ".0f")
    glue("epochs_saved", 1 - epochs_run / epochs_full, ".0%")
    glue("saving_verdict", "The saving is in worker time per trial" if saved
         else "This time pruning saved no worker time per trial")
    glue("saving_then",
         "the search, with the same number of trials, finishes sooner, or, in the same time, "
         "tries more" if saved else
         "so the search took no less worker time than random search's for its trials. "
         "Pruning cut the epochs trained (by {}), but an epoch of Optuna's trials cost "
         "{} of worker time against {} for random search's. An Optuna trial's time, from "
         "its creation in the study to its end, also holds what a random trial does not "
         "do: TPE's proposal, made from every finished trial, and, after every epoch, the "
         "report written to the shared journal and the pruner's reading of every other "
         "trial's curve from it, costs that grow with the trials finished{}{}".format(
             glued("epochs_saved"), glued("tuned_epoch"), glued("random_epoch"),
             "; and TPE chose wider layers, whose epochs cost more (a mean hidden width of "
             f"{hidden_tuned:.0f} against {hidden_random:.0f})"
             if hidden_tuned > 1.1 * hidden_random else "",
             "; and the machine was busy (random search: " + load.describe() + "; Optuna's: "
             + optuna_load.describe() + "), which weighs on the two searches unequally"
             if load.busy or optuna_load.busy else ""))

# %% jupyter={"source_hidden": true}
if HAVE_OPTUNA:
    say("""
{glue}`two_verdict` after two epochs ({glue}`at_two` of {glue}`pruned`): the
pruner judges from the second report on
(`MedianPruner(n_startup_trials=4, n_warmup_steps=1)`), once four trials
have finished. The median rule is blunt: once warm, any trial below the
median curve so far is stopped, so {glue}`half_verdict` ({glue}`pruned` of
{glue}`trials` here, {glue}`pruned_share`), and a late bloomer (slow start,
good finish) can be among them. {glue}`saving_verdict` ({glue}`tuned_per_trial`
against {glue}`random_per_trial` for the random search's full trials):
{glue}`saving_then`.
""")

# %% [markdown]
# One picture, two panels: on the left Optuna's trials over time, one row
# per worker, as section 2 drew the random search's (the hatched bars are
# pruned trials, short; each bar's trial number is on it or just above it);
# on the right the best validation accuracy found so far against time, for
# both searches:

# %%
if HAVE_OPTUNA:
    figure, axes = plt.subplots(1, 2, figsize=(12, 3.4), gridspec_kw={"width_ratios": [2, 1]})
    plot_trials_over_time(tuned, ax=axes[0])
    plot_best_so_far([many, tuned], ax=axes[1],
                     labels=[f"random, {WORKERS} workers", "Optuna TPE + median pruner"])
    axes[1].set_ylim(0.8, 1.0)
    axes[1].set_ylabel("best validation accuracy so far")
    figure.tight_layout()
    show_figure(figure, "search_optuna_gantt.png", dpi=90)

# %% [markdown]
# Optuna draws its own pictures from the study (`optuna.visualization.matplotlib`):
# each trial's learning curve, the validation accuracy after each epoch
# (the pruned ones cut short; the lesson relabels the axes, colours the
# curves by the trial's state and adds a legend), and the accuracy of every
# *complete* trial in order with the best so far (Optuna's history leaves
# the pruned trials out: their last value is not a result).

# %%
if HAVE_OPTUNA:
    from optuna.visualization import matplotlib as optuna_plots

    # Optuna's functions make a figure each and switch to the ggplot style:
    # the context puts matplotlib's style back afterwards.
    with warnings.catch_warnings(), plt.style.context("default"):
        warnings.simplefilter("ignore")  # they are marked "experimental"
        curves = optuna_plots.plot_intermediate_values(tuned.study)
        curves.get_legend().remove()  # one entry per trial: too many to read
        # One colour per state instead, and a legend of two entries; Optuna's step
        # is the epoch counted from 0 (trial.report(accuracy, epoch)): shown from 1.
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter, MaxNLocator

        state_of = {f"Trial{t.number}": t.state.name for t in tuned.study.trials}
        colours = {"COMPLETE": "#006BA4", "PRUNED": "#FF800E"}
        for line in curves.get_lines():
            state = state_of.get(line.get_label())
            if state in colours:
                line.set_color(colours[state])
                line.set_alpha(0.6)
        counts_by_state = Counter(state_of.values())
        curves.legend(handles=[Line2D([], [], color=colour, marker="o",
                                      label=f"{state.lower()} ({counts_by_state[state]})")
                               for state, colour in colours.items() if counts_by_state[state]],
                      fontsize=8, loc="lower right")
        curves.xaxis.set_major_locator(MaxNLocator(integer=True))
        curves.xaxis.set_major_formatter(FuncFormatter(lambda step, _: f"{step + 1:.0f}"))
        curves.set_xlabel("epoch")
        curves.set_ylabel("validation accuracy")
        curves.set_title("each trial's validation accuracy per epoch (cut short: pruned)")
        curves.figure.set_size_inches(7, 3.6)
        curves.figure.tight_layout()
        show_figure(curves.figure, "search_optuna_curves.png", dpi=90)
        history = optuna_plots.plot_optimization_history(tuned.study)
        history.set_ylabel("validation accuracy")
        history.set_xlabel("trial number (complete trials only)")
        history.figure.set_size_inches(7, 3.6)
        history.figure.tight_layout()
        show_figure(history.figure, "search_optuna_history.png", dpi=90)

# %% [markdown]
# ## 5. A crash under Optuna, and resuming the study
#
# With a database, Optuna notices dead workers by their *heartbeat* (each
# running trial writes a timestamp; a stale one is failed). The journal file
# has no heartbeat, so the search does it itself: each trial carries its
# worker in its user attributes, and once the launch is over every trial of
# a dead worker still RUNNING is set to FAIL with the worker's error. The
# study in the file stays usable: load it, and run more trials in it.

# %%
if HAVE_OPTUNA:
    first = N_OPTUNA  # the number of the first trial of this new run


    def fragile_under_optuna(trial):
        if trial.number == first + 1:
            os._exit(1)
        return objective(trial)

    resumed = optuna_search(fragile_under_optuna, DIGITS_SPACE, 6, n_workers=WORKERS, seed=0,
                            storage=str(journal), sampler="tpe", pruner="median")
    print(resumed.summary())
    died = [t for t in resumed.trials if t.number == first + 1][0]
    print(f"trial {died.number}: {died.state} ({died.error})")
    study = optuna.load_study(study_name="minidist-search",
                              storage=optuna.storages.JournalStorage(
                                  optuna.storages.journal.JournalFileBackend(str(journal))))
    counts = {}
    for trial in study.trials:
        counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    print(f"the study in {journal.name}, loaded again: {len(study.trials)} trials {counts}")
    assert "RUNNING" not in counts and died.state == "failed"

# %% [markdown]
# ## 6. The test set, once
#
# The search chose on the validation split. The chosen trial is trained
# again (its parameters and its seed: the same model), and the test set,
# never looked at so far, says how good it is.

# %%
from minidist.data import load_digits  # noqa: E402
from minidist.train import evaluate  # noqa: E402

chosen = (tuned if HAVE_OPTUNA else many).best
print(f"chosen: trial {chosen.number} of the {'Optuna' if HAVE_OPTUNA else 'random'} search, "
      f"validation {chosen.value:.4f}, params {shown(chosen.params)}")


again, final_model = train_digits_trial(
    Trial(chosen.number, chosen.params, seed=trial_seed(0, chosen.number), worker=0),
    data=DATA, return_model=True)
print(f"trained again from the trial's seed: validation {again:.4f}")
x_test, y_test = load_digits()[2:]
print(f"test accuracy {evaluate(final_model, x_test, y_test):.4f} on {len(x_test)} digits "
      f"never used to choose")

# %% [markdown]
# ## What to take away
#
# * Independent trials need no communication: n workers run n trials at
#   once, and the search scales with the cores until they run out.
# * A shared counter hands out trials one at a time, so workers stay busy
#   when trials cost different amounts (pruning makes them very different)
#   and a dead worker's share is not lost.
# * Reproducibility comes from drawing trial i's parameters from (seed, i),
#   not from a generator per worker. Optuna with one worker and a seeded
#   sampler is reproducible; with several it is not: what TPE has seen and
#   which curves the pruner compares with depend on the order trials
#   finish. That is the price of a sampler that learns from the others.
# * The state of a search belongs in storage every worker can reach (a
#   journal file, a database), never in a process: then a crash costs one
#   trial, and the study can be loaded and resumed.
#
# Try: `N_OPTUNA = 200` (the number of Optuna's trials, a constant at the top
# of the lesson's first code cell) with `sampler="random"` against `"tpe"`
# (an argument of `optuna_search` in section 4's code cell); a wider
# `hidden` range (`Int(16, 512, log=True)`); the journal on a shared file
# system, with workers started on several machines.
