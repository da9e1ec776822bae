"""The mpi transport: minidist's messages over MPI point-to-point.

For a script started by ``mpiexec -n 4 python script.py`` (MPICH or Open MPI):
``dist.init_process_group()`` sees the launcher's environment (``PMI_RANK`` /
``PMI_SIZE``, ``OMPI_COMM_WORLD_RANK`` / ``_SIZE``) and connects this
transport. The only file of minidist that imports mpi4py, and only when an
MPI run is actually joined (``pip install -e '.[mpi]'`` installs it).

How a minidist message travels. MPI already is a reliable, ordered, tagged
message layer, but its matching is not minidist's (a minidist tag is 64 bits
and comes with a context, receives may go into a buffer or be reduced into
one, and the engine in :mod:`.base` keeps the unexpected messages itself). So
this file uses MPI as nothing more than one *channel* per ordered pair of
ranks, exactly as pipe.py uses a pipe:

* a message is MPI messages on a private duplicate of ``MPI.COMM_WORLD``:
  its header (the bytes of :mod:`.message`, MPI tag ``HEADER_TAG``), then
  its payload in pieces of at most :data:`CHUNK` bytes, whole elements (the
  array's own bytes, MPI tag ``PAYLOAD_TAG``; NumPy buffers, never pickled;
  an empty array has no piece). Both sides cut the same pieces from the
  byte count and the itemsize, so they need not tell each other. A payload
  of at most :data:`INLINE` bytes rides in its header's message instead;
* MPI does not overtake messages between one pair with the same tag and
  communicator, so headers arrive in the order they were sent, and so do
  pieces; the receiver posts the receives of a payload right after taking
  its header, one message per source at a time, so the pieces of the k-th
  payload always land with the k-th header. That per-source FIFO is the
  channel the engine expects, and the engine does the rest (tags,
  contexts, ANY_SOURCE, probes, the order of receives): every collective
  runs on it unchanged;
* ``_peek`` is an ``Iprobe`` for a header (received at once: it is small);
  ``_begin`` posts the pieces' ``Irecv`` straight into the receive buffer,
  or, for a reduce, two at a time into two scratch pieces, each combined
  into the buffer as it completes (so no temporary of the whole message);
  ``_pull`` tests them;
* ``_push`` posts all the ``Isend`` and reports the send done only when MPI
  says all completed, so the caller's array is never changed under MPI;
* progress: MPI moves bytes only inside MPI calls here (no progress thread),
  which the engine makes all the time while it waits; between them a waiting
  rank naps :data:`NAP` seconds, which leaves the core to the others when
  ranks outnumber cores.

Failures. Under ``mpiexec`` there is no minidist parent watching the ranks:
nobody raises the control block's abort flag, and the status records are
shared by the ranks of one machine only (see :mod:`.mpi_node`). A rank that
raises reports its rank and error on stderr, then calls ``MPI_Abort``, which
ends every rank of the job (see :func:`minidist.distributed.world.init_process_group`).
A waiting rank names, first, a peer of its machine that finished without
entering its call, whose process is gone, or that is stopped (state T for a
few seconds ends the wait then, not at the timeout); MPICH ends the
job when a process exits without MPI_Finalize, sometimes with status 0,
which ``minidist run --transport mpi`` catches (:func:`tell_launcher`).
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque

import numpy as np

from minidist.distributed.transport import message
from minidist.distributed.transport.base import Inbound, SendRequest, Transport
from minidist.distributed.transport.message import ANY_SOURCE
from minidist.distributed.transport.mpi_environment import (  # noqa: F401 - re-exported
    launched_by_mpi,
    mpi_environment,
)
from minidist.distributed.transport.mpi_node import (
    stalled_error,
    stopped_words,
    vanished_error,
)
from minidist.distributed.transport.spin import SpinBeforeSleep
from minidist.runtime import control as ctl
from minidist.runtime.errors import PeerGoneError

#: How long a rank polls MPI for a message already on its way before it
#: concludes that a finished peer never sent it (see MpiTransport._in_flight).
IN_FLIGHT_GRACE = 0.5

HEADER_TAG = 1
PAYLOAD_TAG = 2
#: Largest payload piece (bytes): what a reduce holds in scratch, twice.
CHUNK = 1 << 18
#: Payloads up to this size ride in their header's MPI message: one message
#: instead of two, and no receive to post (a small message's time is mostly
#: per-message work, in MPI and in Python). Below MPI's eager limits.
INLINE = 8192
#: minidist's reductions by name, and MPI's (for algorithm="native").
_MPI_OPS = {"sum": "SUM", "product": "PROD", "min": "MIN", "max": "MAX", "band": "BAND",
            "bor": "BOR", "bxor": "BXOR"}
#: Longest nap of a waiting rank between two looks at MPI (seconds).
NAP = 1e-4

INSTALL_HINT = ("the 'mpi' transport needs mpi4py and an MPI library: pip install -e '.[mpi]' "
                "(mpi4py and the `mpich` wheel, which also provides mpiexec), or "
                "`pip install mpi4py` over a system MPICH / Open MPI")


def load_mpi():
    """mpi4py's MPI module (initializing MPI), or an ImportError that says how to install it."""
    try:
        import mpi4py
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    if "mpi4py.MPI" not in sys.modules:
        # One thread per process talks to minidist (see minidist.distributed):
        # ask for no more than that, which spares MPICH its locks.
        mpi4py.rc.thread_level = "funneled"
    try:
        from mpi4py import MPI
    except ImportError as error:  # mpi4py without a loadable MPI library
        raise ImportError(f"{INSTALL_HINT} ({error})") from error
    _note_pid(MPI.COMM_WORLD.Get_rank())
    _release_segments_on_sigterm()
    return MPI


