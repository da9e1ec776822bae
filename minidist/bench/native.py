"""The reference columns of ``minidist bench collectives``: the same collectives,
sizes and timing loop on MPICH (through mpi4py, started by ``mpiexec``) and on
PyTorch's gloo backend (``torch.distributed``, one process per rank).

Each side runs as its own processes (``python -m minidist.bench.native mpich
SPEC`` under mpiexec, or once per rank for gloo); rank 0 prints one line with
the results. A side whose library is missing or fails is skipped with the
reason, never failing the benchmark.

MPICH runs all_reduce and reduce in place (``MPI.IN_PLACE``), as minidist's
calls are; everything else out of place, as in torch.distributed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile

from minidist.bench.cases import GLOO_NAMES, MPICH_NAMES, layout
from minidist.bench.common import child_env, find_mpiexec
from minidist.bench.timing import Timing, fastest_block, time_collective

RESULT_MARK = "minidist-bench-result "


def _spec(collectives, sizes, timing: Timing) -> str:
    return json.dumps({"collectives": list(collectives), "sizes": [int(s) for s in sizes],
                       "timing": timing.as_dict()})


def _sizes_of(collective: str, sizes) -> list[int]:
    return [0] if collective == "barrier" else list(sizes)


# --------------------------------------------------------------------------- MPICH side


def _mpich_call(comm, MPI, collective: str, rank: int, n: int, nbytes: int):
    import numpy as np

    piece_count, total_count = layout(collective, n, nbytes)
    piece = np.full(piece_count, 1.0, np.float32)
    total = np.full(total_count, 1.0, np.float32)
    root = rank == 0
    if collective == "broadcast":
        return lambda: comm.Bcast(total, root=0)
    if collective == "reduce":
        if root:
            return lambda: comm.Reduce(MPI.IN_PLACE, total, op=MPI.SUM, root=0)
        return lambda: comm.Reduce(total, None, op=MPI.SUM, root=0)
    if collective == "all_reduce":
        total[...] = 0  # summed in place over and over: zeros never overflow
        return lambda: comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    if collective == "gather":
        return lambda: comm.Gather(piece, total if root else None, root=0)
    if collective == "scatter":
        return lambda: comm.Scatter(total if root else None, piece, root=0)
    if collective == "all_gather":
        return lambda: comm.Allgather(piece, total)
    if collective == "reduce_scatter":
        return lambda: comm.Reduce_scatter_block(total, piece, op=MPI.SUM)
    if collective == "all_to_all":
        received = np.zeros_like(total)
        return lambda: comm.Alltoall(total, received)
    if collective == "barrier":
        return comm.Barrier
    raise ValueError(f"no MPI call for {collective!r}")


def _mpich_main(spec: dict) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    timing = Timing(**spec["timing"])
    seconds: dict = {}
    for collective in spec["collectives"]:
        for nbytes in _sizes_of(collective, spec["sizes"]):
            call = _mpich_call(comm, MPI, collective, rank, n, nbytes)
            means, _ = time_collective(call, nbytes, timing, comm.Barrier,
                                       lambda count: comm.bcast(count, root=0))
            seconds.setdefault(collective, {})[str(nbytes)] = fastest_block(comm.allgather(means))
            del call
    if rank == 0:
        version = MPI.Get_library_version().strip().splitlines()[0]
        print(RESULT_MARK + json.dumps({"seconds": seconds, "version": version}), flush=True)


# --------------------------------------------------------------------------- gloo side


def _gloo_call(torch, dist, collective: str, rank: int, n: int, nbytes: int):
    piece_count, total_count = layout(collective, n, nbytes)
    piece = torch.full((piece_count,), 1.0, dtype=torch.float32)
    total = torch.full((total_count,), 1.0, dtype=torch.float32)
    root = rank == 0
    if collective == "broadcast":
        return lambda: dist.broadcast(total, src=0)
    if collective == "reduce":
        total.zero_()
        return lambda: dist.reduce(total, dst=0)
    if collective == "all_reduce":
        total.zero_()
        return lambda: dist.all_reduce(total)
    if collective == "gather":
        parts = list(total.chunk(n)) if root else None
        return lambda: dist.gather(piece, parts, dst=0)
    if collective == "scatter":
        parts = list(total.chunk(n)) if root else None
        return lambda: dist.scatter(piece, parts, src=0)
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(total, piece)
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(piece, total)
    if collective == "all_to_all":
        received = torch.zeros_like(total)
        return lambda: dist.all_to_all_single(received, total)
    if collective == "barrier":
        return dist.barrier
    raise ValueError(f"no torch.distributed call for {collective!r}")


def _gloo_main(spec: dict) -> None:
    import warnings

    warnings.filterwarnings("ignore")  # torch's deprecation notices would bury real errors
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = int(os.environ["MINIDIST_BENCH_RANK"]), int(os.environ["MINIDIST_BENCH_WORLD"])
    dist.init_process_group("gloo", init_method=os.environ["MINIDIST_BENCH_INIT"], rank=rank,
                            world_size=n)
    count = torch.zeros(1, dtype=torch.int64)

    def agree(calls: int) -> int:
        count[0] = calls
        dist.broadcast(count, src=0)
        return int(count[0])

    seconds: dict = {}
    unsupported: dict = {}
    for collective in spec["collectives"]:
        for nbytes in _sizes_of(collective, spec["sizes"]):
            call = _gloo_call(torch, dist, collective, rank, n, nbytes)
            try:
                call()  # an unsupported call fails here, on every rank alike
            except (RuntimeError, NotImplementedError, ValueError) as error:
                unsupported[collective] = str(error).strip().splitlines()[0][:200]
                break
            means, _ = time_collective(call, nbytes, Timing(**spec["timing"]), dist.barrier,
                                       agree)
            worst = torch.tensor(means, dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # each block: its slowest rank
            seconds.setdefault(collective, {})[str(nbytes)] = float(worst.min())
            del call
    if rank == 0:
        print(RESULT_MARK + json.dumps({"seconds": seconds, "version": torch.__version__,
                                        "unsupported": unsupported}), flush=True)
    dist.destroy_process_group()


# --------------------------------------------------------------------------- the parent


def _result_of(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    return None


def _seconds_by_size(result: dict) -> dict:
    return {collective: {int(size): seconds for size, seconds in by_size.items()}
            for collective, by_size in result["seconds"].items()}


def _stop(process: subprocess.Popen) -> None:
    """Kill a process this module started, and the session it leads."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-400:]


