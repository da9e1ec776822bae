"""What the collectives hang on a transport, and what they ask it, besides messages.

The progress engine (:mod:`.base`) moves tagged arrays and knows nothing of
collectives. The collectives' layer (:mod:`minidist.distributed.collectives`,
``call.py``) registers each group it runs collectives in, here:

* ``strict_contexts``: context -> ``explain(expected_tag, got_tag, rank,
  source)``. In these contexts two ranks receive each other's messages in
  exactly the order they were sent, so a message from a rank that a receive
  from that rank does not match is a *mismatch* (the two ranks are in
  different collective calls): :meth:`CollectiveHooks._check_strict` fails
  the receive at once instead of letting both wait for their timeout.
* ``collective_groups``: context -> the group's record of its collective
  calls and their fingerprints (the collectives' ``CallRecord``). While a
  rank sleeps in a collective it asks the record, now and then, whether its
  peers are in the same call (``_group_check``, with the other checks of a
  wait in :mod:`.failures`); a
  message no receive asked for is checked against it (:meth:`_check_strict`),
  and the rank's last word (:meth:`check_collectives_ended`) raises what was
  found. Whoever notices a mismatch, the error leads with the group's
  verdict (:meth:`CollectiveHooks._judged` asks the record, which reads the
  members' status records): the ranks whose call differs from the majority's.
  A collective's message that does not fit its receive is judged too
  (:meth:`CollectiveHooks._judged_misfit`), by the shapes the group's ranks
  showed as they entered the call (``show_call``: an uneven all_to_all's
  split sizes).

And the questions every transport answers for the collectives' cost
accounting: ``tracing``, ``now_ns``, ``record_event``, ``charge_combine``,
``byte_scale``. A real transport answers plainly (the trace's clock, the
bytes as they are, no charge for combining); the simulator
(:class:`~.sim.SimTransport`) answers from its virtual clock. Last, the
entry points of the speed shortcuts (:mod:`minidist.distributed.fast_paths`):
a transport without them says no (``send_small`` / ``recv_small`` return
False, ``shared_slots`` is None); :mod:`.shm_fast` has them.

:class:`CollectiveHooks` is a mixin of :class:`~.base.Transport`.
"""

from __future__ import annotations

import copy

from minidist import trace as _trace
from minidist.runtime.errors import CollectiveMismatchError


