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
    """The awaited message can never arrive: its sender has finished or died."""


class MessageMismatchError(DistributedError, ValueError):
    """The receive buffer does not match the incoming message (shape or dtype)."""


class CollectiveMismatchError(DistributedError, ValueError):
    """Ranks of one group called different collectives, or the same one with
    different arguments (dtype, element count, root, op, algorithm)."""


class AbortedError(DistributedError):
    """The run is being stopped because another rank failed (or the parent was interrupted)."""


class WorkerError(DistributedError):
    """A worker failed; raised in the parent by :func:`minidist.launch`.

    Attributes: ``rank``; ``kind`` ("exception", "timeout", "killed", "exited");
    ``remote_type`` (the exception class name in the worker, if any);
    ``remote_message``; ``remote_traceback`` (the worker's traceback as text);
    ``exitcode``; ``other_failures`` (list of (rank, summary) of ranks that failed
    afterwards, usually because they were stopped).
    """

    def __init__(self, rank: int, kind: str, summary: str, *, remote_type: str = "",
                 remote_message: str = "", remote_traceback: str = "", exitcode=None,
                 other_failures=()):
        self.rank = rank
        self.kind = kind
        self.summary = summary
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode
        self.other_failures = list(other_failures)
        super().__init__(self._format())

    def _format(self) -> str:
        lines = [self.summary]
        if self.remote_traceback:
            lines += ["", f"Traceback from rank {self.rank}:", self.remote_traceback.rstrip()]
        if self.other_failures:
            lines += ["", "The other ranks were stopped:"]
            lines += [f"  rank {rank}: {what}" for rank, what in self.other_failures]
        return "\n".join(lines)

    def __reduce__(self):
        return (_rebuild_worker_error, (self.rank, self.kind, self.summary, self.remote_type,
                                        self.remote_message, self.remote_traceback,
                                        self.exitcode, self.other_failures))


def _rebuild_worker_error(rank, kind, summary, remote_type, remote_message, remote_traceback,
                          exitcode, other_failures):
    return WorkerError(rank, kind, summary, remote_type=remote_type,
                       remote_message=remote_message, remote_traceback=remote_traceback,
                       exitcode=exitcode, other_failures=other_failures)
