"""What starting workers costs: ``minidist.launch`` next to a bare fork and join,
and ``minidist run`` next to ``mpiexec`` of mpi4py.

    .venv/bin/python benchmarks/bench_launch.py                  # about a minute
    .venv/bin/python benchmarks/bench_launch.py --before HEAD~3  # and an older minidist
    .venv/bin/python benchmarks/bench_launch.py --quick          # a smoke run

What it measures, all in one run on one machine, interleaved (A, B, A, B,
...) so that a machine whose load changes during the run slows both sides
alike, and reported as medians and ratios of medians:

* a *warm* ``minidist.launch(trivial, world_size=n)`` (the program has
  launched once already, so imports and first-time setup are paid) next to
  the same n processes forked and joined bare with ``multiprocessing``'s
  fork context running the same trivial function: what minidist adds to
  starting and ending n processes (its shared memory, pipes, supervisor,
  logging, BLAS threads), n = 2 and 4. Each side runs in its own process
  per block of rounds, several blocks, alternating. The bare side comes
  twice: in an interpreter that imported only ``minidist`` (no NumPy), and
  ("bare loaded") in one that has run one ``minidist.launch`` first, so it
  has mapped what the launching process has (NumPy, minidist's modules):
  fork copies the page tables of everything mapped, so forking a bigger
  process costs more, whoever forks;
* a whole ``minidist run -n 2 hello.py`` (the script calls
  ``init_process_group()`` and ``barrier()``) next to ``mpiexec -n 2 python
  hello_mpi.py`` (mpi4py: ``COMM_WORLD.Barrier()``), wall time of the
  command; skipped when mpi4py or mpiexec is missing
  (``pip install -e '.[bench]'``);
* the floors under those commands, in the same rounds: ``python -c pass``
  (an interpreter's start), ``python -c "import numpy"`` (what every rank of
  minidist pays: its transports move NumPy arrays) and what a rank of the
  hello imports (``import minidist.distributed as dist; dist.barrier``: the
  package face imports the collectives, and NumPy, when a name is first used);
* with ``--before REF``: every minidist row again with the minidist of git
  revision REF (exported to a temporary folder), interleaved with the
  current one, so the table shows before / after from the same run.

The commands run with Python's bytecode cache on (in a temporary
``PYTHONPYCACHEPREFIX``, dropping ``PYTHONDONTWRITEBYTECODE``): NumPy and
mpi4py come compiled from their wheels, and an installed minidist is too;
without the cache every minidist import compiled its source again (40 ms
of each process here), a cost no user pays twice.

Writes ``benchmarks/results/launch.json`` (or ``--json FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

HELLO_MINIDIST = """\
import minidist.distributed as dist
dist.init_process_group()
dist.barrier()
"""
HELLO_MPI = """\
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
"""
#: The same with NumPy imported, as any mpi4py program that sends arrays has:
#: minidist's ranks always import it, so this row says how much of the gap is
#: NumPy's import.
HELLO_MPI_NUMPY = "import numpy\n" + HELLO_MPI


# --------------------------------------------------------------------------- one block


def _trivial():
    return 1


def _bare(world_size: int, context) -> None:
    processes = [context.Process(target=_trivial) for _ in range(world_size)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()


def block(side: str, world_size: int, rounds: int) -> list[float]:
    """Seconds of each of ``rounds`` warm starts of ``side`` ("launch", "bare"
    or "bare-loaded") with ``world_size`` processes, in this process."""
    import multiprocessing
    import warnings

    import minidist

    warnings.simplefilter("ignore")  # more ranks than cores: said once, known here
    context = multiprocessing.get_context("fork")
    if side == "bare-loaded":  # what the launching process has mapped, mapped here too
        minidist.launch(_trivial, world_size=world_size)
    if side == "launch":
        def run():
            minidist.launch(_trivial, world_size=world_size)
    else:
        def run():
            _bare(world_size, context)
    run()  # warm: imports, the resource tracker, first-time setup
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return seconds


# --------------------------------------------------------------------------- the trees


def export_tree(ref: str, folder: str) -> str:
    """``minidist/`` of git revision ``ref`` under ``folder``; returns the folder."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", ref, "minidist"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"bench_launch: --before {ref}: git archive failed: "
                         f"{archive.stderr.decode().strip()}")
    path = os.path.join(folder, "archive.tar")
    with open(path, "wb") as file:
        file.write(archive.stdout)
    with tarfile.open(path) as tar:
        tar.extractall(folder, filter="data")
    return folder


def _env(tree: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def block_in_process(tree: str, side: str, world_size: int, rounds: int) -> list[float]:
    """:func:`block` in a fresh interpreter that imports minidist from ``tree``."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--block", side,
                           str(world_size), str(rounds)], env=_env(tree),
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"block {side} n={world_size} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def command_seconds(command: list[str], env: dict, cwd: str) -> float:
    """Wall time of ``command``. ``cwd`` is a folder without minidist in it: ``python
    -m`` puts the working folder first on the path, ahead of PYTHONPATH's tree."""
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout)[-2000:]}")
    return seconds