def _release_segments_on_sigterm() -> None:
    """A rank that SIGTERM kills (what mpiexec sends its ranks when it is told
    to stop: Ctrl-C, or its launcher died) ends without MPI_Finalize, which
    would leave MPICH's ``/dev/shm/mpich_shm_*`` segments behind until reboot.
    So the rank first unlinks the segments it maps (their names only: every
    process that maps one keeps its memory), then dies of the signal as it
    would have. Only where SIGTERM still has its default action, from the
    main thread; a SIGKILLed rank leaves them to ``minidist run``'s launcher
    (:mod:`minidist.runtime.job_segments`)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def release_then_die(signum, frame):
        release_segments()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, release_then_die)


def release_segments() -> None:
    """Unlink the MPICH segments this process maps: their names only (every
    process that maps one keeps its memory). For a rank whose job is about
    to end without MPI_Finalize (SIGTERM, or this rank's MPI_Abort, after
    which the others are killed outright)."""
    from minidist.runtime.job_segments import SHM_DIRECTORY, mapped_segments

    for name in mapped_segments(os.getpid()):
        try:
            os.unlink(os.path.join(SHM_DIRECTORY, name))
        except OSError:
            pass  # another rank of the job was first


#: Under ``minidist run --transport mpi``: this rank's line to the launcher.
_LAUNCHER_LINE = None


def _note_pid(rank: int) -> None:
    """Under ``minidist run --transport mpi``: open a Unix socket to the
    launcher (the path it names), say ``hello <rank> <pid>``, and keep it open
    until the process ends. The kernel closes it when the process dies, however
    it dies (SIGKILL included), so the launcher learns which rank ended first:
    mpiexec itself reports a dead process only by a PID, not always its own.

    A rank also says how it ends: ``done`` when its script ended normally
    (at exit, after minidist's own exit work; see :func:`tell_launcher`),
    ``failed`` just before it reports its error and aborts the job. A rank
    whose line ends without either ended in the middle of the run (os._exit,
    a signal, a crash): the launcher names it and fails the job, whatever
    status mpiexec returns (MPICH returns 0 for a rank's os._exit(0))."""
    global _LAUNCHER_LINE
    path = os.environ.get("MINIDIST_MPI_WATCH")
    if not path or _LAUNCHER_LINE is not None:
        return
    import atexit
    import socket

    try:
        line = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        line.connect(path)
        line.sendall(f"hello {rank} {os.getpid()}\n".encode())
        _LAUNCHER_LINE = line
    except OSError:
        return  # only a nicer message is lost
    # Registered after mpi4py's MPI_Finalize and before minidist's exit work
    # (world.py registers that when the script joins), so it runs after the
    # latter and before the former: atexit runs the last registered first.
    atexit.register(tell_launcher, "done")


def tell_launcher(word: str, headline: str = "") -> None:
    """Say ``word`` ("done" or "failed") to ``minidist run``'s launcher, once;
    with "failed", also the first line of this rank's report (``headline``),
    which the launcher repeats at the end of the run: mpiexec's teardown can
    cut the rank's own output short."""
    global _LAUNCHER_LINE
    line, _LAUNCHER_LINE = _LAUNCHER_LINE, None
    if line is None:
        return  # not under minidist run, or already said
    said = f"{word}\n"
    if headline:
        said += "report " + " ".join(headline.split()) + "\n"
    try:
        line.sendall(said.encode())
    except OSError:
        pass
    # Not closed: the launcher sees the end of the line when the process ends.
    _KEPT.append(line)


_KEPT: list = []


def cuda_aware(MPI=None) -> bool | None:
    """Does this MPI library move GPU memory itself ("CUDA-aware")? Asked of
    the library, never assumed: mpi4py's Query_cuda_support where it has one,
    else Open MPI's MPIX_Query_cuda_support or MPICH's MPIX_GPU_query_support
    found in the loaded library. None: the library has no way to say."""
    import ctypes

    MPI = MPI or load_mpi()
    query = getattr(MPI, "Query_cuda_support", None)
    if query is not None:
        return bool(query())
    try:
        library = ctypes.CDLL(_loaded_libmpi() or None)
    except OSError:
        return None
    if hasattr(library, "MPIX_Query_cuda_support"):  # Open MPI
        library.MPIX_Query_cuda_support.restype = ctypes.c_int
        return bool(library.MPIX_Query_cuda_support())
    if hasattr(library, "MPIX_GPU_query_support"):  # MPICH: (MPIX_GPU_SUPPORT_CUDA = 0, &flag)
        flag = ctypes.c_int(0)
        library.MPIX_GPU_query_support(ctypes.c_int(0), ctypes.byref(flag))
        return bool(flag.value)
    return None


def _loaded_libmpi() -> str | None:
    """The path of the MPI library this process loaded (mpi4py may load it
    privately, out of reach of a plain symbol look-up)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libmpi." in path or "/libmpi_" in path or path.endswith("/libmpi.so"):
                    return path
    except OSError:
        pass
    return None


def spin_ns_under_mpi(spin_ns: int, environ=None) -> int:
    """How long a waiting rank spins before napping, under mpiexec.

    The usual rule (spin only when ranks <= the cores this process may use)
    misreads an MPI job: Open MPI binds each rank to a core of its own, so
    every rank sees one core and would never spin, and every small message
    would wait a nap for its receiver. Here the question is the node's: are there
    no more ranks on this node (mpiexec says how many) than it has cores?
    MINIDIST_SPIN_US still decides when set."""
    environ = os.environ if environ is None else environ
    if "MINIDIST_SPIN_US" in environ:
        return spin_ns
    local = environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or environ.get("MPI_LOCALNRANKS")
    if local is None:
        return spin_ns
    return 200_000 if int(local) <= (os.cpu_count() or 1) else 0


def pieces(nbytes: int, itemsize: int) -> list[tuple[int, int]]:
    """(offset, length) of each MPI message of a payload: whole elements, at
    most CHUNK bytes (or one element, if bigger)."""
    step = max(CHUNK - CHUNK % max(itemsize, 1), itemsize, 1)
    return [(offset, min(step, nbytes - offset)) for offset in range(0, nbytes, step)]


class _Receiving:
    """A payload arriving from one source: its pieces' Irecvs in flight."""

    __slots__ = ("pieces", "posted", "flight")

    def __init__(self, pieces):
        self.pieces = pieces
        self.posted = 0  # pieces whose Irecv is posted
        self.flight = deque()  # (MPI request, offset, length, scratch or None)


class MpiResources:
    """The MPI side of a run: a private duplicate of COMM_WORLD."""

    name = "mpi"

    def __init__(self, MPI, comm, owned: bool = False):
        self.MPI = MPI
        self.comm = comm
        self._owned = owned  # made for one launch: freed when it ends
        self.rank = comm.Get_rank()
        self.world_size = comm.Get_size()
        self.node_ranks = [self.rank]  # the ranks that share this machine's control block

    @classmethod
    def from_environment(cls) -> MpiResources:
        MPI = load_mpi()
        # A duplicate, so that minidist's two tags cannot meet a message the
        # script itself sends over COMM_WORLD with mpi4py.
        return cls(MPI, MPI.COMM_WORLD.Dup())

    def control_block(self):
        """The control block this rank shares with the ranks of its machine
        (see mpi_node.py). Collective: every rank of the communicator calls it."""
        from minidist.distributed.transport.mpi_node import node_control_block

        control, self.node_ranks = node_control_block(self.MPI, self.comm)
        return control

    def connect(self, rank: int, control, timeout, spin_ns: int, fast: bool = True
                ) -> MpiTransport:
        """This rank's transport; it spins only with ``fast`` (the fast paths on)."""
        if rank != self.rank:
            raise ValueError(f"connect({rank}) on MPI rank {self.rank}")
        return MpiTransport(rank, self.world_size, self.MPI, self.comm, control, timeout,
                            spin_ns_under_mpi(spin_ns) if fast else 0,
                            node_ranks=self.node_ranks)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job (MPI_Abort on COMM_WORLD)."""
        self.MPI.COMM_WORLD.Abort(code)

    def wake_all(self) -> None:
        """Nobody sleeps inside MPI: waiting ranks nap and look again."""

    def close_unconnected(self) -> None:
        """A rank that never connected holds nothing of its own: the
        communicator is freed by :meth:`close`, as for one that did."""

    def close(self) -> None:
        """A launch's communicator is freed; the script's duplicate of
        COMM_WORLD lives until MPI_Finalize (mpi4py calls it at exit)."""
        if self._owned and self.comm != self.MPI.COMM_NULL:
            self.comm.Free()

    def unlink(self) -> None:
        """Nothing has a name."""


class MpiJob:
    """The whole mpiexec job (MPI_COMM_WORLD), as :func:`minidist.launch` sees
    it under mpiexec (see minidist/distributed/mpi_launch.py): split it for a
    launch, share the ranks' results, end it."""

    def __init__(self, MPI):
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    @classmethod
    def from_environment(cls) -> MpiJob:
        return cls(load_mpi())

    def split(self, world_size: int) -> MpiResources | None:
        """A fresh communicator of ranks 0 .. world_size - 1 (None on the others).
        Every rank of the job must call it (MPI_Comm_split is collective)."""
        color = 0 if self.rank < world_size else self.MPI.UNDEFINED
        comm = self.comm.Split(color, self.rank)
        return None if comm == self.MPI.COMM_NULL else MpiResources(self.MPI, comm, owned=True)

    def share(self, value) -> list:
        """Every rank's ``value`` (pickled), by rank, on every rank."""
        return self.comm.allgather(value)

    def broadcast_from_zero(self, value):
        """Rank 0's ``value`` (pickled) on every rank."""
        return self.comm.bcast(value, root=0)

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)


class MpiTransport(SpinBeforeSleep, Transport):
    """Point-to-point messages over MPI Isend / Irecv on NumPy buffers."""

    name = "mpi"

    def __init__(self, rank, world_size, MPI, comm, control, timeout=None, spin_ns=0,
                 node_ranks=None):
        super().__init__(rank, world_size, control, timeout)
        self._spin_ns = spin_ns
        from minidist.distributed.transport.mpi_node import NodeWatch

        self._node = NodeWatch(rank, control, node_ranks or [rank])
        self._MPI = MPI
        self._comm = comm
        self._status = MPI.Status()
        self._byte = MPI.BYTE
        # Per destination: (the send at the head of its queue, its MPI requests).
        self._sending: list = [None] * world_size
        # Per source: the payload arriving (_Receiving), and two scratch pieces for reduces.
        self._receiving: list = [None] * world_size
        self._scratch: list = [None] * world_size
        # Sub-communicators of groups, for the library's own collectives.
        self._communicators: dict = {}
        # Payloads that came inside their header's message, by id of the header.
        self._inline: dict = {}

    # ---------------------------------------------------------------- reading

    def _peek(self, src: int):
        comm, status = self._comm, self._status
        if not comm.Iprobe(src, HEADER_TAG, status):
            return None
        data = bytearray(status.Get_count(self._byte))
        # Taken out of MPI at once (it is small): the engine keeps the
        # decoded header until it begins the message.
        comm.Recv([data, self._byte], src, HEADER_TAG)
        header = message.decode(data)
        if header.nbytes and len(data) > header.length:  # the payload came along
            self._inline[id(header)] = (header, memoryview(data)[header.length:])
        return header

    def _begin(self, src: int, inbound: Inbound) -> None:
        header = inbound.header
        if header.nbytes == 0:
            return
        inline = self._inline.pop(id(header), None)
        if inline is not None:
            inbound.sink.consume(0, inline[1])
            inbound.received = header.nbytes
            return
        receiving = self._receiving[src] = _Receiving(pieces(header.nbytes,
                                                             header.dtype.itemsize))
        if inbound.sink.direct(0, header.nbytes) is not None:
            # A copy: every piece straight into its place in the buffer.
            while receiving.posted < len(receiving.pieces):
                self._post_piece(src, inbound, receiving, None)
            return
        scratch = self._scratch[src]
        if scratch is None:
            scratch = self._scratch[src] = (np.empty(CHUNK, np.uint8), np.empty(CHUNK, np.uint8))
        for buffer in scratch:
            if receiving.posted < len(receiving.pieces):
                self._post_piece(src, inbound, receiving, buffer)

    def _post_piece(self, src, inbound, receiving, scratch) -> None:
        offset, length = receiving.pieces[receiving.posted]
        receiving.posted += 1
        target = inbound.sink.direct(offset, length) if scratch is None else scratch[:length]
        request = self._comm.Irecv([target, self._byte], src, PAYLOAD_TAG)
        receiving.flight.append((request, offset, length, scratch))

    def _pull(self, src: int, inbound: Inbound) -> bool:
        nbytes = inbound.header.nbytes
        if inbound.received >= nbytes:  # empty, or it came inline
            return True
        receiving = self._receiving[src]
        while inbound.received < nbytes:
            request, offset, length, scratch = receiving.flight[0]
            if not request.Test():
                return False
            receiving.flight.popleft()
            if scratch is not None:
                inbound.sink.consume(offset, scratch[:length])
                if receiving.posted < len(receiving.pieces):
                    self._post_piece(src, inbound, receiving, scratch)
            inbound.received += length
        self._receiving[src] = None
        return True

    # ---------------------------------------------------------------- writing

    def _push(self, dst: int, request: SendRequest) -> bool:
        sending = self._sending[dst]
        if sending is None or sending[0] is not request:
            comm, byte = self._comm, self._byte
            payload = request.payload
            if 0 < request.nbytes <= INLINE:  # one message: header, then payload
                whole = bytes(request.header) + bytes(payload)
                requests = [comm.Isend([whole, byte], dst, HEADER_TAG)]
            else:
                requests = [comm.Isend([request.header, byte], dst, HEADER_TAG)]
                for offset, length in pieces(request.nbytes, request.itemsize):
                    requests.append(comm.Isend([payload[offset:offset + length], byte], dst,
                                               PAYLOAD_TAG))
            sending = self._sending[dst] = (request, requests)
            request.written = len(request.header)  # handed to MPI: progress
        if not self._MPI.Request.Testall(sending[1]):
            return False
        self._sending[dst] = None
        request.written = len(request.header) + request.nbytes
        return True

    # ---------------------------------------------------------------- the library's own

    def library_collective(self, function: str, ranks: tuple, *buffers, op=None,
                           root=None) -> None:
        """Call MPI's own ``function`` ("Allreduce", "Bcast", ...: mpi4py's
        buffer-based methods) on the communicator of ``ranks``, blocking.

        For ``algorithm="native"`` (minidist.distributed.collectives.native),
        which says what to pass: NumPy arrays (MPI reads their dtype),
        ``"in_place"`` for MPI_IN_PLACE, None for an unused buffer, ``op`` a
        reduction's name ("sum", "max", ...), ``root`` a rank of ``ranks``.
        """
        MPI = self._MPI
        comm = self._communicator(tuple(ranks))
        arguments = [MPI.IN_PLACE if isinstance(b, str) and b == "in_place" else b
                     for b in buffers]
        keywords = {}
        if op is not None:
            keywords["op"] = getattr(MPI, _MPI_OPS[op])
        if root is not None:
            keywords["root"] = root
        try:
            getattr(comm, function)(*arguments, **keywords)
        except (KeyError, ValueError, TypeError, NotImplementedError) as error:
            dtypes = sorted({str(b.dtype) for b in buffers if isinstance(b, np.ndarray)})
            raise TypeError(f"rank {self.rank}: MPI's {function} refused "
                            f"{'/'.join(dtypes) or 'these'} arrays"
                            f"{' with ' + op.upper() if op else ''} ({error}); use one of the "
                            "course's algorithms for them.") from error

    def _communicator(self, ranks: tuple):
        """The MPI communicator of ``ranks`` (in that order), made on first use:
        MPI_Comm_create_group is collective over those ranks only, which all
        make their first native call on the group together."""
        if ranks == tuple(range(self.world_size)):
            return self._comm
        comm = self._communicators.get(ranks)
        if comm is None:
            comm = self._communicators[ranks] = self._comm.Create_group(
                self._comm.Get_group().Incl(list(ranks)))
        return comm

    # ---------------------------------------------------------------- waiting

    def _sleep(self, seconds: float) -> None:
        if self._spin_ns and (any(self._receiving) or any(self._sending)):
            # A payload is moving. A big one goes by rendezvous, whose steps
            # advance only while both sides are inside MPI: a nap here stalls
            # it (bench_mpi shows a big message slower than mpi4py's blocking
            # Recv when the rank naps). With a
            # core to ourselves (spin_ns > 0), keep calling MPI instead.
            return
        time.sleep(max(min(seconds, NAP), 0.0))

    def _check_peer(self, op, peer, tag, context, request) -> None:
        """As on every transport, plus what this machine shows (mpi_node.py):
        a peer whose process is gone in the middle of the run is named at once;
        a peer that failed reports itself and ends the job (MPI_Abort), so this
        rank waits for that instead of adding a report of its own."""
        gone = self._node.vanished()
        if gone is not None:
            raise vanished_error(*gone, self.rank, f"in {self._describe(op, peer, tag, context)}")
        stalled = self._node.stalled()
        if stalled is not None:
            culprit, pid, seconds = stalled
            error = stalled_error(culprit, pid, seconds, self.rank,
                                  f"in {self._describe(op, peer, tag, context)}")
            error.peer, error.tag = peer, tag
            raise error
        if request is not None and not request.done and peer != ANY_SOURCE \
                and self._control.state_of(peer) == ctl.FINISHED and self._in_flight(request):
            return  # its message was on its way: it has arrived
        try:
            super()._check_peer(op, peer, tag, context, request)
        except PeerGoneError:
            if self._node.any_failed():
                return  # its own report comes, and its MPI_Abort ends this rank
            raise

    def _in_flight(self, request, grace: float = IN_FLIGHT_GRACE) -> bool:
        """Whether ``request`` completes within ``grace`` seconds of polling MPI.
        Through a pipe or shared memory a message is there the moment its
        send returns; through MPI an eager send returns while the bytes are
        still on their way, so a peer can have sent its last message and
        finished before this rank's MPI has seen it. Without this poll a
        finished peer's last message was taken for a mismatch or an early
        return (lesson 5 under mpiexec, now and then)."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.progress(drain=True)
            if request.done:
                return True
            time.sleep(0.001)
        return False

    def shares_records(self, ranks) -> bool:
        # Only the ranks of this machine share its control block: a group that
        # spans machines is judged by what this rank saw, not by the majority.
        return set(ranks) <= set(self._node.peers) | {self.rank}

    def _timeout_error(self, op, peer, tag, context, timeout, current):
        # The ranks of this machine share a control block (mpi_node.py): the
        # report shows their records; the others' are not visible from here.
        from minidist.runtime.desync import format_report
        from minidist.runtime.errors import CommTimeoutError

        here = set(self._node.peers) | {self.rank}
        report = format_report([status for status in self._control.statuses()
                                if status.rank in here], self.rank, current,
                               self.describe_context)
        if len(here) < self.world_size:
            report += (f"\n  ({self.world_size - len(here)} ranks run on other machines: "
                       "their states are not visible from here)")
        report += self._unmatched_report(peer, tag, context)
        what = self._describe(op, peer, tag, context)
        stopped = self._node.stopped()
        headline = f"rank {self.rank} timed out after {timeout:g} s waiting in {what}."
        if stopped:
            # Alive but frozen: the cause, whoever this rank was waiting for.
            culprit, pid, seconds, state = stopped[0]
            headline = (f"{stopped_words(culprit, pid, state)} and has not progressed for "
                        f"{seconds:.1f} s; {headline}")
        error = CommTimeoutError(
            f"{headline}\nWhat the ranks on this machine were doing:\n{report}\nIf the other "
            "side is only slow, pass a longer timeout (init_process_group(timeout=...) or "
            "timeout= on the call).", operation=what, peer=peer, tag=tag, report=report)
        if stopped:
            error.culprit = culprit
        return error

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        for receiving in self._receiving:
            for request, *_ in receiving.flight if receiving is not None else ():
                try:
                    request.Cancel()
                except Exception:  # noqa: BLE001 - best effort at shutdown
                    pass
