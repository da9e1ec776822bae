"""Chaos for fault-tolerant data parallel: many runs, a random replica failing
at a random step in each, every way it can fail, on pipe and shm.

    python scripts/chaos_ftdp.py --runs 50

Each run (world 5: replicas 0-3 and a spare) must either finish with every
rank's weights equal to one process replaying its quorums, or end with an
error naming the culprit within seconds; and leave no /dev/shm segment and
no child process behind. The table: fault x transport -> runs, finished
right, ended naming the culprit, the median seconds from the fault to the
next committed step (the group going on).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

import numpy as np

import minidist
from minidist.parallel.resilience import RegressionProblem, ReplicaFault, replay, train

KINDS = ("sigkill", "exit", "raise", "sigstop")
TRANSPORTS = ("pipe", "shm")


def _shm() -> set:
    """This process's runs' segments (their names carry the launcher's pid;
    other programs on the machine have theirs)."""
    try:
        return {name for name in os.listdir("/dev/shm") if f"_{os.getpid()}_" in name}
    except OSError:
        return set()


def _children() -> set:
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as file:
            return set(file.read().split())
    except OSError:
        return set()


def _right(results, problem, lost) -> bool:
    replicas = [r for rank, r in enumerate(results) if rank != lost and r[0].role != "spare"]
    history = replicas[0][0].history
    if [record.step for record in history] != list(range(problem.steps)):
        return False
    reference = replay(problem, history)
    for result, weights in replicas:
        if result.history != history:
            return False
        for step, arrays in weights.items():
            for got, want in zip(arrays, reference[step]):
                if not np.allclose(got, want, rtol=1e-9, atol=1e-12):
                    return False
    return True


def _going_on_seconds(results, lost, fault_time: float) -> float | None:
    """From the fault to the first commit after it, as rank 0's clock saw it."""
    first = next(r for rank, r in enumerate(results) if rank != lost)
    times = [t for t in first[0].commit_times if t > fault_time]
    return min(times) - fault_time if times else None


def one_run(kind: str, transport: str, rng: random.Random, problem: RegressionProblem) -> dict:
    lost, step = rng.randrange(4), rng.randrange(1, problem.steps - 1)
    where = rng.choice(("compute", "allreduce"))
    with tempfile.NamedTemporaryFile(suffix=".time", delete=False) as file:
        time_file = file.name
    before_shm, before_children = _shm(), _children()
    fault = ReplicaFault(lost, step, kind, where, time_file=time_file)
    outcome = {"right": False, "named": False, "seconds": None, "leak": ""}
    started = time.monotonic()
    try:
        results = minidist.launch(train, world_size=5, transport=transport,
                                  args=(problem, 4, fault), tolerate_failures=True, timeout=30)
        outcome["right"] = _right(results, problem, lost)
        with open(time_file) as file:
            outcome["seconds"] = _going_on_seconds(results, lost, float(file.read()))
    except minidist.distributed.WorkerError as error:
        # Ending is allowed only quickly and naming the rank that failed.
        outcome["named"] = (f"rank {lost}" in str(error).split("\n")[0]
                            and time.monotonic() - started < 30)
    finally:
        os.unlink(time_file)
    time.sleep(0.05)
    left_shm = sorted(_shm() - before_shm)
    left_children = sorted(_children() - before_children)
    if left_shm or left_children:
        outcome["leak"] = f"segments {left_shm}, children {left_children}"
    return outcome


def _nothing():
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="runs per fault and transport")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    problem = RegressionProblem(steps=args.steps)
    # One run first: a process's first segment starts its reaper, a child
    # that stays by design (it unlinks the segments if this process is
    # SIGKILLed); it is not a run's leftover.
    minidist.launch(_nothing, world_size=2, transport="shm")
    print(f"{'fault':8} {'transport':9} {'runs':>5} {'finished right':>15} {'ended named':>12} "
          f"{'median s to going on':>21}")
    bad = 0
    for kind in args.kinds.split(","):
        for transport in args.transports.split(","):
            outcomes = [one_run(kind, transport, rng, problem) for _ in range(args.runs)]
            right = sum(o["right"] for o in outcomes)
            named = sum(o["named"] for o in outcomes)
            seconds = [o["seconds"] for o in outcomes if o["seconds"] is not None]
            median = f"{statistics.median(seconds):.2f}" if seconds else "-"
            print(f"{kind:8} {transport:9} {len(outcomes):5} {right:15} {named:12} {median:>21}")
            for outcome in outcomes:
                if outcome["leak"]:
                    print(f"  left behind: {outcome['leak']}")
            bad += sum(not (o["right"] or o["named"]) or bool(o["leak"]) for o in outcomes)
    print("every run finished right or ended naming the culprit, nothing left behind"
          if not bad else f"{bad} run(s) went wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
