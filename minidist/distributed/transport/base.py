"""The transport contract, and the progress engine every transport shares.

Contract (what collectives and strategies may rely on, on every transport):

* **reliable, ordered, tagged**: messages from one sender with the same tag and
  context arrive in the order they were sent; a receive names its source (or
  any source) and its tag (or any tag);
* **arrays of any plain dtype and shape**: bool to complex128, 0-d, empty,
  non-contiguous (sent as a contiguous copy);
* ``isend`` / ``irecv`` return a :class:`Request` with ``wait()``, ``test()``
  and ``is_completed()``; the blocking forms are an ``isend`` / ``irecv``
  followed by ``wait()``;
* three ways to receive: **into** a preallocated buffer (shape and dtype must
  match, or :class:`MessageMismatchError` and the message stays queued),
  **reduce** into a buffer (``ufunc(buffer, incoming, out=buffer)``, reading
  the incoming bytes where the transport holds them, without a temporary copy
  of the whole message), or as a **new** array;
* ``iprobe`` / ``probe`` report the source, tag, dtype and shape of the next
  matching message without receiving it.

How it works (the same for pipes and shared memory). A transport moves bytes
over one *channel* per ordered pair of ranks; the subclass says how
(:meth:`Transport._push`, :meth:`_peek`, :meth:`_pull`, :meth:`_sleep`). On top,
this engine keeps, MPI-style:

* per destination, a FIFO of pending sends (only the head one moves);
* a list of posted receives, matched in the order they were posted;
* per source, the message being received and a queue of *unexpected*
  messages: ones that had to be moved out of the channel before anyone asked
  for them, because a later message was wanted or because this rank was
  blocked (copying them out is what lets two ranks both send before they
  receive without deadlocking).

There are no background threads: progress happens inside the calls. Every
blocking call runs the engine until its request completes, sleeping when
nothing moves, and every wait checks the run's abort flag, whether the peer
is still there, and its timeout.

Beside the engine, in modules of their own: what a wait that cannot end
raises, and why (:mod:`.failures`); what the collectives register on a
transport and ask of it (:mod:`.collective_hooks`). The speed shortcuts
(spinning, small messages without the engine, one-copy rendezvous, ...) are
subclasses of the plain transports, listed in
:mod:`minidist.distributed.fast_paths`.
"""

from __future__ import annotations

import abc
import copy
from collections import deque

import numpy as np

from minidist import trace as _trace
from minidist.distributed.transport import message
from minidist.distributed.transport.collective_hooks import CollectiveHooks
from minidist.distributed.transport.failures import FailureDiagnosis, buffer_misfit
from minidist.distributed.transport.message import ANY_SOURCE, ANY_TAG
from minidist.runtime import control as ctl
from minidist.runtime.errors import MessageMismatchError, PeerGoneError

_NEW, _INTO, _REDUCE = range(3)
_DEFAULT = object()
_now = _trace.now


# --------------------------------------------------------------------------- sinks


class CopySink:
    """Payload bytes go straight into ``target`` (a flat uint8 array, written
    through a memoryview: the cheapest copy Python has)."""

    __slots__ = ("target", "array")

    def __init__(self, target: np.ndarray):
        self.array = target
        self.target = memoryview(target)

    def direct(self, offset: int, length: int) -> memoryview:
        return self.target[offset:offset + length]

    def consume(self, offset: int, chunk) -> None:
        self.target[offset:offset + len(chunk)] = chunk


class ReduceSink:
    """Payload bytes are combined into ``target`` (flat, typed) as they arrive:
    ``ufunc(target[i:j], incoming, out=target[i:j])``; chunks arrive whole elements."""

    __slots__ = ("target", "ufunc", "dtype", "itemsize")

    def __init__(self, target: np.ndarray, ufunc: np.ufunc):
        self.target = target
        self.ufunc = ufunc
        self.dtype = target.dtype
        self.itemsize = target.dtype.itemsize

    def direct(self, offset: int, length: int):
        return None

    def consume(self, offset: int, chunk) -> None:
        incoming = np.frombuffer(chunk, self.dtype)  # a view: no copy of the chunk
        start = offset // self.itemsize
        part = self.target[start:start + len(incoming)]
        self.ufunc(part, incoming, out=part)