# --------------------------------------------------------------------------- the run


def _with_bytecode_cache(env: dict, folder: str) -> dict:
    """``env`` with Python's bytecode cache on, kept in ``folder`` (see the docstring)."""
    env = dict(env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(folder, "pycache")
    return env


def measure(trees: dict, world_sizes, blocks: int, rounds: int, command_rounds: int,
            commands: bool) -> dict:
    """{"launch": {...}, "commands": {...}} with every sample, interleaved."""
    samples: dict = {}
    for world_size in world_sizes:
        for _ in range(blocks):
            for label, tree in trees.items():
                for side in ("launch", "bare", "bare-loaded"):
                    key = f"{side} {label} n={world_size}"
                    samples.setdefault(key, []).extend(
                        block_in_process(tree, side, world_size, rounds))
    command_samples: dict = {}
    note = None
    if commands:
        from minidist.bench.common import find_mpiexec

        mpiexec = find_mpiexec()
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            mpiexec = None
            note = "mpi4py is not installed: pip install -e '.[bench]'"
        if mpiexec is None and note is None:
            note = "no mpiexec found: pip install -e '.[bench]'"
        with tempfile.TemporaryDirectory() as folder:
            hello = os.path.join(folder, "hello.py")
            hello_mpi = os.path.join(folder, "hello_mpi.py")
            hello_mpi_numpy = os.path.join(folder, "hello_mpi_numpy.py")
            for path, text in ((hello, HELLO_MINIDIST), (hello_mpi, HELLO_MPI),
                               (hello_mpi_numpy, HELLO_MPI_NUMPY)):
                with open(path, "w") as file:
                    file.write(text)
            runs = {f"minidist run {label}": ([sys.executable, "-m", "minidist.cli", "run",
                                               "-n", "2", hello], _env(tree))
                    for label, tree in trees.items()}
            if mpiexec:
                runs["mpiexec"] = ([mpiexec, "-n", "2", sys.executable, hello_mpi],
                                   dict(os.environ))
                runs["mpiexec numpy"] = ([mpiexec, "-n", "2", sys.executable, hello_mpi_numpy],
                                         dict(os.environ))
            runs["python -c pass"] = ([sys.executable, "-c", "pass"], dict(os.environ))
            runs["import numpy"] = ([sys.executable, "-c", "import numpy"], dict(os.environ))
            for label, tree in trees.items():
                runs[f"import minidist.distributed {label}"] = (
                    [sys.executable, "-c", "import minidist.distributed as dist; dist.barrier"],
                    _env(tree))
            runs = {name: (command, _with_bytecode_cache(env, folder))
                    for name, (command, env) in runs.items()}
            for command, env in runs.values():  # warm the file cache once
                command_seconds(command, env, folder)
            for _ in range(command_rounds):
                for name, (command, env) in runs.items():
                    command_samples.setdefault(name, []).append(
                        command_seconds(command, env, folder))
    return {"launch": samples, "commands": command_samples, "commands_note": note}


def summarize(measured: dict, labels, world_sizes) -> dict:
    median = {key: statistics.median(values) for key, values in measured["launch"].items()}
    rows = []
    for world_size in world_sizes:
        for label in labels:
            launch = median[f"launch {label} n={world_size}"]
            bare = median[f"bare {label} n={world_size}"]
            row = {"world_size": world_size, "minidist": label,
                   "launch_ms": launch * 1e3, "bare_ms": bare * 1e3,
                   "launch_over_bare": launch / bare}
            loaded = median.get(f"bare-loaded {label} n={world_size}")
            if loaded:
                row.update(bare_loaded_ms=loaded * 1e3, launch_over_bare_loaded=launch / loaded)
            rows.append(row)
    commands = {name: statistics.median(values) for name, values in measured["commands"].items()}
    command_rows = []
    for label in labels:
        name = f"minidist run {label}"
        if name in commands:
            mpi, mpi_numpy = commands.get("mpiexec"), commands.get("mpiexec numpy")
            command_rows.append({"minidist": label, "run_ms": commands[name] * 1e3,
                                 "mpiexec_ms": mpi * 1e3 if mpi else None,
                                 "run_over_mpiexec": commands[name] / mpi if mpi else None,
                                 "mpiexec_numpy_ms": mpi_numpy * 1e3 if mpi_numpy else None,
                                 "run_over_mpiexec_numpy":
                                     commands[name] / mpi_numpy if mpi_numpy else None})
    floors = {"python_ms": commands.get("python -c pass"),
              "import_numpy_ms": commands.get("import numpy")}
    floors = {key: value * 1e3 for key, value in floors.items() if value}
    for label in labels:
        seconds = commands.get(f"import minidist.distributed {label}")
        if seconds:  # with dist.barrier looked up: what a rank of the hello imports
            floors[f"import_minidist_distributed_barrier_{label}_ms"] = seconds * 1e3
    return {"launch": rows, "commands": command_rows, "floors": floors}


def print_tables(summary: dict, labels, note) -> None:
    print("\nwarm minidist.launch of a trivial function vs fork + join of the same processes "
          "(medians, ms)")
    print("('bare loaded': forked from an interpreter that ran one minidist.launch first, "
          "so it has NumPy and minidist mapped, as the launching one has)")
    print(f"{'n':>3} {'minidist':>10} {'launch':>9} {'bare':>9} {'launch/bare':>12} "
          f"{'bare loaded':>12} {'launch/it':>10}")
    for row in summary["launch"]:
        loaded = (f"{row['bare_loaded_ms']:12.2f} {row['launch_over_bare_loaded']:10.2f}"
                  if "bare_loaded_ms" in row else f"{'-':>12} {'-':>10}")
        print(f"{row['world_size']:>3} {row['minidist']:>10} {row['launch_ms']:9.2f} "
              f"{row['bare_ms']:9.2f} {row['launch_over_bare']:12.2f} {loaded}")
    if "before" in labels:
        for world_size in sorted({row["world_size"] for row in summary["launch"]}):
            by = {row["minidist"]: row for row in summary["launch"]
                  if row["world_size"] == world_size}
            print(f"n={world_size}: after / before = "
                  f"{by['after']['launch_ms'] / by['before']['launch_ms']:.2f}")
    if summary["commands"]:
        print("\nminidist run -n 2 hello.py vs mpiexec -n 2 python hello_mpi.py "
              "(wall time of the command, medians, ms; 'numpy': the mpi4py hello with "
              "`import numpy` added)")
        print(f"{'minidist':>10} {'run':>9} {'mpiexec':>9} {'run/mpiexec':>12} "
              f"{'mpiexec numpy':>14} {'run/it':>7}")

        def cell(value, width, digits):
            return f"{value:{width}.{digits}f}" if value else f"{'-':>{width}}"

        for row in summary["commands"]:
            print(f"{row['minidist']:>10} {row['run_ms']:9.1f} {cell(row['mpiexec_ms'], 9, 1)} "
                  f"{cell(row['run_over_mpiexec'], 12, 2)} "
                  f"{cell(row['mpiexec_numpy_ms'], 14, 1)} "
                  f"{cell(row['run_over_mpiexec_numpy'], 7, 2)}")
    if summary.get("floors"):
        print("\nthe floors, same rounds (wall time of `python -c ...`, medians, ms; "
              "bytecode cached)")
        for name, value in summary["floors"].items():
            print(f"{name[:-3]:>40} {value:9.1f}")
    if note:
        print(f"mpiexec: not measured ({note})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", nargs=3, metavar=("SIDE", "N", "ROUNDS"),
                        help=argparse.SUPPRESS)  # one block, in a child interpreter
    parser.add_argument("--before", metavar="REF",
                        help="also measure the minidist of this git revision, interleaved")
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--blocks", type=int, default=6,
                        help="blocks per side and world size (each a fresh interpreter)")
    parser.add_argument("--rounds", type=int, default=20, help="launches per block")
    parser.add_argument("--command-rounds", type=int, default=10,
                        help="runs of each command (minidist run, mpiexec)")
    parser.add_argument("--no-commands", action="store_true",
                        help="skip minidist run vs mpiexec")
    parser.add_argument("--quick", action="store_true", help="2 blocks of 5, 3 command runs")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "launch.json"))
    args = parser.parse_args(argv)
    if args.block:
        side, world_size, rounds = args.block[0], int(args.block[1]), int(args.block[2])
        print(json.dumps(block(side, world_size, rounds)))
        return 0
    if args.quick:
        args.blocks, args.rounds, args.command_rounds = 2, 5, 3
    world_sizes = [int(n) for n in args.world_sizes.split(",") if n.strip()]
    from minidist.bench.common import machine

    info = machine()
    load_at_start = os.getloadavg()[0]
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}; "
          f"load average {load_at_start:.1f} at the start")
    with tempfile.TemporaryDirectory() as folder:
        trees = {"after": ROOT}
        if args.before:
            trees = {"before": export_tree(args.before, folder), "after": ROOT}
        started = time.perf_counter()
        measured = measure(trees, world_sizes, args.blocks, args.rounds, args.command_rounds,
                           not args.no_commands)
    labels = list(trees)
    summary = summarize(measured, labels, world_sizes)
    print_tables(summary, labels, measured["commands_note"])
    report = {"about": "warm minidist.launch vs bare fork+join, minidist run vs mpiexec; "
                       "medians of interleaved samples; written by benchmarks/bench_launch.py",
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": info,
              "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg()[0],
              "settings": {"before": args.before, "world_sizes": world_sizes,
                           "blocks": args.blocks, "rounds": args.rounds,
                           "command_rounds": args.command_rounds},
              "summary": summary, "samples": measured,
              "seconds_total": time.perf_counter() - started}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
