"""``minidist demo parameter-server -n N --servers S --mode M --tau T``: a parameter server, watched live.

N processes: S servers, each owning one key range of the digits' MLP
(64-32-10), and N - S workers training it by push and pull
(:func:`~minidist.examples.parameter_server.train_mlp_on_digits`), with the
consistency ``--mode`` (bsp, ssp, async, drop; ``--tau`` for ssp and drop).
The last worker is a straggler: it sleeps a few milliseconds before every
gradient, so that the modes differ visibly (in ssp the others run up to tau
steps ahead of it and wait; in async they go on and its pushes arrive stale).

The live view in the parent shows each server's version (the updates it
applied to its range) and the pushes it accepted and dropped; each worker's
step and the staleness of its last push; the throughput (worker steps and
server updates per second). It is fed from the processes themselves: the
parameter server records every push, pull and update in the trace as it
runs, and a thread in each process reads its own trace recorder every few
milliseconds and puts a summary on a multiprocessing queue created before
the launch (so the forked processes inherit it). Nothing in the strategy
knows about the view. When standard output is not a terminal, the parent
prints a plain report twice a second instead (the servers' line, then the
workers').

The run is traced; the parent writes the trace, the test accuracy and how
to draw the trace.
"""

from __future__ import annotations

import multiprocessing
import threading
import time

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

import minidist
from minidist import trace
from minidist.data import load_digits
from minidist.examples.parameter_server import (
    digits_accuracy,
    digits_mlp,
    split_rows,
    train_mlp_on_digits,
)
from minidist.parallel.parameter_server.layout import Layout, flat_parameters, shard_ranges
from minidist.parallel.parameter_server.shard import MODES
from viz.terminal import fold, print_commands, print_folded

#: At most this many epochs (the demo parser's default, 20, is the tour's).
MAX_EPOCHS = 10
BATCH = 32
LR = 0.1
STRAGGLER_SECONDS = 0.01
REPORT_SECONDS = 0.05
DEFAULT_TRACE = "parameter_server.trace.jsonl"


class _Progress:
    """What one process has done so far, read from its own trace recorder,
    scanning only the events added since the last look."""

    def __init__(self, rank: int, layout: Layout, mode: str):
        self.rank, self.layout, self.mode = rank, layout, mode
        self.scanned = 0
        self.steps = 0                # worker: gradients computed
        self.version = 0              # server: updates applied to its range
        self.accepted = self.dropped = 0
        self.staleness: dict[int, int] = {}     # server: worker -> its last push's
        self.bases: dict[tuple[int, int], int] = {}   # server: (worker, step) -> version

    def scan(self) -> dict:
        recorder = trace.current()
        events = recorder.events if recorder is not None else []
        kind_at, label_at = trace.FIELDS.index("kind"), trace.FIELDS.index("label")
        for event in events[self.scanned:]:
            info = trace.label_info(event[label_at])
            if event[kind_at] == "compute" and event[label_at].startswith("gradient"):
                self.steps += 1
            elif event[kind_at] == "recv" and info.get("kind") == "push":
                self.bases[info["worker"], info["step"]] = info["version"]
            elif event[kind_at] == "compute" and info.get("kind") == "update":
                self._update(info)
        self.scanned = len(events)
        if self.layout.is_server(self.rank):
            return {"rank": self.rank, "role": "server", "version": self.version,
                    "accepted": self.accepted, "dropped": self.dropped,
                    "staleness": dict(self.staleness)}
        return {"rank": self.rank, "role": "worker", "steps": self.steps}

    def _update(self, info: dict) -> None:
        if not info["accepted"]:
            self.dropped += 1
            self.staleness[info["worker"]] = info["staleness"]
            return
        if info["worker"] == "all":   # a synchronous step: every worker's push of that step
            for (worker, step), base in list(self.bases.items()):
                if step == info["step"]:
                    self.staleness[worker] = info["version"] - base
                    self.accepted += 1
                    del self.bases[worker, step]
        else:
            self.staleness[info["worker"]] = info["staleness"]
            self.accepted += 1
            self.bases.pop((info["worker"], info["step"]), None)
        self.version = info["version"] + 1


def _report(status, progress: _Progress, stop: threading.Event) -> None:
    while not stop.wait(REPORT_SECONDS):
        status.put(progress.scan())