# --------------------------------------------------------------------------- requests


class Request:
    """A send or receive in progress (torch calls it a Work handle)."""

    __slots__ = ("_transport", "done", "error", "tag", "context", "label", "start_ns",
                 "group_ranks", "__weakref__")

    def wait(self, timeout=_DEFAULT):
        """Block until done (progressing all of this rank's traffic meanwhile).
        Returns True, like torch; raises if the operation failed or timed out."""
        if not self.done:
            self._transport.wait(self, timeout)
        if self.error is not None:
            raise self.error
        return True

    def test(self) -> bool:
        """Make progress without blocking; True once the operation is done."""
        if not self.done:
            self._transport.progress()
        if self.error is not None:
            raise self.error
        return self.done

    is_completed = test

    def _fail(self, error: BaseException) -> None:
        self.error = error
        self.done = True


class CompletedRequest(Request):
    """A request that was done when it was made (a send taken by a fast path)."""

    def __init__(self):
        self._transport = None
        self.done = True
        self.error = None
        self.tag = self.context = None
        self.label = ""
        self.start_ns = 0
        self.group_ranks = None


COMPLETED = CompletedRequest()


class SendRequest(Request):
    __slots__ = ("dst", "header", "payload", "nbytes", "seq", "written", "itemsize", "keepalive",
                 "mark")

    def __init__(self, transport, dst, tag, context, header, payload, itemsize, seq, label,
                 keepalive):
        self._transport = transport
        self.done = False
        self.error = None
        self.dst = dst
        self.tag = tag
        self.context = context
        self.header = header
        self.payload = payload
        self.nbytes = len(payload)
        self.itemsize = itemsize
        self.seq = seq
        self.label = label
        self.written = 0
        self.mark = 0  # transport-specific (shm: the slot count that means "read")
        self.keepalive = keepalive
        self.group_ranks = None
        self.start_ns = _now() if transport._recorder is not None else 0

    def _complete(self) -> None:
        self.done = True
        self.payload = self.keepalive = None
        recorder = self._transport._recorder
        if recorder is not None:
            recorder.add("send", self.start_ns, _now(), self.dst, self.nbytes, self.tag,
                         self.label, self.seq, self.context >> 32, self.context & 0xFFFFFFFF)

    def describe(self) -> str:
        return f"send to {self.dst}, tag {self.tag}"


