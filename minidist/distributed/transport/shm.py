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

Two shortcuts. A message bigger than the whole ring goes by *rendezvous*:
only its header and the sender's address travel through a slot, and the
receiver copies the bytes straight out of the sender's memory (one copy, see
:mod:`.cma`). And the one-shot all_reduce of small arrays uses a slots area
of its own, with no messages at all (:mod:`.shared_slots`). When each is
used, and the switch that turns them off, is in
:mod:`minidist.distributed.fast_paths`.

Waiting. A rank that must wait first spins for up to 200 microseconds
(only when there are at least as many cores as ranks; with 8 ranks on 2 cores
spinning would steal the CPU from the very rank it waits for), then sleeps on
its *doorbell* (see :mod:`.doorbell`). Before sleeping it raises its
"sleeping" flag and looks once more; a writer, after publishing, looks at the
flag and rings only if it is raised. For this handshake to be safe each side
needs a full memory fence between its store and its load (the classic
store-buffer race); Python has no fence instruction, so we take and release
an uncontended ``threading.Lock``, whose atomic compare-and-swap is a full
fence on x86-64. Should that ever not hold, a wake-up is late by one wait
slice (50 ms), never lost for good.

Memory ordering. The payload is written before ``head`` is stored and read
after ``head`` is loaded; on x86-64 (TSO: stores are seen in program order)
that is all the ordering needed. Other CPUs need real acquire/release
barriers, which pure Python cannot express, so this transport runs on
x86-64 Linux only; elsewhere use ``transport="pipe"``.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time

import numpy as np

from minidist.distributed.transport import cma, memcopy, message, shared_slots
from minidist.distributed.transport.base import Inbound, SendRequest, Transport
from minidist.runtime.errors import PeerGoneError

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


_TAIL = message.TAIL
_now = time.monotonic_ns
#: What a rendezvous slot holds after the header: the sender's pid and the
#: address of its array (see :mod:`.cma`).
_DESCRIPTOR = struct.Struct("<QQ")
#: A rendezvous ``recv_reduce`` reads and combines this many bytes at a time:
#: a block that stays in the core's cache between the read and the combine
#: (on the 2-core EPYC: 64 MiB in 128 KiB blocks 19 ms, 512 KiB 12 ms, 4 MiB 15 ms).
REDUCE_BLOCK_BYTES = 512 << 10


class _FastLayouts(dict):
    """(dtype, shape) -> (header prefix, where the per-message tail goes, where
    the payload starts) for the dtypes the fast paths handle (those whose
    arrays memoryview can cast to bytes); None for the others."""

    FAST_DTYPES = frozenset(np.dtype(code) for code in "?bBhHiIlLqQefdgFDG")

    def __missing__(self, key):
        dtype, shape = key
        if dtype not in self.FAST_DTYPES or len(self) > 4096:
            return None
        layout = message.layout(dtype, shape)
        found = self[key] = (layout.prefix, layout.tail_at, _align(layout.length, _HEADER_PAD))
        return found


