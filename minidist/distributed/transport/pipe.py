"""The pipe transport: one OS pipe per ordered pair of ranks.

The simplest thing that works, and the one to read first: a message is its
header bytes followed by its payload bytes, written into the pipe from a to b
and read back out at b. The kernel does the buffering (up to 1 MiB per pipe)
and the waking (``poll``), so there is no shared state to get wrong. It costs
two copies through the kernel and a system call or more per message, which
the benchmark puts next to the shared-memory transport.

All pipe ends are non-blocking so that a rank blocked writing a large message
to a busy peer can still read what others send it (the progress engine
interleaves both). A peer that exits closes its ends: reads then see end of
file and writes fail, which turns a would-be hang into a clear error. A
write fails whenever the engine moves that send, which may be inside a wait
for something else, so the error goes to the send (raised by its own
wait()), never out of the wait that happened to notice it.
"""

from __future__ import annotations

import fcntl
import os
import select

import numpy as np

from minidist.distributed.transport import message
from minidist.distributed.transport.base import Inbound, SendRequest, Transport
from minidist.distributed.transport.spin import SpinBeforeSleep
from minidist.runtime import control as ctl
from minidist.runtime.errors import PeerGoneError

PIPE_BYTES = 1 << 20
STAGING_BYTES = 1 << 16


def _nonblocking(fd: int) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)


class PipeResources:
    """All the pipes of one run, created by the parent before starting workers."""

    name = "pipe"

    def __init__(self, world_size: int, pipes: dict):
        self.world_size = world_size
        self.pipes = pipes  # (src, dst) -> (read fd, write fd)

    @classmethod
    def create(cls, world_size: int) -> PipeResources:
        needed = 2 * world_size * (world_size - 1)
        try:
            import resource

            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        except (ImportError, OSError):
            soft = None
        if soft is not None and soft != -1 and needed + 64 > soft:
            raise OSError(
                f"the pipe transport for {world_size} ranks needs {needed} file descriptors, "
                f"more than this process may open ({soft}); use transport='shm', fewer ranks, "
                "or raise the limit with `ulimit -n`."
            )
        pipes = {}
        try:
            for src in range(world_size):
                for dst in range(world_size):
                    if src == dst:
                        continue
                    read_fd, write_fd = os.pipe()
                    pipes[(src, dst)] = (read_fd, write_fd)
                    _nonblocking(read_fd)
                    _nonblocking(write_fd)
                    try:
                        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
                    except (AttributeError, OSError):
                        pass  # a bigger pipe is only faster, not required
        except BaseException:
            for read_fd, write_fd in pipes.values():
                os.close(read_fd)
                os.close(write_fd)
            raise
        return cls(world_size, pipes)

    @classmethod
    def from_spec(cls, spec: dict) -> PipeResources:
        pipes = {}
        for key, fd in spec["read"].items():
            pipes[(int(key), spec["rank"])] = (fd, -1)
        for key, fd in spec["write"].items():
            pipes[(spec["rank"], int(key))] = (-1, fd)
        return cls(spec["world_size"], pipes)

    def spec_for(self, rank: int) -> dict:
        return {
            "transport": "pipe",
            "rank": rank,
            "world_size": self.world_size,
            "read": {str(src): fds[0] for (src, dst), fds in self.pipes.items() if dst == rank},
            "write": {str(dst): fds[1] for (src, dst), fds in self.pipes.items() if src == rank},
        }

    def fds_for(self, rank: int) -> list[int]:
        spec = self.spec_for(rank)
        return list(spec["read"].values()) + list(spec["write"].values())

    def after_fork(self, rank: int) -> None:
        """In worker ``rank``: close every end that is not its own, so that a
        peer's exit is seen as end of file."""
        keep = set(self.fds_for(rank))
        for fds in self.pipes.values():
            for fd in fds:
                if fd >= 0 and fd not in keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        self.pipes = {key: tuple(fd if fd in keep else -1 for fd in fds)
                      for key, fds in self.pipes.items()}

    def release_worker_ends(self) -> None:
        """In the parent, once the workers are started: it keeps no pipe ends."""
        self.close()

    def close_unconnected(self) -> None:
        """In a rank that ends without having connected: close its ends (all it
        holds after :meth:`after_fork`), as its transport's close would, so a
        peer's write to it fails at once instead of filling a pipe nobody reads."""
        self.close()

    def connect(self, rank: int, control, timeout, spin_ns: int, fast: bool = True
                ) -> PipeTransport:
        """This rank's transport; with ``fast`` (the fast paths on) and a core
        per rank (``spin_ns``), one that spins before it sleeps."""
        spec = self.spec_for(rank)
        reads = {int(src): fd for src, fd in spec["read"].items()}
        writes = {int(dst): fd for dst, fd in spec["write"].items()}
        if fast and spin_ns:
            return SpinningPipeTransport(rank, self.world_size, reads, writes, control,
                                         timeout, spin_ns=spin_ns)
        return PipeTransport(rank, self.world_size, reads, writes, control, timeout)

    def wake_all(self) -> None:
        """Sleepers poll with a short timeout and see the abort flag by themselves."""

    def close(self) -> None:
        for read_fd, write_fd in self.pipes.values():
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        self.pipes = {}

    def unlink(self) -> None:
        """Pipes have no names; closing them is all."""