class RecvRequest(Request):
    __slots__ = ("src", "mode", "buffer", "ufunc", "source", "header", "array", "_scratch")

    def __init__(self, transport, src, tag, context, mode, buffer, ufunc, label):
        self._transport = transport
        self.done = False
        self.error = None
        self.src = src
        self.tag = tag
        self.context = context
        self.mode = mode
        self.buffer = buffer
        self.ufunc = ufunc
        self.label = label
        self.source = None
        self.header = None
        self.array = None
        self._scratch = None
        self.group_ranks = None
        self.start_ns = _now() if transport._recorder is not None else 0

    # Which source and tag the message had (group ranks if posted through a group).
    @property
    def source_rank(self):
        if self.source is None or self.group_ranks is None:
            return self.source
        return self.group_ranks.index(self.source)

    def matches(self, source: int, header) -> bool:
        return ((self.src == source or self.src == ANY_SOURCE)
                and (self.tag == header.tag or self.tag == ANY_TAG)
                and self.context == header.context)

    def misfit(self, source: int, header) -> MessageMismatchError | None:
        """Why the buffer cannot take this message, or None."""
        if self.mode == _NEW:
            return None
        buffer = self.buffer
        if buffer.dtype == header.dtype and buffer.shape == header.shape:
            return None
        transport = self._transport
        error = buffer_misfit(transport.rank, self.mode == _REDUCE, source, header, buffer)
        if header.context in transport.collective_groups:
            # A collective's: which rank is odd, the group's shown calls may
            # tell (see collective_hooks).
            return transport._judged_misfit(header.context, self.tag, error)
        return error

    def sink(self, header):
        """Where this message's payload goes."""
        copy_sink = self._transport.copy_sink
        if self.mode == _NEW:
            self.array = np.empty(header.shape, header.dtype)
            return copy_sink(_bytes_of(self.array))
        buffer = self.buffer
        if buffer.flags.c_contiguous:
            if self.mode == _INTO:
                return copy_sink(_bytes_of(buffer))
            return ReduceSink(buffer.reshape(-1), self.ufunc)
        # A strided buffer cannot be filled chunk by chunk in place: receive
        # whole, then copy (or combine) once at the end.
        self._scratch = np.empty(header.shape, header.dtype)
        return copy_sink(_bytes_of(self._scratch))

    def _bind(self, source: int, header) -> None:
        self.source = source
        self.header = header

    def _deliver_from(self, data: np.ndarray) -> None:
        """Complete from a fully received unexpected message (flat uint8)."""
        header = self.header
        if self.mode == _NEW:
            self.array = data.view(header.dtype).reshape(header.shape)
        elif self.mode == _INTO:
            np.copyto(self.buffer, data.view(header.dtype).reshape(header.shape))
        else:
            self.ufunc(self.buffer, data.view(header.dtype).reshape(header.shape),
                       out=self.buffer)
        self._complete()

    def _complete(self) -> None:
        scratch = self._scratch
        if scratch is not None:
            self._scratch = None
            if self.mode == _INTO:
                np.copyto(self.buffer, scratch)
            else:
                self.ufunc(self.buffer, scratch, out=self.buffer)
        self.done = True
        recorder = self._transport._recorder
        if recorder is not None:
            header = self.header
            recorder.add("recv", self.start_ns, _now(), self.source, header.nbytes, header.tag,
                         self.label, header.seq, header.context >> 32,
                         header.context & 0xFFFFFFFF)

    def describe(self) -> str:
        source = "any rank" if self.src == ANY_SOURCE else self.src
        tag = "any" if self.tag == ANY_TAG else self.tag
        return f"recv from {source}, tag {tag}"


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array (0-d and empty included)."""
    return array.reshape(-1).view(np.uint8)


class _Unexpected:
    """A message moved out of its channel before a receive asked for it."""

    __slots__ = ("header", "data", "complete", "waiter")

    def __init__(self, header):
        self.header = header
        self.data = np.empty(header.nbytes, np.uint8)
        self.complete = False
        self.waiter = None


class Inbound:
    """The message currently being read from one source's channel."""

    __slots__ = ("header", "sink", "owner", "received", "chunks")

    def __init__(self, header, sink, owner):
        self.header = header
        self.sink = sink
        self.owner = owner
        self.received = 0  # payload bytes delivered to the sink
        self.chunks = 0  # transport-specific count (slots consumed, ...)


class MessageInfo:
    """What :meth:`Transport.iprobe` reports about a waiting message."""

    __slots__ = ("source", "tag", "dtype", "shape", "nbytes")

    def __init__(self, source, tag, dtype, shape, nbytes):
        self.source = source
        self.tag = tag
        self.dtype = dtype
        self.shape = shape
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return (f"MessageInfo(source={self.source}, tag={self.tag}, dtype={self.dtype}, "
                f"shape={self.shape}, nbytes={self.nbytes})")


# --------------------------------------------------------------------------- engine


