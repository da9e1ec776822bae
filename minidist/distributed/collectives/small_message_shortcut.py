"""The small-message shortcut of every collective's sends and receives,
installed over :class:`~.comm.Comm` when the fast paths are on (see
:mod:`minidist.distributed.fast_paths`).

Read :meth:`~.comm.Comm.isend`, :meth:`~.comm.Comm.irecv` and
:func:`~.comm.run` as if this module did not exist: with
``MINIDIST_FAST_PATHS=0`` at the start of a run it installs nothing, and an
algorithm's messages go straight to the transport's ``isend`` / ``irecv``.
With the fast paths on, :func:`install` (called by the package's
``__init__``) replaces three things; each checks the switch on every call,
so ``fast_paths.disabled()`` sends the calls the plain way again.

1. **Small sends** (:meth:`Comm.isend`): a message that fits the
   transport's small-message area is copied there at once and the send is
   complete (the transport's ``send_small``). Replaces: a request queued in
   the progress engine and pushed on the next progress. Gains: no request,
   no queue.
2. **Receives posted when first needed** (:meth:`Comm.irecv`,
   :meth:`Comm.irecv_reduce`): the receive is a :class:`_Receive`, which a
   blocking step waits on with the transport's ``recv_small`` (a small
   message from an idle peer, taken where it lies, after a short spin), and
   which is posted as a normal receive only when that does not apply.
   Replaces: posting at once and waiting in the general engine. Gains: the
   engine's matching, queues and sleeps on the latency path. Posting late
   changes nothing a peer can see: a message that arrives before its
   receive is kept, in order, until asked for.
Only where the transport has a small-message path (``small_messages``:
shm's fast class); elsewhere (pipes, MPI, the simulator) every receive is
posted when the algorithm makes it, as with the shortcuts off.

3. **The step's wait** (:func:`~.comm._wait_step`): when more than one
   request of a step is pending, every :class:`_Receive` is posted before
   anything waits, so that a rank blocked on its own send finds the
   incoming message's buffer ready (else the transport must park the whole
   message in a temporary copy and copy it twice).
"""

from __future__ import annotations

import functools

from minidist.distributed import fast_paths
from minidist.distributed.collectives import comm as comm_module
from minidist.distributed.collectives.comm import Comm
from minidist.distributed.transport.base import _DEFAULT, COMPLETED


def install() -> None:
    """Put the three shortcuts in place (once, at import, fast paths on)."""
    Comm.isend = _small_send_first(Comm.isend)
    Comm.irecv = _posted_when_needed(Comm.irecv, reduce=False)
    Comm.irecv_reduce = _posted_when_needed(Comm.irecv_reduce, reduce=True)
    comm_module._wait_step = _wait_step


def _small_send_first(plain_isend):
    @functools.wraps(plain_isend)
    def isend(comm, array, to, label=""):
        if fast_paths.enabled() and comm.transport.small_messages and comm.transport.send_small(
                array, comm.ranks[to], comm.tag, comm.context, comm._label(label, array)):
            return COMPLETED
        return plain_isend(comm, array, to, label)

    return isend


def _posted_when_needed(plain_irecv, reduce: bool):
    @functools.wraps(plain_irecv)
    def irecv(comm, array, source, label="", **options):
        if not (fast_paths.enabled() and comm.transport.small_messages):
            return plain_irecv(comm, array, source, label, **options)
        # The trace's words for the message, as the plain receive would say them.
        combined_into = options.get("combined_into")
        if combined_into is not None:
            text = comm._label(label, combined_into, "combine")
        else:
            text = comm._label(label, array, "combine" if reduce else "copy")
        return _Receive(comm, array, source, text, comm.ufunc if reduce else None)

    return irecv


class _Receive:
    """A receive that is posted when it is first needed.

    Waited on directly (the blocking case) it tries the transport's
    ``recv_small`` first; tested first (``async_op``, the simulator) it is
    posted as a normal non-blocking receive."""

    __slots__ = ("comm", "array", "source", "text", "ufunc", "request", "done", "error")

    def __init__(self, comm, array, source, text, ufunc):
        self.comm = comm
        self.array = array
        self.source = source
        self.text = text
        self.ufunc = ufunc
        self.request = None
        self.done = False
        self.error = None

    def _post(self):
        """Post the plain receive (as :meth:`Comm.irecv` / ``irecv_reduce`` would,
        with the trace's words computed when the algorithm asked)."""
        comm = self.comm
        if self.ufunc is None:
            self.request = comm.transport.irecv(comm.ranks[self.source], comm.tag, comm.context,
                                                into=self.array, label=self.text)
        else:
            self.request = comm.transport.irecv(comm.ranks[self.source], comm.tag, comm.context,
                                                reduce_into=self.array, ufunc=self.ufunc,
                                                label=self.text)
        return self.request

    def wait(self, timeout=_DEFAULT):
        if self.done:
            return True
        comm = self.comm
        if self.request is None and not (fast_paths.enabled() and comm.transport.recv_small(
                self.array, comm.ranks[self.source], comm.tag, comm.context, self.text,
                self.ufunc)):
            self._post()
        if self.request is not None:
            self.request.wait(timeout)
        self.done = True
        return True

    def test(self) -> bool:
        if not self.done:
            request = self.request or self._post()
            self.done = request.test()
        return self.done

    is_completed = test


def _wait_step(requests, timeout) -> None:
    """The plain step's wait, with every :class:`_Receive` posted before
    anything waits when more than one request is pending."""
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