def _run(status, steps, servers, mode, options, straggler):
    """Every rank: train (or serve) with a reporting thread beside it."""
    import minidist.distributed as dist

    layout = Layout.for_world(dist.get_world_size(), servers, dist.get_rank())
    progress = _Progress(dist.get_rank(), layout, mode)
    stop = threading.Event()
    reporter = threading.Thread(target=_report, args=(status, progress, stop), daemon=True)
    reporter.start()
    try:
        result = train_mlp_on_digits(steps, servers=servers, mode=mode, lr=LR, batch_size=BATCH,
                                     straggler=straggler, **options)
    finally:
        stop.set()
        reporter.join()
        status.put(progress.scan())
        # Push what the queue's feeder thread still holds before the process ends.
        status.close()
        status.join_thread()
    return result


#: The workers' table's columns but the progress bar take this many of the terminal's.
WORKERS_WITHOUT_BAR = 52


class _View:
    def __init__(self, layout: Layout, key_ranges, steps: int, title: str):
        self.layout, self.key_ranges, self.steps, self.title = layout, key_ranges, steps, title
        self.latest: dict[int, dict] = {}
        self.start = time.perf_counter()

    def add(self, row: dict) -> None:
        self.latest[row["rank"]] = row

    def _servers(self):
        return [self.latest.get(s, {"version": 0, "accepted": 0, "dropped": 0, "staleness": {}})
                for s in range(self.layout.servers)]

    def _worker_steps(self):
        return [self.latest.get(self.layout.worker_rank(k), {}).get("steps", 0)
                for k in range(self.layout.workers)]

    def _staleness(self, worker: int):
        found = [s["staleness"][worker] for s in self._servers() if worker in s["staleness"]]
        return max(found) if found else None

    def throughput(self) -> tuple[float, float]:
        seconds = max(time.perf_counter() - self.start, 1e-9)
        updates = sum(s["version"] for s in self._servers()) / self.layout.servers
        return sum(self._worker_steps()) / seconds, updates / seconds

    def table(self, width: int = 80):
        """The servers' table and the workers', whose progress bars are as wide
        as the terminal leaves them (at most 30): both fit in ``width`` columns."""
        bar = max(8, min(30, width - WORKERS_WITHOUT_BAR))
        servers = Table(title=self.title, title_justify="left")
        for column in ("server", "keys", "version", "accepted", "dropped"):
            servers.add_column(column, justify="right")
        for s, row in enumerate(self._servers()):
            start, stop = self.key_ranges[s]
            servers.add_row(str(s), f"{start}:{stop}", str(row["version"]), str(row["accepted"]),
                            str(row["dropped"]))
        workers = Table()
        for column in ("worker", "rank", "progress", "step", "staleness"):
            workers.add_column(column, justify="left" if column == "progress" else "right")
        for k, steps in enumerate(self._worker_steps()):
            staleness = self._staleness(k)
            name = f"{k} (straggler)" if k == self.layout.workers - 1 else str(k)
            workers.add_row(name, str(self.layout.worker_rank(k)),
                            ProgressBar(total=self.steps, completed=steps, width=bar),
                            f"{steps}/{self.steps}", "-" if staleness is None else str(staleness))
        steps_per_second, updates_per_second = self.throughput()
        return Group(servers, workers, f"throughput: {steps_per_second:,.0f} worker steps/s, "
                                       f"{updates_per_second:,.0f} updates/s per server")

    def line(self, width: int = 80) -> str:
        """Two lines, folded to ``width``: the servers', then the workers'
        under it."""
        steps_per_second, _ = self.throughput()
        servers = self._servers()
        staleness = [self._staleness(k) for k in range(self.layout.workers)]
        first = (f"{time.perf_counter() - self.start:5.1f} s  server versions "
                 f"{[s['version'] for s in servers]}  accepted {sum(s['accepted'] for s in servers)}"
                 f"  dropped {sum(s['dropped'] for s in servers)}  {steps_per_second:,.0f} steps/s")
        second = (f"         worker steps {self._worker_steps()}  staleness "
                  f"{['-' if x is None else x for x in staleness]}")
        return fold(first, width) + "\n" + fold(second, width)


