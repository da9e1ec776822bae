"""What ``minidist simulate`` and ``minidist run`` do, once :mod:`minidist.cli`
has parsed their arguments.

The library (:mod:`minidist.distributed.simulator`,
:mod:`minidist.distributed.launch`) knows nothing of argparse or of printing
tables: these functions read the parsed ``args``, check them, call the
library, and turn what it returns into lines on the terminal and an exit
status. :mod:`minidist.cli` imports this module only when one of these
subcommands runs.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from minidist import costmodel
from minidist.distributed.collectives import ALGORITHMS, registry, topology_costs
from minidist.distributed.launch import warn_if_oversubscribed
from minidist.distributed.simulator import CALLS, SYMMETRIC, estimate, simulate
from minidist.distributed.transport import check_name
from minidist.model_gap import RunFacts, explain, ratio_text
from minidist.runtime.machine_memory import MEMORY_SHARE, memory_available
from minidist.topology import parse_topology
from minidist.units import format_bytes

# --------------------------------------------------------------------------- minidist simulate


def _format_seconds(seconds: float) -> str:
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if seconds >= scale or unit == "ns":
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds:g} s"


def _format_duration(seconds: float) -> str:
    """A wait as a person reads it: "40 s", "2 min 5 s"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def _trace_path(path: str, algorithm: str, several: bool) -> str:
    if not several:
        return path
    stem, suffix = os.path.splitext(path)
    return f"{stem}.{algorithm}{suffix or '.jsonl'}"


def _progress_bar(quiet: bool, console=None):
    """A bar per algorithm on stderr (or ``console``): messages simulated of
    those the algorithm sends, counted before the first is sent (the
    simulator's first report), so it never reads "0/?". Its counts in
    thousands or millions past 100,000 and no elapsed time, so that the
    longest name and 8,590M messages fit in 80 columns. Transient, so that
    the table is all that stays; Rich draws it only on a terminal (a pipe or a log gets the
    table alone), and ``--quiet`` turns it off."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("simulating {task.description}"), BarColumn(bar_width=20),
                    TextColumn("{task.fields[counted]} messages"), TimeRemainingColumn(),
                    console=console or Console(stderr=True), transient=True, disable=quiet)


def _counted(messages: int, total: int | None) -> str:
    """"done/total" for the bar, both in the total's unit: exact up to 100,000,
    then thousands ("5k/778k"), past 100 million millions ("268M/8,590M")."""
    if total is None:
        return f"{messages:,}"
    if total < 100_000:
        return f"{messages:,}/{total:,}"
    unit, scale = ("k", 1e3) if total < 100_000_000 else ("M", 1e6)
    return f"{messages / scale:,.0f}{unit}/{total / scale:,.0f}{unit}"


#: A simulation estimated to take longer than this is refused ...
REFUSE_SECONDS = 300.0
#: ... and one longer than this is warned about (on stderr) before it starts.
WARN_SECONDS = 30.0


#: An estimate above this many seconds is told at this machine's pace.
PACE_ABOVE_SECONDS = 2.0
#: The small simulation that measures it: the per-message work of the big
#: ones (the double binary tree's are what take minutes), small enough to
#: cost a fraction of the estimate it corrects.
PACE_PROBE = ("all_reduce", "double_binary_tree", 64, 1 << 20)


def _machine_pace() -> tuple[float, float]:
    """How many times longer than :func:`~minidist.distributed.simulator.estimate`
    says a simulation takes here: (in CPU time, on the wall clock now).

    The estimate's constants were fitted on one idle machine; a faster one
    takes half its time, and one shared with other work takes several times
    it on the wall clock (94 s estimated, 2 min taken; 72 s told from the
    probe alone, 4 min taken at a load of 10 on 2 cores). A small simulation
    timed here gives the machine's speed (its CPU time, about 0.03 s); the
    wall clock's share is the larger of the probe's own (too short to be
    fair: a process just started is scheduled first) and the load average's,
    (load + 1) / cores: a CPU-bound process's turn among the runnable ones."""
    simulate(*PACE_PROBE[:2], 2, 64)  # first-call costs (imports, tables) out of the probe
    start, cpu = time.perf_counter(), time.process_time()
    simulate(*PACE_PROBE)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    expected = estimate(*PACE_PROBE).seconds
    pace = max(cpu / expected, 0.1)
    queue = (os.getloadavg()[0] + 1) / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 1
    return pace, pace * max(wall / max(cpu, 1e-9), queue, 1.0)


