"""Failure diagnosis: why a wait cannot end, said in words a user can act on.

The progress engine (:mod:`.base`) only waits; when waiting stops making
sense it asks this module what to raise:

* the awaited peer is gone (finished or failed) and nothing that could
  complete the wait has arrived: :class:`PeerGoneError`, or, when the peer
  finished after making the collective call this message belongs to under
  another fingerprint, :class:`CollectiveMismatchError` (the two ranks made
  different calls);
* the run was aborted (another rank failed): :class:`AbortedError`;
* the timeout passed: :class:`CommTimeoutError`, with what every rank was
  doing at that moment and the messages that arrived but match no receive
  (often the awaited one, with another tag or in another group);
* a message does not fit the receive's buffer: :class:`MessageMismatchError`;
* asleep in a collective, the group's other ranks are in another call
  (:meth:`FailureDiagnosis._group_check` asks the collectives' record of the
  group, now and then): :class:`CollectiveMismatchError`, naming first the
  ranks whose call differs from the majority's where every member's status
  record can be read here (:meth:`~.collective_hooks.CollectiveHooks.shares_records`).

:class:`FailureDiagnosis` is a mixin of :class:`~.base.Transport`: its
methods read the engine's queues but change nothing in them. The words of
every message are held by ``tests/runtime/test_failures*.py``.
"""

from __future__ import annotations

import time

from minidist import trace as _trace
from minidist.distributed.transport.message import ANY_SOURCE, ANY_TAG
from minidist.runtime import control as ctl
from minidist.runtime.errors import (
    AbortedError,
    CommTimeoutError,
    MessageMismatchError,
    PeerGoneError,
)

#: How long a rank that saw a peer's pipe close waits for the launcher to say
#: whether the peer failed (see FailureDiagnosis._await_verdict).
VERDICT_GRACE = 2.0

_now = _trace.now


def buffer_misfit(rank: int, reduce: bool, source: int, header, buffer) -> MessageMismatchError:
    """The error of a receive whose buffer cannot take the message ``header`` describes."""
    verb = "recv_reduce" if reduce else "recv"
    return MessageMismatchError(
        f"rank {rank}: {verb} from {source} (tag {header.tag}) got a {header.dtype} message "
        f"of shape {header.shape}, but the buffer is {buffer.dtype} of shape {buffer.shape}. "
        "Allocate the buffer with the sender's shape and dtype, or use recv_array() "
        "(which returns a new array) or probe() to learn them first. The message is "
        "still queued and can be received again."
    )


