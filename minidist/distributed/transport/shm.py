"""The shared-memory transport: per-pair rings of fixed-size slots.

For every ordered pair of ranks (a -> b) one shared segment holds a ring of
``slots`` slots of ``slot_bytes`` each, and two counters: ``head`` (slots a has
published, written only by a) and ``tail`` (slots b has consumed, written only
by b). A message is its header followed by its payload, cut into as many
consecutive slots as it needs::

    slot k:   [header | pad to 64 B | first piece of payload]   (first slot)
    slot k+1: [next piece of payload ......................]   (and so on)

so a 64 MiB message flows through a ring of a few MiB: the sender fills slot
k+1 while the receiver empties slot k (a pipeline, both cores busy). Pieces are
whole elements, so ``recv_reduce`` combines each slot into the destination
straight from shared memory (``np.add(dst[i:j], slot_view, out=dst[i:j])``)
and ``recv`` into a buffer copies each slot once: one copy on each side,
no temporary buffers.

Waiting. A rank with nothing to do sleeps on its *doorbell* (see
:mod:`.doorbell`). Before sleeping it raises its "sleeping" flag and looks
once more; a writer, after publishing, looks at the flag and rings only if it
is raised. For this handshake to be safe each side needs a full memory fence
between its store and its load (the classic store-buffer race); Python has
no fence instruction, so we take and release an uncontended
``threading.Lock``, whose atomic compare-and-swap is a full fence on x86-64.
Should that ever not hold, a wake-up is late by one wait slice (50 ms),
never lost for good.

Memory ordering. The payload is written before ``head`` is stored and read
after ``head`` is loaded; on x86-64 (TSO: stores are seen in program order)
that is all the ordering needed. Other CPUs need real acquire/release
barriers, which pure Python cannot express, so this transport runs on
x86-64 Linux only; elsewhere use ``transport="pipe"``.

This is the plain transport, the one to read. The speed shortcuts built on
it (spinning before sleeping, small messages without the engine, one-copy
rendezvous for messages bigger than the ring, copies around a processor's
slow page distances, the one-shot all_reduce's shared slots) are the
subclass :class:`~.shm_fast.FastShmTransport`, used while the fast paths are
on (see :mod:`minidist.distributed.fast_paths`).
"""

from __future__ import annotations

import threading

from minidist.distributed.transport import message
from minidist.distributed.transport.base import Inbound, SendRequest, Transport

# The segment's layout is in .shm_rings (which imports this module to connect,
# so this one does not import it back); these two are the cache line and the page.
_LINE = 64
_PAGE = 4096
_HEADER_PAD = 64  # payload starts at a 64-byte boundary after the header
_FLAG_STRIDE = _LINE // 8  # one "sleeping" flag per cache line, in 8-byte words

MIN_PIECES = 4
MIN_PIECE_BYTES = 64 << 10


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


