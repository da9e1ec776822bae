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

Every message of one call carries the call's tag, its fingerprint (which
collective, algorithm, reduction, dtype, count, call number), so that ranks
in different calls are told so at once: see :mod:`.fingerprints`.
"""

from __future__ import annotations

import numpy as np

from minidist import trace as _trace
from minidist.distributed.transport.base import _DEFAULT

#: At most this many bytes of scratch arrays are kept per group between calls.
SCRATCH_BYTES = 256 << 20


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

    __slots__ = ("group", "transport", "ranks", "context", "rank", "size", "tag", "ufunc",
                 "prefix", "tracing", "algorithm",
                 "calls", "scratch_pool", "_charge_combine", "_byte_scale", "collective", "call", "step",
                 "phase", "buffer", "root", "_start", "_steps_seen", "yields", "_taken",
                 "blocking", "_after", "entered_at", "inside_ns")

    def __init__(self, group, tag: int, ufunc, prefix: str, algorithm: str = "", calls=None,
                 *, collective: str = "", call: int = 0, buffer=None, root=None,
                 scratch_pool=None):
        self.group = group
        # Messages go straight to the transport: ``ranks[r]`` is group rank r's
        # rank in the world, ``context`` keeps this group's collectives apart.
        self.transport = group.transport
        self.ranks = group.ranks
        self.context = group.context
        self.algorithm = algorithm
        self.calls = calls  # the group's CallRecord (see fingerprints.py), or None
        self.call = call    # this call's number in the group
        # (dtype, size) -> an array no call of the group is using (see scratch)
        self.scratch_pool = scratch_pool
        self.rank = group.rank
        self.size = group.size
        self.tag = tag
        self.ufunc = ufunc
        self.prefix = prefix
        self.collective = collective
        self.buffer = buffer
        self.root = root
        self.step = None
        self.phase = None
        transport = self.transport
        # Real transports follow the process's recorder; the simulator records
        # its own trace (see collective_hooks).
        self.tracing = transport.tracing
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
        self.entered_at = None  # traced async_op calls: when the current test() or wait() began,
        self.inside_ns = 0  # and the time spent in the earlier ones

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
        return self.transport.isend(array, self.ranks[to], self.tag, self.context,
                                    self._label(label, array))

    def irecv(self, array: np.ndarray, source: int, label: str = "", *, combined_into=None):
        """Start receiving into ``array`` (same shape and dtype as the message).
        ``combined_into``: for the trace, the part of the call's buffer a scratch
        ``array`` is combined into once it has arrived."""
        if combined_into is not None:
            text = self._label(label, combined_into, "combine")
        else:
            text = self._label(label, array, "copy")
        return self.transport.irecv(self.ranks[source], self.tag, self.context, into=array,
                                    label=text)

    def irecv_reduce(self, array: np.ndarray, source: int, label: str = ""):
        """Start receiving and combining into ``array`` with the call's reduction."""
        return self.transport.irecv(self.ranks[source], self.tag, self.context,
                                    reduce_into=array, ufunc=self.ufunc,
                                    label=self._label(label, array, "combine"))

    def exchange_with_all(self, buffer: np.ndarray, label: str = "whole array"):
        """Hand ``buffer`` to every other rank and get every other rank's, in one
        step. Use it as ``arrays = yield from comm.exchange_with_all(buffer)``:
        ``arrays[r]`` is rank r's array, for every rank of the group (this
        one's included, as a copy wherever combining into ``buffer`` could
        overwrite it before it is read), so ``buffer`` is free to take a result.
        Read the arrays, never write them; they are valid until the call ends.

        Cost: n - 1 isends and n - 1 irecvs of the whole array, in one step.
        """
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

    def scratch(self, like: np.ndarray) -> np.ndarray:
        """A flat array of ``like``'s dtype and size for this call alone.

        Reused from the group's earlier calls: a fresh array of many
        megabytes costs a page fault per 4 KiB the first time it is written
        (a 64 MiB scratch copy took longer than the message it served)."""
        key = (like.dtype, like.size)
        pool = self.scratch_pool
        array = pool.pop(key, None) if pool is not None else None
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
        pool = self.scratch_pool
        if self._taken and pool is not None:
            for array in self._taken:
                pool[(array.dtype, array.size)] = array
            while sum(array.nbytes for array in pool.values()) > SCRATCH_BYTES:
                del pool[next(iter(pool))]  # the oldest first
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
        # An async_op call is in flight while the rank does other work, and
        # moves only inside its test() and wait() calls: say how long the rank
        # spent in them (inside=, ns), so that a profile can tell communication
        # under compute from communication the rank sat in. A blocking call
        # keeps the rank inside it throughout. The simulator's driver makes
        # every call async_op to move the ranks in turn: there the mark
        # would say nothing of the script, and none is written.
        transport = self.transport
        if not self.blocking and getattr(transport, "name", "") != "sim":
            inside = self.inside_ns
            if self.entered_at is not None:
                inside += transport.now_ns() - self.entered_at
            label += f" async=1 inside={inside}"
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


# --------------------------------------------------------------------------- running


def run(steps, timeout=_DEFAULT, comm=None) -> None:
    """Run an algorithm to the end, waiting for each step's requests (each wait
    at most ``timeout`` seconds: default the run's timeout, None no limit)."""
    for requests in steps:
        _wait_step(requests, timeout)
        if comm is not None:
            comm.yields += 1


def _wait_step(requests, timeout) -> None:
    """Wait for one step's requests (every receive was posted when the
    algorithm made it, so a rank blocked on its own send finds the incoming
    message's buffer ready)."""
    for request in requests:
        request.wait(timeout)


class Work:
    """The handle of a collective started with ``async_op=True`` (torch's Work).

    Nothing runs in the background: each :meth:`test` moves the algorithm on
    as far as it can without blocking, and :meth:`wait` runs it to the end.
    Call ``test()`` now and then between pieces of computation to overlap
    them with communication.
    """

    def __init__(self, steps, finish=None, comm=None):
        self._comm = comm
        self._steps = steps
        self._finish = finish
        self._requests = ()
        self._done = False
        self._error = None
        self.result = None

    def _note_entry(self) -> None:
        """In a traced run, when this test() or wait() began (see Comm.record_call)."""
        comm = self._comm
        if comm is not None and comm.tracing and not self._done:
            comm.entered_at = comm.transport.now_ns()

    def _note_exit(self) -> None:
        comm = self._comm
        if comm is not None and comm.entered_at is not None:
            comm.inside_ns += comm.transport.now_ns() - comm.entered_at
            comm.entered_at = None

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
        self._note_entry()
        try:
            while not self._done:
                for request in self._requests:
                    if not request.test():
                        return False
                self._next_step()
        except BaseException as error:
            self._abandon(error)
            raise
        finally:
            self._note_exit()
        return True

    is_completed = test

    def wait(self, timeout=_DEFAULT) -> bool:
        """Block until the collective has finished; returns True (as torch does)."""
        if self._error is not None:
            raise self._error
        self._note_entry()
        try:
            while not self._done:
                _wait_step(self._requests, timeout)
                self._next_step()
        except BaseException as error:
            self._abandon(error)
            raise
        finally:
            self._note_exit()
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
