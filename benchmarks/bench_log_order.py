"""What the time order of `minidist run`'s log lines costs: the delay from a
rank's ``log.info`` to the parent's handler, and whether the lines came out
in the order they were made.

minidist's listener (:class:`minidist.runtime.console.PipeLogListener`) merges
the ranks' pipes by each record's creation time, holding a record until every
other rank has sent a later one or for ``HOLD_SECONDS`` at most. The peer is
the listener as it was before: each pipe read as it becomes ready, records
handled in the order read. Both run the same script (N ranks each logging a
line every 10 ms, all at the same moments) in the same process, interleaved,
``--repeats`` times.

    python benchmarks/bench_log_order.py            # 4 ranks, 3 repeats
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import textwrap
import time
from multiprocessing.connection import wait

from minidist.cli import main
from minidist.runtime import console

SCRIPT = textwrap.dedent("""
    import logging, time
    import minidist.distributed as dist
    dist.init_process_group()
    log = logging.getLogger("bench")
    dist.barrier()
    for k in range({lines}):
        log.info("line %d", k)
        time.sleep(0.01)
    dist.barrier()
""")


def pipe_by_pipe(self) -> None:
    """The peer: the listener's loop before the merge (records in the order read)."""
    open_connections = list(self._connections)
    while open_connections:
        for connection in wait(open_connections):
            try:
                fields = connection.recv()
            except (EOFError, OSError):
                open_connections.remove(connection)
                continue
            record = logging.makeLogRecord(fields)
            logging.getLogger(record.name).handle(record)


class Delays(logging.Handler):
    def __init__(self):
        super().__init__()
        self.delays, self.in_order, self.last = [], True, 0.0

    def emit(self, record):
        if record.getMessage().split("] ")[-1].startswith("line"):
            self.delays.append(time.time() - record.created)
            self.in_order &= record.created >= self.last
            self.last = record.created


def main_(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--lines", type=int, default=40, help="lines per rank (default 40)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    merged = console.PipeLogListener._run
    readers = {"merged by time (minidist)": merged, "pipe by pipe (before)": pipe_by_pipe}
    results = {name: [] for name in readers}
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "logs.py")
        with open(script, "w") as file:
            file.write(SCRIPT.format(lines=args.lines))
        for _ in range(args.repeats):
            for name, reader in readers.items():  # interleaved: same load for both
                console.PipeLogListener._run = reader
                handler = Delays()
                logging.getLogger().addHandler(handler)
                try:
                    if main(["run", "-n", str(args.n), script]) != 0:
                        return 1
                finally:
                    logging.getLogger().removeHandler(handler)
                    console.PipeLogListener._run = merged
                results[name].append(handler)
    print(f"{args.n} ranks x {args.lines} lines, {args.repeats} repeats, {os.cpu_count()} cores; "
          f"HOLD_SECONDS = {console.HOLD_SECONDS}")
    print(f"{'reader':28s} {'median delay':>13s} {'max delay':>10s} {'runs in order':>14s}")
    for name, handlers in results.items():
        median = statistics.median(d for h in handlers for d in h.delays)
        worst = max(d for h in handlers for d in h.delays)
        in_order = sum(h.in_order for h in handlers)
        print(f"{name:28s} {median * 1e3:10.2f} ms {worst * 1e3:7.2f} ms "
              f"{in_order:>8d} of {len(handlers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
