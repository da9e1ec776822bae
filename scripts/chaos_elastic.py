"""Random faults through `minidist run --max-restarts`: does every run recover, cleanly?

    python scripts/chaos_elastic.py --runs 50
    python scripts/chaos_elastic.py --each 2        # every fault on every transport, twice

Each run trains examples/elastic_training.py (DDP, 30 steps, a checkpoint
every 10) under ``minidist run --max-restarts 1`` on 2 or 3 ranks, over the
pipe or the shm transport, and strikes one random rank at one random step of
the first attempt with one fault: SIGKILL, ``os._exit(0)`` (a rank that
leaves without a word), an exception, or SIGSTOP (a frozen rank: the
supervisor names it after a few seconds, see minidist/runtime/stopped_ranks.py).

A run passes when all of these hold:

* it finishes (status 0) with weights bit-equal to an unbroken run of the
  same size and transport, or it ends with the faulty rank named as the
  culprit; within ``--deadline`` seconds either way;
* the first failure line names the rank that was struck;
* nothing is left: no shared-memory segment named after the launcher in
  /dev/shm, no rank process alive;
* the checkpoint folder's latest ``step_`` checkpoint loads whole.

It prints one line per run and a table: outcome by fault, and the seconds
from the fault to the first step of the next attempt (median, worst).
The exit status is 1 if any run failed a check.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "elastic_training.py")
FAULTS = ("sigkill", "exit0", "raise", "sigstop")
TRANSPORTS = ("pipe", "shm")
STEPS = 30


def minidist_run(arguments, deadline):
    """Run ``minidist run ARGUMENTS``; (status, stderr, stdout, seconds, launcher pid)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "minidist.cli", "run", *arguments],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        err += f"\n(chaos: killed after the deadline of {deadline} s)"
    return process.returncode, err, out, time.monotonic() - started, process.pid