#: How to install each side's library: MPICH and mpi4py are small wheels, in
#: the ``bench`` extra; PyTorch is named apart, with its CPU-only wheel index
#: (the default wheel on Linux pulls in CUDA, gigabytes that gloo never uses,
#: and an extra cannot name an index).
INSTALL = {"mpich": "pip install -e '.[bench]'",
           "gloo": "pip install torch --index-url https://download.pytorch.org/whl/cpu"}


def missing(kind: str) -> str | None:
    """Why the "mpich" or "gloo" side cannot run here, with the command that
    installs what is missing; None when it can run."""
    if kind == "mpich":
        if importlib.util.find_spec("mpi4py") is None:
            return f"mpi4py is not installed ({INSTALL['mpich']} installs mpi4py and MPICH)"
        if find_mpiexec() is None:
            return f"no mpiexec found ({INSTALL['mpich']} installs MPICH's)"
        return None
    if importlib.util.find_spec("torch") is None:
        return f"PyTorch is not installed ({INSTALL['gloo']}: the CPU build, with gloo)"
    return None


def measure_mpich(world_size: int, collectives, sizes, timing: Timing, timeout: float = 1800):
    """({collective: {nbytes: seconds}}, version) or (None, why it was skipped)."""
    collectives = [c for c in collectives if c in MPICH_NAMES]
    reason = missing("mpich")
    if reason:
        return None, reason
    command = [find_mpiexec(), "-n", str(world_size), sys.executable, "-m", "minidist.bench.native",
               "mpich", _spec(collectives, sizes, timing)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=child_env(), start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        return None, f"mpiexec did not finish within {timeout:.0f} s"
    result = _result_of(stdout)
    if process.returncode != 0 or result is None:
        return None, f"mpiexec failed (exit {process.returncode}): {_tail(stderr or stdout)}"
    return _seconds_by_size(result), result["version"]


def measure_gloo(world_size: int, collectives, sizes, timing: Timing, timeout: float = 1800):
    """({collective: {nbytes: seconds}}, note) or (None, why it was skipped). The
    note names the torch version and any collective gloo does not support."""
    collectives = [c for c in collectives if c in GLOO_NAMES]
    reason = missing("gloo")
    if reason:
        return None, reason
    spec = _spec(collectives, sizes, timing)
    with tempfile.TemporaryDirectory(prefix="minidist-gloo-") as directory:
        init = "file://" + os.path.join(directory, "rendezvous")
        processes = [
            subprocess.Popen([sys.executable, "-m", "minidist.bench.native", "gloo", spec],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True,
                             env=child_env(MINIDIST_BENCH_RANK=str(rank),
                                           MINIDIST_BENCH_WORLD=str(world_size),
                                           MINIDIST_BENCH_INIT=init))
            for rank in range(world_size)]
        outputs = []
        try:
            for process in processes:
                outputs.append(process.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for process in processes:
                _stop(process)
            return None, f"the gloo ranks did not finish within {timeout:.0f} s"
    failed = [(rank, process.returncode, outputs[rank][1])
              for rank, process in enumerate(processes) if process.returncode != 0]
    if failed:
        rank, code, stderr = failed[0]
        return None, f"gloo rank {rank} failed (exit {code}): {_tail(stderr)}"
    result = _result_of(outputs[0][0])
    if result is None:
        return None, f"gloo rank 0 printed no result: {_tail(outputs[0][1])}"
    note = f"torch {result['version']}"
    for collective, reason in result["unsupported"].items():
        note += f"; gloo has no {GLOO_NAMES[collective]} ({reason})"
    return _seconds_by_size(result), note


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("mpich", "gloo"):
        print("usage: python -m minidist.bench.native {mpich|gloo} SPEC_JSON "
              "(started by minidist bench collectives)", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    (_mpich_main if argv[0] == "mpich" else _gloo_main)(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
