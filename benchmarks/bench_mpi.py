"""The mpi transport against MPICH itself, in the same mpiexec job.

    .venv/bin/python benchmarks/bench_mpi.py            # n = 2 and 4, 4 KiB and 64 MiB
    .venv/bin/python benchmarks/bench_mpi.py --quick    # smaller, for the smoke test

Started without mpiexec, it starts itself with ``mpiexec -n N`` for each N
and prints one table. Inside each job, all in one run, interleaved (the
order of the contenders turns every round) and repeated:

* all_reduce of float32 arrays (4 KiB and 64 MiB): minidist's ring, minidist's
  "auto" (the cost model's pick for the size), both on the mpi transport, and
  ``algorithm="native"``: MPICH's own MPI_Allreduce on the same communicator.
  A call's time is the slowest rank's (what the next step waits for); each
  figure is the median of the rounds;
* point-to-point (n = 2 only): ping-pong of 8 B to 64 MiB, minidist's
  ``dist.send`` / ``dist.recv`` (the mpi transport: a header, then the
  payload in pieces of 256 KiB) against raw mpi4py ``Send`` / ``Recv`` of the
  same NumPy buffer on COMM_WORLD. One-way time = round trip / 2.

Writes ``benchmarks/results/mpi.json``. Needs ``pip install -e '.[mpi]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KIB, MIB = 1024, 1024 * 1024


def _under_mpi() -> bool:
    return any(name in os.environ for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"))


# --------------------------------------------------------------------------- inside the job


def _time_all_reduce(dist, MPI, nbytes: int, algorithm: str, calls: int) -> float:
    array = np.ones(nbytes // 4, np.float32)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(array, algorithm=algorithm)
    mine = np.array([(time.perf_counter() - start) / calls])
    slowest = np.empty(1)
    MPI.COMM_WORLD.Allreduce(mine, slowest, op=MPI.MAX)
    return float(slowest[0])


def _pingpong(send, recv, buffer, rank: int, rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        if rank == 0:
            send(buffer, 1)
            recv(buffer, 1)
        else:
            recv(buffer, 0)
            send(buffer, 0)
    return (time.perf_counter() - start) / rounds / 2


def job(args) -> None:
    import minidist.distributed as dist
    from minidist.distributed.transport.mpi import load_mpi

    MPI = load_mpi()
    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    comm = MPI.COMM_WORLD
    out = {"world_size": n, "all_reduce": {}, "p2p": {},
           "library": MPI.Get_library_version().split(",")[0].strip()}
    sizes = [4 * KIB, (4 if args.quick else 64) * MIB]
    algorithms = ["ring", "auto", "native"]
    for nbytes in sizes:
        calls = 200 if nbytes < MIB else 2
        times = {a: [] for a in algorithms}
        for a in algorithms:  # warm-up: first-call costs (plans, scratch, MPI connections)
            _time_all_reduce(dist, MPI, nbytes, a, 1)
        for round_ in range(args.rounds):
            turn = algorithms[round_ % 3:] + algorithms[:round_ % 3]
            for a in turn:
                times[a].append(_time_all_reduce(dist, MPI, nbytes, a, calls))
        out["all_reduce"][nbytes] = {a: float(np.median(t)) for a, t in times.items()}
    if n == 2:
        ptp = [8, 64 * KIB, MIB, 16 * MIB] + ([] if args.quick else [64 * MIB])
        for nbytes in ptp:
            buffer = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
            rounds = 1000 if nbytes < MIB else (20 if nbytes <= 16 * MIB else 5)
            contenders = {
                "minidist": (lambda b, peer: dist.send(b, dst=peer),
                             lambda b, peer: dist.recv(b, src=peer)),
                "mpi4py": (lambda b, peer: comm.Send([b, MPI.BYTE], peer, 77),
                           lambda b, peer: comm.Recv([b, MPI.BYTE], peer, 77)),
            }
            times = {name: [] for name in contenders}
            for send, recv in contenders.values():  # warm-up
                _pingpong(send, recv, buffer, rank, 2)
            for round_ in range(args.rounds):
                names = list(contenders)[round_ % 2:] + list(contenders)[:round_ % 2]
                for name in names:
                    comm.Barrier()
                    times[name].append(_pingpong(*contenders[name], buffer, rank, rounds))
            out["p2p"][nbytes] = {name: float(np.median(t)) for name, t in times.items()}
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


# --------------------------------------------------------------------------- the driver


def _human(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB" \
        if nbytes >= KIB else f"{nbytes} B"


def _seconds(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} us"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--output", default=os.path.join(HERE, "results", "mpi.json"))
    parser.add_argument("--mpiexec", default=None, help="which mpiexec (default: the venv's, "
                        "else the PATH's)")
    args = parser.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 7)
    if _under_mpi():
        job(args)
        return 0
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        print("bench_mpi: mpi4py is not installed: pip install -e '.[mpi]'", file=sys.stderr)
        return 2
    from minidist.bench.common import find_mpiexec, machine

    mpiexec = args.mpiexec or find_mpiexec()
    if mpiexec is None:
        print("bench_mpi: no mpiexec: pip install -e '.[mpi]'", file=sys.stderr)
        return 2
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    results = {"machine": machine(), "rounds": args.rounds, "jobs": []}
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    mpich = "HYDRA" in version or "MPICH" in version
    for n in args.ranks:
        command = [mpiexec, "-n", str(n), sys.executable, os.path.abspath(__file__),
                   "--rounds", str(args.rounds)] + (["--quick"] if args.quick else [])
        job_env = dict(env)
        if mpich and n > (os.cpu_count() or 1):
            # MPICH's shared-memory collectives busy-wait for their peers:
            # with more ranks than cores one 4 MiB MPI_Allreduce took 8 s
            # here. Its generic (point-to-point) algorithms do not.
            job_env["MPIR_CVAR_DEVICE_COLLECTIVES"] = "none"
        done = subprocess.run(command, capture_output=True, text=True, env=job_env,
                              timeout=900)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(f"bench_mpi: the {n}-rank job failed:\n{done.stdout}{done.stderr}",
                  file=sys.stderr)
            return 1
        job_result = json.loads(lines[0][7:])
        job_result["settings"] = {k: v for k, v in job_env.items() if k.startswith("MPIR_CVAR")}
        results["jobs"].append(job_result)
    print(f"all_reduce of float32 on the mpi transport, slowest rank, median of {args.rounds} "
          "interleaved rounds")
    print(f"library: {results['jobs'][0]['library']}; 'native' = its own MPI_Allreduce")
    print(f"{'n':>2} {'size':>7} {'ring':>10} {'auto':>10} {'native':>10} {'ring/nat':>9} "
          f"{'auto/nat':>9}")
    for job_result in results["jobs"]:
        for size, t in job_result["all_reduce"].items():
            if job_result["settings"] and size == next(iter(job_result["all_reduce"])):
                print(f"   (n={job_result['world_size']}: {job_result['settings']})")
            print(f"{job_result['world_size']:>2} {_human(int(size)):>7} {_seconds(t['ring']):>10} "
                  f"{_seconds(t['auto']):>10} {_seconds(t['native']):>10} "
                  f"{t['ring'] / t['native']:>8.2f}x {t['auto'] / t['native']:>8.2f}x")
    for job_result in results["jobs"]:
        if job_result["p2p"]:
            print("\npoint-to-point ping-pong, 2 ranks, one-way time (median)")
            print(f"{'size':>7} {'minidist':>10} {'mpi4py':>10} {'ratio':>7} {'minidist GB/s':>14}")
            for size, t in job_result["p2p"].items():
                gbs = int(size) / t["minidist"] / 1e9
                print(f"{_human(int(size)):>7} {_seconds(t['minidist']):>10} "
                      f"{_seconds(t['mpi4py']):>10} {t['minidist'] / t['mpi4py']:>6.2f}x "
                      f"{gbs:>14.2f}")
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as file:
        json.dump(results, file, indent=1)
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