class ShmTransport(Transport):
    """Point-to-point messages through the rings of a
    :class:`~.shm_rings.ShmResources` (``resources``)."""

    name = "shm"

    def __init__(self, resources, rank: int, control, timeout=None, spin_ns=0):
        layout = resources.layout
        super().__init__(rank, layout.world_size, control, timeout, spin_ns)
        self._resources = resources
        world, slots, slot_bytes = layout.world_size, layout.slots, layout.slot_bytes
        buf = resources.segment.buf
        self._buf = buf
        self._address = memcopy.address_of(np.frombuffer(buf, np.uint8))  # see _push, _pull
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
        self._small_bytes = slot_bytes // 2
        self._layouts = _FastLayouts()
        self.shared_slots = None  # the one-shot all_reduce's slots (see .shared_slots)
        if shared_slots.area_bytes(world):
            self.shared_slots = shared_slots.SharedSlots(self, buf, layout.small, world)
        self._cma = None
        if resources.cma:
            cma.allow_peers()
            self._cma = cma.Reader()
            self._pid = os.getpid()
            self._block = np.empty(REDUCE_BLOCK_BYTES + memcopy.PAGE, np.uint8)

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

    def notify_all(self, ranks) -> None:
        """:meth:`_notify` for several ranks, with one fence."""
        lock = self._fence_lock
        lock.acquire()
        lock.release()
        flags = self._flags
        for rank in ranks:
            if flags[rank * _FLAG_STRIDE]:
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
        if total > slots and self._cma is not None:
            return self._push_rendezvous(dst, request, offset)
        piece = request.written
        payload, buf, base0 = request.payload, self._buf, self._out_base[dst]
        head_index = self._out_head[dst]
        # A piece copied to a slot at a slow page distance goes by memcopy.copy.
        source = memcopy.address_of(payload) if nbytes >= memcopy.MIN_BYTES else 0
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
            if length >= memcopy.MIN_BYTES and memcopy.slow(self._address + at, source + start):
                memcopy.copy(np.frombuffer(buf, np.uint8, length, at),
                             payload[start:start + length], self._address + at, source + start)
            elif length:
                buf[at:at + length] = payload[start:start + length]
            head += 1
            piece += 1
            counters[head_index] = head
            self._notify(dst)
        self._head[dst] = head
        request.written = piece
        return piece == total

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
        if total > slots and self._cma is not None:
            return self._pull_rendezvous(src, inbound, offset, total)
        piece = inbound.chunks
        buf, base0, sink = self._buf, self._in_base[src], inbound.sink
        address = self._address
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
                sink.consume(start, buf[at:at + length], address + at)
            inbound.received = start + length
            piece += 1
            tail += 1
            counters[tail_index] = tail
            self._notify(src)
        self._tail[src] = tail
        inbound.chunks = piece
        return piece == total

    # ---------------------------------------------------------------- rendezvous
    #
    # A message that needs more slots than the ring has (by default over
    # 4 MiB) could not be sent before its receiver drained it anyway. So it
    # is not copied into the ring at all: one slot carries its header and a
    # descriptor (our pid, the address of the array), the receiver copies the
    # bytes straight out of our memory with process_vm_readv (one copy
    # instead of two, see :mod:`.cma`) and then frees the slot, which is the
    # sender's signal that the array may be reused. Both sides tell a
    # rendezvous message from its size alone, with the same arithmetic.

    def _push_rendezvous(self, dst: int, request: SendRequest, offset: int) -> bool:
        counters = self._counters
        tail_index = self._out_tail[dst]
        if request.written:  # the descriptor is out: done once its slot is freed
            return counters[tail_index] >= request.mark
        head = self._head[dst]
        if head >= counters[tail_index] + self._slots:
            return False
        base = self._out_base[dst] + (head % self._slots) * self._slot_bytes
        buf, header = self._buf, request.header
        buf[base:base + len(header)] = header
        _DESCRIPTOR.pack_into(buf, base + offset, self._pid, request.payload.ctypes.data)
        head += 1
        self._head[dst] = head
        counters[self._out_head[dst]] = head
        self._notify(dst)
        request.written = 1
        request.mark = head
        return False

    def _pull_rendezvous(self, src: int, inbound: Inbound, offset: int, total: int) -> bool:
        tail = self._tail[src]
        base = self._in_base[src] + (tail % self._slots) * self._slot_bytes
        pid, address = _DESCRIPTOR.unpack_from(self._buf, base + offset)
        nbytes = inbound.header.nbytes
        sink, reader = inbound.sink, self._cma
        target = sink.direct(0, nbytes)
        try:
            target_address = (ctypes.addressof(ctypes.c_char.from_buffer(target))
                              if target is not None else 0)
            if target is not None and not memcopy.slow(target_address, address):
                # A copy: straight into the destination.
                reader.read(pid, address, target_address, nbytes)
            else:
                # A combine, or a copy at a slow page distance for the kernel's
                # copy (see memcopy): block by block through a buffer that
                # stays in cache, placed at distance 0 from the source.
                itemsize = inbound.header.dtype.itemsize
                step = max(REDUCE_BLOCK_BYTES // itemsize, 1) * itemsize
                raw = (self._block if step + memcopy.PAGE <= len(self._block)
                       else np.empty(step + memcopy.PAGE, np.uint8))
                for start in range(0, nbytes, step):
                    length = min(step, nbytes - start)
                    block = memcopy.aligned_block(raw, address + start, length)
                    block_address = memcopy.address_of(block)
                    reader.read(pid, address + start, block_address, length)
                    sink.consume(start, block, block_address)
        except cma.ReadError as error:
            if error.gone:
                raise PeerGoneError(f"rank {self.rank}: rank {src} exited while rank "
                                    f"{self.rank} was reading its {nbytes}-byte message "
                                    "from it.", peer=src) from None
            raise cma.ReadError(error.errno, f"rank {self.rank}: {error.strerror}") from None
        inbound.received = nbytes
        inbound.chunks = total
        tail += 1
        self._tail[src] = tail
        self._counters[self._in_tail[src]] = tail  # frees the slot: the sender is done
        self._notify(src)
        return True

    # ---------------------------------------------------------------- fast paths
    #
    # A small message between two idle ranks is the latency case: the general
    # engine (request objects, matching lists, sinks) costs tens of
    # microseconds of Python per message. These two paths do the same work in
    # a few memoryview operations, and step aside (return False) whenever
    # anything is queued that the engine must order them with.
    # Called only through minidist.distributed.fast_paths (send, recv).

    def send_small(self, array, dst, tag, context, label) -> bool:
        nbytes = array.nbytes
        if nbytes == 0 or nbytes > self._small_bytes or self._pending_sends[dst]:
            return False
        counters = self._counters
        head = self._head[dst]
        slots = self._slots
        if head - counters[self._out_tail[dst]] >= slots:
            return False
        layout = self._layouts[array.dtype, array.shape]
        if layout is None:
            return False
        try:
            payload = memoryview(array).cast("B")
        except TypeError:
            return False  # not C-contiguous
        prefix, tail_at, payload_at = layout
        recorder = self._recorder
        start_ns = _now() if recorder is not None else 0
        seq = self._send_seq[dst]
        self._send_seq[dst] = seq + 1
        base = self._out_base[dst] + (head % slots) * self._slot_bytes
        buf = self._buf
        buf[base:base + tail_at] = prefix
        _TAIL.pack_into(buf, base + tail_at, tag, context, seq)
        buf[base + payload_at:base + payload_at + nbytes] = payload
        head += 1
        self._head[dst] = head
        counters[self._out_head[dst]] = head  # published
        lock = self._fence_lock  # see _notify
        lock.acquire()
        lock.release()
        if self._flags[dst * _FLAG_STRIDE]:
            self._doorbells.ring(dst)
        if recorder is not None:
            recorder.add("send", start_ns, _now(), dst, nbytes, tag, label, seq,
                         context >> 32, context & 0xFFFFFFFF)
        return True

    def recv_small(self, buffer, src, tag, context, label, ufunc=None) -> bool:
        # A peeked header does not stop it: peeking reads the message at the
        # tail without taking it, so that message is still the one below.
        # (Declining then left the shortcut off for good once a rank fell
        # behind its sender: every plain receive peeks at the next message.)
        if (self._posted or self._active_sends or self._incoming[src] is not None
                or self._unexpected[src]):
            return False
        nbytes = buffer.nbytes
        if nbytes == 0 or nbytes > self._small_bytes:
            return False
        layout = self._layouts[buffer.dtype, buffer.shape]
        if layout is None:
            return False
        target = memoryview(buffer)
        if target.readonly or not target.c_contiguous:
            return False
        # Everything that does not need the message is done before it arrives.
        target = target.cast("B")
        prefix, tail_at, payload_at = layout
        recorder = self._recorder
        start_ns = _now() if recorder is not None else 0
        counters, head_index, tail = self._counters, self._in_head[src], self._tail[src]
        base = self._in_base[src] + (tail % self._slots) * self._slot_bytes
        buf = self._buf
        if counters[head_index] == tail:
            if not self._spin_ns:
                return False
            limit = _now() + self._spin_ns
            spins = 0
            while counters[head_index] == tail:
                spins += 1
                if not spins & 15 and _now() > limit:
                    return False
        if buf[base:base + tail_at] != prefix:
            return False  # another dtype or shape: the engine sorts it out
        got_tag, got_context, seq = _TAIL.unpack_from(buf, base + tail_at)
        if got_tag != tag or got_context != context:
            return False
        if ufunc is None:
            target[:] = buf[base + payload_at:base + payload_at + nbytes]
        else:  # combine straight from the slot
            incoming = np.frombuffer(buf, buffer.dtype, buffer.size, base + payload_at)
            ufunc(buffer, incoming.reshape(buffer.shape), out=buffer)
        tail += 1
        self._tail[src] = tail
        self._peeked[src] = None  # it was this message's header, if any
        counters[self._in_tail[src]] = tail
        lock = self._fence_lock  # see _notify
        lock.acquire()
        lock.release()
        if self._flags[src * _FLAG_STRIDE]:
            self._doorbells.ring(src)
        if recorder is not None:
            recorder.add("recv", start_ns, _now(), src, nbytes, tag, label, seq,
                         context >> 32, context & 0xFFFFFFFF)
        return True

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        if self.shared_slots is not None:
            self.shared_slots.close()
        self._counters.release()
        self._flags.release()
        self._buf = None
