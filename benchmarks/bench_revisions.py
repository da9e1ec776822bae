"""Did a change cost speed? The same timings on two versions of minidist, interleaved.

    .venv/bin/python benchmarks/bench_revisions.py              # working tree vs HEAD
    .venv/bin/python benchmarks/bench_revisions.py main~3 --rounds 7

The other version is checked out (``git worktree``) into a temporary folder.
Each round starts one fresh process per version, in alternating order, and
each process measures, on 2 ranks and each transport:

* a blocking all_reduce of 4 KiB (float32): the mean of 2,000 calls, after
  200 to warm up: the latency path (shared slots, the fast lane);
* a blocking all_reduce of 64 MiB: the best of 5 calls: the bandwidth path;
* a 4 KiB ping-pong: one-way time, the mean of 2,000 round trips;
* a 1F1B pipeline step, 2 stages x 4 micro-batches of a small MLP (so that
  the runtime's own work and its 8 messages weigh, not the arithmetic): the
  mean of 200 steps, after 20.

The table shows each version's best round (the one least disturbed by the
rest of the machine) and the ratio new / old. Rounds alternate so that a
slow spell of the machine falls on both versions alike; compare ratios, not
absolute figures, and treat differences within the spread across rounds
(also printed) as noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import minidist, minidist.distributed as dist

    def measure():
        out = {}
        small = np.zeros(1024, np.float32)  # zeros: a sum of ones would overflow to inf
        for _ in range(200):
            dist.all_reduce(small)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(2000):
            dist.all_reduce(small)
        out["all_reduce 4 KiB (us)"] = (time.perf_counter() - start) / 2000 * 1e6
        big = np.zeros(16 << 20, np.float32)
        dist.all_reduce(big)
        best = float("inf")
        for _ in range(5):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(big)
            best = min(best, time.perf_counter() - start)
        out["all_reduce 64 MiB (ms)"] = best * 1e3
        buffer = np.zeros(4096, np.uint8)
        other = 1 - dist.get_rank()
        for rounds, record in ((200, False), (2000, True)):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(rounds):
                if dist.get_rank() == 0:
                    dist.send(buffer, other)
                    dist.recv(buffer, other)
                else:
                    dist.recv(buffer, other)
                    dist.send(buffer, other)
            if record:
                out["ping-pong 4 KiB one-way (us)"] = \\
                    (time.perf_counter() - start) / rounds / 2 * 1e6
        out["pipeline 1F1B step (us)"] = pipeline_step()
        return out

    def pipeline_step():
        from minidist import Tensor, nn, optim
        from minidist.nn import functional as F
        from minidist.parallel.pipeline import Pipeline
        nn.init.manual_seed(0)
        layers = []
        for _ in range(4):
            layers += [nn.Linear(64, 64), nn.Tanh()]
        pipe = Pipeline(nn.Sequential(*layers), "1f1b", 4)
        optimizer = optim.SGD(pipe.parameters(), lr=0.01)
        x, y = np.ones((32, 64), np.float32), np.zeros((32, 64), np.float32)

        def loss_fn(output, target):
            return F.mse_loss(output, Tensor(target))

        for _ in range(20):
            pipe.step(x, y, loss_fn, optimizer)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(200):
            pipe.step(x, y, loss_fn, optimizer)
        return (time.perf_counter() - start) / 200 * 1e6

    results = {}
    for transport in ("shm", "pipe"):
        for name, value in minidist.launch(measure, world_size=2, transport=transport)[0].items():
            results[f"{transport}: {name}"] = value
    print(json.dumps({"file": minidist.__file__, "results": results}))
""")


def run_child(tree: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    result = subprocess.run([sys.executable, "-c", CHILD], cwd=tree, env=env,
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"the timing process for {tree} failed:\n{result.stderr[-3000:]}")
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    if not answer["file"].startswith(tree):
        raise SystemExit(f"measured {answer['file']}, not the tree {tree}")
    return answer["results"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", nargs="?", default="HEAD",
                        help="git revision to compare the working tree with (default HEAD)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="minidist-base-")
    base = os.path.join(folder, "tree")
    subprocess.run(["git", "worktree", "add", "--detach", base, args.base], cwd=ROOT,
                   check=True, capture_output=True)
    try:
        trees = {"old": base, "new": ROOT}
        rounds: dict[str, list[dict]] = {"old": [], "new": []}
        for index in range(args.rounds):
            order = ("old", "new") if index % 2 == 0 else ("new", "old")
            for which in order:
                rounds[which].append(run_child(trees[which]))
            print(f"round {index + 1} of {args.rounds} done", file=sys.stderr)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", base], cwd=ROOT,
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
    names = list(rounds["old"][0])
    print(f"\nworking tree vs {args.base}, {args.rounds} interleaved rounds, 2 ranks; "
          "best round of each, [min-max] over rounds\n")
    print("| measurement | old | new | new / old |")
    print("|---|---|---|---|")
    for name in names:
        old = [r[name] for r in rounds["old"]]
        new = [r[name] for r in rounds["new"]]
        print(f"| {name} | {min(old):.1f} [{min(old):.1f}-{max(old):.1f}] | "
              f"{min(new):.1f} [{min(new):.1f}-{max(new):.1f}] | {min(new) / min(old):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
