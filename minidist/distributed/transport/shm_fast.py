"""The shared-memory transport with its speed shortcuts: :class:`FastShmTransport`.

A subclass of the plain ring of slots (:class:`~.shm.ShmTransport`; read
that first). Each shortcut below says what it replaces and what it gains;
none changes the bytes a program receives (``tests/transport/test_fast_paths.py``
runs the same traffic with and without them). They are all off with
``MINIDIST_FAST_PATHS=0`` (the plain class is then used), and all listed in
:mod:`minidist.distributed.fast_paths`.

* **Spinning before sleeping** (:mod:`.spin`): a rank with a core of its own
  keeps looking for a while before it sleeps on its doorbell.
* **Rendezvous for big messages** (:mod:`.cma`): replaces streaming a message
  bigger than the whole ring through its slots (two copies, and the sender
  waits on the receiver slot by slot). Only its header and the sender's
  address travel through a slot; the receiver copies the bytes straight out
  of the sender's memory with ``process_vm_readv``: one copy instead of two.
  ``MINIDIST_SHM_CMA=0`` turns this one off alone (for a system that refuses
  the call: a container's seccomp profile, a ptrace policy).
* **Copies around slow page distances** (:mod:`.memcopy`): replaces the plain
  ``memcpy`` of a piece into or out of a slot where the two addresses are a
  few bytes apart modulo the page, which some processors copy many times
  slower; those go by vector loads and stores instead.
* **Small messages without the engine** (:meth:`FastShmTransport.send_small`,
  :meth:`~FastShmTransport.recv_small`): replaces isend/irecv and wait for
  a blocking send or receive of a small array with nothing else queued (a
  request, matching lists, a sink: tens of microseconds of Python per
  message) with a few memoryview operations on the slot, in the same format,
  so the other side may take either road.
* **Shared slots** (:mod:`.shared_slots`): the one-shot all_reduce of small
  arrays with no messages at all (the transport only holds them here;
  :mod:`minidist.distributed.fast_paths` uses them).
"""

from __future__ import annotations

import ctypes
import os
import struct
import time

import numpy as np

from minidist.distributed.transport import cma, memcopy, message, shared_slots
from minidist.distributed.transport.base import CopySink, Inbound, SendRequest
from minidist.distributed.transport.shm import _FLAG_STRIDE, _HEADER_PAD, ShmTransport, _align
from minidist.distributed.transport.spin import SpinBeforeSleep
from minidist.runtime.errors import PeerGoneError

_TAIL = message.TAIL
_now = time.monotonic_ns
#: What a rendezvous slot holds after the header: the sender's pid and the
#: address of its array (see :mod:`.cma`).
_DESCRIPTOR = struct.Struct("<QQ")
#: A rendezvous ``recv_reduce`` reads and combines this many bytes at a time:
#: a block that stays in the core's cache between the read and the combine.
REDUCE_BLOCK_BYTES = 512 << 10
#: Larger than any message: no rendezvous (CMA not available or turned off).
_NEVER = 1 << 62


class PageAwareCopySink(CopySink):
    """A :class:`~.base.CopySink` that is told where each chunk lies, so that
    a copy at a slow page distance takes :func:`.memcopy.copy`'s road."""

    __slots__ = ("_address",)

    def __init__(self, target: np.ndarray):
        super().__init__(target)
        self._address = None

    @property
    def address(self) -> int:
        """The address of the target's first byte."""
        if self._address is None:
            self._address = memcopy.address_of(self.array)
        return self._address

    def consume_at(self, offset: int, chunk, address: int) -> None:
        """:meth:`consume` of a chunk that lies at ``address``."""
        length = len(chunk)
        if length >= memcopy.MIN_BYTES:
            memcopy.copy(self.array[offset:offset + length], chunk, self.address + offset,
                         address)
        else:
            self.target[offset:offset + length] = chunk


class _FastLayouts(dict):
    """(dtype, shape) -> (header prefix, where the per-message tail goes, where
    the payload starts) for the dtypes the small-message path handles (those
    whose arrays memoryview can cast to bytes); None for the others."""

    FAST_DTYPES = frozenset(np.dtype(code) for code in "?bBhHiIlLqQefdgFDG")

    def __missing__(self, key):
        dtype, shape = key
        if dtype not in self.FAST_DTYPES or len(self) > 4096:
            return None
        layout = message.layout(dtype, shape)
        found = self[key] = (layout.prefix, layout.tail_at, _align(layout.length, _HEADER_PAD))
        return found


