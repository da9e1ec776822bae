"""A script's process that ends with status 0 while the others still need it.

Under ``minidist run`` each rank is a script, and a script that exits with
status 0 has succeeded. Its exit also *leaves the run*: the exit work that
``init_process_group`` registered writes FINISHED in the rank's record of
the control block, and a peer that waits for it reads that and stops waiting
(see transport/failures.py). ``os._exit`` skips every exit function, so a
rank that calls it in the middle of the run is gone while its record still
says running (or waiting). Its peers cannot tell: over shared memory no pipe
closes, and they would wait out their timeout, blaming themselves, while
the report said the dead rank "is running its own code".

The supervisor sees every process end (its pidfd). A status-0 end whose
record never said FINISHED is noted here, not yet a failure: the rank may
have left after its last exchange, and then the run has succeeded. It is a
failure the moment a live rank *waits for it*: that rank's record says
WAITING, for it by rank or for any rank (a collective for the whole group, a
wait on several requests, a receive from any source). Then the rank that
left is the cause: "rank 1 exited (status 0) while rank 0 waited for it in
recv from 1, tag 7". The supervisor looks between its waits (a quarter of a
second at most).
"""

from __future__ import annotations

from minidist.runtime import control as ctl
from minidist.runtime.desync import describe_wait


def left_without_finishing(control: ctl.ControlBlock, rank: int) -> bool:
    """Did ``rank``'s process end without its exit work saying FINISHED?"""
    return control.state_of(rank) != ctl.FINISHED


def waits_for(status: ctl.RankStatus, rank: int) -> bool:
    """Is the rank of ``status`` waiting for ``rank`` (by rank, or for any rank)?"""
    return status.state == ctl.WAITING and status.peer in (rank, ctl.ANY)


class EarlyExits:
    """The ranks whose process ended with status 0 without leaving the run,
    and what a live rank waiting for one of them was waiting in."""

    def __init__(self):
        self.since: dict[int, float] = {}  # rank -> when its end was seen

    def note(self, rank: int, now: float) -> None:
        self.since.setdefault(rank, now)

    def forget(self, rank: int) -> float:
        """Stop watching ``rank``; when its end was seen."""
        return self.since.pop(rank)

    def waited_for(self, control: ctl.ControlBlock, live) -> list[tuple[int, list[int], str]]:
        """(rank that left, the live ranks waiting for it, what the first of
        them waits in) for each noted rank that a rank of ``live`` waits for."""
        found = []
        for rank in sorted(self.since):
            statuses = [control.status(other) for other in live if other != rank]
            waiting = [status for status in statuses if waits_for(status, rank)]
            if waiting:
                first = waiting[0]
                found.append((rank, [status.rank for status in waiting],
                              describe_wait(first.op, first.peer, first.tag, "")))
        return found
