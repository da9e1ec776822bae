"""How big a world the simulator can take: wall time and peak memory of
``simulate("all_reduce", algorithm, n, 100 MB)``, this tree against a git revision.

    .venv/bin/python benchmarks/bench_simulator.py                 # against HEAD
    .venv/bin/python benchmarks/bench_simulator.py --before main~3 --timeout 120
    .venv/bin/python benchmarks/bench_simulator.py --quick         # n = 256 and 1,024 only
    .venv/bin/python benchmarks/bench_simulator.py --floor         # the double binary tree's floor
    .venv/bin/python benchmarks/bench_simulator.py --topology flat,dgx   # a cluster's shape

The cases: every all_reduce algorithm at n = 1,024 and 4,096, and
the ring at 16,384 and 65,536. Each case runs in a fresh process per version
(so that the peak resident memory, ``ru_maxrss``, is that case's alone),
the two versions one after the other in alternating order, under a time
limit (``--timeout``, a run past it is reported as "> limit") and an
address-space limit (``--memory``, a run past it as "out of memory").

The table shows each version's wall time and peak memory, the ratios
after / before, and whether the two versions computed the same simulated
time (they must: the simulation is exact). The old version cannot finish
the biggest cases (the ring at 65,536 ranks is 8.6 billion messages), so
their "before" is the time limit. Timings on a shared machine are noisy:
compare ratios, and rerun a surprising one.

``--floor``: what the double binary tree's own code costs with no simulator
under it. Every rank's generator runs to its end against a comm whose isend,
irecv and irecv_reduce do nothing (no clock, no queue, no copy), in this
process, at n = 1,024 and 4,096 and 100 MB. A simulator that runs the
algorithm's code cannot take less; the double binary tree is not
symmetric, so it cannot run one rank for all as the ring does.

``--topology flat,dgx``: what a cluster's shape costs the simulator. The
ring and a tree (``reduce_broadcast``: a binomial reduce, then a binomial
broadcast) at n = 4,096 and 65,536, 100 MB, on each named topology
(``flat``: one link for every pair; ``dgx``: :func:`minidist.topology.dgx`
with the nodes n fills, or any text ``parse_topology`` reads), a fresh
process per case: wall time, peak memory, the simulated time and the cost
model's (the two-level formula, "-" where none is given). On a topology
the ring runs node 0's 8 ranks for all instead of rank 0 alone, so 8 times
the messages; the tree runs every rank either way. ``--write FILE``: the
table as Markdown (benchmarks/results/simulator_topology.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGORITHMS = ("coordinator", "reduce_broadcast", "recursive_doubling", "rabenseifner", "ring",
              "double_binary_tree", "two_shot", "one_shot")
NBYTES = 100_000_000

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from minidist.distributed.simulator import simulate
    algorithm, n, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    start = time.perf_counter()
    result = simulate("all_reduce", algorithm, n, nbytes)
    wall = time.perf_counter() - start
    print(json.dumps({"wall": wall, "peak_mb": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024, "time": result.time,
        "predicted": result.predicted, "messages": result.messages}))
""")


TOPOLOGY_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from minidist.distributed.simulator import simulate
    from minidist.topology import parse_topology
    algorithm, n, nbytes, text = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    topology = parse_topology(text, n)
    start = time.perf_counter()
    result = simulate("all_reduce", algorithm, n, nbytes, topology=topology)
    wall = time.perf_counter() - start
    print(json.dumps({"wall": wall, "peak_mb": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024, "time": result.time,
        "predicted": result.predicted, "messages": result.messages,
        "symmetric": result.symmetric}))
""")

#: The cases of --topology: the ring and a tree, at two sizes of world.
TOPOLOGY_CASES = [(algorithm, n) for n in (4096, 65536) for algorithm in ("ring", "reduce_broadcast")]


FLOOR = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from minidist.distributed.collectives.all_reduce import double_binary_tree
    from minidist.distributed.collectives.chunks import double_binary_tree_chunks

    class NullComm:
        # What the algorithm asks of a comm, doing nothing but count the calls.
        def __init__(self, n, rank, nbytes):
            self.size, self.rank, self.nbytes, self.calls = n, rank, nbytes, 0
        def nbytes_of(self, array):
            return self.nbytes
        def at(self, step, phase):
            pass
        def isend(self, array, to, label=""):
            self.calls += 1
        def irecv(self, array, source, label=""):
            self.calls += 1
        irecv_reduce = irecv

    n, nbytes = int(sys.argv[1]), int(sys.argv[2])
    buffer = np.zeros(4 * double_binary_tree_chunks(nbytes), np.float32)
    start, calls = time.perf_counter(), 0
    for rank in range(n):
        comm = NullComm(n, rank, nbytes)
        for _ in double_binary_tree(comm, buffer):
            pass
        calls += comm.calls
    print(json.dumps({"wall": time.perf_counter() - start, "calls": calls}))
""")