def _show(status, console: Console, view: _View) -> None:
    """Draw the processes' reports until the parent puts None on the queue."""
    if console.is_terminal:
        with Live(view.table(console.width), console=console, refresh_per_second=10) as live:
            while (row := status.get()) is not None:
                view.add(row)
                live.update(view.table(console.width))
        return
    printed = time.perf_counter()
    while (row := status.get()) is not None:
        view.add(row)
        if time.perf_counter() - printed >= 0.5:
            console.print(view.line(console.width), markup=False, soft_wrap=True)
            printed = time.perf_counter()
    console.print(view.line(console.width), markup=False, soft_wrap=True)


def _problem(args) -> str | None:
    if args.nproc < 2:
        return f"-n must be at least 2 (a server and a worker), got {args.nproc}"
    if args.servers < 1 or args.servers >= args.nproc:
        return (f"--servers must be from 1 to {args.nproc - 1} with -n {args.nproc} (the rest "
                f"are workers), got {args.servers}")
    if args.mode not in MODES:
        return f"unknown --mode {args.mode!r}; choose one of {', '.join(MODES)}"
    if args.mode in ("ssp", "drop") and args.tau < 0:
        return f"--tau must be >= 0, got {args.tau}"
    if args.epochs < 1:
        return f"--epochs must be at least 1, got {args.epochs}"
    return None


def main(args) -> int:
    console = Console(no_color=args.no_color, highlight=False)
    problem = _problem(args)
    if problem is not None:
        console.print(f"minidist demo parameter-server: {problem}")
        return 2
    layout = Layout(args.servers, args.nproc - args.servers)
    epochs = min(args.epochs, MAX_EPOCHS)
    images = len(load_digits()[1])
    rows_per_worker = min(r.stop - r.start for r in split_rows(images, layout.workers))
    steps = epochs * -(-rows_per_worker // BATCH)
    options = {"tau": args.tau} if args.mode in ("ssp", "drop") else {}
    straggler = (layout.workers - 1, STRAGGLER_SECONDS)
    trace_path = args.trace or DEFAULT_TRACE
    mode = f"{args.mode}(tau={args.tau})" if options else args.mode
    console.print(f"[bold]minidist demo parameter-server[/bold]: MLP 64-32-10 on the 8x8 digits, "
                  f"{layout.servers} server(s) and {layout.workers} worker(s), mode {mode}, "
                  f"{steps} steps per worker ({epochs} epoch{'s' if epochs > 1 else ''} of its "
                  f"part, {BATCH} images a step), SGD lr {LR}; worker {layout.workers - 1} is a "
                  f"straggler: it sleeps {STRAGGLER_SECONDS * 1e3:.0f} ms before each gradient")
    key_ranges = shard_ranges(flat_parameters(digits_mlp()).size, layout.servers)
    view = _View(layout, key_ranges, steps, f"parameter server, {mode}")
    # Made before the launch, so the forked processes inherit it.
    status = multiprocessing.get_context("fork").Queue()
    viewer = threading.Thread(target=_show, args=(status, console, view), daemon=True,
                              name="parameter-server-view")
    viewer.start()
    try:
        results = minidist.launch(_run, world_size=args.nproc, transport="shm",
                                  args=(status, steps, layout.servers, args.mode, options,
                                        straggler), trace=trace_path)
    finally:
        status.put(None)
        viewer.join(10.0)

    seconds = time.perf_counter() - view.start
    servers = results[:layout.servers]
    staleness = [record.staleness for server in servers for record in server.pushes]
    print_folded(console, f"test accuracy {digits_accuracy(results[0].weights):.3f} after {steps} steps "
                  f"per worker ({seconds:.1f} s); server versions "
                  f"{[server.version for server in servers]}; pushes accepted "
                  f"{sum(s.accepted for s in servers)}, dropped {sum(s.dropped for s in servers)}"
                  f"; staleness mean {sum(staleness) / max(len(staleness), 1):.2f}, "
                  f"max {max(staleness, default=0)}")
    console.print(f"trace written to {trace_path}", markup=False)
    console.print("draw it, or export it for Perfetto (ui.perfetto.dev):")
    print_commands(console, f"minidist viz {trace_path} --timeline parameter_server.png",
                   f"minidist viz {trace_path} --chrome parameter_server.json")
    if args.timeline:
        from viz.timeline import save_timeline

        console.print(f"timeline saved to {save_timeline(trace_path, args.timeline)}")
    return 0