class ShmTransport(Transport):
    """Point-to-point messages through the rings of a
    :class:`~.shm_rings.ShmResources` (``resources``)."""

    name = "shm"

    def __init__(self, resources, rank: int, control, timeout=None):
        layout = resources.layout
        super().__init__(rank, layout.world_size, control, timeout)
        self._resources = resources
        world, slots, slot_bytes = layout.world_size, layout.slots, layout.slot_bytes
        buf = resources.segment.buf
        self._buf = buf
        self._counters = buf[layout.counters:layout.data].cast("Q")
        self._flags = buf[layout.flags:layout.flags + world * _LINE].cast("Q")
        self._doorbells = resources.doorbells
        self._fence_lock = threading.Lock()
        self._slots = slots
        self._slot_bytes = slot_bytes
        words_per_pair = 2 * _LINE // 8
        ring_bytes = slots * slot_bytes
        # Outgoing ring me -> dst: I write its head and read its tail.
        self._out_head = [(rank * world + dst) * words_per_pair for dst in range(world)]
        self._out_tail = [index + _LINE // 8 for index in self._out_head]
        self._out_base = [layout.data + (rank * world + dst) * ring_bytes for dst in range(world)]
        # Incoming ring src -> me: I read its head and write its tail.
        self._in_head = [(src * world + rank) * words_per_pair for src in range(world)]
        self._in_tail = [index + _LINE // 8 for index in self._in_head]
        self._in_base = [layout.data + (src * world + rank) * ring_bytes for src in range(world)]
        self._head = [0] * world  # my copies of the counters only I write
        self._tail = [0] * world
        self._my_flag = rank * (_LINE // 8)

    # ---------------------------------------------------------------- geometry

    def _capacities(self, header_length: int, itemsize: int, nbytes: int):
        """(payload offset in the first slot, payload bytes in the first slot, in
        each later slot). Pieces are whole elements, so each can be reduced on
        its own. A message that does not fit one slot is cut into at least
        :data:`MIN_PIECES` pieces (of at least :data:`MIN_PIECE_BYTES`), so that
        even a 1 MiB message keeps both sides copying at once."""
        unit = itemsize if 0 < itemsize <= 4096 else 1
        offset = _align(header_length, _HEADER_PAD)
        first = (self._slot_bytes - offset) // unit * unit
        if nbytes <= first:
            return offset, first, first
        piece = min(self._slot_bytes, max(MIN_PIECE_BYTES, _align(-(-nbytes // MIN_PIECES), _PAGE)))
        later = max(piece // unit * unit, unit)
        return offset, min(first, later), later

    # ---------------------------------------------------------------- waking

    def _notify(self, rank: int) -> None:
        """Ring ``rank``'s doorbell if it said it is going to sleep."""
        lock = self._fence_lock
        lock.acquire()  # full fence: our counter store is visible before the flag load
        lock.release()
        if self._flags[rank * _FLAG_STRIDE]:
            self._doorbells.ring(rank)

    def _sleep(self, seconds: float) -> None:
        flags, me = self._flags, self._my_flag
        flags[me] = 1
        lock = self._fence_lock
        lock.acquire()  # full fence: the flag is visible before we look again
        lock.release()
        try:
            if self.progress(drain=True):
                return
            self._doorbells.sleep(self.rank, seconds)
        finally:
            flags[me] = 0
        self._doorbells.drain(self.rank)

    # ---------------------------------------------------------------- channels

    def _ready_sources(self):
        counters, heads, tails = self._counters, self._in_head, self._tail
        return [src for src in self._sources if counters[heads[src]] != tails[src]]

    def _push(self, dst: int, request: SendRequest) -> bool:
        counters = self._counters
        head = self._head[dst]
        tail_index = self._out_tail[dst]
        slots, slot_bytes = self._slots, self._slot_bytes
        limit = counters[tail_index] + slots
        if head >= limit:
            return False
        header = request.header
        nbytes = request.nbytes
        offset, first, later = self._capacities(len(header), request.itemsize, nbytes)
        total = 1 if nbytes <= first else 1 + -(-(nbytes - first) // later)
        piece = request.written
        payload, buf, base0 = request.payload, self._buf, self._out_base[dst]
        head_index = self._out_head[dst]
        while piece < total:
            if head >= limit:
                limit = counters[tail_index] + slots
                if head >= limit:
                    break
            base = base0 + (head % slots) * slot_bytes
            if piece == 0:
                buf[base:base + len(header)] = header
                start, length, at = 0, min(first, nbytes), base + offset
            else:
                start = first + (piece - 1) * later
                length, at = min(later, nbytes - start), base
            if length:
                self._copy_in(at, payload, start, length)
            head += 1
            piece += 1
            counters[head_index] = head
            self._notify(dst)
        self._head[dst] = head
        request.written = piece
        return piece == total

    def _copy_in(self, at: int, payload, start: int, length: int) -> None:
        """Copy ``payload[start:start + length]`` into the segment at ``at``."""
        self._buf[at:at + length] = payload[start:start + length]

    def _begin(self, src: int, inbound: Inbound) -> None:
        """Nothing to consume: the header stays in its slot until the slot is released."""

    def _peek(self, src: int):
        tail = self._tail[src]
        if self._counters[self._in_head[src]] == tail:
            return None
        return message.decode(self._buf, self._in_base[src] + (tail % self._slots) * self._slot_bytes)

    def _pull(self, src: int, inbound: Inbound) -> bool:
        counters = self._counters
        head_index, tail_index = self._in_head[src], self._in_tail[src]
        head = counters[head_index]
        tail = self._tail[src]
        header = inbound.header
        nbytes = header.nbytes
        offset, first, later = self._capacities(header.length, header.dtype.itemsize, nbytes)
        total = 1 if nbytes <= first else 1 + -(-(nbytes - first) // later)
        slots, slot_bytes = self._slots, self._slot_bytes
        piece = inbound.chunks
        base0, sink = self._in_base[src], inbound.sink
        while piece < total:
            if tail >= head:
                head = counters[head_index]
                if tail >= head:
                    break
            base = base0 + (tail % slots) * slot_bytes
            if piece == 0:
                start, length, at = 0, min(first, nbytes), base + offset
            else:
                start = first + (piece - 1) * later
                length, at = min(later, nbytes - start), base
            if length:
                self._copy_out(sink, start, at, length)
            inbound.received = start + length
            piece += 1
            tail += 1
            counters[tail_index] = tail
            self._notify(src)
        self._tail[src] = tail
        inbound.chunks = piece
        return piece == total

    def _copy_out(self, sink, start: int, at: int, length: int) -> None:
        """Hand the ``length`` bytes at ``at`` in the segment to ``sink`` (payload offset ``start``)."""
        sink.consume(start, self._buf[at:at + length])

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        self._counters.release()
        self._flags.release()
        self._buf = None