def floor(sizes=(1024, 4096)) -> int:
    """Print the double binary tree's floor (see the module's docstring)."""
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    print("| n | messages | the algorithm's code alone (null comm) | per message end |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        done = subprocess.run([sys.executable, "-c", FLOOR, str(n), str(NBYTES)], cwd=ROOT,
                              env=env, capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {n:,} | {result['calls'] // 2:,} | {result['wall']:.2f} s | "
              f"{result['wall'] / result['calls'] * 1e9:.0f} ns |", flush=True)
    print("load average at the end: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    return 0


def cases(quick: bool) -> list[tuple[str, int]]:
    if quick:
        return [(algorithm, n) for n in (256, 1024) for algorithm in ALGORITHMS]
    return ([(algorithm, n) for n in (1024, 4096) for algorithm in ALGORITHMS]
            + [("ring", 16384), ("ring", 65536)])


def run_case(tree: str, algorithm: str, n: int, timeout: float, memory_gb: float,
             topology: str | None = None) -> dict:
    """One simulation in a fresh process on ``tree``'s minidist (on
    ``topology``, text for parse_topology, when given)."""
    env = dict(os.environ, PYTHONPATH=tree, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    limit = int(memory_gb * (1 << 30))

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    start = time.perf_counter()
    try:
        command = ([sys.executable, "-c", CHILD, algorithm, str(n), str(NBYTES)]
                   if topology is None else
                   [sys.executable, "-c", TOPOLOGY_CHILD, algorithm, str(n), str(NBYTES),
                    topology])
        done = subprocess.run(command,
                              cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        return {"status": f"> {timeout:g} s"}
    if done.returncode != 0:
        memory = "MemoryError" in done.stderr or done.returncode in (-9, 137)
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"status": "out of memory" if memory else f"failed: {last[:60]}",
                "elapsed": time.perf_counter() - start}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), status="ok")


def _seconds(result: dict) -> str:
    return f"{result['wall']:.3g} s" if result["status"] == "ok" else result["status"]


def _megabytes(result: dict) -> str:
    return f"{result['peak_mb']:.0f}" if result["status"] == "ok" else "-"


def _ratio(after: dict, before: dict, key: str) -> str:
    if after["status"] != "ok":
        return "-"
    if before["status"] != "ok":
        if before["status"].startswith(">") and key == "wall":
            return f"< {after['wall'] / float(before['status'][2:-2]):.2g}"
        return "-"
    return f"{after[key] / before[key]:.2g}"


def _same(after: dict, before: dict) -> str:
    if after["status"] != "ok" or before["status"] != "ok":
        return "-"
    return "yes" if after["time"] == before["time"] and \
        after["messages"] == before["messages"] else \
        f"NO ({before['time']!r} vs {after['time']!r})"


def topology_table(names: list[str], timeout: float, memory_gb: float,
                   write: str | None = None) -> int:
    """--topology: each case of :data:`TOPOLOGY_CASES` on each topology named."""
    load = os.getloadavg()
    lines = ["| algorithm | n | topology | wall | peak memory | simulated | cost model "
             "| messages | ranks run |", "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    print(lines[0] + "\n" + lines[1], flush=True)
    for algorithm, n in TOPOLOGY_CASES:
        for name in names:
            result = run_case(ROOT, algorithm, n, timeout, memory_gb, topology=name)
            if result["status"] == "ok":
                predicted = result["predicted"]
                ran = ("one node" if name != "flat" else "rank 0") if result["symmetric"] \
                    else "all"
                line = (f"| {algorithm} | {n:,} | {name} | {result['wall']:.3g} s | "
                        f"{result['peak_mb']:.0f} MB | {result['time'] * 1e3:.4g} ms | "
                        + (f"{predicted * 1e3:.4g} ms" if predicted is not None else "-")
                        + f" | {result['messages']:,} | {ran} |")
            else:
                line = f"| {algorithm} | {n:,} | {name} | {result['status']} | - | - | - | - | - |"
            lines.append(line)
            print(line, flush=True)
    end = os.getloadavg()
    footer = (f"load average at the start: {load[0]:.2f}, at the end: {end[0]:.2f}; "
              f"{os.cpu_count()} cores; N = 100 MB; a fresh process a case")
    print("\n" + footer)
    if write:
        with open(write, "w") as file:
            file.write("# The simulator on a cluster's shape (`bench_simulator.py --topology`)\n\n"
                       f"`.venv/bin/python benchmarks/bench_simulator.py --topology "
                       f"{','.join(names)} --write {os.path.relpath(write, ROOT)}`\n\n"
                       + "\n".join(lines) + "\n\n" + footer + "\n")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="HEAD", help="git revision to compare with")
    parser.add_argument("--before-tree", default=None,
                        help="a folder holding the old version instead (no git needed)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one simulation may take (default 120)")
    parser.add_argument("--memory", type=float, default=8.0,
                        help="GiB of address space one simulation may use (default 8)")
    parser.add_argument("--quick", action="store_true", help="n = 256 and 1,024 only")
    parser.add_argument("--only", default=None,
                        help="comma-separated algorithm@n cases, e.g. ring@4096,one_shot@1024")
    parser.add_argument("--jobs", type=int, default=1,
                        help="cases run at once, each pair of versions in one worker (default "
                             "1; more only on a machine with that many idle cores)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--floor", action="store_true",
                        help="only time the double binary tree's own code on a null comm")
    parser.add_argument("--topology", default=None,
                        help="only the ring and a tree at 4,096 and 65,536 ranks on each of "
                             "these topologies, e.g. flat,dgx (separated by ; when one is "
                             "given as key=value pairs)")
    parser.add_argument("--write", default=None,
                        help="with --topology: also write the table here as Markdown")
    args = parser.parse_args(argv)
    if args.floor:
        return floor()
    if args.topology:
        return topology_table(args.topology.split(";") if ";" in args.topology
                              else args.topology.split(","), args.timeout, args.memory,
                              args.write)

    todo = cases(args.quick)
    if args.only:
        todo = [(case.split("@")[0], int(case.split("@")[1])) for case in args.only.split(",")]
    if args.before_tree:
        base = os.path.abspath(args.before_tree)
    else:
        base = tempfile.mkdtemp(prefix="minidist-before-")
        shutil.rmtree(base)
        subprocess.run(["git", "worktree", "add", "--detach", base, args.before], cwd=ROOT,
                       check=True, capture_output=True)
    load = os.getloadavg()
    def pair(index):
        algorithm, n = todo[index]
        order = [("before", base), ("after", ROOT)]
        if index % 2:
            order.reverse()  # a slow spell of the machine falls on both alike
        measured = {}
        for name, tree in order:
            measured[name] = run_case(tree, algorithm, n, args.timeout, args.memory)
        before, after = measured["before"], measured["after"]
        print(f"{algorithm:>19} n={n:>6}: before {_seconds(before):>9} "
              f"{_megabytes(before):>6} MB | after {_seconds(after):>9} "
              f"{_megabytes(after):>6} MB | wall ratio {_ratio(after, before, 'wall'):>8} "
              f"| same time {_same(after, before)}", flush=True)
        return {"algorithm": algorithm, "n": n, "before": before, "after": after}

    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            rows = list(pool.map(pair, range(len(todo))))
    finally:
        if not args.before_tree:
            subprocess.run(["git", "worktree", "remove", "--force", base], cwd=ROOT,
                           capture_output=True)
    print(f"\nload average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at the end: "
          + " ".join(f"{value:.2f}" for value in os.getloadavg())
          + f"; {os.cpu_count()} cores, {args.jobs} case(s) at once")
    print("\n| algorithm | n | before | after | after/before | before MB | after MB "
          "| MB after/before | same simulated time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        before, after = row["before"], row["after"]
        print(f"| {row['algorithm']} | {row['n']:,} | {_seconds(before)} | {_seconds(after)} | "
              f"{_ratio(after, before, 'wall')} | {_megabytes(before)} | {_megabytes(after)} | "
              f"{_ratio(after, before, 'peak_mb')} | {_same(after, before)} |")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"before": args.before, "load": load, "rows": rows}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