class FastShmTransport(SpinBeforeSleep, ShmTransport):
    """:class:`~.shm.ShmTransport` with the shortcuts this module lists."""

    copy_sink = PageAwareCopySink
    small_messages = True

    def __init__(self, resources, rank: int, control, timeout=None, spin_ns: int = 0):
        super().__init__(resources, rank, control, timeout)
        self._spin_ns = spin_ns
        layout, buf = resources.layout, self._buf
        self._address = memcopy.address_of(np.frombuffer(buf, np.uint8))  # the segment's
        self._source = 0  # the address of the payload being pushed (see _push)
        self._small_bytes = self._slot_bytes // 2
        self._layouts = _FastLayouts()
        self.shared_slots = None  # the one-shot all_reduce's slots (see .shared_slots)
        if shared_slots.area_bytes(layout.world_size):
            self.shared_slots = shared_slots.SharedSlots(self, buf, layout.small,
                                                         layout.world_size)
        self._cma = None
        self._rendezvous_above = _NEVER
        if resources.cma:
            cma.allow_peers()
            self._cma = cma.Reader()
            self._pid = os.getpid()
            self._block = np.empty(REDUCE_BLOCK_BYTES + memcopy.PAGE, np.uint8)
            self._rendezvous_above = self._slots * self._slot_bytes  # bigger than the ring

    # ---------------------------------------------------------------- the ring's copies

    def _push(self, dst: int, request: SendRequest) -> bool:
        if request.nbytes > self._rendezvous_above:
            return self._push_rendezvous(dst, request)
        self._source = (memcopy.address_of(request.payload)
                        if request.nbytes >= memcopy.MIN_BYTES else 0)
        return ShmTransport._push(self, dst, request)

    def _copy_in(self, at: int, payload, start: int, length: int) -> None:
        target, source = self._address + at, self._source + start
        if length >= memcopy.MIN_BYTES and memcopy.slow(target, source):
            memcopy.copy(np.frombuffer(self._buf, np.uint8, length, at),
                         payload[start:start + length], target, source)
        else:
            self._buf[at:at + length] = payload[start:start + length]

    def _pull(self, src: int, inbound: Inbound) -> bool:
        if inbound.header.nbytes > self._rendezvous_above:
            return self._pull_rendezvous(src, inbound)
        return ShmTransport._pull(self, src, inbound)

    def _copy_out(self, sink, start: int, at: int, length: int) -> None:
        if type(sink) is PageAwareCopySink:
            sink.consume_at(start, self._buf[at:at + length], self._address + at)
        else:
            sink.consume(start, self._buf[at:at + length])

    # ---------------------------------------------------------------- rendezvous
    #
    # A message bigger than the ring could not be sent before its receiver
    # drained it anyway. So it is not copied into the ring at all: one slot
    # carries its header and a descriptor (our pid, the address of the
    # array), the receiver copies the bytes straight out of our memory with
    # process_vm_readv (one copy instead of two, see .cma) and then frees the
    # slot, which is the sender's signal that the array may be reused. Both
    # sides tell a rendezvous message from its size alone.

    def _push_rendezvous(self, dst: int, request: SendRequest) -> bool:
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
        _DESCRIPTOR.pack_into(buf, base + _align(len(header), _HEADER_PAD), self._pid,
                              request.payload.ctypes.data)
        head += 1
        self._head[dst] = head
        counters[self._out_head[dst]] = head
        self._notify(dst)
        request.written = 1
        request.mark = head
        return False

    def _pull_rendezvous(self, src: int, inbound: Inbound) -> bool:
        tail = self._tail[src]
        base = self._in_base[src] + (tail % self._slots) * self._slot_bytes
        header = inbound.header
        pid, address = _DESCRIPTOR.unpack_from(self._buf,
                                               base + _align(header.length, _HEADER_PAD))
        nbytes = header.nbytes
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
                itemsize = header.dtype.itemsize
                step = max(REDUCE_BLOCK_BYTES // itemsize, 1) * itemsize
                raw = (self._block if step + memcopy.PAGE <= len(self._block)
                       else np.empty(step + memcopy.PAGE, np.uint8))
                for start in range(0, nbytes, step):
                    length = min(step, nbytes - start)
                    block = memcopy.aligned_block(raw, address + start, length)
                    block_address = memcopy.address_of(block)
                    reader.read(pid, address + start, block_address, length)
                    if type(sink) is PageAwareCopySink:
                        sink.consume_at(start, block, block_address)
                    else:
                        sink.consume(start, block)
        except cma.ReadError as error:
            if error.gone:
                raise PeerGoneError(f"rank {self.rank}: rank {src} exited while rank "
                                    f"{self.rank} was reading its {nbytes}-byte message "
                                    "from it.", peer=src) from None
            raise cma.ReadError(error.errno, f"rank {self.rank}: {error.strerror}") from None
        inbound.received = nbytes
        inbound.chunks = 1
        tail += 1
        self._tail[src] = tail
        self._counters[self._in_tail[src]] = tail  # frees the slot: the sender is done
        self._notify(src)
        return True

    # ---------------------------------------------------------------- small messages
    #
    # A small message between two idle ranks is the latency case. These two
    # paths do the engine's work in a few memoryview operations, and step
    # aside (return False) whenever anything is queued that the engine must
    # order them with. Called only through minidist.distributed.fast_paths.

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
        self._notify(dst)
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
        self._notify(src)
        if recorder is not None:
            recorder.add("recv", start_ns, _now(), src, nbytes, tag, label, seq,
                         context >> 32, context & 0xFFFFFFFF)
        return True

    # ---------------------------------------------------------------- shared slots

    def notify_all(self, ranks) -> None:
        """:meth:`_notify` for several ranks, with one fence (the shared slots' publications)."""
        lock = self._fence_lock
        lock.acquire()
        lock.release()
        flags = self._flags
        for rank in ranks:
            if flags[rank * _FLAG_STRIDE]:
                self._doorbells.ring(rank)

    def close(self) -> None:
        if self.closed:
            return
        if self.shared_slots is not None:
            self.shared_slots.close()
        super().close()
