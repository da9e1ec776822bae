"""The "sim" transport: many ranks in one process, timed by a virtual clock.

The collectives run here exactly as on real processes (the same generators,
the same :class:`~minidist.distributed.process_group.ProcessGroup`), but every
rank is a :class:`SimTransport` of one :class:`SimNetwork` in this process,
and time is not measured: it is computed from the alpha-beta-gamma model.
That is what lets a laptop run an all_reduce on 1,024 ranks and say how
long it would take on a cluster.

The model (one port per direction per rank, full duplex; the cost model's):

* every rank has a **clock**, and two ports: **out** (sending) and **in**
  (receiving), each busy until some time;
* ``isend`` of m bytes starts when the rank gets there and its out port is
  free, ``start = max(clock, out port free)``, and the message arrives
  ``alpha + m beta`` later; the send completes then, and the out port is busy
  until then (a rank's sends leave one after another);
* the in port is busy ``alpha + m beta`` for each message it takes, ending
  no earlier than the message's arrival: a message takes the earliest free
  slot of the in port that ends at or after its arrival (messages that
  arrived at different times do not disturb each other; n - 1 messages
  that reach one root together take (n - 1)(alpha + m beta), one after
  another). Slots are booked in the order the receives are matched;
* a combining receive (``irecv_reduce``) then spends ``m gamma`` adding the
  data, starting no earlier than the rank posted it, and the in port is
  busy meanwhile, because the transport combines straight from its
  buffers (so a reduce to one root costs (n - 1)(alpha + m beta + m gamma),
  as the formula says);
* once a step's requests are done (``request.test()`` in the driver), the
  rank's clock moves to the latest of their completion times, and a local
  combine (:meth:`~minidist.distributed.collectives.comm.Comm.combine`)
  adds ``m gamma`` to it.

The clocks and the ports are :mod:`minidist.virtual_clock`'s
(a :class:`SimTransport` is its rank's ``RankClock``; the out port a
``SerialPort``, the in port a ``BusyPort``): the same clock as the pipeline
planner's. With this, every formula of :mod:`minidist.costmodel` comes out exactly when
the array divides evenly: a ring step costs ``alpha + (N/n) beta``, a binomial
broadcast ``ceil(log2 n)(alpha + N beta)``.

Data really moves: a message is copied when it is sent (straight into the
receive buffer if one is posted), so the results can be compared with NumPy.

**byte_scale.** To simulate 1,024 ranks of 100 MB each without 100 GB of
memory, the driver runs the algorithm on a small array (a few elements per
rank) and the network charges every message ``nbytes * byte_scale`` bytes, in
the clock and in the trace. This is exact as long as the algorithm cuts the
small array in the same proportions as the large one (the driver picks an
element count that every chunking divides).

**symmetric.** In an algorithm where rank r does what rank 0 does with every
rank number shifted by r (the ring: send right, receive from the left), the
network can hold rank 0 alone: what it sends to rank d, rank -d sends to it,
at the same virtual moment, so each send is handed back to rank 0 as coming
from rank -d. Its clock is every rank's, and the messages and bytes are n
times its own. The simulator uses this for the algorithms it lists in
:data:`~minidist.distributed.simulator.SYMMETRIC` (checked against the full
network in the tests); on any other algorithm rank 0 would wait for a
message nobody sends, which ends as a stall error.

**A cluster with a shape** (``topology=``, a :class:`~minidist.topology.Topology`).
Each message is charged by the link it crosses: the intra link's alpha and
beta within a node; off the node, the inter link's, and the message must
also find its NIC free on both sides: a node's ranks share its
``nics_per_node`` NICs, each NIC a port out and a port in that take one
message at a time (the first free slot, as the in port), so the 8 off-node
messages of a node with one NIC leave one after another. The slots are
booked in the order the driver reaches the messages, not strictly by their
time: when two ranks of a node want one NIC in turns, a rank the driver
moved on first may take it before another's earlier message (a real NIC
would serve the earlier first). Where that matters the simulation is a
little slower than a NIC by time order, never faster than the NIC busy
without a break. The spine's
oversubscription x multiplies every off-node byte's time by x (the model's
worst case: every NIC busy). The rank keeps its one out port and one in
port for all its messages, as the flat model. Ranks are no longer all
alike (rank 7 of a node may have a neighbour off the node, rank 0 not), so
the symmetric network holds a whole node, ranks 0 .. R - 1: what rank r
sends to rank d, rank r - kR (k = d's node) sends to rank d mod R, with
everything shifted by k nodes, so the message is handed to rank d mod R of
node 0 as coming from rank r - kR; node 0's NICs stand for every node's.

Nothing blocks: all calls return at once, and a receive is completed by the
sender's ``isend``. A ``wait()`` on a request that is not done cannot be
served (the other ranks are generators that only the driver moves), so it
raises; run collectives with ``async_op=True`` under
:func:`minidist.distributed.simulator.simulate`.
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np

from minidist.distributed.transport.base import ANY_SOURCE, ANY_TAG, MessageInfo
from minidist.runtime.errors import (
    CollectiveMismatchError,
    DistributedError,
    MessageMismatchError,
)
from minidist.virtual_clock import (
    BusyPort,
    RankClock,
    SerialPort,
    latest,
    to_ns,
)

_INTO, _REDUCE, _NEW = range(3)


class SimulationStallError(DistributedError):
    """A simulated rank waits for something that can never happen."""


class SimRequest:
    """A send or receive of a simulated rank; ``finish`` is its virtual completion time."""

    __slots__ = ("transport", "done", "error", "finish", "tag", "context", "group_ranks")

    def test(self) -> bool:
        """True once done; the rank's clock then moves to the completion time."""
        if self.error is not None:
            raise self.error
        if self.done:
            self.transport.wait_until(self.finish)
            return True
        return False

    is_completed = test

    def wait(self, timeout=None) -> bool:
        if not self.test():
            raise SimulationStallError(
                f"simulated rank {self.transport.rank}: wait() on {self.describe()}, which is "
                "not done. Simulated ranks cannot block: start collectives with async_op=True "
                "and let minidist.distributed.simulate() drive them.")
        return True

    def _fail(self, error: BaseException) -> None:
        self.error = error
        self.done = True


