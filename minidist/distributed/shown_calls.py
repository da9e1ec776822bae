"""Ranks show the shape of the call they are in; a message that does not fit is judged by them.

Some calls need their ranks' arguments to fit together, and a rank whose
arguments do not fit shows it only as a message of the wrong size. Ring
attention computes the size of every rank's block from (T, n): a rank with
another T sends blocks of other sizes, and expects them, so *both* of its
neighbours' receives and its own fail with a MessageMismatchError, and which
of them raises first is chance. An uneven all_to_all is the same: rank i's
``input_split_sizes[j]`` must be rank j's ``output_split_sizes[i]``, and only
a receiver sees that they are not.

So as a rank enters such a call it **shows** the call's shape, a few
integers, in its record of the run's control block (the shown call, see
:mod:`minidist.runtime.control`), under a key every rank computes alike: the
group's context and the call's number in it. No message is sent: the
traces' counts of messages and bytes are those of the call itself. The
rank that receives a message that does not fit reads its group's shown calls
(:func:`read_shown`, waiting for members still on their way) and judges
them: equal shapes by the majority rule
(:func:`~minidist.runtime.majority.odd_ones`, the wording of
:func:`~minidist.distributed.agreement.disagreement`), an all_to_all's split
sizes pair by pair (``collectives/split_sizes.py``). Every rank that notices
reads the same records, so the error names the same odd rank, whichever
rank noticed first.

A strategy writes ``with dist.shown_call("ring_attention", shape, group):``
around the messages of its call (:func:`shown_call`). Where the records are
not shared (MPI across machines), or do not settle within
:data:`VERDICT_SECONDS`, the MessageMismatchError is raised as it was.

Cost: one write of 32 + 8 k bytes to shared memory per call (k values);
the reading only when a message did not fit.
"""

from __future__ import annotations

import contextlib
import time

from minidist.distributed.agreement import disagreement
from minidist.distributed.world import current, group_or_world
from minidist.runtime import control as ctl
from minidist.runtime.errors import CollectiveMismatchError, MessageMismatchError
from minidist.runtime.majority import odd_ones

#: A rank that saw a misfit reads its group's shown calls for at most this
#: long, so that members still computing can enter the call and show theirs.
VERDICT_SECONDS = 3.0
#: A member asleep this long in a wait without showing the call is not
#: coming to it (it waits elsewhere, perhaps on a rank that is here).
ELSEWHERE_SECONDS = 0.5
POLL_SECONDS = 0.005


def read_shown(control, ranks, context: int, number: int,
               seconds: float = VERDICT_SECONDS) -> tuple[dict, bool]:
    """({member: its values} of the members of ``ranks`` (global ranks) that
    showed call ``number`` of ``context``, settled).

    Settled: every member has shown the call or is not coming to it (it
    finished or failed, showed a later call of the context, or has slept in
    another wait for ELSEWHERE_SECONDS). Read until settled, for at most
    ``seconds``, less if the run is aborted. Records are read without a
    lock; a record being written reads as none and is read again."""
    shown: dict = {}
    away: dict = {}  # member -> when it was first seen asleep without showing the call
    deadline = time.monotonic() + seconds
    while True:
        pending = False
        for rank in ranks:
            if rank in shown:
                continue
            record = control.shown_call(rank)
            if record is not None and record[0] == context:
                if record[1] == number:
                    shown[rank] = record[2]
                    continue
                if record[1] > number:
                    continue  # it went on: its shape of this call is gone
            state = control.state_of(rank)
            if state in (ctl.FINISHED, ctl.FAILED):
                continue
            if state == ctl.WAITING:
                first = away.setdefault(rank, time.monotonic())
                pending = pending or time.monotonic() - first < ELSEWHERE_SECONDS
                continue
            away.pop(rank, None)
            pending = True  # running its own code: on its way, perhaps
        if not pending or control.aborted or time.monotonic() >= deadline:
            return shown, not pending
        time.sleep(POLL_SECONDS)


#: context -> how many calls this rank has shown in it (every rank of a
#: group makes the same calls in the same order, so the numbers agree).
_NUMBERS: dict = {}


def show(group, values, context: int | None = None, number: int | None = None):
    """Show ``values`` (ints) as this rank's call in ``group``; returns the key
    (context, number), or None where nothing could be shown (too many
    values, or a transport without records). ``context`` and ``number``
    default to the group's own context and the next number of it."""
    context = group.context if context is None else context
    if number is None:
        number = _NUMBERS.get(context, 0)
        _NUMBERS[context] = number + 1
    if not group.transport.show_call(context, number, [int(value) for value in values]):
        return None
    return context, number


@contextlib.contextmanager
def shown_call(what: str, values, group=None, describe=repr, hint: str = ""):
    """Show ``values`` (a tuple of ints, the call's shape) to the other ranks
    of ``group`` (None: the world) while the block runs; a
    MessageMismatchError raised in it is judged by every member's shown
    shape: where the ranks' shapes differ, it becomes a
    :class:`CollectiveMismatchError` that names the odd ranks ("rank 1
    called ring_attention with seq_len 13 where ranks 0, 2 and 3 call it with
    seq_len 16"), ``describe(values)`` saying a shape in words. Every rank of
    the group must enter it, in the same order as the group's other shown
    calls."""
    group = group_or_world(group)
    values = tuple(int(value) for value in values)
    key = show(group, values) if group.size > 1 else None
    try:
        yield
    except MessageMismatchError as error:
        judged = None if key is None else _judged(what, values, group, key, describe, hint, error)
        if judged is None:
            raise
        raise judged from error


def _judged(what, values, group, key, describe, hint, error):
    """The CollectiveMismatchError that names the odd ranks of the shown
    call ``key``, or None where the records do not tell."""
    if not group.transport.shares_records(group.ranks):
        return None
    shown, settled = read_shown(current().control, group.ranks, *key)
    line = disagreement(what, shown, describe) if settled else None
    if line is None:
        return None
    return CollectiveMismatchError(
        f"{line}. Every rank must call {what} with the same arguments."
        + (f" {hint}" if hint else "") + f"\n{error}", odd=odd_ones(shown)[2])