class PipeTransport(Transport):
    """Point-to-point messages over per-pair pipes."""

    name = "pipe"

    def __init__(self, rank, world_size, read_fds: dict, write_fds: dict, control,
                 timeout=None):
        super().__init__(rank, world_size, control, timeout)
        self._read_fd = [read_fds.get(r, -1) for r in range(world_size)]
        self._write_fd = [write_fds.get(r, -1) for r in range(world_size)]
        self._source_of_fd = {fd: src for src, fd in read_fds.items()}
        # Per source: bytes read but not yet used live in staging[start:end].
        self._staging = [np.empty(STAGING_BYTES, np.uint8) for _ in range(world_size)]
        self._start = [0] * world_size
        self._end = [0] * world_size
        self._poller = select.poll()
        for fd in read_fds.values():
            self._poller.register(fd, select.POLLIN)

    # ---------------------------------------------------------------- reading

    def _fill(self, src: int) -> int:
        """Read what is available into the staging area; returns bytes read."""
        staging, start, end = self._staging[src], self._start[src], self._end[src]
        if start == end:
            start = end = self._start[src] = self._end[src] = 0
        elif end == len(staging):
            staging[:end - start] = staging[start:end]
            end -= start
            start = self._start[src] = 0
            self._end[src] = end
        if end == len(staging) or src in self._closed_sources:
            return 0
        try:
            count = os.readv(self._read_fd[src], [staging[end:]])
        except BlockingIOError:
            return 0
        if count == 0:
            self._mark_closed(src)
        self._end[src] = end + count
        return count

    def _mark_closed(self, src: int) -> None:
        self._closed_sources.add(src)
        try:
            self._poller.unregister(self._read_fd[src])
        except (KeyError, ValueError):
            pass

    def _ready_sources(self):
        ready = [src for src in self._sources if self._end[src] > self._start[src]]
        for fd, _ in self._poller.poll(0):
            src = self._source_of_fd[fd]
            if src not in ready:
                ready.append(src)
        return ready

    def _peek(self, src: int):
        fixed = message.fixed_length()
        for _ in range(2):
            available = self._end[src] - self._start[src]
            if available >= fixed:
                staging, start = self._staging[src], self._start[src]
                length = message.full_length(staging, start)
                if available >= length:
                    return message.decode(staging, start)
            if self._fill(src) == 0:
                return None
        return None

    def _begin(self, src: int, inbound: Inbound) -> None:
        self._start[src] += inbound.header.length

    def _pull(self, src: int, inbound: Inbound) -> bool:
        nbytes = inbound.header.nbytes
        sink = inbound.sink
        unit = getattr(sink, "itemsize", 1)
        staging = self._staging[src]
        while inbound.received < nbytes:
            wanted = nbytes - inbound.received
            available = self._end[src] - self._start[src]
            if available:
                usable = min(available, wanted)
                usable -= usable % unit
                if usable:
                    start = self._start[src]
                    sink.consume(inbound.received, staging[start:start + usable])
                    self._start[src] = start + usable
                    inbound.received += usable
                    continue
            direct = sink.direct(inbound.received, wanted) if not available else None
            if direct is not None and wanted >= STAGING_BYTES // 2:
                # Big payloads go from the pipe straight into the destination.
                try:
                    count = os.readv(self._read_fd[src], [direct])
                except BlockingIOError:
                    return False
                if count == 0:
                    self._mark_closed(src)
                    return False
                inbound.received += count
                continue
            if self._fill(src) == 0:
                return False
        return True

    # ---------------------------------------------------------------- writing

    def _push(self, dst: int, request: SendRequest) -> bool:
        header, payload = request.header, request.payload
        header_length = len(header)
        total = header_length + request.nbytes
        fd = self._write_fd[dst]
        written = request.written
        while written < total:
            try:
                if written < header_length:
                    count = os.writev(fd, [header[written:], payload])
                else:
                    count = os.write(fd, payload[written - header_length:])
            except BlockingIOError:
                break
            except BrokenPipeError:
                # Raised for the engine, which fails this send with it (and
                # the sends queued behind it): it surfaces from their wait().
                self._await_verdict(dst)
                if self._control.state_of(dst) == ctl.FAILED:
                    raise PeerGoneError(
                        f"rank {self.rank}: send to {dst} failed: rank {dst} failed.",
                        peer=dst) from None
                raise PeerGoneError(
                    f"rank {self.rank}: send to {dst} failed: rank {dst} has exited (its end "
                    "of the pipe is closed). Every send needs a matching recv on the other "
                    "side.", peer=dst) from None
            written += count
        request.written = written
        return written == total

    # ---------------------------------------------------------------- waiting

    def _sleep(self, seconds: float) -> None:
        poller = select.poll()
        for src in self._sources:
            if src not in self._closed_sources:
                poller.register(self._read_fd[src], select.POLLIN)
        for dst in self._active_sends:
            poller.register(self._write_fd[dst], select.POLLOUT)
        poller.poll(max(int(seconds * 1000), 1))

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        for fd in self._read_fd + self._write_fd:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


class SpinningPipeTransport(SpinBeforeSleep, PipeTransport):
    """The pipe transport, spinning before it sleeps in ``poll`` (see :mod:`.spin`)."""

    def __init__(self, *args, spin_ns: int, **kwargs):
        super().__init__(*args, **kwargs)
        self._spin_ns = spin_ns