class CollectiveHooks:
    """The collectives' registrations on a transport, and the checks they drive."""

    # What the collectives ask every transport. ``tracing``: whether this
    # rank's messages are traced (a real transport sets it from its process's
    # recorder). Only the simulator differs in the rest (it records its own
    # trace, charges local combining on its virtual clock, and runs on small
    # arrays that stand for bigger ones).
    tracing = False
    charge_combine = None
    byte_scale = 1.0
    #: The one-shot all_reduce's shared slots, on transports that have them (shm_fast).
    shared_slots = None

    def __init__(self):
        self.strict_contexts: dict = {}
        self.collective_groups: dict = {}

    @staticmethod
    def now_ns() -> int:
        """Now, on the trace's clock (the simulator's is virtual)."""
        return _trace.now()

    def record_event(self, kind: str, start: int, end: int, *, label: str = "",
                     group: int = 0) -> None:
        """Add an event of this rank to the trace (nothing when tracing is off)."""
        _trace.record(kind, start, end, label=label, group=group)

    # ---------------------------------------------------------------- shortcut entry points

    #: True where :meth:`send_small` / :meth:`recv_small` can take a message
    #: (shm's fast class); the collectives' small-message shortcut asks it.
    small_messages = False

    def send_small(self, array, dst: int, tag: int, context: int, label: str) -> bool:
        """Send at once if the transport has a fast path for this case (a small
        message, nothing queued); False means: use isend().wait()."""
        return False

    def recv_small(self, buffer, src: int, tag: int, context: int, label: str,
                   ufunc=None) -> bool:
        """Receive into ``buffer`` (or combine into it with ``ufunc``) at once, or
        after a short spin, if a fast path applies; False means: use irecv().wait()."""
        return False

    # ---------------------------------------------------------------- strict contexts

    def _strict_on_post(self, request, src: int, context: int) -> None:
        """A receive is posted in a strict context: if the oldest message
        already here from ``src`` in that context carries another tag, the
        ranks are in different calls (fail the receive, when ``explain`` says so)."""
        for entry in self._unexpected[src]:
            if entry.header.context == context:
                if entry.header.tag != request.tag:
                    self._strict_mismatch(request, src, entry.header)
                return

    def _check_strict(self, source: int, header) -> None:
        """A collective's message that no receive matches, while a receive from
        the same rank in the same context waits for another tag: the two ranks
        are in different collective calls. Fail that receive now rather than
        let both wait until their timeout."""
        for request in self._posted:
            if request.src == source and request.context == header.context:
                self._strict_mismatch(request, source, header)
                if request.done:
                    self._posted.remove(request)
                return
        # Nothing here waits for that rank. The message may still belong to a
        # call this rank is in or has finished, under another fingerprint
        # (ranks that disagree on a root each complete without reading the
        # other root's messages): then fail this rank's receives in the group
        # now, and keep the error for the group's next call and for the end
        # of the function (see the collectives' CallRecord.stray).
        record = self.collective_groups.get(header.context)
        if record is None or record.error is not None:
            return
        why = record.stray(header.tag, self.rank, source)
        if why is None:
            return
        record.error = self._judged(header.context, record.mine_like(header.tag),
                                    {source: header.tag}, why)
        for request in [r for r in self._posted if r.context == header.context]:
            request._fail(copy.copy(record.error))
            self._posted.remove(request)

    def _strict_mismatch(self, request, source: int, header) -> None:
        explain = self.strict_contexts[header.context]
        why = explain(request.tag, header.tag, self.rank, source)
        if why is not None:
            request._fail(self._judged(header.context, request.tag, {source: header.tag}, why))

    def _judged(self, context: int, tag: int, known: dict, why: str) -> CollectiveMismatchError:
        """The error of a mismatch this rank saw in its call tagged ``tag``
        (``why``: what it saw; ``known``: rank -> the tag of its message).
        Which rank sees the odd message first is chance, so the first line is
        the group's verdict where the records tell one: the ranks whose call
        differs from the majority's (the collectives' ``CallRecord.verdict``)."""
        record = self.collective_groups.get(context)
        verdict = None
        if record is not None and self.shares_records(record.ranks):
            verdict = record.verdict(self._control, self.rank, tag, known)
        if verdict is None:
            return CollectiveMismatchError(f"rank {self.rank}: {why}")
        odd, line = verdict
        return CollectiveMismatchError(f"{line}.\nrank {self.rank}: {why}", odd=odd)

    def _judged_misfit(self, context: int, tag: int, error):
        """The error of a collective's message that does not fit its receive
        (``error``, the MessageMismatchError): a CollectiveMismatchError that
        names the odd ranks where the group's shown calls tell one (an uneven
        all_to_all's split sizes: the collectives' ``CallRecord.misfit_verdict``),
        else ``error`` itself."""
        record = self.collective_groups.get(context)
        if record is None or not self.shares_records(record.ranks):
            return error
        verdict = record.misfit_verdict(self._control, tag)
        if verdict is None:
            return error
        odd, line = verdict
        return CollectiveMismatchError(f"{line}.\n{error}", odd=odd)

    def show_call(self, context: int, number: int, values) -> bool:
        """Show ``values`` (ints) as this rank's call ``number`` of ``context``
        in its shown-call record, where the group's other ranks can read it
        (see ``distributed/shown_calls.py``); False if it does not fit."""
        return self._control.show_call(self.rank, context, number, values)

    def shares_records(self, ranks) -> bool:
        """Whether this rank can read the status records of all ``ranks``: the
        ranks of one run on one machine share its control block (under MPI
        across machines, only those of a machine do: see mpi.py)."""
        return True

    def check_collectives_ended(self) -> None:
        """Raise the collective mismatch found in a message no receive asked
        for (see :meth:`_check_strict`): called as the rank finishes, after
        every message that has arrived has been looked at."""
        self.progress(drain=True)
        for record in self.collective_groups.values():
            if record.error is not None:
                raise record.error