def _check_cost(collective, algorithms, args, nbytes, dtype, topology=None) -> None:
    """Refuse (ValueError, one line) a simulation estimated to outgrow this
    machine's memory or :data:`REFUSE_SECONDS`, saying what to run instead;
    warn about one over :data:`WARN_SECONDS`. See
    :func:`minidist.distributed.simulator.estimate`; the warning's seconds
    are at this machine's pace (:func:`_machine_pace`)."""
    from rich.console import Console

    available = memory_available()
    def cost(name, nproc):
        return estimate(collective, name, nproc, nbytes, dtype=dtype,
                        root=min(args.root, nproc - 1), trace=bool(args.trace),
                        topology=topology)

    def fits(e):
        return e.bytes <= MEMORY_SHARE * available and e.seconds <= REFUSE_SECONDS

    estimates = {name: cost(name, args.nproc) for name in algorithms}
    too_big = {name: e for name, e in estimates.items() if not fits(e)}
    if too_big:
        what = "; ".join(f"{name} about {_format_seconds(e.seconds)} and "
                         f"{format_bytes(e.bytes)}" for name, e in too_big.items())
        instead = []
        fit = [name for name in estimates if name not in too_big]
        if fit:
            instead.append(f"--algorithm {' or '.join(fit)} alone")
        else:
            symmetric = [name for name in ALGORITHMS[collective]
                         if (collective, name) in SYMMETRIC and name not in too_big
                         and fits(cost(name, args.nproc))]
            if symmetric:
                instead.append(f"--algorithm {' or '.join(symmetric)} (one rank stands "
                               "for all)")
        fewer = args.nproc // 2
        while fewer > 1 and not all(fits(cost(name, fewer)) for name in too_big):
            fewer //= 2
        if topology is not None and fewer % topology.ranks_per_node:
            fewer = 0  # a world of whole nodes only
        if fewer > 1:
            instead.append(f"-n {fewer} or fewer")
        if CALLS[collective].sized:
            instead.append("a smaller --size")
        raise ValueError(
            f"{collective} on {args.nproc:,} ranks, N = {format_bytes(nbytes)}: too big to "
            f"simulate here ({what}; this machine has {format_bytes(available)} available, "
            f"the limits are {MEMORY_SHARE:.0%} of it and {_format_seconds(REFUSE_SECONDS)}). "
            f"Run {', or '.join(instead)}; the cost model's formula alone is "
            "minidist.costmodel.predict(collective, algorithm, n, nbytes).")
    # A refusal needs the order of magnitude only (it is at once, and says what
    # to run instead); the time a run will take is told at this machine's
    # pace, measured when a simulation is long enough for it to matter.
    pace = busy = 1.0
    if any(e.seconds > PACE_ABOVE_SECONDS for e in estimates.values()):
        pace, wall_pace = _machine_pace()
        busy = wall_pace / pace  # wall seconds per second of work, now
    slow = {name: e.seconds * pace * busy for name, e in estimates.items()
            if e.seconds * pace * busy > WARN_SECONDS}
    if slow:
        what = ", ".join(f"{name} about {_format_duration(seconds)}"
                         for name, seconds in slow.items())
        if len(slow) > 1:
            what += f"; about {_format_duration(sum(slow.values()))} in all"
        shared = (f", this machine being shared: about {busy:.1f} s for each second of "
                  "work" if busy > 1.5 else "")
        Console(stderr=True).print(f"minidist simulate: this will take a while ({what} "
                                   f"here{shared}); Ctrl-C stops it.", markup=False,
                                   highlight=False, soft_wrap=True)


