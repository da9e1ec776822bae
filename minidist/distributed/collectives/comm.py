"""What a collective algorithm sees, and how a call to it runs.

Every algorithm in this package is a **generator** written on three
non-blocking point-to-point calls of a :class:`Comm`::

    def ring(comm, buffer):
        ...
        for step in range(n - 1):
            yield [comm.isend(chunk_out, right, "step 0"),
                   comm.irecv_reduce(chunk_in, left, "step 0")]

(plus one step made of them, :meth:`Comm.exchange_with_all`: every rank
hands its array to every other, ``arrays = yield from
comm.exchange_with_all(buffer)``, which the one-shot all_reduce is written on).
Each ``yield`` hands back the requests that must finish before the
algorithm may go on: one *step* of the algorithm. Who waits for them is up to
the driver, which is what lets the same code run

* blocking (:func:`run`): wait for each step's requests, then resume;
* as a non-blocking collective (``async_op=True``): the returned
  :class:`Work` resumes the generator whenever the user calls ``test()`` or
  ``wait()``, so computation can go on between steps (MPI without a
  progress thread works the same way);
* in the simulator, where thousands of ranks are generators in one process
  and a virtual clock says when each step's messages arrive.

Tags: the collective's fingerprint. All collectives of a group share one
message context, and every message of one call carries the same tag, built
from what the call is: which collective, which algorithm, the reduction,
the dtype, a hash of the element count and root, and the call's number in
the group. Two ranks whose calls of the same number disagree about any of
these exchange messages with different tags, which the transport notices at
once (:class:`~minidist.runtime.errors.CollectiveMismatchError` naming
both calls) instead of both waiting until a timeout. (Ranks that made
different *numbers* of calls are left to the timeout's desync report: with
``async_op`` a peer may rightly send for a later call first.) Within one call, messages
between two ranks are told apart by their order, which every algorithm keeps
the same on both sides.

Messages are not the only witness. Ranks in different collectives may never
exchange one (an all_reduce through shared slots, see
:mod:`minidist.distributed.fast_paths`, sends none; a rank that
returned early sends nothing at all), so a rank that sleeps in a collective
also reads its peers' status records in the control block
(:meth:`_Fingerprints.check_group`): a peer asleep in the same call number
with another fingerprint, or a peer that finished without making this call,
ends the wait at once with an error that names both.
"""

from __future__ import annotations

import zlib

import numpy as np

from minidist import trace as _trace
from minidist.distributed import fast_paths
from minidist.distributed.reduce_op import ReduceOp
from minidist.distributed.transport.base import _DEFAULT
from minidist.runtime import control as ctl
from minidist.runtime.errors import CollectiveMismatchError, PeerGoneError, name_ranks

# --------------------------------------------------------------------------- fingerprints

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
    return (seq & 0xFF) << SEQ_SHIFT | base


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


