"""Failures of the fault-tolerant parameter server: made on purpose, and reported.

A test of fault tolerance needs failures that come when it wants them, and
a run that survives one must say what happened, where its user sees it.

Making them. ``crash_server_at=(server, step[, moment])`` makes that server
SIGKILL itself (a machine vanishing; its own trace dies with it) at the
update of ``step`` of its own range (:class:`ServerCrash`):
``moment="before_forward"`` (the update is on the dying server only) or
``"after_one_reply"`` (the backup has acknowledged it and one worker has
pulled it; the others' requests come again and are duplicates). Launch with
that server's rank in ``tolerate_failures``. ``push_twice_at=(worker,
step)`` makes a worker send that push a second time with no failure at all,
as a worker that gave up waiting and retried would.

Reporting them. Each is logged (the ``minidist`` logger, at warning level)
and kept in the rank's result, and marked in the trace by a zero-length
event of kind ``"fault"``: ``kind=failover|backup_lost|worker_gone|duplicate``.

Cost: nothing until a failure; a SIGKILL takes the process at once, with
nothing flushed. Read after :mod:`.fault_tolerant`'s overview, before
:mod:`.replicated_shard`.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

from minidist import trace
from minidist.parallel.parameter_server.server import _check_whole

logger = logging.getLogger("minidist")

CRASH_MOMENTS = ("before_forward", "after_one_reply")


@dataclass(frozen=True)
class ServerCrash:
    """Server ``server`` SIGKILLs itself at the update of ``step`` of its own
    key range, at ``moment`` (see the module docstring)."""

    server: int
    step: int
    moment: str = "before_forward"

    @classmethod
    def parse(cls, value, servers: int, rank: int) -> ServerCrash | None:
        if value is None:
            return None
        if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
            raise ValueError(f"rank {rank}: crash_server_at must be (server, step) or (server, "
                             f"step, moment), got {value!r}")
        server = _check_whole("crash_server_at's server", value[0], 0, rank)
        step = _check_whole("crash_server_at's step", value[1], 0, rank)
        moment = value[2] if len(value) == 3 else "before_forward"
        if server >= servers:
            raise ValueError(f"rank {rank}: crash_server_at names server {server}, but there "
                             f"are only servers 0..{servers - 1}")
        if moment not in CRASH_MOMENTS:
            raise ValueError(f"rank {rank}: unknown crash moment {moment!r}; choose "
                             f"{' or '.join(map(repr, CRASH_MOMENTS))}")
        return cls(server, step, moment)


def _die_now() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _say(events: list[str], text: str) -> None:
    """Log a fault where the run's user sees it, and keep it for the result."""
    logger.warning(text)
    events.append(text)


def _fault_event(text: str, **info) -> None:
    moment = trace.now()
    trace.record("fault", moment, moment, label=trace.with_info(text, **info))