def simulate_command(args) -> int:
    """``minidist simulate COLLECTIVE [--algorithm NAME|all] -n N --size 100MB
    --alpha 5us --bandwidth 10GB/s [--gamma-bandwidth 10GB/s] [--trace FILE] [--quiet]``.

    Simulates each chosen algorithm, prints a table of simulated time against
    the cost model's prediction, and writes the traces if asked (one file per
    algorithm when there are several: FILE with the algorithm's name inserted).
    """
    from rich.console import Console
    from rich.table import Table

    out = Console()
    try:
        collective = args.collective
        if collective not in CALLS or collective not in ALGORITHMS:
            known = sorted(name for name in ALGORITHMS if name in CALLS)
            raise ValueError(f"cannot simulate {collective!r}; choose one of {known}")
        topology = parse_topology(getattr(args, "topology", None) or "flat", args.nproc)
        # On a topology the algorithms for nodes run too (hierarchical, ring_2d, ...).
        names = list(ALGORITHMS[collective] if topology is None
                     else registry.every_algorithm(collective))
        algorithms = names if args.algorithm in (None, "all") else [args.algorithm]
        for name in algorithms:
            if name not in names:
                raise ValueError(f"{collective} has no algorithm {name!r}; choose one of "
                                 f"{names} or 'all'")
        if args.nproc < 1:
            raise ValueError(f"-n must be at least 1, got {args.nproc}")
        nbytes = costmodel.parse_size(args.size)
        if nbytes < 0:
            raise ValueError(f"--size must not be negative, got {args.size!r}")
        if topology is not None:
            given = [flag for flag, value in (("--alpha", args.alpha),
                                              ("--bandwidth", args.bandwidth))
                     if value is not None]
            if given:
                raise ValueError(f"--topology {args.topology} sets every link's latency and "
                                 f"bandwidth, so {' and '.join(given)} would contradict it: "
                                 "give the links in the topology (such as "
                                 "nodes=4,ranks_per_node=8,intra=300GB/s,inter=25GB/s) or "
                                 "drop --topology")
        alpha = costmodel.parse_time(args.alpha or "5us")
        bandwidth = costmodel.parse_bandwidth(args.bandwidth or "10GB/s")
        if args.gamma_bandwidth is None and topology is not None:
            gamma_bandwidth = 1 / topology.gamma if topology.gamma else math.inf
        else:
            gamma_text = args.gamma_bandwidth or "10GB/s"
            gamma_bandwidth = (math.inf if str(gamma_text).strip().lower() == "inf"
                               else costmodel.parse_bandwidth(gamma_text))
        for flag, value in (("--alpha", alpha), ("--bandwidth", bandwidth),
                            ("--gamma-bandwidth", gamma_bandwidth)):
            if not value >= 0 or (flag != "--alpha" and value == 0):
                raise ValueError(f"{flag} must be positive, got {value:g}")
        dtype = np.dtype(args.dtype)
        if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biufc":
            raise ValueError(f"--dtype {args.dtype!r}: choose a numeric dtype such as "
                             "float32, float64, int32 or int64")
        if CALLS[collective].rooted and not 0 <= args.root < args.nproc:
            raise ValueError(f"--root {args.root} is out of range for -n {args.nproc}")
        if args.trace:
            folder = os.path.dirname(os.path.abspath(args.trace))
            if not os.path.isdir(folder):
                raise ValueError(f"--trace {args.trace}: the folder {folder} does not exist")
        _check_cost(collective, algorithms, args, nbytes, dtype, topology)
    except (ValueError, TypeError) as error:
        Console(stderr=True).print(f"minidist simulate: error: {error}", style="bold red",
                                   markup=False, highlight=False, soft_wrap=True)
        return 2

    params = costmodel.Params(alpha=alpha, beta=1.0 / bandwidth,
                              gamma=1.0 / gamma_bandwidth if math.isfinite(gamma_bandwidth)
                              else 0.0)
    size = f"N = {format_bytes(nbytes)}; " if CALLS[collective].sized else ""
    links = (f"alpha {_format_seconds(alpha)}, links {format_bytes(bandwidth)}/s, "
             if topology is None else f"{topology.describe()}; ")
    out.print(f"{collective} on {args.nproc:,} simulated ranks, {size}{links}"
              + (f"combining {format_bytes(gamma_bandwidth)}/s"
                 if math.isfinite(gamma_bandwidth) else "combining free"),
              markup=False, highlight=False)
    table = Table()
    # Every cell whole: at 80 columns Rich shrinks the widest columns first,
    # and cut "reduce_broadcast" to "reduce_bro…" and 8,589,803,520 messages
    # to "8,589,803,…". So no cell wraps, the headers take two lines to be
    # no wider than their numbers, and a table that must still give way (a
    # terminal narrower than 80) folds a cell onto a second line rather than
    # losing its end.
    table.add_column("algorithm", no_wrap=True, overflow="fold",
                     min_width=max(map(len, algorithms)))
    for header in ("simulated", "cost\nmodel", "messages", "bytes\nmoved", "sim /\nmodel"):
        table.add_column(header, justify="right", no_wrap=True, overflow="fold")
    several = len(algorithms) > 1
    results = []
    written = []
    with _progress_bar(quiet=getattr(args, "quiet", False)) as bar:
        for name in algorithms:
            # Shown from the simulator's first report, which brings the total.
            task = bar.add_task(name, total=None, visible=False, counted="")

            def progress(messages, total, task=task):
                bar.update(task, completed=messages, total=total, visible=True,
                           counted=_counted(messages, total))

            links = (dict(alpha=params.alpha, beta=params.beta) if topology is None
                     else dict(topology=topology))
            result = simulate(collective, name, args.nproc, nbytes, gamma=params.gamma,
                              dtype=dtype, root=args.root, trace=bool(args.trace),
                              progress=progress, **links)
            results.append(result)
            if args.trace:
                path = _trace_path(args.trace, name, several)
                written.append(f"trace of {name}: {result.write_trace(path):,} events in {path}")
                result.events = None  # a 1,024-rank trace is large: keep one at a time
    fastest = min(result.time for result in results)
    gaps = []  # the rows where the formula and the simulation differ, and why
    for result in results:
        style = "bold green" if several and result.time == fastest else None
        ratio = "-"
        if result.predicted is not None:
            ratio = ratio_text(result.time, result.predicted)
            why = explain(result.time, result.predicted,
                          RunFacts(args.nproc, simulated=True, params="given"))
            if not why.endswith("the model holds here"):
                gaps.append(f"{result.algorithm}: {why}")
            figure = (None if topology is None else
                      topology_costs.kind(collective, result.algorithm, args.nproc, topology))
            if figure in ("lower bound", "estimate"):
                article = "an" if figure == "estimate" else "a"
                gaps.append(f"{result.algorithm}: the cost model's figure is {article} {figure} "
                            "on this topology, not an exact time (topology_costs.kind)")
        table.add_row(result.algorithm, _format_seconds(result.time),
                      "-" if result.predicted is None else _format_seconds(result.predicted),
                      f"{result.messages:,}", format_bytes(result.bytes), ratio, style=style)
    out.print(table)
    for line in gaps + written:  # wrapped at the terminal's width, as the table
        out.print(line, markup=False, highlight=False)
    return 0