class _Fingerprints:
    """The per-(group, context) bookkeeping the transport's mismatch checks ask
    (and the group's spare scratch arrays, see :meth:`Comm.scratch`)."""

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
        self.spare: dict = {}  # (dtype, size) -> an array no call is using
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
                     sending: bool = False) -> str | None:
        """Why rank ``me``, waiting in the call tagged ``tag`` on ``peer`` (which
        finished; ``sending``: to ``peer``), is in a mismatched call; None when ``peer`` finished before
        making this call (an early return, said elsewhere).

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
        return (f"rank {me}: collective mismatch in call {number} of {self._where()}: "
                + "; ".join(parts) + f"; rank {peer} made the call and returned without "
                f"{missed}. Every rank of a group must make the same "
                "collective calls, in the same order, with the same count, dtype, root, op "
                "and algorithm.")

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
            if rank == me:
                continue
            status = control.status(rank)
            if status.state == ctl.WAITING and status.context == self.context \
                    and status.tag >= 0 and (status.tag >> SEQ_SHIFT) & 0xFF == seq:
                in_call.setdefault(status.tag, []).append(rank)
        out = []
        for each, ranks in in_call.items():
            what = self._what(each)
            if each != tag and what == self._what(tag):
                what += " with a different element count or root"
            out.append((what, sorted(ranks)))
        return out

    def check_group(self, control, me: int, tag: int) -> None:
        """Raise if the call tagged ``tag`` that rank ``me`` sleeps in can never
        complete, judging by the other members' status records:

        * a member that finished (returned from its function) after fewer
          calls in this group than this one's number: :class:`PeerGoneError`
          naming it (it never joins);
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
        elsewhere = 0  # members neither asleep in this call number nor finished
        for rank in self.ranks:
            if rank == me:
                continue
            status = control.status(rank)
            if status.state == ctl.WAITING and status.context == self.context \
                    and status.tag >= 0 and (status.tag >> SEQ_SHIFT) & 0xFF == seq:
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
            raise PeerGoneError(
                f"rank {me}: {self._what(tag)}, call {number} of {self._where()}, cannot "
                f"complete: {who} returned from its function after {made} collective "
                f"call{'s' if made != 1 else ''} in {self._where()}, without entering this "
                "one. Every rank of a group must make the same collective calls, in the "
                "same order.", peer=rank)
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
        parts = []
        for each, ranks in sorted(in_call.items(), key=lambda item: min(item[1])):
            what = self._what(each)
            if each != tag and what == self._what(tag):
                what += " with a different element count or root"
            parts.append(f"{what} on {name_ranks(sorted(ranks), most=8)}")
        raise CollectiveMismatchError(
            f"rank {me}: collective mismatch in call {number} of {self._where()}: "
            + "; ".join(parts) + ". Every rank of a group must make the same collective calls, "
            "in the same order, with the same count, dtype, root, op and algorithm.")


# --------------------------------------------------------------------------- the comm

#: At most this many bytes of scratch arrays are kept per group between calls.
SPARE_BYTES = 256 << 20



