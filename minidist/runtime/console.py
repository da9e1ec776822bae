"""Output from many workers, readable: logs routed to the parent, rank 0 helpers.

Logs. Every worker's ``logging`` records travel to the parent process and are
printed there by the parent's handlers (a Rich console when the program has
configured none), each prefixed with ``[rank r]``. A record is one message, so
lines from different ranks never interleave mid-line the way bare ``print``
output of several processes can.

* Workers started by :func:`minidist.launch` (fork) use multiprocessing-logging:
  the parent's root handlers are wrapped for the duration of the run in
  handlers that workers feed through a multiprocessing queue.
* Workers started by ``minidist run`` (separate programs) send their records
  over a pipe the parent reads with a listener thread. Each pipe is in order,
  but the pipes are read as they become ready, so the listener merges them by
  the time each record was made (``record.created``, stamped in the worker):
  a record is printed once every other rank has sent a later one, or after
  :data:`HOLD_SECONDS` at most. Log lines thus appear in the order the ranks
  logged them, as long as a record reaches the parent within that time.

Printing. :func:`print0` prints on rank 0 only; :func:`progress0` shows a Rich
progress bar on rank 0 and just iterates elsewhere.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import queue
import sys
import threading
import time
from multiprocessing.connection import Connection, wait

from multiprocessing_logging import MultiProcessingHandler


class RankPrefix(logging.Filter):
    """Prefix each record's message with ``[rank r] `` (and keep ``record.rank``)."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank
        self.prefix = f"[rank {rank}] "

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "rank", None) is None:
            record.msg = self.prefix + record.getMessage()
            record.args = None
            record.rank = self.rank
        return True


def _default_handler() -> logging.Handler:
    from rich.logging import RichHandler

    return RichHandler(show_path=False, rich_tracebacks=False, markup=False)


_STOP = None  # put on the queue by close(): ends the receiving thread at once


class _RunHandler(MultiProcessingHandler):
    """multiprocessing-logging's handler for one run. Differences: closing
    does not close the handler it wraps (that belongs to the program and
    outlives the run), and it ends the receiving thread at once instead of at
    its next 0.2 s poll, which would add 0.2 s to every launch."""

    def _receive(self):
        while True:
            try:
                record = self.queue.get(timeout=0.2)
            except queue.Empty:
                if self._is_closed:
                    break
                continue
            except (EOFError, OSError):
                break
            if record is _STOP:
                break
            try:
                self.sub_handler.emit(record)
            except Exception:
                self.sub_handler.handleError(record)
        self.queue.close()
        self.queue.join_thread()

    def close(self):
        if not self._is_closed:
            self._is_closed = True
            self.queue.put_nowait(_STOP)
            self._receive_thread.join(5.0)
            logging.Handler.close(self)


@contextlib.contextmanager
def route_worker_logs():
    """Parent side, around a fork-mode run: wrap the root handlers so records
    logged in forked workers are emitted here. Restores everything after."""
    root = logging.getLogger()
    added = None
    if not root.handlers:
        added = _default_handler()
        root.addHandler(added)
    originals = list(root.handlers)
    wrappers = []
    for index, handler in enumerate(originals):
        wrapper = _RunHandler(f"minidist-log-{index}", sub_handler=handler)
        wrapper.filters = list(handler.filters)  # do not share the list with the wrapped one
        root.removeHandler(handler)
        root.addHandler(wrapper)
        wrappers.append(wrapper)
    try:
        yield
    finally:
        for wrapper in wrappers:
            root.removeHandler(wrapper)
            wrapper.close()
        for handler in originals:
            if handler is not added:
                root.addHandler(handler)
        if added is not None:
            added.close()


def flush_worker_logs() -> None:
    """Worker side (fork), at the end: push buffered records into the pipe now,
    so they reach the parent before the worker's result does."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, MultiProcessingHandler):
            handler.queue.close()
            handler.queue.join_thread()


def configure_worker_logging(rank: int, level) -> None:
    """Worker side (fork): tag this rank's records; let INFO through by default."""
    global _this_rank
    _this_rank = rank
    root = logging.getLogger()
    prefix = RankPrefix(rank)
    for handler in root.handlers:
        handler.addFilter(prefix)
    if level is not None:
        root.setLevel(level)