class FailureDiagnosis:
    """What a :class:`~.base.Transport` raises when a wait cannot complete."""

    @staticmethod
    def describe_context(context: int) -> str:
        """Words for a message context (the world replaces this with the groups' names)."""
        return ""

    def _why_gone(self, dst: int, request, error: PeerGoneError) -> Exception:
        """The error a send to ``dst``, which can never be read, fails with:
        ``error``, unless ``dst`` finished after making the collective call the
        send belongs to (then the two ranks made it with different
        fingerprints, a CollectiveMismatchError)."""
        record = self.collective_groups.get(request.context)
        if record is None or self._control.state_of(dst) != ctl.FINISHED:
            return error
        judge = self.shares_records(record.ranks)
        mismatch = record.went_through(self._control, self.rank, request.tag, dst, sending=True,
                                       judge=judge)
        if mismatch is None and judge:  # most of the group returned before this call?
            mismatch = record.returned_mismatch(self._control, self.rank, request.tag,
                                                str(error))
        return error if mismatch is None else mismatch

    def _check_peer(self, op, peer, tag, context, request) -> None:
        """Raise PeerGoneError when the awaited peer(s) can never act again."""
        if op not in (ctl.OP_SEND, ctl.OP_RECV, ctl.OP_PROBE):
            return
        control = self._control
        gone = (ctl.FINISHED, ctl.FAILED)
        if peer == ANY_SOURCE:
            if not all(control.state_of(r) in gone or r in self._closed_sources
                       for r in self._sources):
                return
            who = "every other rank has"
        elif control.state_of(peer) in gone or (op != ctl.OP_SEND and peer in self._closed_sources):
            who = f"rank {peer} has"
        else:
            return
        # The peer may have sent its last messages just before finishing.
        self.progress(drain=True)
        if request is not None and request.done:
            return
        if op == ctl.OP_PROBE and self.iprobe(peer, tag, context) is not None:
            return
        for gone_peer in (self._closed_sources if peer == ANY_SOURCE else (peer,)):
            self._await_verdict(gone_peer)
        what = self._describe(op, peer, tag, context)
        blamed = None if peer == ANY_SOURCE else peer
        if peer != ANY_SOURCE and control.state_of(peer) == ctl.FAILED:
            raise PeerGoneError(f"rank {self.rank}: {what} cannot complete: rank {peer} failed.",
                                peer=blamed)
        if peer != ANY_SOURCE and control.state_of(peer) != ctl.FINISHED:
            raise PeerGoneError(f"rank {self.rank}: {what} cannot complete: rank {peer} has "
                                "exited (its end of the pipe is closed).", peer=blamed)
        if op == ctl.OP_SEND:
            gone = PeerGoneError(
                f"rank {self.rank}: {what} cannot complete: {who} finished without receiving "
                "it. Every send needs a matching recv on the other side.", peer=blamed)
        else:
            gone = PeerGoneError(
                f"rank {self.rank}: {what} will never complete: {who} finished without sending "
                "a matching message. Check that both sides agree on the source, tag and group "
                "of every message.", peer=blamed)
        record = self.collective_groups.get(context)
        if record is not None and peer != ANY_SOURCE and control.state_of(peer) == ctl.FINISHED:
            judge = self.shares_records(record.ranks)
            mismatch = record.went_through(control, self.rank, tag, peer,
                                           sending=op == ctl.OP_SEND, judge=judge)
            if mismatch is None and judge:
                # The peer returned before this call: so did most of the
                # group, perhaps, and then this rank's call is the odd one.
                mismatch = record.returned_mismatch(control, self.rank, tag, str(gone))
            if mismatch is not None:
                raise mismatch
        raise gone

    def _group_check(self, context: int, tag: int, start: int):
        """For a wait in a collective's context: a function of the time now
        that, once every ``check_interval_ns`` of the group, asks whether the
        group's other ranks are in the same call (``check_group`` raises if
        not). None in any other context."""
        group = self.collective_groups.get(context)
        if group is None:
            return None
        control, rank = self._control, self.rank
        next_check = start + group.check_interval_ns
        judge = self.shares_records(group.ranks)  # may the error name the odd ranks?

        def check(now: int) -> None:
            nonlocal next_check
            if now >= next_check:
                group.check_group(control, rank, tag, judge)
                next_check = now + group.check_interval_ns

        return check

    def _await_verdict(self, peer: int, grace: float = VERDICT_GRACE) -> None:
        """Give the supervisor a moment to record why ``peer`` is gone.

        A pipe reports a dead peer (end of file, a broken pipe) the instant the
        kernel closes its ends, which can be before the launcher, woken by the
        same death, has marked the rank FAILED. Raising at once would tell the
        user "has exited" where the truth is "failed", and a fault-tolerant
        strategy that then asks ``failed_ranks()`` would not find the rank
        there. The launcher marks a death within milliseconds; the wait is
        bounded, so a verdict that never comes costs ``grace`` seconds, not a
        hang."""
        control = self._control
        limit = _now() + int(grace * 1e9)
        while control.state_of(peer) not in (ctl.FINISHED, ctl.FAILED) and _now() < limit:
            time.sleep(0.001)

    def _describe(self, op, peer, tag, context) -> str:
        from minidist.runtime.desync import describe_wait

        return describe_wait(op, ctl.ANY if peer == ANY_SOURCE else peer,
                             ctl.ANY if tag == ANY_TAG else tag, self.describe_context(context))

    def _unmatched_report(self, peer, tag, context) -> str:
        """Messages that arrived here but that no receive has asked for: often
        the one being waited for, sent with another tag or in another group."""
        lines = []
        sources = self._sources if peer in (ANY_SOURCE, None) else (peer,)
        for source in sources:
            headers = [entry.header for entry in self._unexpected[source]]
            if self._peeked[source] is not None:
                headers.append(self._peeked[source])
            for header in headers:
                where = self.describe_context(header.context)
                lines.append(f"  from rank {source}: tag {header.tag}, {header.describe()}"
                             + (f" ({where})" if where else ""))
                if source == peer and header.context == context and tag not in (
                        ANY_TAG, header.tag):
                    lines.append(f"  hint: rank {source} sent tag {header.tag}, but rank "
                                 f"{self.rank} waits for tag {tag}.")
                elif source == peer and header.context != context:
                    lines.append(f"  hint: rank {source} sent this in another group or "
                                 "context than the one rank "
                                 f"{self.rank} receives in.")
        if not lines:
            return ""
        return (f"\nMessages that reached rank {self.rank} but match no receive:\n"
                + "\n".join(lines))

    def _aborted_error(self, op, peer, tag, context) -> AbortedError:
        culprit = self._control.culprit
        why = (f"rank {culprit} failed" if culprit >= 0
               else "the run was interrupted")
        return AbortedError(f"rank {self.rank} stopped while waiting in "
                            f"{self._describe(op, peer, tag, context)}: {why}, so the run is "
                            "being shut down.")

    def _timeout_error(self, op, peer, tag, context, timeout, current) -> CommTimeoutError:
        from minidist.runtime.desync import format_report

        report = format_report(self._control.statuses(), self.rank, current,
                               self.describe_context)
        report += self._unmatched_report(peer, tag, context)
        what = self._describe(op, peer, tag, context)
        message_text = (
            f"rank {self.rank} timed out after {timeout:g} s waiting in {what}.\n"
            f"What every rank was doing at that moment:\n{report}\n"
            "If the other side is only slow, pass a longer timeout "
            "(minidist.launch(..., timeout=...), `minidist run --timeout`, or timeout= on "
            "the call).")
        return CommTimeoutError(message_text, operation=what, peer=peer, tag=tag, report=report)