# --------------------------------------------------------------------------- minidist run


def _run_under_mpiexec(args, world_size: int) -> int:
    """``minidist run --transport mpi``: the same script, started by
    ``mpiexec -n N`` (MPICH or Open MPI); each rank's
    ``dist.init_process_group()`` finds MPI and uses the mpi transport.

    Returns mpiexec's status, except that a run where a rank ended without
    finishing its script (os._exit, a signal, a crash: MPICH may still return
    0) fails with status 1 (see :class:`_RankLines`), the first line naming
    that rank. MPICH leaves its shared-memory segments behind when a job ends
    badly; this parent removes those of this job, and only those
    (:class:`minidist.runtime.job_segments.JobSegments`). Ctrl-C and SIGTERM
    end the job the same way (the exception goes on to the command, which
    says one line), and its folder (the ranks' socket) goes on every end;
    after a SIGKILL, with the next run (:mod:`minidist.runtime.launcher_folders`)."""
    import importlib.util

    if not os.path.isfile(args.script):
        raise SystemExit(f"minidist run: error: no such script: {args.script}")
    if args.trace is not None:
        raise SystemExit("minidist run: error: --transport mpi: --trace is not supported under mpiexec; "
                         "set MINIDIST_TRACE_DIR=DIR to write one trace per rank (DIR/rank<r>.jsonl)")
    if importlib.util.find_spec("mpi4py") is None:
        raise SystemExit("minidist run: error: --transport mpi: mpi4py is not installed; "
                         "pip install -e '.[mpi]' (mpi4py and the MPICH wheel)")
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = here if os.path.exists(here) else shutil.which("mpiexec")
    if mpiexec is None:
        raise SystemExit("minidist run: error: --transport mpi: mpiexec not found; pip install -e "
                         "'.[mpi]' brings MPICH's, or put your cluster's MPI on the PATH")
    command = [mpiexec, "-n", str(world_size)]
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    if ("Open MPI" in version or "OpenRTE" in version) and world_size > (os.cpu_count() or 1):
        command.append("--oversubscribe")   # Open MPI refuses more ranks than cores without it
    script_args = list(args.script_args or [])
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("MINIDIST_RANK", "MINIDIST_WORLD_SIZE", "MINIDIST_RUN",
                                  "MINIDIST_TRANSPORT"))}
    warn_if_oversubscribed(world_size)
    from minidist.runtime import launcher_folders, signals

    # Those of launchers killed outright (SIGKILL: no end of their own to clean up).
    launcher_folders.remove_orphans("mpi", tempfile.gettempdir())
    folder = None
    with signals.as_exceptions() as guard:
        try:
            with guard.deferred():  # made and remembered, or not made
                folder = tempfile.mkdtemp(prefix=launcher_folders.prefix("mpi", os.getpid()))
            return _run_job(command, args.script, script_args, env, world_size, folder, guard)
        finally:
            if folder is not None:
                with guard.deferred():
                    shutil.rmtree(folder, ignore_errors=True)


