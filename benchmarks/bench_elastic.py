"""Recovery from a killed rank: `minidist run --max-restarts` against starting again by hand.

Both sides train examples/elastic_training.py (a float64 MLP under DDP, 2
ranks, shm, 30 steps, a checkpoint every 10) and SIGKILL rank 1 at step 13
of the first attempt; the time measured is **from the fault to the end of
the first step after it** (the fault's and the step's moments noted by the
ranks on CLOCK_MONOTONIC, one clock for every process):

  elastic   `minidist run --max-restarts 1 -n 2 ...`: the supervisor sees
            the death, stops rank 0, releases the run; the same launcher
            forks two fresh ranks, which load the checkpoint of step 10 and
            run step 10;
  by hand   `minidist run -n 2 ...` ends with the failure (status 1); then a
            new `minidist run -n 2 ...` of the same script on the same
            checkpoint folder: a fresh interpreter, its imports, the forks,
            the load, step 10.

Both redo the same 3 steps (10, 11, 12; the first of them is in the time),
so the difference is the launcher's own start and exit. A round runs both,
the order alternating; the table gives the median over ``--rounds`` rounds
and the median of each round's ratio (by hand / elastic), with the range.

Usage:
  python benchmarks/bench_elastic.py [--rounds 5] [--json results/elastic.json]
  python benchmarks/bench_elastic.py --quick       # 2 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "elastic_training.py")
KILL = ["--kill-rank=1", "--kill-step=13", "--fault=sigkill"]


def minidist_run(arguments) -> int:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "minidist.cli", "run", *arguments], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120).returncode


def notes(path) -> list[dict]:
    with open(path) as file:
        return [json.loads(line) for line in file if line.strip()]


def elastic(work: str) -> float:
    times = os.path.join(work, "elastic.times")
    status = minidist_run(["--max-restarts", "1", "-n", "2", EXAMPLE, *KILL, f"--times={times}",
                           f"--checkpoint-dir={os.path.join(work, 'elastic.ckpt')}"])
    assert status == 0, f"the elastic run ended with status {status}"
    seen = notes(times)
    fault = next(n["t"] for n in seen if n["event"] == "fault")
    first = next(n["t"] for n in seen if n["event"] == "first_step" and n["attempt"] == 1)
    return (first - fault) / 1e9


def by_hand(work: str) -> float:
    folder = os.path.join(work, "hand.ckpt")
    failed, again = os.path.join(work, "hand1.times"), os.path.join(work, "hand2.times")
    status = minidist_run(["-n", "2", EXAMPLE, *KILL, f"--times={failed}",
                           f"--checkpoint-dir={folder}"])
    assert status == 1, f"the run with the fault ended with status {status}"
    status = minidist_run(["-n", "2", EXAMPLE, f"--times={again}", f"--checkpoint-dir={folder}"])
    assert status == 0, f"the run started by hand ended with status {status}"
    fault = next(n["t"] for n in notes(failed) if n["event"] == "fault")
    first = next(n["t"] for n in notes(again) if n["event"] == "first_step")
    return (first - fault) / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    load_at_start = os.getloadavg()[0]
    print(f"{rounds} rounds, {os.cpu_count()} cores, load average {load_at_start:.1f} at the "
          f"start", flush=True)
    measured = {"elastic": [], "by hand": []}
    for index in range(rounds):
        order = ("elastic", "by hand") if index % 2 == 0 else ("by hand", "elastic")
        for side in order:
            with tempfile.TemporaryDirectory(prefix="bench-elastic-") as work:
                started = time.monotonic()
                seconds = (elastic if side == "elastic" else by_hand)(work)
                measured[side].append(seconds)
            print(f"round {index + 1}: {side:8s} recovery {seconds * 1e3:7.1f} ms "
                  f"(the whole side {time.monotonic() - started:.1f} s)", flush=True)
    ratios = [hand / fast for hand, fast in zip(measured["by hand"], measured["elastic"])]
    print()
    print("| recovery (fault -> first step after it) | median | range | / elastic |")
    print("|---|---|---|---|")
    for side in ("elastic", "by hand"):
        values = measured[side]
        ratio = ("1.00" if side == "elastic" else
                 f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
        print(f"| {side} | {statistics.median(values) * 1e3:.0f} ms | "
              f"{min(values) * 1e3:.0f}-{max(values) * 1e3:.0f} ms | {ratio} |")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"rounds": rounds, "cores": os.cpu_count(),
                       "load_average_at_start": load_at_start,
                       "load_average_at_end": os.getloadavg()[0],
                       "seconds": measured, "ratios_by_hand_over_elastic": ratios}, file,
                      indent=1)
        print(f"\nwritten to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
