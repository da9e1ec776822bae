"""The errors of the runtime, each saying what went wrong, where, and what to do.

In a worker:

* :class:`NotInitializedError` - a distributed call before the process group exists;
* :class:`CommTimeoutError` - a blocking call waited longer than its timeout; its
  message carries the desync report (what every rank was doing at that moment);
* :class:`PeerGoneError` - the message awaited can never come: the peer finished
  or died;
* :class:`MessageMismatchError` - the buffer given to a receive does not have the
  shape or dtype of the message that arrived (the message is left in place);
* :class:`CollectiveMismatchError` - ranks of a group are in different collective
  calls (another collective, dtype, count, root, op or algorithm);
* :class:`AbortedError` - another rank failed and the run is being shut down.

In the parent, :class:`WorkerError` names the rank that failed first and carries
its traceback text; the other ranks' failures (usually ``AbortedError``) are in
``other_failures``.
"""

from __future__ import annotations


class DistributedError(RuntimeError):
    """Base class of the errors raised by minidist.distributed."""


class NotInitializedError(DistributedError):
    def __init__(self, what: str = "this call"):
        super().__init__(
            f"{what} needs the distributed runtime, which is not initialized in this process. "
            "Run your function with minidist.launch(fn, world_size=N), or start your script "
            "with `minidist run -n N script.py` and call dist.init_process_group() first."
        )


class CommTimeoutError(DistributedError, TimeoutError):
    """A blocking call waited longer than its timeout."""

    def __init__(self, message: str, *, operation: str = "", peer=None, tag=None,
                 report: str = ""):
        super().__init__(message)
        self.operation = operation
        self.peer = peer
        self.tag = tag
        self.report = report


class PeerGoneError(DistributedError):
    """The awaited message can never arrive: its sender has finished or died.

    ``peer`` is the global rank that is gone (None when the wait was on any
    rank): the launcher follows it to the rank that really caused the failure."""

    def __init__(self, message: str, *, peer: int | None = None):
        super().__init__(message)
        self.peer = peer

    def __reduce__(self):
        return (_rebuild_peer_gone, (str(self), self.peer))


def _rebuild_peer_gone(message, peer):
    return PeerGoneError(message, peer=peer)


class MessageMismatchError(DistributedError, ValueError):
    """The receive buffer does not match the incoming message (shape or dtype)."""


class CollectiveMismatchError(DistributedError, ValueError):
    """Ranks of one group called different collectives, or the same one with
    different arguments (dtype, element count, root, op, algorithm).

    ``odd`` lists the global ranks whose call differs from the majority's
    (empty when the rank that raised could not tell): the launcher names the
    first of them as the cause, whichever rank noticed first."""

    def __init__(self, message: str, *, odd=()):
        super().__init__(message)
        self.odd = tuple(int(rank) for rank in odd)

    def __reduce__(self):
        return (_rebuild_mismatch, (str(self), self.odd))


def _rebuild_mismatch(message, odd):
    return CollectiveMismatchError(message, odd=odd)


class AbortedError(DistributedError):
    """The run is being stopped because another rank failed (or the parent was interrupted)."""


class OversubscriptionWarning(UserWarning):
    """More ranks than cores: the ranks take turns, and timings show it."""


class WorkerError(DistributedError):
    """A worker failed; raised in the parent by :func:`minidist.launch`.

    Attributes: ``rank`` (the root cause: the rank whose failure, death or
    early return explains the others'); ``kind`` ("exception", "timeout",
    "died", "exited", "returned": it returned from its function while others
    still waited for it, "mismatch": its collective call differs from the
    other ranks' (the first line says how), "frozen": its process was stopped, by a signal or a
    debugger, while others waited for it); ``remote_type`` (the exception class name in the
    worker, if any); ``remote_message``; ``remote_traceback`` (the worker's
    traceback as text); ``exitcode``; ``noticed_by`` (where the root cause
    raised nothing itself, the rank whose error revealed it, and whose
    traceback this carries); ``other_failures`` (list of (rank, summary) of
    every other rank that failed or was stopped).

    The message puts the root cause on its first line and, however many ranks
    there are, summarises the others: every one when there are a few, counts
    by kind with the first ranks of each when there are many.
    """

    #: Up to this many other ranks, each gets a line of its own.
    LIST_ALL = 8
    #: Otherwise, this many ranks are named per kind, and this many lines of detail shown.
    NAMED_PER_KIND = 5
    DETAIL_LINES = 3

    def __init__(self, rank: int, kind: str, summary: str, *, remote_type: str = "",
                 remote_message: str = "", remote_traceback: str = "", exitcode=None,
                 other_failures=(), noticed_by: int | None = None):
        self.rank = rank
        self.kind = kind
        self.summary = summary
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode
        self.noticed_by = noticed_by
        self.other_failures = list(other_failures)
        super().__init__(self._format())

    def _format(self) -> str:
        lines = [self.summary]
        if self.remote_traceback:
            source = self.rank if self.noticed_by is None else self.noticed_by
            lines += ["", f"Traceback from rank {source}:", self.remote_traceback.rstrip()]
        if self.other_failures:
            lines += [""] + summarise_ranks(self.other_failures, self.LIST_ALL,
                                            self.NAMED_PER_KIND, self.DETAIL_LINES)
        return "\n".join(lines)

    def __reduce__(self):
        return (_rebuild_worker_error, (self.rank, self.kind, self.summary, self.remote_type,
                                        self.remote_message, self.remote_traceback,
                                        self.exitcode, self.other_failures, self.noticed_by))


def name_ranks(ranks, most: int = 5) -> str:
    """'rank 3', 'ranks 0, 1 and 4', 'ranks 0, 1, 2, 3, 4 and 995 more'."""
    ranks = list(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) <= most:
        return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:most])) + f" and {len(ranks) - most} more"


def summarise_ranks(failures, list_all: int = 8, named: int = 5, details: int = 3) -> list[str]:
    """Lines about the other ranks' failures: one per rank when there are at
    most ``list_all``; else one per kind of failure (what comes before the
    first colon of its summary), with a count and the first ranks, then the
    first ``details`` summaries that are not the common "stopped" kind."""
    failures = list(failures)
    if len(failures) <= list_all:
        return ["The other ranks were stopped:"] + [f"  rank {rank}: {what}"
                                                     for rank, what in failures]
    kinds: dict[str, list[int]] = {}
    for rank, what in failures:
        kinds.setdefault(what.split(":")[0], []).append(rank)
    lines = [f"The other {len(failures)} ranks:"]
    for kind, ranks in sorted(kinds.items(), key=lambda item: -len(item[1])):
        lines.append(f"  {len(ranks)} {kind} ({name_ranks(ranks, named)})")
    common = max(kinds.items(), key=lambda item: len(item[1]))[0]
    shown = [(rank, what) for rank, what in failures if what.split(":")[0] != common][:details]
    if shown:
        lines.append("  the first of the others:")
        lines += [f"    rank {rank}: {what}" for rank, what in shown]
    return lines


def _rebuild_worker_error(rank, kind, summary, remote_type, remote_message, remote_traceback,
                          exitcode, other_failures, noticed_by=None):
    return WorkerError(rank, kind, summary, remote_type=remote_type,
                       remote_message=remote_message, remote_traceback=remote_traceback,
                       exitcode=exitcode, other_failures=other_failures,
                       noticed_by=noticed_by)