class Comm:
    """One rank's view of one collective call: its rank, the group size, and
    non-blocking sends and receives that all carry the call's tag.

    Ranks are group ranks. ``label`` says what the message is in the
    algorithm's words ("reduce-scatter step 2 chunk 3"); it goes into the
    trace (prefixed with the collective and algorithm) for the visualiser.
    An algorithm also says where it is with :meth:`at` (its step, numbered
    the same on every rank, and the phase); with tracing on, every message
    then records its step, phase, the range of the call's buffer it reads or
    writes, and whether it is combined (see :mod:`minidist.trace`).
    """

    __slots__ = ("group", "rank", "size", "tag", "ufunc", "prefix", "tracing", "algorithm",
                 "book", "_charge_combine", "_byte_scale", "collective", "call", "step",
                 "phase", "buffer", "root", "_start", "_steps_seen", "yields", "_taken",
                 "blocking", "_after")

    def __init__(self, group, tag: int, ufunc, prefix: str, algorithm: str = "", book=None,
                 *, collective: str = "", call: int = 0, buffer=None, root=None):
        self.group = group
        self.algorithm = algorithm
        self.book = book
        self.rank = group.rank
        self.size = group.size
        self.tag = tag
        self.ufunc = ufunc
        self.prefix = prefix
        self.collective = collective
        self.call = call
        self.buffer = buffer
        self.root = root
        self.step = None
        self.phase = None
        transport = group.transport
        # The simulator records its own trace in this process; real transports
        # follow the process's recorder.
        self.tracing = transport.tracing or _trace.enabled()
        # Only the simulator charges time for local work (its clock is virtual),
        # and only it runs on arrays that stand for bigger ones.
        self._charge_combine = transport.charge_combine
        self._byte_scale = transport.byte_scale
        self._start = transport.now_ns() if self.tracing else 0
        self._steps_seen = 0
        self.yields = 0  # steps this rank has finished (the drivers count them)
        self._taken = None
        self._after = None  # see when_released
        self.blocking = True  # False for async_op (set by call.execute)

    def at(self, step: int, phase: str) -> None:
        """Say which step of the algorithm the next messages belong to (the
        same numbering on every rank) and its phase ("reduce-scatter", ...).
        Without it a message's step is the number of steps this rank has
        finished, which is the same thing for algorithms in which every rank
        takes part in every step (the ring, pairwise exchanges)."""
        self.step = step
        self.phase = phase

    def _label(self, label: str, array=None, op=None) -> str:
        if not self.tracing:
            return self.prefix
        step = self.yields if self.step is None else self.step
        if step >= self._steps_seen:
            self._steps_seen = step + 1
        return _trace.with_info(f"{self.prefix}: {label}", call=self.call, step=step,
                                phase=self.phase, range=self._range(array), op=op)

    def _range(self, array):
        """[first, last) elements of the call's buffer that ``array`` views, or None."""
        buffer = self.buffer
        if array is None or buffer is None or array.dtype != buffer.dtype or not buffer.size:
            return None
        offset = (array.__array_interface__["data"][0]
                  - buffer.__array_interface__["data"][0])
        first, rest = divmod(offset, buffer.itemsize)
        if rest or first < 0 or first + array.size > buffer.size:
            return None
        return first, first + array.size

    def isend(self, array: np.ndarray, to: int, label: str = ""):
        """Start sending ``array`` to group rank ``to``; keep it unchanged until done."""
        return self.group.isend(array, to, self.tag, label=self._label(label, array))

    def irecv(self, array: np.ndarray, source: int, label: str = "", *, combined_into=None):
        """Start receiving into ``array`` (same shape and dtype as the message).
        ``combined_into``: for the trace, the part of the call's buffer a scratch
        ``array`` is combined into once it has arrived."""
        if combined_into is not None:
            text = self._label(label, combined_into, "combine")
        else:
            text = self._label(label, array, "copy")
        return _Receive(self.group, array, source, self.tag, text, None)

    def irecv_reduce(self, array: np.ndarray, source: int, label: str = ""):
        """Start receiving and combining into ``array`` with the call's reduction."""
        return _Receive(self.group, array, source, self.tag,
                        self._label(label, array, "combine"), self.ufunc)

    def exchange_with_all(self, buffer: np.ndarray, label: str = "whole array"):
        """Hand ``buffer`` to every other rank and get every other rank's, in one
        step. Use it as ``arrays = yield from comm.exchange_with_all(buffer)``:
        ``arrays[r]`` is rank r's array, for every rank of the group (this
        one's included, as a copy wherever combining into ``buffer`` could
        overwrite it before it is read), so ``buffer`` is free to take a result.
        Read the arrays, never write them; they are valid until the call ends.

        Plainly n - 1 isends and n - 1 irecvs; on one machine the fast paths
        may serve it through shared memory instead
        (:func:`minidist.distributed.fast_paths.exchange_with_all`), with the
        same arrays."""
        shortcut = fast_paths.exchange_with_all(self, buffer)
        if shortcut is not None:
            return shortcut
        return self._exchange_by_messages(buffer, label)

    def _exchange_by_messages(self, buffer, label):
        n, rank = self.size, self.rank
        to = [(rank + step) % n for step in range(1, n)]
        since = [(rank - step) % n for step in range(1, n)]  # the order the others send to us
        arrays = [None] * n
        for peer in since:
            arrays[peer] = self.scratch(buffer)
        if rank < 2:
            arrays[rank] = buffer  # read by the first combine, before anything is written
        else:
            arrays[rank] = self.scratch(buffer)
            np.copyto(arrays[rank], buffer)
        yield ([self.isend(buffer, peer, f"{label} to {peer}") for peer in to]
               + [self.irecv(arrays[peer], peer, f"{label} from {peer}", combined_into=buffer)
                  for peer in since])
        return arrays

    def when_released(self, action) -> None:
        """Run ``action()`` when the call ends (see :meth:`release`)."""
        if self._after is None:
            self._after = []
        self._after.append(action)

    def tag_of_call(self, number: int) -> int:
        """The tag call ``number`` of this group would carry with this call's
        fingerprint (the fast paths' lane numbers its calls itself)."""
        return (self.tag & ~(0xFF << SEQ_SHIFT)) | (number & 0xFF) << SEQ_SHIFT

    def scratch(self, like: np.ndarray) -> np.ndarray:
        """A flat array of ``like``'s dtype and size for this call alone.

        Reused from the group's earlier calls: a fresh array of many
        megabytes costs a page fault per 4 KiB the first time it is written
        (a 64 MiB scratch copy took longer than the message it served)."""
        key = (like.dtype, like.size)
        array = self.book.spare.pop(key, None) if self.book is not None else None
        if array is None:
            array = np.empty(like.size, like.dtype)
        if self._taken is None:
            self._taken = []
        self._taken.append(array)
        return array

    def release(self) -> None:
        """Hand the call's scratch arrays back to the group (at the end of the
        call), and run what :meth:`when_released` asked for."""
        if self._after is not None:
            after, self._after = self._after, None
            for action in after:
                action()
        if self._taken and self.book is not None:
            spare = self.book.spare
            for array in self._taken:
                spare[(array.dtype, array.size)] = array
            while sum(array.nbytes for array in spare.values()) > SPARE_BYTES:
                del spare[next(iter(spare))]  # the oldest first
        self._taken = None

    def record_call(self) -> None:
        """Trace the whole call on this rank (a ``collective`` event)."""
        if not self.tracing:
            return
        buffer = self.buffer
        label = _trace.with_info(
            self.prefix, call=self.call, collective=self.collective, algorithm=self.algorithm,
            world=self.size, count=0 if buffer is None else buffer.size,
            itemsize=0 if buffer is None else buffer.itemsize,
            root=-1 if self.root is None else self.root, steps=self._steps_seen,
            group=self.group.group_id)
        transport = self.group.transport
        transport.record_event("collective", self._start, transport.now_ns(), label=label,
                               group=self.group.group_id)

    def nbytes_of(self, array: np.ndarray) -> int:
        """The bytes ``array`` stands for: its size, except in the simulator,
        which runs on small arrays standing for big ones. An algorithm whose
        shape depends on the size (how many segments, how many chunks) asks
        this, not ``array.nbytes``, so that it is simulated as it would run."""
        if self._byte_scale == 1.0:
            return array.nbytes
        return round(array.nbytes * self._byte_scale)

    def combine(self, array: np.ndarray, incoming: np.ndarray, out=None) -> None:
        """``array = op(array, incoming)`` with the call's reduction, on this rank
        (into ``out`` instead of ``array`` if given).
        Use it (not the ufunc directly) for every local combine, so that the
        simulator can charge its N gamma."""
        self.ufunc(array, incoming, out=array if out is None else out)
        if self._charge_combine is not None:
            self._charge_combine(array.nbytes)