def _run_job(command, script, script_args, env, world_size, folder, guard) -> int:
    """mpiexec's job, watched through the ranks' lines in ``folder``: its status."""
    from minidist.runtime.job_segments import JobSegments

    process = segments = watcher = None
    ending = ""

    def vanished(rank: int, pid: int) -> None:
        # Said at once, before anything the dying job prints: the cause first.
        print(f"minidist: rank {rank} (pid {pid}) exited in the middle of the run, without "
              "finishing its script (os._exit, a signal or a crash): ending the job.",
              file=sys.stderr, flush=True)
        if segments is not None:
            segments.look()  # the others still map the job's segments: note them
        _end_job_soon(process)

    try:
        from minidist.runtime.process_setup import end_job_with_parent

        with guard.deferred():
            watcher = _RankLines(os.path.join(folder, "ranks"), vanished)
        env["MINIDIST_MPI_WATCH"] = watcher.path
        with guard.deferred():  # a started job is always in `process` (fork: see signals.py)
            process = subprocess.Popen(command + [sys.executable, script, *script_args],
                                       env=env, stdout=subprocess.PIPE, text=True, bufsize=1,
                                       preexec_fn=end_job_with_parent)
            segments = JobSegments(process.pid)
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if "EXIT STRING:" in line:  # MPICH's words for how the job ended
                ending = line.split("EXIT STRING:", 1)[1].strip()
        status = process.wait()
    finally:
        with guard.deferred():  # a second Ctrl-C or SIGTERM does not cut the clean-up short
            if process is not None and process.poll() is None:
                if watcher is not None:
                    watcher.ending_the_job()
                process.kill()  # the launcher itself was interrupted
                process.wait()
            if watcher is not None:
                watcher.close()  # after the job: it reads the lines to their ends
            if segments is not None:
                unfinished = watcher.greeted and len(watcher.finished) < world_size
                if process.returncode != 0 or watcher.culprit is not None or unfinished:
                    segments.remove()  # a clean MPICH exit removes its own
                else:
                    segments.stop()
    missing = [rank for rank in range(world_size) if rank not in watcher.finished]
    if status == 0 and watcher.culprit is None and watcher.greeted and missing:
        # A rank's report of the vanished one may have been cut short by
        # the job's end: name the first line that ended with neither word.
        rank, pid = watcher.vanished[0] if watcher.vanished else (missing[0], None)
        which = f"rank {rank}" + (f" (pid {pid})" if pid else "")
        print(f"minidist: {which} exited in the middle of the run, without finishing its "
              "script (os._exit, a signal or a crash); mpiexec returned 0, but the run "
              "failed (status 1).", file=sys.stderr)
        return 1
    if watcher.culprit is None and watcher.reports and status != 0:
        # The failed rank printed its report through mpiexec, whose
        # teardown (SIGKILL to the job) can cut it short: say its first
        # line again, so that a failed run never ends unexplained.
        print(f"minidist: {watcher.reports[0]} (the failed rank's report, repeated: "
              f"mpiexec ended the job, status {status})", file=sys.stderr)
    if watcher.culprit is not None:
        rank, _ = watcher.culprit
        if status == 0:
            print(f"minidist: mpiexec returned 0, but rank {rank} never finished its "
                  "script: the run failed (status 1).", file=sys.stderr)
            return 1
        print(f"minidist: mpiexec ended the job (status {status}"
              f"{': ' + ending if ending else ''}).", file=sys.stderr)
    return status