class Transport(CollectiveHooks, FailureDiagnosis, abc.ABC):
    """Base class: the progress engine over abstract per-pair channels."""

    name = "base"
    #: What copies an arriving payload into its buffer (a transport may bring its own).
    copy_sink = CopySink

    def __init__(self, rank: int, world_size: int, control: ctl.ControlBlock,
                 timeout: float | None = None):
        super().__init__()  # the collectives' registrations (see .collective_hooks)
        self.rank = rank
        self.world_size = world_size
        self.default_timeout = timeout
        self._control = control
        self._recorder = _trace.current()
        # A real transport traces when its process records (which starts
        # before the transport is made); the collectives read this one flag.
        self.tracing = self._recorder is not None
        self._sources = [r for r in range(world_size) if r != rank]
        self._pending_sends = [deque() for _ in range(world_size)]
        self._active_sends: set[int] = set()
        self._posted: list[RecvRequest] = []
        self._incoming: list[Inbound | None] = [None] * world_size
        self._peeked = [None] * world_size
        self._unexpected = [deque() for _ in range(world_size)]
        self._send_seq = [0] * world_size
        self._closed_sources: set[int] = set()
        self.closed = False

    # ---------------------------------------------------------------- subclass hooks

    @abc.abstractmethod
    def _push(self, dst: int, request: SendRequest) -> bool:
        """Move as much of ``request`` into the channel as fits now; True when all of it is in.
        Must advance ``request.written`` when it moves anything. May raise
        PeerGoneError when ``dst`` can never read it (its pipe is broken): the
        engine then fails this send and the ones queued behind it."""

    @abc.abstractmethod
    def _peek(self, src: int):
        """The header of the next message from ``src`` if it has arrived, else None."""

    @abc.abstractmethod
    def _begin(self, src: int, inbound: Inbound) -> None:
        """The header at the head of the channel from ``src`` is now being received
        (a stream transport consumes the header bytes here)."""

    @abc.abstractmethod
    def _pull(self, src: int, inbound: Inbound) -> bool:
        """Move arrived payload of ``inbound`` into its sink (advancing
        ``inbound.received``); True when the whole message is in."""

    def _ready_sources(self):
        """Sources whose channels may hold something new (a superset is fine)."""
        return self._sources

    @abc.abstractmethod
    def _sleep(self, seconds: float) -> None:
        """Block until something may have happened on a channel, or ``seconds``.
        May return early; must never miss a wake-up for longer than ``seconds``."""

    # ---------------------------------------------------------------- sending

    def isend(self, array: np.ndarray, dst: int, tag: int, context: int = 0,
              label: str = "") -> SendRequest:
        """Start sending a C-contiguous array (the caller keeps it unchanged until done).
        Never raises for a destination that is gone: the request fails, and
        its wait() raises the PeerGoneError (see _fail_sends)."""
        seq = self._send_seq[dst]
        self._send_seq[dst] = seq + 1
        header = message.encode(tag, context, seq, array.dtype, array.shape)
        request = SendRequest(self, dst, tag, context, header, _bytes_of(array),
                              array.dtype.itemsize, seq, label, array)
        queue = self._pending_sends[dst]
        queue.append(request)
        self._active_sends.add(dst)
        if len(queue) == 1:
            self._progress_sends(dst)
        return request

    def _progress_sends(self, dst: int) -> bool:
        queue = self._pending_sends[dst]
        moved = False
        while queue:
            request = queue[0]
            before = request.written
            try:
                complete = self._push(dst, request)
            except PeerGoneError as error:
                self._fail_sends(dst, self._why_gone(dst, request, error))
                return True
            if request.written != before:
                moved = True
            if not complete:
                break
            queue.popleft()
            request._complete()
            moved = True
        if not queue:
            self._active_sends.discard(dst)
        return moved

    def _fail_sends(self, dst: int, error: Exception) -> None:
        """``dst`` is gone: fail every send queued to it, each raising ``error``
        from its own wait().

        Not raised from here: this runs inside progress(), that is inside
        every wait of this rank, whatever it waits for. Raised, the error
        would surface in a wait on another peer (a receive from a live
        server), and a caller that fails over on PeerGoneError would blame
        that peer; and the send, left at the head of its queue, would raise
        again in every later wait."""

        queue = self._pending_sends[dst]
        first = True
        while queue:
            # Each request its own copy: one exception raised from several
            # waits would pile up their tracebacks.
            queue.popleft()._fail(error if first else copy.copy(error))
            first = False
        self._active_sends.discard(dst)

    # ---------------------------------------------------------------- receiving

    def irecv(self, src: int, tag: int, context: int = 0, *, into: np.ndarray | None = None,
              reduce_into: np.ndarray | None = None, ufunc=None, label: str = "") -> RecvRequest:
        """Post a receive: a new array (default), ``into`` a buffer, or combined
        into ``reduce_into`` with ``ufunc``. If the matching message does not fit
        the buffer, the request fails (``wait()`` raises MessageMismatchError) and
        the message stays queued for another receive."""
        if into is not None:
            request = RecvRequest(self, src, tag, context, _INTO, into, None, label)
        elif reduce_into is not None:
            request = RecvRequest(self, src, tag, context, _REDUCE, reduce_into, ufunc, label)
        else:
            request = RecvRequest(self, src, tag, context, _NEW, None, None, label)
        if self.strict_contexts and src != ANY_SOURCE and self._unexpected[src] \
                and context in self.strict_contexts:
            self._strict_on_post(request, src, context)  # a collective's: see collective_hooks
            if request.done:
                return request
        sources = self._sources if src == ANY_SOURCE else (src,)
        for source in sources:
            for entry in self._unexpected[source]:
                if request.matches(source, entry.header):
                    error = request.misfit(source, entry.header)
                    if error is not None:
                        request._fail(error)  # raised by wait(); the message stays queued
                        return request
                    self._unexpected[source].remove(entry)
                    request._bind(source, entry.header)
                    if entry.complete:
                        request._deliver_from(entry.data)
                    else:
                        entry.waiter = request
                    return request
        self._posted.append(request)
        return request

    def _match_posted(self, source: int, header) -> RecvRequest | None:
        posted = self._posted
        index = 0
        while index < len(posted):
            request = posted[index]
            if request.matches(source, header):
                del posted[index]
                error = request.misfit(source, header)
                if error is not None:
                    request._fail(error)
                    continue
                request._bind(source, header)
                return request
            index += 1
        return None

    def _wants_more_from(self, source: int) -> bool:
        for request in self._posted:
            if request.src == source or request.src == ANY_SOURCE:
                return True
        return False

    def _progress_source(self, src: int, drain: bool) -> bool:
        moved = False
        while True:
            inbound = self._incoming[src]
            if inbound is not None:
                before = inbound.received
                complete = self._pull(src, inbound)
                if inbound.received != before:
                    moved = True
                if not complete:
                    return moved
                self._incoming[src] = None
                self._finish(inbound)
                moved = True
                continue
            header = self._peeked[src]
            if header is None:
                header = self._peek(src)
                if header is None:
                    return moved
                self._peeked[src] = header
            request = self._match_posted(src, header)
            if request is None and header.context in self.strict_contexts:
                self._check_strict(src, header)  # a collective's: see collective_hooks
            if request is not None:
                inbound = Inbound(header, request.sink(header), request)
            elif drain or self._wants_more_from(src):
                entry = _Unexpected(header)
                self._unexpected[src].append(entry)
                inbound = Inbound(header, self.copy_sink(entry.data), entry)
            else:
                return moved
            self._peeked[src] = None
            self._incoming[src] = inbound
            self._begin(src, inbound)
            moved = True

    def _finish(self, inbound: Inbound) -> None:
        owner = inbound.owner
        if isinstance(owner, RecvRequest):
            owner._complete()
            return
        owner.complete = True
        if owner.waiter is not None:
            owner.waiter._deliver_from(owner.data)

    def progress(self, drain: bool = False) -> bool:
        """Move whatever can move without blocking; True if anything did.
        With ``drain``, also move unrequested messages out of their channels."""
        moved = False
        if self._active_sends:
            for dst in tuple(self._active_sends):
                if self._progress_sends(dst):
                    moved = True
        incoming, peeked = self._incoming, self._peeked
        for src in self._ready_sources():
            if self._progress_source(src, drain):
                moved = True
        for src in self._sources:
            if (incoming[src] is not None or peeked[src] is not None) and \
                    self._progress_source(src, drain):
                moved = True
        return moved

    # ---------------------------------------------------------------- probing

    def _find_unexpected(self, source, tag, context) -> MessageInfo | None:
        for entry in self._unexpected[source]:
            header = entry.header
            if (tag == ANY_TAG or header.tag == tag) and header.context == context:
                return MessageInfo(source, header.tag, header.dtype, header.shape, header.nbytes)
        return None

    def iprobe(self, src: int, tag: int, context: int = 0) -> MessageInfo | None:
        """The next message matching (src, tag, context), without receiving it.
        Messages ahead of it in its channel are moved aside (kept, in order)."""
        self.progress()
        sources = self._sources if src == ANY_SOURCE else (src,)
        for source in sources:
            while True:
                info = self._find_unexpected(source, tag, context)
                if info is not None:
                    return info
                if self._incoming[source] is not None:
                    self._progress_source(source, drain=False)
                    if self._incoming[source] is not None:
                        break  # cannot look past a message still arriving
                    continue
                header = self._peeked[source] or self._peek(source)
                if header is None:
                    break
                self._peeked[source] = header
                if (tag == ANY_TAG or header.tag == tag) and header.context == context:
                    return MessageInfo(source, header.tag, header.dtype, header.shape,
                                       header.nbytes)
                self._progress_source(source, drain=True)
        return None

    def probe(self, src: int, tag: int, context: int = 0, timeout=_DEFAULT) -> MessageInfo:
        found = []

        def arrived():
            info = self.iprobe(src, tag, context)
            if info is not None:
                found.append(info)
            return info is not None

        self._wait_until(arrived, timeout, ctl.OP_PROBE, src, tag, context, 0)
        return found[0]

    # ---------------------------------------------------------------- waiting

    def wait(self, request: Request, timeout=_DEFAULT) -> None:
        if request.done:
            return
        if isinstance(request, SendRequest):
            op, peer, nbytes = ctl.OP_SEND, request.dst, request.nbytes
        else:
            op, peer, nbytes = ctl.OP_RECV, request.src, 0
        try:
            self._wait_until(lambda: request.done, timeout, op, peer, request.tag,
                             request.context, nbytes, request)
        except BaseException:
            if not request.done and isinstance(request, RecvRequest):
                self._cancel(request)
            raise

    def _cancel(self, request: RecvRequest) -> None:
        """Withdraw a receive whose wait failed, so that a message arriving later
        is not written into a buffer its owner has given up on. (A message
        already streaming into the buffer finishes there.)"""
        if request in self._posted:
            self._posted.remove(request)
            return
        for source, queue in enumerate(self._unexpected):
            inbound = self._incoming[source]
            if inbound is not None and isinstance(inbound.owner, _Unexpected) \
                    and inbound.owner.waiter is request:
                inbound.owner.waiter = None
                queue.append(inbound.owner)  # the newest message from that source

    def wait_all(self, requests, timeout=_DEFAULT) -> None:
        pending = [request for request in requests if not request.done]
        if len(pending) == 1:
            pending[0].wait(timeout)
        elif pending:
            try:
                self._wait_until(lambda: all(request.done for request in pending), timeout,
                                 ctl.OP_WAIT_MANY, ANY_SOURCE, ANY_TAG, 0, 0)
            except BaseException:
                for request in pending:
                    if not request.done and isinstance(request, RecvRequest):
                        self._cancel(request)
                raise
        for request in requests:
            if request.error is not None:
                raise request.error

    def _wait_until(self, is_done, timeout, op, peer, tag, context, nbytes, request=None):
        """Progress until ``is_done()``, sleeping in slices while nothing moves,
        and checking between them that the wait can still end (the abort flag,
        the peer, the group, the timeout: see :mod:`.failures`)."""
        if is_done():
            return
        self.progress()
        if is_done():
            return
        if timeout is _DEFAULT:
            timeout = self.default_timeout
        control = self._control
        start = _now()
        deadline = None if timeout is None else start + int(timeout * 1e9)
        control.set_waiting(self.rank, op, peer, tag, context, nbytes, start)
        check_group = self._group_check(context, tag, start)  # None outside collectives
        try:
            while True:
                if control.aborted:
                    raise self._aborted_error(op, peer, tag, context)
                moved = self.progress()
                if is_done():
                    return
                if not moved:
                    moved = self.progress(drain=True)
                    if is_done():
                        return
                if moved:
                    continue
                self._check_peer(op, peer, tag, context, request)
                current = _now()
                if check_group is not None:
                    check_group(current)  # asleep in a collective: are the others in it?
                if deadline is not None and current >= deadline:
                    raise self._timeout_error(op, peer, tag, context, timeout, current)
                remaining = ctl.WAIT_SLICE if deadline is None else (deadline - current) / 1e9
                self._sleep(min(ctl.WAIT_SLICE, remaining))
        finally:
            control.set_running(self.rank, _now())

    # ---------------------------------------------------------------- lifetime

    def pending_sends(self) -> int:
        return sum(len(queue) for queue in self._pending_sends)

    def flush(self, timeout=_DEFAULT) -> None:
        """Wait until every started send has been handed to its channel."""
        pending = [request for queue in self._pending_sends for request in queue]
        if pending:
            self.wait_all(pending, timeout)

    def close(self) -> None:
        self.closed = True