class _Receive:
    """A receive that is posted when it is first needed.

    Waited on directly (the blocking case) it becomes the group's blocking
    ``recv`` / ``recv_reduce``, whose fast path takes a small message from an
    idle peer in a few microseconds instead of the general engine's tens.
    Tested first (``async_op``, the simulator) it is posted as a normal
    non-blocking receive. Posting late changes nothing a peer can see: a
    message that arrives before its receive is kept, in order, until asked
    for.
    """

    __slots__ = ("group", "array", "source", "tag", "label", "ufunc", "request", "done",
                 "error")

    def __init__(self, group, array, source, tag, label, ufunc):
        self.group = group
        self.array = array
        self.source = source
        self.tag = tag
        self.label = label
        self.ufunc = ufunc
        self.request = None
        self.done = False
        self.error = None

    def _post(self):
        if self.ufunc is None:
            self.request = self.group.irecv(self.array, self.source, self.tag, label=self.label)
        else:
            self.request = self.group.irecv_reduce(self.array, self.source, self.ufunc,
                                                   self.tag, label=self.label)
        return self.request

    def wait(self, timeout=_DEFAULT):
        if self.done:
            return True
        if self.request is not None:
            self.request.wait(timeout)
        elif self.ufunc is None:
            self.group.recv(self.array, self.source, self.tag, label=self.label,
                            timeout=timeout)
        else:
            self.group.recv_reduce(self.array, self.source, self.ufunc, self.tag,
                                   label=self.label, timeout=timeout)
        self.done = True
        return True

    def test(self) -> bool:
        if not self.done:
            request = self.request or self._post()
            self.done = request.test()
        return self.done

    is_completed = test


