"""Fingerprints: what every message of a collective call carries, and the
checks that catch ranks in different calls.

Tags. All collectives of a group share one message context, and every
message of one call carries the same tag, built from what the call is:
which collective, which algorithm, the reduction, the dtype, a hash of the
element count and root, and the call's number in the group (31 bits, packed
by :func:`fingerprint`). Two ranks whose calls of the same number disagree
about any of these exchange messages with different tags, which the
transport notices at once (:class:`~minidist.runtime.errors.CollectiveMismatchError`
naming both calls, from :meth:`CallRecord.explain`) instead of both waiting
until a timeout. (Ranks that made different *numbers* of calls are left to
the timeout's desync report: with ``async_op`` a peer may rightly send for a
later call first.) Within one call, messages between two ranks are told
apart by their order, which every algorithm keeps the same on both sides.

Messages are not the only witness. Ranks in different collectives may never
exchange one (an all_reduce through shared slots, see
:mod:`minidist.distributed.fast_paths`, sends none; a rank that returned
early sends nothing at all), so a rank that sleeps in a collective also
reads its peers' status records in the control block
(:meth:`CallRecord.check_group`): a peer asleep in the same call number with
another fingerprint, or a peer that finished without making this call, ends
the wait at once with an error that names both.

Who is wrong. The rank that notices a mismatch is often not the one that
made the wrong call: which rank receives the odd message first is chance.
So before it raises, the noticing rank reads the group's status records
(:meth:`CallRecord.verdict`): each member's call of this number and its
fingerprint are there, written as the member falls asleep in it. The call
most ranks are in is the reference (a tie: the call of the lowest rank, the
rule of :mod:`minidist.runtime.majority`), and the error's first line names
the others, the same line whichever rank noticed; its ``odd`` lets the
launcher name them. An uneven all_to_all's calls carry one fingerprint on
every rank (their split sizes differ by right): a piece that does not fit
is judged by the sizes the members showed as they entered the call
(:meth:`CallRecord.misfit_verdict`, :mod:`.split_sizes`). Where the records are not shared (MPI across machines)
or do not settle, the error says only what the noticing rank saw.

One :class:`CallRecord` per group and context counts the calls and keeps
the last ones' fingerprints; the transport asks it (``collective_groups``)
whenever a message or a peer's record looks wrong.
"""

from __future__ import annotations

import time
import zlib

import numpy as np

from minidist.distributed.reduce_op import ReduceOp
from minidist.runtime import control as ctl
from minidist.runtime.errors import CollectiveMismatchError, PeerGoneError, name_ranks
from minidist.runtime.majority import odd_ones
from minidist.trace import now as _now

COLLECTIVES = ("broadcast", "reduce", "all_reduce", "gather", "scatter", "all_gather",
               "reduce_scatter", "all_to_all", "barrier")
_OPS = (None, ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND,
        ReduceOp.BOR, ReduceOp.BXOR)
