"""Parallel hyper-parameter search: do N workers finish N times the trials of
one in the same wall time?

    .venv/bin/python benchmarks/bench_search.py              # about a minute
    .venv/bin/python benchmarks/bench_search.py --quick      # a smoke run
    .venv/bin/python benchmarks/bench_search.py --workers 1,2,4 --trials-per-worker 8

Weak scaling: with N workers the search runs N x K trials (K per worker), each
of the same fixed cost: the digits MLP (64 -> 64 -> 10, batches of 8, 10
epochs, about 0.13 s on one core) with fixed parameters, whatever the
trial draws, one BLAS thread per worker (the searches set it). Perfect
scaling keeps the wall time of the whole search (from the call to its return: starting the workers,
every trial, the journal, the results) equal to that of one worker running
K trials. Both engines are timed: the plain random search (a ticket counter
and a journal of JSON lines) and Optuna (its journal file storage, the
random sampler, no pruner, so the trials stay equal), each configuration
``--rounds`` times in rotating order, the median reported.

* trials/s = N x K / wall time;
* speed-up = trials/s at N / trials/s at 1 worker (ideal: N, up to the cores);
* wall ratio = wall time at N / wall time at 1 (ideal: 1.0, up to the cores).

More workers than cores is labelled "oversubscribed": the workers take
turns on the cores, and trials/s cannot grow past the cores' count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's minidist, installed or not

from minidist.distributed.launch import cores  # noqa: E402
from minidist.runtime.errors import OversubscriptionWarning  # noqa: E402
from minidist.search import Uniform, random_search  # noqa: E402
from minidist.search.objectives import digits_split, train_digits_trial  # noqa: E402
from minidist.search.optuna_search import optuna_available  # noqa: E402

SPACE = {"unused": Uniform(0.0, 1.0)}
FIXED = {"lr": 0.05, "momentum": 0.9, "hidden": 64, "weight_decay": 1e-4}
DATA = digits_split()


class _Fixed:
    """The trial with its parameters replaced by FIXED: every trial costs the same."""

    def __init__(self, trial):
        self.trial, self.params, self.seed = trial, FIXED, trial.seed

    def report(self, value, step):
        self.trial.report(value, step)

    def should_prune(self):
        return False


def fixed_cost_objective(trial, epochs=10):
    return train_digits_trial(_Fixed(trial), epochs=epochs, batch_size=8, data=DATA)


def one_search(engine: str, workers: int, per_worker: int, epochs: int) -> dict:
    objective = lambda trial: fixed_cost_objective(trial, epochs)  # noqa: E731
    n_trials = workers * per_worker
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        if engine == "random":
            result = random_search(objective, SPACE, n_trials, workers, seed=0)
        else:
            from minidist.search import optuna_search

            result = optuna_search(objective, SPACE, n_trials, workers, seed=0,
                                   storage=os.path.join(folder, "bench.journal"),
                                   sampler="random", pruner="none")
        wall = time.perf_counter() - started
    done = len(result.by_state("complete"))
    if done != n_trials:
        raise RuntimeError(f"{engine} with {workers} workers completed {done} of {n_trials}")
    busy = sum(t.duration for t in result.trials)
    return {"wall": wall, "trial": busy / n_trials, "per_worker": result.trials_per_worker()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--trials-per-worker", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=10, help="per trial: its fixed cost")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-optuna", action="store_true")
    parser.add_argument("--quick", action="store_true", help="1 and 2 workers, 1 round, small")
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    if args.quick:
        workers, args.rounds, args.trials_per_worker, args.epochs = [1, 2], 1, 3, 3
    engines = ["random"] + (["optuna"] if optuna_available() and not args.no_optuna else [])
    if "optuna" not in engines and not args.no_optuna:
        print("Optuna is not installed: timing the plain random search only "
              "(pip install -e '.[search]' for its column)")
    available = cores()
    load = os.getloadavg()
    print(f"os.cpu_count() = {os.cpu_count()}, cores this process may use = {available}, "
          f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{args.trials_per_worker} trials per worker, each {args.epochs} epochs of the digits "
          f"MLP 64-64-10 (batches of 8), 1 BLAS thread; median of {args.rounds} rounds\n")
    warnings.simplefilter("ignore", OversubscriptionWarning)
    if "optuna" in engines:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
    one_search("random", 1, 1, 1)  # warm the caches and the page cache once
    samples = {(e, w): [] for e in engines for w in workers}
    order = [(e, w) for e in engines for w in workers]
    for round_ in range(args.rounds):
        shift = round_ % len(order)
        for engine, count in order[shift:] + order[:shift]:
            samples[engine, count].append(
                one_search(engine, count, args.trials_per_worker, args.epochs))
    rows = []
    print(f"{'engine':8} {'workers':>7} {'trials':>6} {'wall s':>7} {'trials/s':>9} "
          f"{'speed-up':>8} {'wall ratio':>10} {'s/trial':>8}  note")
    for engine in engines:
        base = None
        for count in workers:
            wall = statistics.median(s["wall"] for s in samples[engine, count])
            trial = statistics.median(s["trial"] for s in samples[engine, count])
            n_trials = count * args.trials_per_worker
            rate = n_trials / wall
            base = base or (rate, wall)
            note = "oversubscribed" if count > available else ""
            rows.append({"engine": engine, "workers": count, "trials": n_trials, "wall_s": wall,
                         "trials_per_s": rate, "speedup": rate / base[0],
                         "wall_ratio": wall / base[1], "seconds_per_trial": trial,
                         "oversubscribed": count > available})
            print(f"{engine:8} {count:>7} {n_trials:>6} {wall:7.2f} {rate:9.2f} "
                  f"{rate / base[0]:8.2f} {wall / base[1]:10.2f} {trial:8.3f}  {note}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"cpu_count": os.cpu_count(), "cores": available, "load_average": load,
                       "trials_per_worker": args.trials_per_worker, "epochs": args.epochs,
                       "rounds": args.rounds, "rows": rows}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