# --------------------------------------------------------------------------- running


def run(steps, timeout=_DEFAULT, comm=None) -> None:
    """Run an algorithm to the end, waiting for each step's requests (each wait
    at most ``timeout`` seconds: default the run's timeout, None no limit)."""
    for requests in steps:
        _wait_step(requests, timeout)
        if comm is not None:
            comm.yields += 1


def _wait_step(requests, timeout) -> None:
    """Wait for one step's requests. When more than one is pending, every
    receive is posted before anything waits: a rank blocked on its own send
    must find the incoming message's buffer ready, or the transport has to
    park the whole message in a temporary copy (an exchange of two 32 MiB
    chunks took 1.6x as long that way)."""
    pending = 0
    for request in requests:
        if not request.done:
            pending += 1
    if pending > 1:
        for request in requests:
            if type(request) is _Receive and request.request is None:
                request._post()
    for request in requests:
        if not request.done:
            request.wait(timeout)
        elif request.error is not None:
            raise request.error


class Work:
    """The handle of a collective started with ``async_op=True`` (torch's Work).

    Nothing runs in the background: each :meth:`test` moves the algorithm on
    as far as it can without blocking, and :meth:`wait` runs it to the end.
    Call ``test()`` now and then between pieces of computation to overlap
    them with communication.
    """

    def __init__(self, steps, finish=None, book=None, comm=None):
        self._comm = comm
        self._steps = steps
        self._finish = finish
        self._book = book
        self._requests = ()
        self._done = False
        self._error = None
        self.result = None

    def _complete(self) -> None:
        self._done = True
        if self._comm is not None:
            self._comm.release()
            self._comm.record_call()
        if self._finish is not None:
            self.result = self._finish()

    def test(self) -> bool:
        """Advance without blocking; True once the collective has finished."""
        if self._error is not None:
            raise self._error
        try:
            while not self._done:
                for request in self._requests:
                    if not request.test():
                        return False
                self._next_step()
        except BaseException as error:
            self._abandon(error)
            raise
        return True

    is_completed = test

    def wait(self, timeout=_DEFAULT) -> bool:
        """Block until the collective has finished; returns True (as torch does)."""
        if self._error is not None:
            raise self._error
        try:
            while not self._done:
                _wait_step(self._requests, timeout)
                self._next_step()
        except BaseException as error:
            self._abandon(error)
            raise
        return True

    def _abandon(self, error: BaseException) -> None:
        """A step failed: this call will never finish (later test() and wait()
        raise the same error); give its scratch arrays back."""
        if self._error is None:
            self._error = error
            if self._comm is not None:
                self._comm.release()

    def _next_step(self) -> None:
        """The current step's requests are done: run the algorithm to its next one."""
        if self._comm is not None and self._requests:
            self._comm.yields += 1
        try:
            self._requests = next(self._steps)
        except StopIteration:
            self._complete()


class _Done(Work):
    def __init__(self, result=None):
        super().__init__(iter(()))
        self._done = True
        self.result = result


def completed_work(result=None) -> Work:
    """A Work that is already finished (a world of one, an empty buffer)."""
    return _Done(result)