_DTYPES = tuple(np.dtype(name) for name in (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128"))

# 31 bits: seq (8) | shape hash (8) | dtype (4) | op (3) | algorithm (4) | collective (4)
SEQ_SHIFT, _HASH_SHIFT, _DTYPE_SHIFT, _OP_SHIFT, _ALGORITHM_SHIFT = 23, 15, 11, 8, 4


def fingerprint(collective: str, algorithm_index: int, op, dtype, count: int, root: int,
                seq: int) -> int:
    """The tag every message of one collective call carries."""
    key = (collective, algorithm_index, op, dtype, count, root)
    base = _BASES.get(key)
    if base is None:
        base = _base_tag(*key)
        if len(_BASES) < 4096:  # a bounded cache: calls repeat the same few shapes
            _BASES[key] = base
    return with_call_number(base, seq)


_BASES: dict = {}


def _base_tag(collective, algorithm_index, op, dtype, count, root) -> int:
    op_code = _OPS.index(op) if op in _OPS else 0
    dtype = np.dtype(dtype) if dtype is not None else None
    dtype_code = _DTYPES.index(dtype) if dtype in _DTYPES else 15
    shape_hash = zlib.crc32(f"{count},{root}".encode()) & 0xFF
    return (shape_hash << _HASH_SHIFT | dtype_code << _DTYPE_SHIFT
            | op_code << _OP_SHIFT | (algorithm_index & 0xF) << _ALGORITHM_SHIFT
            | COLLECTIVES.index(collective))


#: The rooted collectives, and what torch calls their root.
ROOT_NAMES = {"broadcast": "src", "scatter": "src", "reduce": "dst", "gather": "dst"}


def describe_fingerprint(tag: int, algorithms: dict, count: int | None = None,
                         ranks=()) -> str:
    """'all_reduce (ring, SUM, float32), call 3' from a tag.

    With the element ``count`` of the call and the group's (global) ``ranks``,
    a rooted collective also names its root ('broadcast (binomial, float32,
    src=1)'): the tag holds only a hash of count and root, so every root of
    the group is tried and named when exactly one fits."""
    collective = COLLECTIVES[tag & 0xF] if (tag & 0xF) < len(COLLECTIVES) else "?"
    names = list(algorithms.get(collective, {}))
    index = (tag >> _ALGORITHM_SHIFT) & 0xF
    algorithm = names[index] if index < len(names) else \
        "native" if index == 15 else f"algorithm {index}"  # 15: collectives/native.py
    op = _OPS[(tag >> _OP_SHIFT) & 0x7]
    dtype_code = (tag >> _DTYPE_SHIFT) & 0xF
    dtype = _DTYPES[dtype_code].name if dtype_code < len(_DTYPES) else "other dtype"
    parts = [algorithm] + ([op.name] if op is not None else []) + [dtype]
    if collective in ROOT_NAMES and count is not None and ranks and dtype_code < len(_DTYPES):
        base = tag & ((1 << SEQ_SHIFT) - 1)
        roots = [root for root in range(len(ranks))
                 if _base_tag(collective, index, op, _DTYPES[dtype_code], count, root) == base]
        if len(roots) == 1:
            parts.append(f"{ROOT_NAMES[collective]}={ranks[roots[0]]}")
    return f"{collective} ({', '.join(parts)}), call {tag >> SEQ_SHIFT}"


def with_call_number(tag: int, number: int) -> int:
    """``tag`` with the call number ``number`` in its 8 call bits: the tag a
    later call with the same fingerprint carries."""
    return (tag & ~(0xFF << SEQ_SHIFT)) | (number & 0xFF) << SEQ_SHIFT


class CallRecord:
    """The collective calls of one group (and context) on this rank: how many
    were made, the last ones' fingerprints, and the checks the transport asks
    when a message or a peer's status record does not fit."""

    #: A rank sleeping in a call reads its peers' records every CHECK_SECONDS
    #: times (group size / CHECK_RANKS), so that a thousand sleeping ranks do
    #: not spend the cores reading each other's records.
    CHECK_SECONDS = 0.05
    CHECK_RANKS = 16
    #: Once a mismatch is confirmed while some members are neither asleep in
    #: the call nor finished, this many checks more are spent waiting for them.
    PATIENCE = 4

    def __init__(self, algorithms: dict, ranks=(), context: int = 0):
        self.algorithms = algorithms
        self.ranks = tuple(ranks)  # global ranks, in group order
        self.context = context
        self.seq = 0           # calls started on this group
        # The last calls' (number, tag, element count), by the tag's 8 call
        # bits: what a message of a past call is checked against (see stray).
        self.recent: list = [None] * 256
        #: A mismatch seen in a message no receive asked for (see stray),
        #: raised by this group's next collective call, or as the rank finishes.
        self.error = None
        self._suspects = None  # the mismatched records seen by the last check
        self._waited = 0       # checks spent since a confirmed mismatch (see PATIENCE)
        self.check_interval_ns = int(self.CHECK_SECONDS * 1e9
                                     * max(1.0, len(self.ranks) / self.CHECK_RANKS))

    def explain(self, expected: int, got: int, me: int, peer: int) -> str | None:
        """Why rank ``me``, waiting for tag ``expected``, cannot take ``peer``'s
        message tagged ``got``; None when that message may be legitimately early.

        Only a message of the *same* call number is certainly wrong. One of
        another call may come from a peer that runs several calls at once
        (``async_op``) and sent for a later one first; ranks that really made
        different numbers of calls are caught by the timeout's desync report."""
        if (expected >> SEQ_SHIFT) != (got >> SEQ_SHIFT):
            return self.stray(got, me, peer)
        mine = self._what(expected, with_call=True)
        theirs = self._what(got, with_call=True, count_of=expected)
        if mine == theirs:
            theirs = "the same collective with a different element count or root"
        return (f"collective mismatch: rank {me} is in {mine}, but rank {peer} sent it a "
                f"message of {theirs}. Every rank of a group must make the same collective "
                "calls, in the same order, with the same count, dtype, root, op and algorithm.")

    # ---------------------------------------------------------------- the peers' records

    def _call_number(self, tag: int) -> int:
        """The full number of this rank's call whose tag carries ``tag``'s 8 bits."""
        last = self.seq - 1
        return last - ((last - (tag >> SEQ_SHIFT)) & 0xFF)

    def _where(self) -> str:
        group_id = self.context >> 32
        return "the world" if group_id == 0 else f"group {group_id}"

    def last_tag(self) -> int:
        """The tag of this rank's last call in the group (-1: none made)."""
        entry = self.recent[(self.seq - 1) & 0xFF] if self.seq else None
        return entry[1] if entry is not None and entry[0] == self.seq - 1 else -1

    def record(self, number: int, tag: int, count: int) -> None:
        """Call ``number`` of this rank carries ``tag`` and moves ``count`` elements."""
        self.recent[number & 0xFF] = (number, tag, count)

    #: How many of this rank's last calls a stray message is checked against.
    #: A message of call c + k from a peer that runs ahead aliases call
    #: c + k - 256 in the tag's 8 bits; with this window that needs k > 240.
    STRAY_WINDOW = 16

    def stray(self, got: int, me: int, peer: int) -> str | None:
        """Why ``peer``'s message tagged ``got``, which no receive of this rank
        asked for, is a mismatch; None when it may be legitimately early.

        Every message of one call carries the same tag on every rank. A
        message numbered like one of this rank's last calls (the one it is
        in, or one it finished) but tagged otherwise comes from a rank that
        made that call with another fingerprint: ranks that disagree only on
        the root of a broadcast or scatter may each complete the call, the
        other root's messages left unread, so this is where it shows."""
        last = self.seq - 1
        number = self._call_number(got)
        if last - number >= self.STRAY_WINDOW:
            return None  # a later call of a peer that runs ahead (or one long gone)
        entry = self.recent[number & 0xFF]
        if entry is None or entry[0] != number or entry[1] == got:
            return None
        mine = self._what(entry[1])
        theirs = self._what(got, count_of=entry[1])
        if mine == theirs:
            theirs += " with a different element count or root"
        return (f"collective mismatch in call {number} of {self._where()}: {mine} on rank "
                f"{me}; {theirs} on rank {peer} (its message reached rank {me}, which never "
                "asked for it). Every rank of a group must make the same collective calls, "
                "in the same order, with the same count, dtype, root, op and algorithm.")

    def mine_like(self, tag: int) -> int:
        """The tag of this rank's call numbered like ``tag`` (one of its last
        calls: see :meth:`stray`)."""
        return self.recent[(tag >> SEQ_SHIFT) & 0xFF][1]

    def _count(self, tag: int) -> int | None:
        """The element count of this rank's call numbered like ``tag``, if known."""
        entry = self.recent[(tag >> SEQ_SHIFT) & 0xFF]
        return entry[2] if entry is not None else None

    def _what(self, tag: int, *, with_call: bool = False, count_of: int | None = None) -> str:
        """The call ``tag`` stands for; its root found with the count of this
        rank's call ``count_of`` (default: ``tag``'s own call number)."""
        text = describe_fingerprint(tag, self.algorithms,
                                    self._count(tag if count_of is None else count_of),
                                    self.ranks)
        return text if with_call else text.rsplit(", call ", 1)[0]

    def went_through(self, control, me: int, tag: int, peer: int,
                     sending: bool = False, judge: bool = False):
        """The CollectiveMismatchError of rank ``me``, waiting in the call tagged
        ``tag`` on ``peer`` (which finished; ``sending``: to ``peer``); None when
        ``peer`` finished before making this call (an early return, said
        elsewhere). ``judge``: the odd ranks may be named (see :meth:`verdict`).

        A peer that made this call and returned never sent (or took) the
        message this rank waits for: the two made the call with different
        fingerprints (ranks that disagree on a reduce's root each wait for
        children the other tree does not give them). The members asleep in
        the same call are named with theirs."""
        number = self._call_number(tag)
        made = control.calls_of(peer, self.context)
        if made is None or made <= number:
            return None
        theirs = control.last_call_of(peer, self.context)
        if made != number + 1 or theirs is None or (theirs >> SEQ_SHIFT) != (tag >> SEQ_SHIFT):
            theirs = None  # not its last call: that one's fingerprint is not recorded
        parts = [f"{what} on {name_ranks(ranks, most=8)}"
                 for what, ranks in self._calls_in(control, me, tag, {peer: theirs})]
        missed = (f"taking the message rank {me} sends it" if sending
                  else f"the message rank {me} waits for")
        seen = (f"rank {me}: collective mismatch in call {number} of {self._where()}: "
                + "; ".join(parts) + f"; rank {peer} made the call and returned without "
                f"{missed}. Every rank of a group must make the same "
                "collective calls, in the same order, with the same count, dtype, root, op "
                "and algorithm.")
        verdict = self.verdict(control, me, tag, {peer: theirs}) if judge else None
        if verdict is None:
            return CollectiveMismatchError(seen)
        return CollectiveMismatchError(f"{verdict[1]}.\n{seen}", odd=verdict[0])

    def _calls_in(self, control, me: int, tag: int, known=None) -> list:
        """[(the call, [ranks])] of this rank and the members asleep in the same
        call number as ``tag`` (and those whose tag in it is ``known``, a dict
        rank -> tag or None), this rank's call first."""
        seq = (tag >> SEQ_SHIFT) & 0xFF
        in_call = {tag: [me]}
        for rank, theirs in (known or {}).items():
            if theirs is not None:
                in_call.setdefault(theirs, []).append(rank)
        for rank in self.ranks:
            if rank != me:
                status = control.status(rank)
                if self._asleep_in(status, seq):
                    in_call.setdefault(status.tag, []).append(rank)
        return self._name_calls(in_call, tag)

    def _asleep_in(self, status, seq: int) -> bool:
        """Whether a peer's status record says it sleeps in this group's call
        numbered ``seq`` (the tag's 8 call bits)."""
        return (status.state == ctl.WAITING and status.context == self.context
                and status.tag >= 0 and (status.tag >> SEQ_SHIFT) & 0xFF == seq)

    def _name_calls(self, in_call: dict, tag: int) -> list:
        """[(the call, [ranks])] of ``in_call`` (tag -> ranks); a call that reads
        like ``tag``'s but is not is said to differ in count or root."""
        out = []
        for each, ranks in in_call.items():
            what = self._what(each)
            if each != tag and what == self._what(tag):
                what += " with a different element count or root"
            out.append((what, sorted(ranks)))
        return out

    # ---------------------------------------------------------------- the odd rank

    #: A rank that saw a mismatch reads the group's records for at most this
    #: long, so that members still computing can fall asleep in the call.
    VERDICT_SECONDS = 3.0
    #: A member asleep in another wait this long is not coming to this call:
    #: it waits, in another group or for a message, on a rank that is here.
    ELSEWHERE_SECONDS = 0.5
    VERDICT_POLL = 0.005

    def votes(self, control, me: int, tag: int, known=None) -> tuple[dict, bool]:
        """({member: its call numbered like ``tag``}, settled).

        A member's call is a tag (this rank's is ``tag``; ``known``, a dict
        rank -> tag, holds those seen in messages; the others' are read from
        their status records as they sleep in the call), or ``("returned",
        calls)`` for a member that returned from its function after fewer
        calls. Settled: every member has voted or is not coming (failed,
        finished without a record of this call, asleep elsewhere for
        ELSEWHERE_SECONDS). Read until settled, for at most VERDICT_SECONDS,
        less if the run is aborted. While it reads, this rank's own record
        shows its call, so that members judging at the same moment count it."""
        seq, number = (tag >> SEQ_SHIFT) & 0xFF, self._call_number(tag)
        votes = {me: tag}
        votes.update({rank: theirs for rank, theirs in (known or {}).items()
                      if theirs is not None})
        shown = control.status(me)
        shows_mine = self._asleep_in(shown, seq) and shown.tag == tag
        if not shows_mine:
            control.set_waiting(me, ctl.OP_WAIT_MANY, None, tag, self.context, 0, _now())
        away: dict = {}  # member -> when it was first seen asleep elsewhere
        deadline = time.monotonic() + self.VERDICT_SECONDS
        while True:
            pending = False
            for rank in self.ranks:
                if rank not in votes:
                    vote, coming = self._vote(control, rank, seq, number, away)
                    if vote is not None:
                        votes[rank] = vote
                    pending = pending or coming
            if not pending or control.aborted or time.monotonic() >= deadline:
                break
            time.sleep(self.VERDICT_POLL)
        if not shows_mine:
            control.set_running(me, _now())
        return votes, not pending

    def _vote(self, control, rank: int, seq: int, number: int, away: dict):
        """(the member's call numbered ``number``, or None; whether it may
        still show one)."""
        status = control.status(rank)
        if status.state == ctl.FINISHED:
            made = control.calls_of(rank, self.context)
            if made is not None and made <= number:
                return ("returned", made), False
            last = control.last_call_of(rank, self.context)
            if made == number + 1 and last is not None and (last >> SEQ_SHIFT) & 0xFF == seq:
                return last, False
            return None, False
        if status.state == ctl.FAILED:
            return None, False
        if self._asleep_in(status, seq):
            # Records are read without a lock: believe one only if read twice alike.
            return (status.tag, False) if control.status(rank) == status else (None, True)
        if status.state == ctl.WAITING:
            first = away.setdefault(rank, time.monotonic())
            return None, time.monotonic() - first < self.ELSEWHERE_SECONDS
        away.pop(rank, None)
        return None, True  # running its own code: on its way, perhaps

    def verdict(self, control, me: int, tag: int, known=None) -> tuple[list, str] | None:
        """(the odd members, the line that names them) of the call tagged
        ``tag`` in which this rank saw a mismatch; None when the group's
        records do not tell (they did not settle, and no call holds a
        majority of the members).

        The call most members are in is the reference (a tie: the call of
        the lowest rank among the tied); every member in another is odd.
        Members that never come (returned, asleep elsewhere) do not vote."""
        votes, settled = self.votes(control, me, tag, known)
        calls = {rank: vote for rank, vote in votes.items() if isinstance(vote, int)}
        reference, holders, odd = odd_ones(calls)
        if not odd or not (settled or 2 * len(holders) > len(self.ranks)):
            return None
        by_call: dict = {}
        for rank in odd:
            by_call.setdefault(calls[rank], []).append(rank)
        theirs = self._what(reference)
        parts = []
        for each, ranks in by_call.items():
            what = self._what(each)
            if what == theirs:
                what += " with a different element count or root"
            parts.append(f"{what} on {name_ranks(ranks, most=8)}")
        most = len(holders) > max(len(ranks) for ranks in by_call.values())
        parts.append(f"{theirs} on {name_ranks(holders, most=8)} "
                     + ("(most ranks)" if most else "(a tie: the lowest rank's call)"))
        return odd, f"{self._odd_in(odd, tag)}: " + "; ".join(parts)

    def misfit_verdict(self, control, tag: int) -> tuple[list, str] | None:
        """(the odd members, the line that names them) of the call tagged
        ``tag``, in which a message did not fit its receive, judged by the
        split sizes its members showed (an uneven all_to_all: see
        :mod:`.split_sizes`); None where they do not tell."""
        from minidist.distributed.collectives.split_sizes import verdict

        return verdict(control, self.ranks, self.context, self._call_number(tag),
                       lambda odd: self._odd_in(odd, tag))

    def returned_verdict(self, control, me: int, tag: int) -> tuple[list, str] | None:
        """(the odd members, the line that names them) when more members
        returned from their function without making the call tagged ``tag``
        than are in any one call of that number: then the members in it are
        odd (they call in a group the others never used). None otherwise,
        and while members are on their way: a rank that returned early is
        named as such (PeerGoneError) by the caller."""
        votes, settled = self.votes(control, me, tag)
        calls = {rank: vote for rank, vote in votes.items() if isinstance(vote, int)}
        returned = sorted(rank for rank in votes if rank not in calls)
        in_call: dict = {}
        for rank, vote in calls.items():
            in_call.setdefault(vote, []).append(rank)
        if not settled or len(returned) <= max(len(ranks) for ranks in in_call.values()):
            return None
        odd = sorted(calls)
        made = sorted({votes[rank][1] for rank in returned})
        after = (f"after {made[0]} collective call{'s' if made[0] != 1 else ''}"
                 if len(made) == 1 else "after fewer collective calls")
        parts = [f"{what} on {name_ranks(ranks, most=8)}"
                 for what, ranks in self._name_calls(in_call, tag)]
        return odd, (f"{self._odd_in(odd, tag)}: " + "; ".join(parts)
                     + f"; {name_ranks(returned, most=8)} returned from their function "
                     f"{after} in {self._where()}, without making it (most ranks)")

    def returned_mismatch(self, control, me: int, tag: int, seen: str):
        """The CollectiveMismatchError that names the members in the call
        tagged ``tag`` as odd, when more members returned without it than
        sleep in it (see :meth:`returned_verdict`); else None. ``seen``: what
        this rank saw, said after the verdict."""
        seq, number = (tag >> SEQ_SHIFT) & 0xFF, self._call_number(tag)
        returned = in_it = elsewhere = 0
        for rank in self.ranks:
            status = control.status(rank) if rank != me else None
            if status is None or self._asleep_in(status, seq) and status.tag == tag:
                in_it += 1
            elif status.state == ctl.FINISHED:
                made = control.calls_of(rank, self.context)
                returned += made is not None and made <= number
            elif status.state != ctl.FAILED:
                elsewhere += 1  # may still return, or come
        if not returned or returned + elsewhere <= in_it:
            return None  # fewer ranks returned early than are here: the caller names them
        verdict = self.returned_verdict(control, me, tag)
        if verdict is None:
            return None
        return CollectiveMismatchError(f"{verdict[1]}.\n{seen}", odd=verdict[0])

    def _odd_in(self, odd, tag: int) -> str:
        who = "is the odd rank" if len(odd) == 1 else "are the odd ranks"
        return f"{name_ranks(odd, most=8)} {who} in call {self._call_number(tag)} of {self._where()}"

    def check_group(self, control, me: int, tag: int, judge: bool = False) -> None:
        """Raise if the call tagged ``tag`` that rank ``me`` sleeps in can never
        complete, judging by the other members' status records (``judge``:
        every member's record is readable here, so the error may name the
        odd ranks, see :meth:`verdict`):

        * a member that finished (returned from its function) after fewer
          calls in this group than this one's number: :class:`PeerGoneError`
          naming it (it never joins);
        * a member that failed (a run that tolerates failures goes on after
          one), when no member finished early (that one is named first: the
          failure may be its consequence): :class:`PeerGoneError` naming it. Its part of the call may
          never come, and a rank waiting on a live peer that saw the failure
          first and left the call would otherwise wait out its timeout; a
          fault-tolerant strategy makes the call again in a group without it;
        * members asleep in the same call number with another fingerprint:
          :class:`CollectiveMismatchError` naming the collective each rank is
          in. Records are read without a lock, so a mismatch is believed only
          when two checks in a row see the very same records.

        Cost: one read of 64 bytes per member; the transport calls this only
        while the rank sleeps, every :attr:`check_interval_ns`."""
        seq, number = (tag >> SEQ_SHIFT) & 0xFF, self._call_number(tag)
        in_call = {tag: [me]}
        suspects = []
        finished = []
        failed = []    # members that raised or died: often because of one that finished
        elsewhere = 0  # members neither asleep in this call number nor finished
        for rank in self.ranks:
            if rank == me:
                continue
            status = control.status(rank)
            if status.state == ctl.FAILED:
                failed.append(rank)
                continue
            if self._asleep_in(status, seq):
                in_call.setdefault(status.tag, []).append(rank)
                if status.tag != tag:
                    suspects.append((rank, status.tag, status.since_ns))
            elif status.state != ctl.FINISHED:
                elsewhere += 1
            if status.state == ctl.FINISHED:
                made = control.calls_of(rank, self.context)
                if made is not None and made <= number:
                    finished.append((rank, made))
        if finished:
            rank, made = finished[0]
            who = "rank " + ", ".join(str(rank) for rank, _ in finished)
            seen = (f"rank {me}: {self._what(tag)}, call {number} of {self._where()}, cannot "
                    f"complete: {who} returned from its function after {made} collective "
                    f"call{'s' if made != 1 else ''} in {self._where()}, without entering "
                    "this one. Every rank of a group must make the same collective calls, in "
                    "the same order.")
            mismatch = self.returned_mismatch(control, me, tag, seen) if judge else None
            if mismatch is not None:
                raise mismatch
            raise PeerGoneError(seen, peer=rank)
        if failed:
            # After the finished ones: a member that returned early is a cause,
            # while a member that failed may have failed because of it.
            raise PeerGoneError(f"rank {me}: {self._what(tag)}, call {number} of "
                                f"{self._where()}, cannot complete: rank {failed[0]}, a member, "
                                "failed.", peer=failed[0])
        suspects = frozenset(suspects)
        confirmed = bool(suspects) and suspects == self._suspects
        self._suspects = suspects or None
        if not confirmed:
            self._waited = 0
            return
        if elsewhere and self._waited < self.PATIENCE:
            # Some members are still on their way (busy, or not yet scheduled
            # on a loaded machine): a few checks more, so that the error can
            # name the call of every rank that is coming, not only the first.
            self._waited += 1
            return
        parts = [f"{what} on {name_ranks(ranks, most=8)}"
                 for what, ranks in sorted(self._name_calls(in_call, tag),
                                           key=lambda item: item[1][0])]
        seen = (f"rank {me}: collective mismatch in call {number} of {self._where()}: "
                + "; ".join(parts) + ". Every rank of a group must make the same collective "
                "calls, in the same order, with the same count, dtype, root, op and algorithm.")
        known = {rank: theirs for rank, theirs, _ in suspects}
        verdict = self.verdict(control, me, tag, known) if judge else None
        if verdict is not None:
            raise CollectiveMismatchError(f"{verdict[1]}.\n{seen}", odd=verdict[0])
        raise CollectiveMismatchError(seen)