class SimSend(SimRequest):
    __slots__ = ("dst",)

    def __init__(self, transport, dst, tag, context, finish):
        self.transport = transport
        self.done = True  # eager: the network holds the copy, the buffer is free at once
        self.error = None
        self.finish = finish
        self.dst = dst
        self.tag = tag
        self.context = context

    def describe(self) -> str:
        return f"send to {self.dst}, tag {self.tag}"


class SimRecv(SimRequest):
    """A simulated receive. It is posted (matched with a message that is
    already here, or queued for one) when the rank first tests it, not when
    it is made: a rank's receives count from the moment its driver starts
    waiting for them, and its in port books them in that order (a step's
    requests are tested in the order the algorithm lists them)."""

    __slots__ = ("src", "mode", "buffer", "ufunc", "label", "post", "source", "array",
                 "posted")

    def __init__(self, transport, src, tag, context, mode, buffer, ufunc, label, post):
        self.transport = transport
        self.done = False
        self.error = None
        self.src = src
        self.tag = tag
        self.context = context
        self.mode = mode
        self.buffer = buffer
        self.ufunc = ufunc
        self.label = label
        self.post = post
        self.source = None
        self.array = None
        self.posted = False

    def test(self) -> bool:
        if not self.posted:
            self.posted = True
            self.transport._post(self)
        return SimRequest.test(self)

    is_completed = test

    @property
    def source_rank(self):
        ranks = getattr(self, "group_ranks", None)
        if self.source is None or ranks is None:
            return self.source
        return ranks.index(self.source)

    def fits(self, array: np.ndarray) -> bool:
        buffer = self.buffer
        if buffer is None:
            return True
        dtype = buffer.dtype
        return (dtype is array.dtype or dtype == array.dtype) and buffer.shape == array.shape

    def misfit_error(self, array: np.ndarray) -> MessageMismatchError:
        verb = "recv_reduce" if self.mode == _REDUCE else "recv"
        buffer = self.buffer
        return MessageMismatchError(
            f"rank {self.transport.rank}: {verb} (tag {self.tag}) got a {array.dtype} message "
            f"of shape {array.shape}, but the buffer is {buffer.dtype} of shape "
            f"{buffer.shape}. Allocate the buffer with the sender's shape and dtype, or use "
            "recv_array().")

    def take(self, array: np.ndarray, owned: bool) -> None:
        """Put the message's data where the receive wants it."""
        mode = self.mode
        if mode == _INTO:
            self.buffer[...] = array
        elif mode == _REDUCE:
            self.ufunc(self.buffer, array, out=self.buffer)
        else:
            self.array = array if owned else array.copy()

    def describe(self) -> str:
        source = "any rank" if self.src == ANY_SOURCE else f"rank {self.src}"
        what = f" ({self.label})" if self.label else ""
        return f"a message from {source}, tag {self.tag}{what}"


