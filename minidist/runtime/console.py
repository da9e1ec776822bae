"""Output from many workers, readable: logs routed to the parent, rank 0 helpers.

Logs. Every worker's ``logging`` records travel to the parent process and are
printed there by the parent's root handlers (a Rich console when the program
has configured none), each prefixed with ``[rank r]``. A record is one message,
so lines from different ranks never interleave mid-line the way bare ``print``
output of several processes can.

How they travel: the worker's root logger gets one handler,
:class:`PipeLogHandler`, that pickles each record's fields and writes them to
a pipe to the parent as ``("log", fields)``; the parent hands them to
:func:`emit_worker_record`. Both launchers use it:

* workers started by :func:`minidist.launch` (fork) write to their *result
  pipe*, which the supervisor already watches: it emits the records between
  the results, in the order they were sent. No thread and no queue per run
  (a log thread, a queue and its feeder thread started and joined by every
  launch cost more than the rest of a trivial launch), and a rank's last
  records always arrive before its result;
* workers started by ``minidist run`` (separate programs) write to a pipe of
  their own, read by a listener thread (:class:`PipeLogListener`). Each pipe
  is in order, but the pipes are read as they become ready, so the listener
  merges them by the time each record was made (``record.created``, stamped
  in the worker): a record is printed once every other rank has sent a later
  one, or after :data:`HOLD_SECONDS` at most. Log lines thus appear in the
  order the ranks logged them, as long as a record reaches the parent within
  that time.

Printing. :func:`print0` prints on rank 0 only, and in a worker it sends the
line to the parent on the same pipe as the records, as ``("print", fields)``,
so that a conclusion printed after the ranks logged comes out after their
lines (written straight to the terminal, it overtook the records still in
their pipes). :func:`progress0` shows a Rich progress bar on rank 0 and just
iterates elsewhere.
"""

from __future__ import annotations

import heapq
import logging
import os
import pickle
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multiprocessing.connection import Connection


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


_default = None  # the parent's Rich handler for workers' records, made at the first one


def _default_handler() -> logging.Handler:
    global _default
    if _default is None:
        from rich.logging import RichHandler

        _default = RichHandler(show_path=False, rich_tracebacks=False, markup=False)
    return _default


def emit_worker_print(fields: dict) -> None:
    """Parent side: write a line a worker printed with :func:`print0`."""
    stream = sys.stderr if fields.get("stream") == "stderr" else sys.stdout
    stream.write(fields["text"])
    stream.flush()


def emit_worker_message(kind: str, fields: dict) -> None:
    """Parent side: a worker's ``("log", fields)`` or ``("print", fields)``."""
    if kind == "print":
        emit_worker_print(fields)
    else:
        emit_worker_record(fields)


def emit_worker_record(fields: dict) -> None:
    """Parent side: print one record a worker logged, through the root logger's
    handlers (or a Rich one if the program configured none), as if it had been
    logged here. Handlers of other loggers are left out: a worker inherits
    those and they already ran there."""
    record = logging.makeLogRecord(fields)
    handlers = logging.getLogger().handlers or [_default_handler()]
    for handler in handlers:
        if record.levelno >= handler.level:
            handler.handle(record)


class PipeLogHandler(logging.Handler):
    """Worker side: send each record, formatted, to the parent as ``("log", fields)``.

    The connection may be shared with other messages (a forked worker's result
    pipe): whoever sends on it holds this handler's lock (:meth:`send_last`),
    so a record logged by another thread never cuts a message in two."""

    def __init__(self, connection: Connection, rank: int):
        super().__init__()
        self.connection = connection
        self.addFilter(RankPrefix(rank))

    def emit(self, record: logging.LogRecord) -> None:
        if self.connection is None:
            return  # the result has gone: the parent reads nothing more
        try:
            if record.exc_info:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
                record.exc_info = None
            fields = dict(record.__dict__)
            fields["msg"] = record.getMessage()
            fields["args"] = None
            self.connection.send_bytes(pickle.dumps(("log", fields), pickle.HIGHEST_PROTOCOL))
        except (OSError, ValueError):
            pass  # the parent is gone; nothing useful to do with a log line
        except Exception:
            self.handleError(record)

    def send(self, message) -> bool:
        """Send another message on the records' pipe (a :func:`print0` line);
        False when it cannot go (the pipe has ended)."""
        with self.lock:
            if self.connection is None:
                return False
            try:
                self.connection.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
            except (OSError, ValueError):
                return False
        return True

    def send_last(self, payload: bytes) -> None:
        """Send the worker's final message after every record, and stop sending."""
        with self.lock:
            connection, self.connection = self.connection, None
            connection.send_bytes(payload)


#: Launcher side: the handler of each rank, made once per process and reused by
#: every launch (see :func:`worker_log_handler`).
_worker_handlers: dict[int, PipeLogHandler] = {}


def worker_log_handler(rank: int) -> PipeLogHandler:
    """Launcher side, before the forks: the handler rank ``rank`` will log
    through, without its connection (the worker sets it). Made in the worker,
    a handler's lock, filter and place in logging's tables touched dozens of
    pages the fork shares, each copied at a fault, in every worker of every
    launch. Made here once, a warm launch's workers only set a field."""
    handler = _worker_handlers.get(rank)
    if handler is None:
        handler = _worker_handlers[rank] = PipeLogHandler(None, rank)
    return handler


