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

Waiting. A rank that must wait first spins for a few tens of microseconds
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
import platform
import shutil
import threading
import time

import numpy as np

from minidist.distributed.shared_segment import Segment
from minidist.distributed.transport import message
from minidist.distributed.transport.base import Inbound, SendRequest, Transport
from minidist.distributed.transport.doorbell import SEM_BYTES, Doorbells

_MAGIC = 0x6D64736D72696E67  # "mdsmring"
_HEADER_WORDS = 8
_LINE = 64
_PAGE = 4096
_HEADER_PAD = 64  # payload starts at a 64-byte boundary after the header

DEFAULT_SLOTS = 4
MAX_SLOT_BYTES = 1 << 20
MIN_SLOT_BYTES = 16 << 10
MAX_RING_MEMORY = 1 << 30


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def check_platform() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise OSError(
            f"the shared-memory transport relies on x86-64 memory ordering; this machine is "
            f"{platform.machine()}. Use transport='pipe' here."
        )
    if not os.path.isdir("/dev/shm"):
        raise OSError("the shared-memory transport needs /dev/shm (Linux); use transport='pipe'")


def choose_geometry(world_size: int) -> tuple[int, int]:
    """(slots per ring, bytes per slot).

    Four slots of up to 1 MiB per ordered pair keep a sender and a receiver
    both busy; with many ranks the slots shrink so that all rings together stay
    under 1 GiB and under half of the free space in /dev/shm (the pages are only
    used once written, but a full /dev/shm turns a write into SIGBUS).
    Overridable with MINIDIST_SHM_SLOTS and MINIDIST_SHM_SLOT_BYTES.
    """
    slots = int(os.environ.get("MINIDIST_SHM_SLOTS", DEFAULT_SLOTS))
    if "MINIDIST_SHM_SLOT_BYTES" in os.environ:
        return slots, _align(int(os.environ["MINIDIST_SHM_SLOT_BYTES"]), _LINE)
    pairs = max(world_size * (world_size - 1), 1)
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        free = MAX_RING_MEMORY
    budget = min(MAX_RING_MEMORY, free // 2)
    per_slot = max(budget // (pairs * slots), 1)
    slot_bytes = 1 << (per_slot.bit_length() - 1)
    return slots, max(MIN_SLOT_BYTES, min(MAX_SLOT_BYTES, slot_bytes))


_FIXED = message.FIXED
_FIXED_BYTES = message.FIXED.size
_HEADER_MAGIC = message.MAGIC
_now = time.monotonic_ns


class _SuffixCache(dict):
    """(dtype, shape) -> (dtype+shape header bytes, dtype text length, payload
    offset in a first slot), for the dtypes that memoryview can cast to bytes."""

    FAST_DTYPES = frozenset(np.dtype(code) for code in "?bBhHiIlLqQefdgFDG")

    def __missing__(self, key):
        dtype, shape = key
        if dtype not in self.FAST_DTYPES or len(self) > 4096:
            return None
        text = message.encode(0, 0, 0, dtype, shape, 0)[_FIXED_BYTES:]
        value = (text, len(dtype.str), _align(_FIXED_BYTES + len(text), _HEADER_PAD))
        self[key] = value
        return value

    def get(self, key):
        return self[key]


class _Layout:
    """Where everything sits in the rings segment."""

    def __init__(self, world_size: int, slots: int, slot_bytes: int):
        self.world_size = world_size
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.doorbells = _PAGE
        self.flags = _align(self.doorbells + world_size * SEM_BYTES, _LINE)
        self.counters = _align(self.flags + world_size * _LINE, _PAGE)
        self.data = _align(self.counters + world_size * world_size * 2 * _LINE, _PAGE)
        self.size = self.data + world_size * world_size * slots * slot_bytes

    def words(self) -> list[int]:
        return [_MAGIC, self.world_size, self.slots, self.slot_bytes, 0, 0, 0, 0]


class ShmResources:
    """The parent-side (or attached) rings segment of one run."""

    name = "shm"

    def __init__(self, segment: Segment, layout: _Layout, owner: bool):
        self.segment = segment
        self.layout = layout
        self.owner = owner
        self._base_address = ctypes.addressof(ctypes.c_char.from_buffer(segment.buf))
        self.doorbells = Doorbells(self._base_address + layout.doorbells, layout.world_size)

    @classmethod
    def create(cls, world_size: int) -> ShmResources:
        check_platform()
        slots, slot_bytes = choose_geometry(world_size)
        layout = _Layout(world_size, slots, slot_bytes)
        segment = Segment.create(layout.size, "rings")
        try:
            header = segment.buf[:_HEADER_WORDS * 8].cast("Q")
            for index, word in enumerate(layout.words()):
                header[index] = word
            header.release()
            resources = cls(segment, layout, owner=True)
            resources.doorbells.initialize()
        except BaseException:
            segment.close()
            segment.unlink()
            raise
        return resources

    @classmethod
    def from_spec(cls, spec: dict) -> ShmResources:
        check_platform()
        segment = Segment.attach(spec["segment"])
        header = segment.buf[:_HEADER_WORDS * 8].cast("Q")
        magic, world_size, slots, slot_bytes = header[0], header[1], header[2], header[3]
        header.release()
        if magic != _MAGIC:
            segment.close()
            raise RuntimeError(f"{spec['segment']} is not a minidist rings segment")
        return cls(segment, _Layout(int(world_size), int(slots), int(slot_bytes)), owner=False)

    def spec_for(self, rank: int) -> dict:
        return {"transport": "shm", "segment": self.segment.name}

    def fds_for(self, rank: int) -> list[int]:
        return []

    def after_fork(self, rank: int) -> None:
        """Nothing to do: the mapping is inherited."""

    def release_worker_ends(self) -> None:
        """The parent keeps its mapping: it rings the doorbells on abort."""

    def connect(self, rank: int, control, timeout, spin_ns: int) -> ShmTransport:
        return ShmTransport(self, rank, control, timeout, spin_ns)

    def wake_all(self) -> None:
        self.doorbells.ring_all()

    def close(self) -> None:
        self.segment.close()

    def unlink(self) -> None:
        if self.owner:
            self.segment.unlink()


class ShmTransport(Transport):
    """Point-to-point messages through the rings of a :class:`ShmResources`."""

    name = "shm"

    def __init__(self, resources: ShmResources, rank: int, control, timeout=None, spin_ns=0):
        layout = resources.layout
        super().__init__(rank, layout.world_size, control, timeout, spin_ns)
        self._resources = resources
        world, slots, slot_bytes = layout.world_size, layout.slots, layout.slot_bytes
        buf = resources.segment.buf
        self._buf = buf
        self._data = np.frombuffer(buf, np.uint8)
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
        self._suffixes = _SuffixCache()

    # ---------------------------------------------------------------- geometry

    def _capacities(self, header_length: int, itemsize: int) -> tuple[int, int, int]:
        """(payload offset in a first slot, payload bytes in a first slot, in later slots);
        both capacities are whole elements so every piece can be reduced on its own."""
        unit = itemsize if 0 < itemsize <= 4096 else 1
        offset = _align(header_length, _HEADER_PAD)
        first = (self._slot_bytes - offset) // unit * unit
        later = self._slot_bytes // unit * unit
        return offset, first, later

    # ---------------------------------------------------------------- waking

    def _notify(self, rank: int) -> None:
        """Ring ``rank``'s doorbell if it said it is going to sleep."""
        lock = self._fence_lock
        lock.acquire()  # full fence: our counter store is visible before the flag load
        lock.release()
        if self._flags[rank * (_LINE // 8)]:
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
        offset, first, later = self._capacities(len(header), request.itemsize)
        total = 1 if nbytes <= first else 1 + -(-(nbytes - first) // later)
        piece = request.written
        payload, data, base0 = request.payload, self._data, self._out_base[dst]
        head_index = self._out_head[dst]
        while piece < total:
            if head >= limit:
                limit = counters[tail_index] + slots
                if head >= limit:
                    break
            base = base0 + (head % slots) * slot_bytes
            if piece == 0:
                self._buf[base:base + len(header)] = header
                start, length, at = 0, min(first, nbytes), base + offset
            else:
                start = first + (piece - 1) * later
                length, at = min(later, nbytes - start), base
            if length:
                data[at:at + length] = payload[start:start + length]
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
        offset, first, later = self._capacities(header.length, header.dtype.itemsize)
        total = 1 if nbytes <= first else 1 + -(-(nbytes - first) // later)
        piece = inbound.chunks
        slots, slot_bytes = self._slots, self._slot_bytes
        data, base0, sink = self._data, self._in_base[src], inbound.sink
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
                sink.consume(start, data[at:at + length])
            inbound.received = start + length
            piece += 1
            tail += 1
            counters[tail_index] = tail
            self._notify(src)
        self._tail[src] = tail
        inbound.chunks = piece
        return piece == total

    # ---------------------------------------------------------------- fast paths
    #
    # A small message between two idle ranks is the latency case: the general
    # engine (request objects, matching lists, sinks) costs tens of
    # microseconds of Python per message. These two paths do the same work in
    # a few memoryview operations, and step aside (return False) whenever
    # anything is queued that the engine must order them with.

    def send_small(self, array, dst, tag, context, label) -> bool:
        nbytes = array.nbytes
        if nbytes == 0 or nbytes > self._small_bytes or self._pending_sends[dst]:
            return False
        counters = self._counters
        head = self._head[dst]
        if head - counters[self._out_tail[dst]] >= self._slots:
            return False
        suffix = self._suffixes.get((array.dtype, array.shape))
        if suffix is None:
            return False
        start_ns = _now() if self._recorder is not None else 0
        seq = self._send_seq[dst]
        self._send_seq[dst] = seq + 1
        base = self._out_base[dst] + (head % self._slots) * self._slot_bytes
        buf = self._buf
        _FIXED.pack_into(buf, base, _HEADER_MAGIC, array.ndim, suffix[1], tag, context, nbytes,
                         seq)
        at = base + _FIXED_BYTES
        buf[at:at + len(suffix[0])] = suffix[0]
        at = base + suffix[2]
        buf[at:at + nbytes] = memoryview(array).cast("B")
        self._head[dst] = head + 1
        counters[self._out_head[dst]] = head + 1
        self._notify(dst)
        if self._recorder is not None:
            self._recorder.add("send", start_ns, _now(), dst, nbytes, tag, label, seq,
                               context >> 32, context & 0xFFFFFFFF)
        return True

    def recv_small(self, buffer, src, tag, context, label) -> bool:
        if (self._posted or self._active_sends or self._incoming[src] is not None
                or self._peeked[src] is not None or self._unexpected[src]):
            return False
        suffix = self._suffixes.get((buffer.dtype, buffer.shape))
        if suffix is None or buffer.nbytes > self._small_bytes or buffer.nbytes == 0:
            return False
        start_ns = _now() if self._recorder is not None else 0
        counters, head_index, tail = self._counters, self._in_head[src], self._tail[src]
        if counters[head_index] == tail:
            if not self._spin_ns:
                return False
            limit = _now() + self._spin_ns
            while counters[head_index] == tail:
                if _now() > limit:
                    return False
        base = self._in_base[src] + (tail % self._slots) * self._slot_bytes
        buf = self._buf
        magic, ndim, dtype_len, got_tag, got_context, nbytes, seq = _FIXED.unpack_from(buf, base)
        text = suffix[0]
        at = base + _FIXED_BYTES
        if (got_tag != tag or got_context != context or nbytes != buffer.nbytes
                or dtype_len != suffix[1] or buf[at:at + len(text)] != text):
            return False  # not the message expected: the engine sorts it out
        at = base + suffix[2]
        memoryview(buffer).cast("B")[:] = buf[at:at + nbytes]
        tail += 1
        self._tail[src] = tail
        counters[self._in_tail[src]] = tail
        self._notify(src)
        if self._recorder is not None:
            self._recorder.add("recv", start_ns, _now(), src, nbytes, tag, label, seq,
                               context >> 32, context & 0xFFFFFFFF)
        return True

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        self._counters.release()
        self._flags.release()
        self._data = None
        self._buf = None
