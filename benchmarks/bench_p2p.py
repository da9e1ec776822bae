"""Point-to-point speed of minidist's transports, next to MPICH and memcpy.

    .venv/bin/python benchmarks/bench_p2p.py            # full run (about a minute)
    .venv/bin/python benchmarks/bench_p2p.py --quick    # fewer sizes and repeats

What it measures, all in one run on one machine:

* ping-pong between two ranks: rank 0 sends n bytes, rank 1 receives them into
  a preallocated buffer and sends them back. One-way time = round trip / 2;
  bandwidth = n / one-way time. Sizes: 8 B (latency), then 1 KiB to 256 MiB.
  Each point is the best of several repeats (the machine is shared: the best
  repeat is the one least disturbed);
* the same ping-pong with mpi4py on MPICH (``pip install mpi4py mpich``), run
  by ``mpiexec -n 2`` in a subprocess, with buffer-based ``Send``/``Recv``;
  skipped when mpi4py is not installed;
* a single-core NumPy copy (``np.copyto``) of each size: the memory
  bandwidth one core gets, the natural ceiling of a copy-based transport;
* the cost of tracing: ping-pong latency with tracing off and on, and the
  cost of the disabled check alone.

It then fits, for each transport, the alpha-beta model t(n) = alpha + n * beta
by least squares on relative error (every size weighs the same), prints a
table with ratios, and writes the fit to ``benchmarks/results/p2p.json`` for
the cost model (``minidist.costmodel``) to read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit

import numpy as np

import minidist
from minidist.bench.common import KIB, MIB, find_mpiexec, machine
from minidist.bench.p2p import (
    BYTES_PER_REPEAT,
    exchange,
    fit_alpha_beta,
    fit_exchange_beta,
    iterations,
    pingpong,
)
from minidist.units import format_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
FULL_SIZES = [8] + [KIB * 4**k for k in range(10)]  # 8 B, 1 KiB ... 256 MiB
QUICK_SIZES = [8, KIB, 16 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]


# --------------------------------------------------------------------------- minidist


def measure_exchange(transport, sizes, repeats, quick):
    return minidist.launch(exchange, world_size=2, transport=transport,
                           args=(sizes, repeats, quick))[0]


def measure_transport(transport, sizes, repeats, quick, trace=None):
    return minidist.launch(pingpong, world_size=2, transport=transport,
                           args=(sizes, repeats, quick), trace=trace)[0]


# --------------------------------------------------------------------------- MPICH

MPI_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
    sizes, repeats, counts = json.loads(sys.argv[1])
    best = {}
    for size, count in zip(sizes, counts):
        outgoing = np.ones(size, np.uint8)
        incoming = np.zeros(size, np.uint8)
        for repeat in range(repeats + 1):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(count):
                if rank == 0:
                    comm.Send(outgoing, peer)
                    comm.Recv(incoming, peer)
                else:
                    comm.Recv(incoming, peer)
                    comm.Send(outgoing, peer)
            elapsed = (time.perf_counter() - start) / count / 2
            if repeat:
                best[size] = min(best.get(size, elapsed), elapsed)
    if rank == 0:
        print(json.dumps({"best": best, "version": MPI.Get_library_version().splitlines()[0]}))
""")