def _end_job_soon(process, grace: float = 1.0) -> None:
    """MPICH ends a job whose rank exits without MPI_Finalize; if it has not
    within ``grace`` seconds, end it here (mpiexec passes SIGTERM to the ranks)."""
    def end():
        if process is not None and process.poll() is None:
            process.terminate()

    timer = threading.Timer(grace, end)
    timer.daemon = True
    timer.start()


class _RankLines(threading.Thread):
    """How each rank of the job ends, as the ranks tell it.

    MPICH reports a dead process by a PID that is not always the one that
    died (seen: rank 0's, when rank 1 was SIGKILLed) and never by rank, kills
    the others within milliseconds, and returns status 0 when a rank's
    os._exit(0) ended the job. So each rank connects to this Unix socket
    when it loads MPI and says ``hello <rank> <pid>``; at a normal end of its
    script it says ``done``; before it reports an error and aborts the job,
    ``failed`` (see transport/mpi.py). The kernel closes a dead process's end
    at once, so a line that ends without ``done`` or ``failed`` is a rank that
    ended in the middle of the run. If that is the first sign of trouble (no
    rank said ``failed`` before: a rank's own report explains the failure
    better, and the ranks MPI_Abort then kills are consequences), it is the
    :attr:`culprit` and ``on_vanished(rank, pid)`` is called, on this thread.

    On a busy machine this thread may wake only after several lines have
    ended: epoll (Linux's selector) lists ready connections in the order they
    became ready, so the first end-of-file in the list is still the first."""

    #: After mpiexec has ended, how long the lines still open may take to end.
    FINISH_SECONDS = 2.0

    def __init__(self, path: str, on_vanished):
        super().__init__(daemon=True)
        import selectors
        import socket

        self.path = path
        self.culprit: tuple[int, int] | None = None  # (rank, pid)
        #: The ranks that said ``done``: a rank missing here at the end never
        #: finished its script, even if it never even said hello (it ended
        #: before MPI started), which no line can tell.
        self.finished: set[int] = set()
        self.greeted: set[int] = set()  # the ranks that said hello (a minidist script)
        #: (rank, pid) of every line that ended with neither word, in order.
        self.vanished: list[tuple[int, int]] = []
        #: The first line of each failed rank's report, as it sent it.
        self.reports: list[str] = []
        self._on_vanished = on_vanished
        self._trouble = False  # a rank said "failed", or one vanished
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(256)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ)
        self._stop_read, self._stop_write = os.pipe()
        self._selector.register(self._stop_read, selectors.EVENT_READ)
        self.start()

    def run(self) -> None:
        import selectors

        said: dict = {}  # connection -> the bytes it sent
        finish_by = None  # once mpiexec has ended: read the lines to their ends until then
        while finish_by is None or (said and time.monotonic() < finish_by):
            wait = None if finish_by is None else max(finish_by - time.monotonic(), 0.0)
            # In the order the kernel saw them become ready (see above): a
            # rank's end before another's "failed" is the first sign.
            for key, _ in self._selector.select(wait):
                if key.fileobj == self._stop_read:
                    os.read(self._stop_read, 16)
                    finish_by = time.monotonic() + self.FINISH_SECONDS
                elif key.fileobj is self._server:
                    connection, _ = self._server.accept()
                    said[connection] = b""
                    self._selector.register(connection, selectors.EVENT_READ)
                else:
                    self._read(key.fileobj, said)

    def _read(self, connection, said: dict) -> None:
        data = connection.recv(256)
        said[connection] += data
        if data:
            if b"\nfailed\n" in said[connection]:
                self._trouble = True  # that rank reports itself
            return
        self._selector.unregister(connection)
        connection.close()
        text = said.pop(connection)
        for line in text.split(b"\n"):
            if line.startswith(b"report "):
                self.reports.append(line[len(b"report "):].decode(errors="replace"))
        words = text.split()
        if words[:1] == [b"hello"] and len(words) >= 3:
            self.greeted.add(int(words[1]))
            if words[3:4] == [b"done"]:
                self.finished.add(int(words[1]))
        if words[:1] == [b"hello"] and len(words) == 3:
            self.vanished.append((int(words[1]), int(words[2])))
        if words[:1] == [b"hello"] and len(words) == 3 and not self._trouble:
            self._trouble = True
            self.culprit = (int(words[1]), int(words[2]))
            self._on_vanished(*self.culprit)

    def ending_the_job(self) -> None:
        """The launcher ends the job itself (Ctrl-C, SIGTERM): the lines that
        end now are its doing, not a rank's."""
        self._trouble = True

    def close(self) -> None:
        """mpiexec has ended: read what the lines still hold (a rank's end may
        reach this thread after mpiexec's: the machine is busy), then stop."""
        os.write(self._stop_write, b"x")
        self.join(self.FINISH_SECONDS + 1.0)
        for key in list(self._selector.get_map().values()):
            if key.fileobj not in (self._stop_read,):
                key.fileobj.close()
        os.close(self._stop_read)
        os.close(self._stop_write)
        self._selector.close()