def configure_worker_logging(rank: int, level, connection: Connection,
                             inherited: bool = True, handler=None) -> PipeLogHandler:
    """Worker side: the root logger sends its records to the parent over
    ``connection``, tagged with the rank; INFO goes through by default. With
    ``inherited`` (a forked worker) the root handlers are the parent's, copied
    by fork, and are dropped: the parent prints what arrives. A separate
    program keeps the handlers it set up itself. ``handler``: one made by
    :func:`worker_log_handler` before the fork."""
    global _this_rank, _this_handler
    _this_rank = rank
    root = logging.getLogger()
    if handler is None:
        handler = PipeLogHandler(connection, rank)
    else:
        handler.connection = connection
    _this_handler = handler
    root.handlers = [handler] if inherited else [*root.handlers, handler]
    if level is not None:
        root.setLevel(level)
    return handler


# ----------------------------------------------------------------- separate programs


#: How long the listener holds a record back for an earlier one from another
#: rank still in its pipe: the price of the time order, in delay of a line.
HOLD_SECONDS = 0.05


class PipeLogListener:
    """Parent side (``minidist run``): a thread that emits the workers' records,
    merged by the time they were made (see the module's docstring)."""

    def __init__(self, read_fds: list[int]):
        from multiprocessing.connection import Connection

        self._connections = [Connection(fd, writable=False) for fd in read_fds]
        self._thread = threading.Thread(target=self._run, name="minidist-logs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from multiprocessing.connection import wait

        open_connections = list(self._connections)
        latest = {connection: 0.0 for connection in open_connections}  # last record's time
        held = []  # (created, arrival number, kind, fields): a heap, earliest first
        arrivals = 0
        while open_connections or held:
            timeout = None if not held else max(0.0, held[0][0] + HOLD_SECONDS - time.time())
            for connection in wait(open_connections, timeout):
                try:
                    kind, fields = pickle.loads(connection.recv_bytes())
                except (EOFError, OSError):
                    open_connections.remove(connection)
                    continue
                latest[connection] = fields.get("created", 0.0)
                heapq.heappush(held, (latest[connection], arrivals, kind, fields))
                arrivals += 1
            now = time.time()
            while held:
                created = held[0][0]
                # Each pipe is in time order: once every open one has sent
                # something later, nothing earlier can still come.
                if now - created < HOLD_SECONDS and \
                        any(latest[connection] < created for connection in open_connections):
                    break
                _, _, kind, fields = heapq.heappop(held)
                emit_worker_message(kind, fields)

    def stop(self, timeout: float = 2.0) -> None:
        self._thread.join(timeout)
        for connection in self._connections:
            connection.close()


def configure_script_logging(fd: int, rank: int, level) -> None:
    # Imported here, not at the top: a worker program imports this module, and
    # multiprocessing's import is a few milliseconds of its start.
    from multiprocessing.connection import Connection

    configure_worker_logging(rank, level, Connection(fd, readable=False), inherited=False)


# ----------------------------------------------------------------- ranks started by mpiexec


class RankConsoleHandler(logging.Handler):
    """A rank's own printer of its records, ``[rank r]`` first, as the parent
    of ``minidist run`` prints them (a Rich handler on stdout).

    Under mpiexec no minidist parent gathers the ranks' records: each rank is
    a program of its own, and mpiexec forwards what it writes. A program that
    configured no logging would show only warnings (Python's last-resort
    handler), so its INFO lines vanished. Rich is imported at the first record,
    not at the rank's start; each record is one write, which the pipe to
    mpiexec keeps whole, so ranks' lines never mix mid-line. They come out
    in the order mpiexec reads them, not merged by time as ``minidist run``
    merges its pipes."""

    def __init__(self, rank: int):
        super().__init__()
        self.addFilter(RankPrefix(rank))
        self._printer = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._printer is None:
                from rich.logging import RichHandler

                self._printer = RichHandler(show_path=False, rich_tracebacks=False,
                                            markup=False)
            self._printer.handle(record)
        except Exception:
            self.handleError(record)


def configure_mpi_logging(rank: int, level) -> RankConsoleHandler | None:
    """Rank side, under mpiexec: the root logger prints its records itself,
    tagged with the rank (:class:`RankConsoleHandler`), INFO through by
    default, unless the program set up handlers of its own (then they are
    its choice, left as they are). Returns the handler added, or None."""
    root = logging.getLogger()
    if root.handlers:
        return None
    handler = RankConsoleHandler(rank)
    root.addHandler(handler)
    if level is not None:
        root.setLevel(level)
    return handler


# ----------------------------------------------------------------- rank 0 helpers


#: This process's rank, once it is a worker (set when its logging is set up).
_this_rank: int | None = None
#: The handler its records travel by (print0's lines take the same pipe).
_this_handler: PipeLogHandler | None = None


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
        text = sep.join(str(arg) for arg in args) + end
        handler = _this_handler
        if handler is not None and stream in (sys.stdout, sys.stderr) and handler.send(
                ("print", {"created": time.time(), "text": text,
                           "stream": "stderr" if stream is sys.stderr else "stdout"})):
            return  # the parent prints it, in order with the ranks' log lines
        stream.write(text)
        stream.flush()


def progress0(iterable, description: str = "", total: int | None = None):
    """A Rich progress bar over ``iterable`` on rank 0; plain iteration elsewhere."""
    if _rank() != 0:
        return iterable
    from rich.progress import track

    return track(iterable, description=description or "working", total=total,
                 transient=not sys.stdout.isatty())