def measure_mpich(sizes, repeats, quick):
    """{size: seconds} and the library's version line, or (None, reason)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None, "mpi4py is not installed (pip install mpi4py mpich)"
    mpiexec = find_mpiexec()
    if mpiexec is None:
        return None, "no mpiexec found (pip install mpich)"
    counts = [iterations(size, quick) for size in sizes]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(MPI_SCRIPT)
        script = file.name
    try:
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        done = subprocess.run([mpiexec, "-n", "2", sys.executable, script,
                               json.dumps([sizes, repeats, counts])],
                              capture_output=True, text=True, timeout=1800, env=env)
    finally:
        os.unlink(script)
    if done.returncode != 0:
        return None, f"mpiexec failed: {done.stderr.strip()[-500:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return ({int(size): seconds for size, seconds in result["best"].items()},
            result["version"])


# --------------------------------------------------------------------------- memcpy


def measure_memcpy(sizes, repeats):
    """Best single-core np.copyto time per size."""
    best = {}
    for size in sizes:
        source = np.ones(size, np.uint8)
        target = np.zeros(size, np.uint8)
        count = max(3, min(20000, BYTES_PER_REPEAT // max(size, 1) // 4))
        np.copyto(target, source)
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(count):
                np.copyto(target, source)
            elapsed = (time.perf_counter() - start) / count
            best[size] = min(best.get(size, elapsed), elapsed)
    return best


# --------------------------------------------------------------------------- tracing


def tracing_cost(repeats):
    """One-way 8 B latency on shm with tracing off and on, and the disabled check alone."""
    sizes = [8]
    off = measure_transport("shm", sizes, repeats, quick=False)[8]
    with tempfile.TemporaryDirectory() as directory:
        on = measure_transport("shm", sizes, repeats, quick=False,
                               trace=os.path.join(directory, "bench.trace.jsonl"))[8]
    recorder = None
    check = min(timeit.repeat("recorder is not None", globals={"recorder": recorder},
                              number=1_000_000, repeat=5)) / 1_000_000
    empty = min(timeit.repeat("pass", number=1_000_000, repeat=5)) / 1_000_000
    return {"off_seconds": off, "on_seconds": on,
            "disabled_check_seconds": max(check - empty, 0.0)}


# --------------------------------------------------------------------------- fit and report


def print_table(sizes, results, memcpy, columns):
    header = f"{'size':>8} | " + " | ".join(f"{name:>10}" for name in columns)
    header += f" | {'memcpy':>8} | {'shm/memcpy':>10} | {'shm/MPICH':>9}"
    print(header)
    print("-" * len(header))
    for size in sizes:
        cells = []
        for name in columns:
            seconds = results[name].get(size) if results.get(name) else None
            if seconds is None:
                cells.append(f"{'-':>10}")
            elif size <= 8:
                cells.append(f"{seconds * 1e6:>7.2f} us")
            else:
                cells.append(f"{size / seconds / 1e9:>5.2f} GB/s")
        line = f"{format_bytes(size):>8} | " + " | ".join(cells)
        shm = results["shm"].get(size)
        mpich = results.get("MPICH", {}) or {}
        if size > 8:
            copy = memcpy.get(size)
            line += f" | {size / copy / 1e9:>8.2f}" if copy else f" | {'-':>8}"
            line += f" | {copy / shm:>10.2f}" if copy else f" | {'-':>10}"
        else:
            line += f" | {'-':>8} | {'-':>10}"
        if size in mpich:
            ratio = shm / mpich[size] if size <= 8 else mpich[size] / shm
            line += f" | {ratio:>9.2f}"
        else:
            line += f" | {'-':>9}"
        print(line)
    print("(8 B: one-way latency, lower is better; shm/MPICH there is a time ratio, "
          "elsewhere a bandwidth ratio; memcpy in GB/s)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    parser.add_argument("--repeats", type=int, default=None, help="best of this many")
    parser.add_argument("--no-mpi", action="store_true", help="skip the MPICH comparison")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "p2p.json"))
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    repeats = args.repeats or (3 if args.quick else 5)

    info = machine()
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
          f"NumPy {info['numpy']}")
    results = {}
    exchanges = {}
    for transport in ("pipe", "shm"):
        print(f"measuring {transport} ...", flush=True)
        results[transport] = measure_transport(transport, sizes, repeats, args.quick)
        exchanges[transport] = measure_exchange(
            transport, [size for size in sizes if size >= 64 * KIB], repeats, args.quick)
    mpich_version = None
    if not args.no_mpi:
        print("measuring MPICH (mpi4py) ...", flush=True)
        mpich, mpich_version = measure_mpich(sizes, repeats, args.quick)
        if mpich is None:
            print(f"  skipped: {mpich_version}")
            mpich_version = None
        results["MPICH"] = mpich
    print("measuring memcpy and tracing cost ...", flush=True)
    memcpy = measure_memcpy([size for size in sizes if size > 8], repeats)
    tracing = tracing_cost(repeats)

    columns = [name for name in ("pipe", "shm", "MPICH") if results.get(name)]
    print()
    print_table(sizes, results, memcpy, columns)

    fits = {}
    print()
    print(f"{'transport':>10} | {'alpha (us)':>10} | {'beta (ns/B)':>11} | {'1/beta (GB/s)':>13}"
          f" | {'exchange beta (ns/B)':>20} | {'x beta':>6}")
    for name in columns:
        alpha, beta = fit_alpha_beta(results[name])
        fits[name] = {"alpha_seconds": alpha, "beta_seconds_per_byte": beta,
                      "points": {str(size): seconds for size, seconds in results[name].items()}}
        line = f"{name:>10} | {alpha * 1e6:>10.2f} | {beta * 1e9:>11.4f} | {1 / beta / 1e9:>13.2f}"
        if exchanges.get(name):
            exchange_beta = fit_exchange_beta(exchanges[name], alpha)
            fits[name]["exchange_beta_seconds_per_byte"] = exchange_beta
            fits[name]["exchange_points"] = {str(size): seconds
                                             for size, seconds in exchanges[name].items()}
            line += f" | {exchange_beta * 1e9:>20.4f} | {exchange_beta / beta:>6.2f}"
        print(line)
    print("(exchange beta: seconds per byte when both ranks send and receive at once, as in a "
          "ring step; x beta: how much dearer than one way)")

    big = 64 * MIB
    print()
    print(f"tracing: 8 B one-way {tracing['off_seconds'] * 1e6:.2f} us off, "
          f"{tracing['on_seconds'] * 1e6:.2f} us on; the disabled check costs "
          f"{tracing['disabled_check_seconds'] * 1e9:.0f} ns per message")
    goals = {}
    if big in results["shm"] and big in memcpy:
        goals["shm_64MiB_over_memcpy"] = memcpy[big] / results["shm"][big]
        print(f"goal: shm 64 MiB bandwidth = {goals['shm_64MiB_over_memcpy']:.0%} of memcpy "
              "(goal >= 60 %)")
    mpich = results.get("MPICH") or {}
    if big in mpich:
        goals["shm_64MiB_over_mpich"] = mpich[big] / results["shm"][big]
        print(f"goal: shm 64 MiB bandwidth = {goals['shm_64MiB_over_mpich']:.2f} x MPICH "
              "(goal >= 1)")
    if 8 in mpich:
        goals["shm_8B_latency_over_mpich"] = results["shm"][8] / mpich[8]
        print(f"goal: shm 8 B latency = {goals['shm_8B_latency_over_mpich']:.2f} x MPICH "
              "(goal <= 3)")

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    report = {
        "about": "one-way point-to-point time t(n) = alpha + n * beta between two ranks on "
                 "one machine, from ping-pong, and exchange_beta from both ranks sending at "
                 "once; written by benchmarks/bench_p2p.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "mpich_version": mpich_version,
        "fits": fits,
        "memcpy_seconds": {str(size): seconds for size, seconds in memcpy.items()},
        "tracing": tracing,
        "goals": goals,
    }
    with open(args.output, "w") as file:
        json.dump(report, file, indent=2)
    print(f"\nwritten: {os.path.relpath(args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