class SimNetwork:
    """The simulated machine: ``world_size`` ranks, their links, and the events.

    ``alpha`` seconds per message, ``beta`` seconds per byte moved, ``gamma``
    seconds per byte combined. ``byte_scale``: every message is charged as
    ``nbytes * byte_scale`` bytes. ``record``: keep every message as a trace
    event (``events``, tuples in :data:`minidist.trace.FIELDS` order, times
    in virtual nanoseconds). ``symmetric``: one transport, rank 0's, stands
    for all ``world_size`` ranks (see the module's docstring); with a
    ``topology``, node 0's ranks stand for all. ``topology``: a
    :class:`~minidist.topology.Topology` whose links and NICs replace
    ``alpha`` and ``beta`` (``gamma`` stays the ranks' combining speed).
    """

    def __init__(self, world_size: int, alpha: float, beta: float, gamma: float = 0.0, *,
                 byte_scale: float = 1.0, record: bool = False, symmetric: bool = False,
                 topology=None):
        if world_size < 1:
            raise ValueError(f"a simulated network needs at least one rank, got {world_size}")
        if topology is not None:
            topology.check_world(world_size, "a simulated world")
        for name, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma),
                            ("byte_scale", byte_scale)):
            if not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        self.world_size = world_size
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.gamma = float(gamma)
        self.byte_scale = float(byte_scale)
        if symmetric and record:
            raise ValueError("a symmetric network runs one rank for all of them, so it has no "
                             "trace of the others; record on a full network (symmetric=False)")
        self.events: list[tuple] | None = [] if record else None
        self.on_ready = None  # called with a rank whose receive just completed
        self.symmetric = bool(symmetric)
        self.topology = topology
        # The ranks simulated: all; or, symmetric, rank 0 (flat) or node 0 (a
        # topology) standing for every rank (see the module's docstring).
        self.period = (world_size if not symmetric
                       else 1 if topology is None else topology.ranks_per_node)
        if topology is None:
            self.transports = [SimTransport(self, rank) for rank in range(self.period)]
        else:
            nics = topology.nodes_used(self.period) * topology.nics_per_node
            self.nic_out = [BusyPort() for _ in range(nics)]  # each NIC, sending off the node
            self.nic_in = [BusyPort() for _ in range(nics)]   # ... and receiving from off it
            self.transports = [TopologyTransport(self, rank) for rank in range(self.period)]

    @property
    def time(self) -> float:
        """The latest clock of any rank: how long everything took, in seconds."""
        return latest(self.transports)

    @property
    def clocks(self) -> list:
        """Every rank's clock, in seconds (in a symmetric network all equal rank 0's)."""
        if self.symmetric:
            if self.period == 1:
                return [self.transports[0].clock] * self.world_size
            transports, period = self.transports, self.period
            return [transports[rank % period].clock for rank in range(self.world_size)]
        return [transport.clock for transport in self.transports]

    @property
    def messages(self) -> int:
        sent = sum(transport.sent for transport in self.transports)
        return sent * (self.world_size // self.period) if self.symmetric else sent

    @property
    def bytes(self) -> float:
        """Bytes charged for all messages (real bytes times byte_scale)."""
        if self.symmetric and self.period == 1:
            # Every rank charged what rank 0 did: add it up n times, in the
            # order the full network adds its ranks, to get its float exactly.
            return sum(itertools.repeat(self.transports[0].sent_bytes, self.world_size))
        if self.symmetric:  # node 0's ranks stand for every node's: the same order
            sent, period = [t.sent_bytes for t in self.transports], self.period
            return sum(sent[rank % period] for rank in range(self.world_size))
        return sum(transport.sent_bytes for transport in self.transports)


class SimTransport(RankClock):
    """One simulated rank's end of the :class:`SimNetwork` (what a ProcessGroup
    calls), and that rank's clock (``clock``, seconds; see
    :mod:`~minidist.virtual_clock`)."""

    name = "sim"

    def __init__(self, network: SimNetwork, rank: int):
        super().__init__(0.0)
        self.network = network
        self.rank = rank
        self.world_size = network.world_size
        self.out_port = SerialPort()  # sends leave one after another
        self.in_port = BusyPort()  # each message in the first free slot after its arrival
        self.strict_contexts: dict = {}
        self.collective_groups: dict = {}
        self.describe_context = lambda context: ""
        self.tracing = network.events is not None
        self.default_timeout = None
        self.closed = False
        # The network's constants, copied: every message reads them.
        self.alpha, self.beta, self.gamma = network.alpha, network.beta, network.gamma
        self.byte_scale = network.byte_scale
        self.events = network.events
        self._mirror = network.period if network.symmetric else 0
        self.sent = 0
        self.sent_bytes = 0.0
        # source -> messages nobody asked for yet: (copy of the data, tag, context,
        # arrival time, bytes charged, sequence number)
        self._unexpected: dict[int, deque] = {}
        self._posted: dict[int, deque] = {}  # source -> receives waiting (never empty)
        self._send_seq: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"SimTransport(rank={self.rank}, clock={self.clock:.9g} s)"

    # ---------------------------------------------------------------- fast paths (none)

    small_messages = False  # no small-message path: see send_small

    def send_small(self, array, dst, tag, context, label) -> bool:
        return False  # every send must hand back a request that carries its finish time

    def recv_small(self, buffer, src, tag, context, label, ufunc=None) -> bool:
        return False

    # ---------------------------------------------------------------- records (none)

    def show_call(self, context: int, number: int, values) -> bool:
        """No shown calls here: the simulated ranks share no control block."""
        return False

    # ---------------------------------------------------------------- time

    def now_ns(self) -> int:
        """Now, on the trace's clock: this rank's virtual clock, in nanoseconds."""
        return to_ns(self.clock)

    def record_event(self, kind: str, start: int, end: int, *, label: str = "",
                     group: int = 0) -> None:
        """Add an event of this rank to the simulated trace (when recording)."""
        if self.events is not None:
            self.events.append((self.rank, kind, None, 0, None, label, start, end, None,
                                group, 0))

    def charge_combine(self, nbytes: int) -> None:
        """A local reduction of ``nbytes`` (real bytes) keeps this rank busy for
        ``nbytes * byte_scale * gamma``."""
        self.advance(nbytes * self.byte_scale * self.gamma)

    # ---------------------------------------------------------------- sending

    def isend(self, array: np.ndarray, dst: int, tag: int, context: int = 0,
              label: str = "") -> SimSend:
        charged = array.nbytes * self.byte_scale
        start, arrival = self._send_times(dst, charged)
        self.sent += 1
        self.sent_bytes += charged
        seq = None
        if self.events is not None:
            seq = self._send_seq.get(dst, 0)
            self._send_seq[dst] = seq + 1
            self.events.append((self.rank, "send", dst, round(charged), tag, label,
                                to_ns(start), to_ns(arrival), seq,
                                context >> 32, context & 0xFFFFFFFF))
        if self._mirror:
            # Rank 0 stands for all: what it sends to dst, rank -dst sends to it.
            # (With a topology, node 0's ranks for all: dst's node shifted to 0.)
            period = self._mirror
            peer = self.network.transports[dst % period]
            source = (self.rank - dst + dst % period) % self.world_size
        else:
            peer, source = self.network.transports[dst], self.rank
        if peer._posted:
            peer._arrive(source, array, tag, context, arrival, charged, seq)
        else:  # the common case in a run: the receiver has not got this far yet
            queue = peer._unexpected.get(source)
            if queue is None:
                queue = peer._unexpected[source] = deque()
            queue.append((array.copy(), tag, context, arrival, charged, seq))
        return SimSend(self, dst, tag, context, arrival)

    def _send_times(self, dst: int, charged: float) -> tuple:
        """(start, arrival) of a message of ``charged`` bytes to ``dst``: it
        leaves when the rank and its out port are free, alpha + m beta long."""
        return self.out_port.take(self.clock, self.alpha, charged * self.beta)

    def _receive_ready(self, source: int, arrival: float, charged: float) -> float:
        """When a message from ``source`` that arrives at ``arrival`` is in: the
        in port busy alpha + m beta for it, in its first free slot ending no
        earlier than the arrival."""
        duration = self.alpha + charged * self.beta
        book = self.in_port.book
        return book(arrival - duration, duration) + duration if duration else arrival

    def _arrive(self, source, array, tag, context, arrival, charged, seq) -> None:
        """A message from ``source`` reaches this rank (in simulation order)."""
        for key in (source, ANY_SOURCE):
            posted = self._posted.get(key)
            if not posted:
                continue
            for request in posted:
                if (request.tag == tag or request.tag == ANY_TAG) and request.context == context:
                    posted.remove(request)
                    if not posted:
                        del self._posted[key]
                    if not request.fits(array):
                        request._fail(request.misfit_error(array))
                        self._wake()
                        break  # the message stays queued for another receive
                    request.take(array, owned=False)
                    self._settle(request, source, arrival, charged, seq)
                    self._wake()  # the receiver is not the rank running now
                    return
            else:
                if key == source and context in self.strict_contexts:
                    self._check_strict(posted, source, tag, context)
        queue = self._unexpected.get(source)
        if queue is None:
            queue = self._unexpected[source] = deque()
        queue.append((array.copy(), tag, context, arrival, charged, seq))

    def _check_strict(self, posted, source, tag, context) -> None:
        """A collective's message that no receive wants, while a receive from the
        same rank in the same context waits for another tag: the two ranks are
        in different collective calls (see transport/base.py)."""
        for request in posted:
            if request.context == context:
                self._strict_mismatch(request, source, tag)
                if request.done:
                    posted.remove(request)
                    if not posted:
                        del self._posted[source]
                    self._wake()
                return

    def _strict_mismatch(self, request, source, tag) -> None:
        why = self.strict_contexts[request.context](request.tag, tag, self.rank, source)
        if why is not None:
            request._fail(CollectiveMismatchError(f"rank {self.rank}: {why}"))

    def _wake(self) -> None:
        on_ready = self.network.on_ready
        if on_ready is not None:
            on_ready(self.rank)

    # ---------------------------------------------------------------- receiving

    def irecv(self, src: int, tag: int, context: int = 0, *, into: np.ndarray | None = None,
              reduce_into: np.ndarray | None = None, ufunc=None, label: str = "") -> SimRecv:
        if reduce_into is not None:
            return SimRecv(self, src, tag, context, _REDUCE, reduce_into, ufunc, label, None)
        if into is not None:
            return SimRecv(self, src, tag, context, _INTO, into, None, label, None)
        return SimRecv(self, src, tag, context, _NEW, None, None, label, None)

    def _post(self, request: SimRecv) -> None:
        """Post ``request`` now (its first test): take the message if it is here."""
        request.post = self.clock
        src, tag, context = request.src, request.tag, request.context
        queue = self._unexpected.get(src)  # never for ANY_SOURCE: it is no sender
        if queue:
            data, message_tag, message_context, arrival, charged, seq = queue[0]
            if message_tag == tag and message_context == context and request.fits(data):
                # The common case: the next message from src is the one wanted.
                queue.popleft()
                request.take(data, owned=True)
                self._settle(request, src, arrival, charged, seq)
                return
        if self._unexpected and self._take_unexpected(request, src, tag, context):
            return
        queue = self._posted.get(src)
        if queue is None:
            queue = self._posted[src] = deque()
        queue.append(request)

    def _take_unexpected(self, request, src, tag, context) -> bool:
        """Match ``request`` with a message already here; True if it is settled
        (matched, or failed because the message does not fit or is another
        collective's)."""
        unexpected = self._unexpected
        sources = list(unexpected) if src == ANY_SOURCE else (src,)
        strict = src != ANY_SOURCE and context in self.strict_contexts
        for source in sources:
            queue = unexpected.get(source)
            if not queue:
                continue
            for message in queue:
                data, message_tag, message_context, arrival, charged, seq = message
                if message_context != context:
                    continue
                if message_tag != tag and tag != ANY_TAG:
                    if strict:
                        # Only the first message of the context tells: a later
                        # one may be another outstanding call's.
                        strict = False
                        self._strict_mismatch(request, source, message_tag)
                        if request.done:
                            return True
                    continue
                if not request.fits(data):
                    request._fail(request.misfit_error(data))
                    return True
                queue.remove(message)
                request.take(data, owned=True)
                self._settle(request, source, arrival, charged, seq)
                return True
        return False

    def _settle(self, request: SimRecv, source, arrival, charged, seq) -> None:
        """Complete a receive whose data is in: book the in port for it (and for
        the combine), and set its completion time."""
        ready = self._receive_ready(source, arrival, charged)
        book = self.in_port.book
        if request.mode == _REDUCE:
            post = request.post
            combine = charged * self.gamma
            begin = ready if ready > post else post
            finish = (book(begin, combine) if combine else begin) + combine
        else:
            finish = ready
        request.source = source
        request.finish = finish
        request.done = True
        if self.events is not None:
            context = request.context
            self.events.append((self.rank, "recv", source, round(charged), request.tag,
                                request.label, to_ns(request.post), to_ns(finish),
                                seq, context >> 32, context & 0xFFFFFFFF))

    # ---------------------------------------------------------------- probing

    def iprobe(self, src: int, tag: int, context: int = 0) -> MessageInfo | None:
        sources = list(self._unexpected) if src == ANY_SOURCE else (src,)
        for source in sources:
            for data, message_tag, message_context, *_ in self._unexpected.get(source, ()):
                if (tag == ANY_TAG or message_tag == tag) and message_context == context:
                    return MessageInfo(source, message_tag, data.dtype, data.shape, data.nbytes)
        return None

    def probe(self, src: int, tag: int, context: int = 0, timeout=None) -> MessageInfo:
        info = self.iprobe(src, tag, context)
        if info is None:
            raise SimulationStallError(
                f"simulated rank {self.rank}: probe found no message from "
                f"{'any rank' if src == ANY_SOURCE else f'rank {src}'}, and simulated ranks "
                "cannot block; use iprobe() and yield.")
        return info

    # ---------------------------------------------------------------- waiting

    def wait(self, request, timeout=None) -> None:
        request.wait()

    def wait_all(self, requests, timeout=None) -> None:
        for request in requests:
            request.wait()

    def progress(self, drain: bool = False) -> bool:
        return False  # everything moves inside the calls

    def waiting_for(self) -> list[str]:
        """What this rank's unfinished receives wait for (for deadlock reports)."""
        return [request.describe() for queue in self._posted.values() for request in queue]

    def pending_sends(self) -> int:
        return 0

    def flush(self, timeout=None) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class TopologyTransport(SimTransport):
    """A simulated rank of a cluster with a shape (see the module's docstring):
    each message charged by the link it crosses, and an off-node one also
    waits for its NIC, on the way out and on the way in."""

    def __init__(self, network: SimNetwork, rank: int):
        super().__init__(network, rank)
        topology = network.topology
        self.topology = topology
        self.gamma = network.gamma
        intra = topology.intra
        self.intra_alpha, self.intra_beta = intra.alpha, intra.beta
        self.inter_alpha, self.inter_beta = topology.inter.alpha, topology.inter_beta
        # In a symmetric network node 0's NICs stand for every node's.
        self.nic = topology.nic_of(rank)

    def _send_times(self, dst: int, charged: float) -> tuple:
        if self.topology.same_node(self.rank, dst):
            return self.out_port.take(self.clock, self.intra_alpha, charged * self.intra_beta)
        # Off the node: the rank's out port and its NIC's must both be free;
        # the NIC takes the message in its first free slot from then on.
        duration = self.inter_alpha + charged * self.inter_beta
        out = self.out_port
        ready = self.clock if self.clock > out.free else out.free
        start = self.network.nic_out[self.nic].book(ready, duration)
        out.free = arrival = start + duration
        return start, arrival

    def _receive_ready(self, source: int, arrival: float, charged: float) -> float:
        book = self.in_port.book
        if self.topology.same_node(source, self.rank):
            duration = self.intra_alpha + charged * self.intra_beta
            return book(arrival - duration, duration) + duration if duration else arrival
        # Off the node: through this rank's NIC first (busy alpha + m beta,
        # ending no earlier than the arrival), then the rank's own in port.
        duration = self.inter_alpha + charged * self.inter_beta
        through = self.network.nic_in[self.nic].book(arrival - duration, duration) + duration
        return book(through - duration, duration) + duration