# --------------------------------------------------------------------------- minidist predict


def int8_speed_line(float_seconds: float, int8_seconds: float) -> str:
    """One line on why ``minidist predict --int8``'s int8 row is as fast as it
    is, chosen from the two single-process times: NumPy has no int8 matrix
    product kernel (BLAS multiplies floating point only), so the int8 layers
    multiply in NumPy's plain integer loop."""
    ratio = int8_seconds / float_seconds
    why = ("NumPy has no int8 matrix product kernel (BLAS multiplies floats only), so the "
           "int8 layers multiply in a plain integer loop: int8 buys a quarter of the weight "
           "bytes here, not speed (hardware with int8 instructions computes it faster)")
    if ratio > 1.1:
        return f"int8 predicted {ratio:.3g}x slower than float32 on 1 process: {why}."
    return (f"int8 predicted in {ratio:.2f} of float32's time on 1 process, though {why}; "
            "at this size other costs than the products dominate.")


def predict_command(args) -> int:
    """``minidist predict --model mlp|cnn -n N [--batch-size B] [--copies K]
    [--epochs E] [--int8] [--transport T] [--no-progress]``.

    Trains the digits model (one process, a few seconds), then predicts the
    test digits (repeated ``--copies`` times for a bigger input) in one
    process and on N processes (:func:`minidist.parallel.data.inference.parallel_predict`),
    and prints each one's throughput and whether the N-process predictions
    equal the single-process ones bit for bit (they compute every batch in
    the same shape, position and BLAS thread count, so they should on any
    BLAS kernel; the check is real). ``--int8`` does the same for
    the model quantised by :func:`minidist.nn.quantization.quantize`, with
    its size and accuracy. Exit status 1 if any predictions differ.
    """
    import time

    from rich.console import Console
    from rich.table import Table

    from minidist.data import load_digits
    from minidist.nn.quantization import model_size_bytes, quantize
    from minidist.parallel.data.inference import parallel_predict, predict
    from minidist.train import train_digits

    try:
        for flag, value in (("-n", args.nproc), ("--batch-size", args.batch_size),
                            ("--copies", args.copies)):
            if value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}")
        if args.epochs is not None and args.epochs < 1:
            raise ValueError(f"--epochs must be at least 1, got {args.epochs}")
        check_name(args.transport)
    except ValueError as error:
        Console(stderr=True).print(f"minidist predict: error: {error}", style="bold red",
                                   markup=False, highlight=False, soft_wrap=True)
        return 2

    out = Console(highlight=False)
    trained = train_digits(model=args.model, epochs=args.epochs, seed=args.seed, progress=False,
                           console=out)
    x_train, _, x_test, y_test = load_digits(flatten=(args.model == "mlp"))
    x = np.concatenate([x_test] * args.copies)
    y = np.concatenate([y_test] * args.copies)
    models = [("float32", trained["model"])]
    if args.int8:
        models.append(("int8", quantize(trained["model"], x_train[:512])))
    out.print(f"predicting {len(x):,} digits ({args.copies} x the {len(x_test)} test digits), "
              f"batch {args.batch_size}, on 1 and {args.nproc} processes of one BLAS thread "
              f"({os.cpu_count()} cores, transport {args.transport})")
    table = Table()
    for column in ("model", "bytes", "accuracy", "1 process", f"{args.nproc} processes",
                   "speed-up", "same bits"):
        table.add_column(column, justify="left" if column == "model" else "right")
    all_equal = True
    verdicts = []
    single_times = {}
    for name, model in models:
        start = time.perf_counter()
        single = predict(model, x, batch_size=args.batch_size)
        single_seconds = time.perf_counter() - start
        single_times[name] = single_seconds
        start = time.perf_counter()
        parallel = parallel_predict(model, x, world_size=args.nproc, batch_size=args.batch_size,
                                    transport=args.transport, progress=not args.no_progress,
                                    console=out)
        parallel_seconds = time.perf_counter() - start
        equal = parallel.shape == single.shape and bool((parallel == single).all())
        all_equal &= equal
        accuracy = float((single.argmax(axis=1) == y).mean())
        table.add_row(name, f"{model_size_bytes(model):,}", f"{100 * accuracy:.2f} %",
                      f"{len(x) / single_seconds:,.0f} ex/s", f"{len(x) / parallel_seconds:,.0f} ex/s",
                      f"{single_seconds / parallel_seconds:.3g}x",
                      "yes" if equal else "NO", style=None if equal else "bold red")
        verdicts.append(f"{name}: the {args.nproc}-process predictions "
                        + ("equal the single-process ones bit for bit" if equal else
                           "DIFFER from the single-process ones"))
    out.print(table)
    for line in verdicts:
        out.print(line, soft_wrap=True)
    if "int8" in single_times:
        out.print(int8_speed_line(single_times["float32"], single_times["int8"]), soft_wrap=True)
    out.print(f"The {args.nproc}-process time includes starting the processes; a bigger input "
              "(--copies) shows the compute's speed-up, bounded by the cores.")
    return 0 if all_equal else 1