# ----------------------------------------------------------------- separate programs


class PipeLogHandler(logging.Handler):
    """Worker side (``minidist run``): send each record, formatted, to the parent."""

    def __init__(self, fd: int, rank: int):
        super().__init__()
        self.connection = Connection(fd, readable=False)
        self.addFilter(RankPrefix(rank))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.exc_info:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
                record.exc_info = None
            fields = dict(record.__dict__)
            fields["msg"] = record.getMessage()
            fields["args"] = None
            self.connection.send(fields)
        except (OSError, ValueError):
            pass  # the parent is gone; nothing useful to do with a log line
        except Exception:
            self.handleError(record)


#: How long the listener holds a record back for an earlier one from another
#: rank still in its pipe: the price of the time order, in delay of a line.
HOLD_SECONDS = 0.05


class PipeLogListener:
    """Parent side (``minidist run``): a thread that emits the workers' records,
    merged by the time they were made (see the module's docstring)."""

    def __init__(self, read_fds: list[int]):
        self._connections = [Connection(fd, writable=False) for fd in read_fds]
        self._thread = threading.Thread(target=self._run, name="minidist-logs", daemon=True)
        self._added = None

    def start(self) -> None:
        root = logging.getLogger()
        if not root.handlers:
            self._added = _default_handler()
            root.addHandler(self._added)
        self._thread.start()

    def _run(self) -> None:
        open_connections = list(self._connections)
        latest = {connection: 0.0 for connection in open_connections}  # last record's time
        held = []  # (created, arrival number, fields): a heap, earliest first
        arrivals = 0
        while open_connections or held:
            timeout = None if not held else max(0.0, held[0][0] + HOLD_SECONDS - time.time())
            for connection in wait(open_connections, timeout):
                try:
                    fields = connection.recv()
                except (EOFError, OSError):
                    open_connections.remove(connection)
                    continue
                latest[connection] = fields.get("created", 0.0)
                heapq.heappush(held, (latest[connection], arrivals, fields))
                arrivals += 1
            now = time.time()
            while held:
                created = held[0][0]
                # Each pipe is in time order: once every open one has sent
                # something later, nothing earlier can still come.
                if now - created < HOLD_SECONDS and \
                        any(latest[connection] < created for connection in open_connections):
                    break
                record = logging.makeLogRecord(heapq.heappop(held)[2])
                logging.getLogger(record.name).handle(record)

    def stop(self, timeout: float = 2.0) -> None:
        self._thread.join(timeout)
        for connection in self._connections:
            connection.close()
        if self._added is not None:
            logging.getLogger().removeHandler(self._added)
            self._added.close()


def configure_script_logging(fd: int, rank: int, level) -> None:
    global _this_rank
    _this_rank = rank
    root = logging.getLogger()
    root.addHandler(PipeLogHandler(fd, rank))
    if level is not None:
        root.setLevel(level)


# ----------------------------------------------------------------- rank 0 helpers


#: This process's rank, once it is a worker (set when its logging is set up).
_this_rank: int | None = None


def _rank() -> int:
    if _this_rank is not None:
        return _this_rank
    for name in ("MINIDIST_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):  # minidist, mpiexec
        if name in os.environ:
            return int(os.environ[name])
    return 0


def print0(*args, sep: str = " ", end: str = "\n", file=None) -> None:
    """``print`` on rank 0 only. The line is written with a single write and
    flushed, so it does not interleave mid-line with the log lines the parent
    prints at the same time (plain ``print`` writes each piece separately when
    output is unbuffered)."""
    if _rank() == 0:
        stream = sys.stdout if file is None else file
        stream.write(sep.join(str(arg) for arg in args) + end)
        stream.flush()


def progress0(iterable, description: str = "", total: int | None = None):
    """A Rich progress bar over ``iterable`` on rank 0; plain iteration elsewhere."""
    if _rank() != 0:
        return iterable
    from rich.progress import track

    return track(iterable, description=description or "working", total=total,
                 transient=not sys.stdout.isatty())