def leftovers(launcher_pid: int, times_path: str) -> list[str]:
    """Segments named after the launcher, rank processes still alive."""
    from minidist.runtime.segments import creator_prefix

    left = [name for name in os.listdir("/dev/shm") if name.startswith(creator_prefix(launcher_pid))]
    for note in _notes(times_path):
        if note["event"] == "start" and _alive(note["pid"]):
            left.append(f"rank {note['rank']} (pid {note['pid']}) alive")
    return left


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _notes(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as file:
        return [json.loads(line) for line in file if line.strip()]


def recovery_seconds(times_path: str) -> float | None:
    """From the fault to the end of the first step of attempt 1."""
    notes = _notes(times_path)
    fault = next((n["t"] for n in notes if n["event"] == "fault"), None)
    first = next((n["t"] for n in notes if n["event"] == "first_step" and n["attempt"] == 1),
                 None)
    return None if fault is None or first is None else (first - fault) / 1e9


def checkpoint_whole(folder: str) -> str | None:
    """None when the latest checkpoint loads; else what is wrong."""
    import minidist.distributed.checkpoint as dcp
    from minidist.distributed.checkpoint.state_dict import get_state_dict

    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import elastic_training

    steps = sorted(name for name in os.listdir(folder) if name.startswith("step_")) \
        if os.path.isdir(folder) else []
    if not steps:
        return "no checkpoint"
    model, optimizer = elastic_training.build(16)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        dcp.load({"model": model_sd, "optim": optim_sd, "progress": {"step": 0, "extra": {}}},
                 checkpoint_id=os.path.join(folder, steps[-1]), no_dist=True)
    except Exception as error:  # noqa: BLE001 - any failure to load is the finding
        return f"{steps[-1]} does not load: {str(error).splitlines()[0]}"
    return None


def reference(world: int, transport: str, work: str, deadline: float) -> dict:
    out = os.path.join(work, f"unbroken_{world}_{transport}.npz")
    status, err, _, _, _ = minidist_run(["-n", str(world), "--transport", transport, EXAMPLE,
                                         f"--out={out}",
                                         f"--checkpoint-dir={out}.checkpoints"], deadline)
    if status != 0:
        raise SystemExit(f"chaos: the unbroken run on {world} ranks ({transport}) failed:\n{err}")
    return dict(np.load(out))


def one_run(number, fault, transport, world, rank, step, work, references, deadline):
    folder = os.path.join(work, f"run{number}")
    os.makedirs(folder)
    out, times = os.path.join(folder, "weights.npz"), os.path.join(folder, "times.jsonl")
    checkpoints = os.path.join(folder, "checkpoints")
    status, err, _, seconds, pid = minidist_run(
        ["--max-restarts", "1", "-n", str(world), "--transport", transport, EXAMPLE,
         f"--kill-rank={rank}", f"--kill-step={step}", f"--fault={fault}", f"--out={out}",
         f"--times={times}", f"--checkpoint-dir={checkpoints}"], deadline)
    problems = []
    named = f"attempt 1 of 2 failed (rank {rank} " in err
    if not named:
        line = next((text for text in err.splitlines() if "attempt 1 of 2 failed" in text),
                    "no such line")
        problems.append(f"culprit not named as rank {rank}: {line}")
    if status == 0:
        weights = dict(np.load(out))
        expected = references[(world, transport)]
        if not all(np.array_equal(weights[k], expected[k]) for k in expected):
            problems.append("finished with other weights than the unbroken run")
        outcome = "recovered"
    else:
        outcome = "ended, culprit named" if named else "ended"
    if seconds > deadline:
        problems.append(f"took {seconds:.1f} s, past the deadline")
    problems += leftovers(pid, times)
    whole = checkpoint_whole(checkpoints)
    if whole:
        problems.append(whole)
    return {"fault": fault, "transport": transport, "world": world, "rank": rank, "step": step,
            "status": status, "outcome": outcome, "seconds": seconds,
            "recover": recovery_seconds(times), "problems": problems}


def plan(args, rng) -> list[tuple[str, str]]:
    if args.each:
        return [(fault, transport) for fault in FAULTS for transport in TRANSPORTS
                for _ in range(args.each)]
    return [(rng.choice(FAULTS), rng.choice(TRANSPORTS)) for _ in range(args.runs)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="random runs (default 20)")
    parser.add_argument("--each", type=int, default=0,
                        help="instead: this many runs of every fault on every transport")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worlds", default="2,3", help="world sizes to draw from")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds a run may take")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    worlds = [int(w) for w in args.worlds.split(",")]
    runs = [(fault, transport, rng.choice(worlds)) for fault, transport in plan(args, rng)]
    with tempfile.TemporaryDirectory(prefix="chaos-elastic-") as work:
        references = {(w, t): reference(w, t, work, args.deadline)
                      for w, t in sorted({(w, t) for _, t, w in runs})}
        results = []
        for number, (fault, transport, world) in enumerate(runs):
            rank, step = rng.randrange(world), rng.randrange(1, STEPS - 1)
            result = one_run(number, fault, transport, world, rank, step, work, references,
                             args.deadline)
            results.append(result)
            recover = f"{result['recover']:.2f} s" if result["recover"] is not None else "-"
            print(f"{number:3d} {fault:8s} {transport:4s} n={world} rank {rank} step {step:2d}: "
                  f"{result['outcome']}, {result['seconds']:.1f} s, recovery {recover}"
                  + (f"  PROBLEMS: {'; '.join(result['problems'])}" if result["problems"] else ""),
                  flush=True)
    print()
    print(f"{'fault':8s} {'runs':>4s} {'recovered':>9s} {'ended':>5s} {'problems':>8s} "
          f"{'recovery median':>15s} {'worst':>6s}")
    for fault in FAULTS:
        mine = [r for r in results if r["fault"] == fault]
        if not mine:
            continue
        seconds = [r["recover"] for r in mine if r["recover"] is not None]
        median = f"{statistics.median(seconds):.2f} s" if seconds else "-"
        worst = f"{max(seconds):.2f} s" if seconds else "-"
        print(f"{fault:8s} {len(mine):4d} {sum(r['outcome'] == 'recovered' for r in mine):9d} "
              f"{sum(r['outcome'] != 'recovered' for r in mine):5d} "
              f"{sum(bool(r['problems']) for r in mine):8d} {median:>15s} {worst:>6s}")
    bad = [r for r in results if r["problems"]]
    print(f"\n{len(results)} runs, {len(bad)} with problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
