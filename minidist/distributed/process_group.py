"""ProcessGroup: a set of ranks that talk among themselves, and how they talk.

A group lists its members by *global* rank, in group-rank order: in
``new_group([2, 3])`` global rank 2 is group rank 0. Every method of a group
takes and returns group ranks (as the methods of torch's ProcessGroup do);
the module-level calls (``dist.send(x, dst=3, group=g)``) take global ranks,
as torch.distributed's do, and :func:`rank_in_group` turns one into the
other. The group translates them and stamps every
message with its **context**, a number no other group uses. A message sent in
one group can therefore never be received in another, even with the same tag
between the same two processes: tensor-parallel and data-parallel traffic of a
2-D layout never mix.

:meth:`ProcessGroup.with_context` gives the same members a separate context
for one purpose ("barrier", "all_reduce", ...), so a library layer (the
collectives) has a tag space of its own that user messages cannot disturb.

Point-to-point calls follow torch.distributed: ``send(tensor, dst, tag)``,
``recv(tensor, src, tag)`` filling ``tensor`` in place, ``isend`` / ``irecv``
returning a request with ``wait()``; plus ``recv_array`` (a new array),
``recv_reduce`` (combine into a buffer) and ``probe``. Arrays are NumPy arrays,
or anything with a ``.data`` NumPy array (a minidist Tensor).

Every method here is the plain road. With the fast paths on (at import),
:func:`minidist.distributed.fast_paths.install_small_messages` puts a
wrapper over ``isend``, ``send``, ``recv`` and ``recv_reduce`` that first
offers the message to the transport's small-message path (small messages
between idle ranks skip the progress engine) and takes the plain road
whenever that declines.
"""

from __future__ import annotations

import functools
import pickle
import zlib

import numpy as np

from minidist.distributed import fast_paths
from minidist.distributed.reduce_op import ReduceOp, ufunc_of
from minidist.distributed.transport.base import (
    _DEFAULT,
    ANY_SOURCE,
    ANY_TAG,
    MessageInfo,
)

MAX_TAG = 2**31 - 1
_CHANNEL_NAMES: dict[int, str] = {}


def channel_id(purpose: str) -> int:
    """A context channel number for ``purpose``, the same in every process."""
    channel = zlib.crc32(purpose.encode("utf-8")) % 0xFFFFFFFE + 1
    _CHANNEL_NAMES[channel] = purpose
    return channel


def describe_context(context: int) -> str:
    """'' for the world's own messages, else 'group 2', 'barrier', 'group 1, barrier'."""
    group_id, channel = context >> 32, context & 0xFFFFFFFF
    parts = []
    if group_id:
        parts.append(f"group {group_id}")
    if channel:
        parts.append(_CHANNEL_NAMES.get(channel, f"context {channel}"))
    return ", ".join(parts)


def _as_array(value, role: str, rank: int) -> np.ndarray:
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(getattr(value, "data", None), np.ndarray):
        array = value.data  # a minidist Tensor (or anything that wraps an array)
    else:
        kind = type(value).__name__
        hint = ("; for arbitrary Python objects use send_object / recv_object"
                if role == "send" else "")
        if type(value).__module__.startswith("cupy"):
            hint = "; copy CuPy arrays to the host first with .get()"
        raise TypeError(f"rank {rank}: {role} expects a NumPy array (or a minidist Tensor), "
                        f"got {kind}. Wrap it with np.asarray(...){hint}.")
    dtype = array.dtype
    if dtype.hasobject:
        raise TypeError(f"rank {rank}: {role} cannot move an array of Python objects (dtype "
                        f"{dtype}): only its pointers would travel. Use a numeric dtype, or "
                        "send_object / recv_object for Python objects.")
    if dtype.fields is not None:
        raise TypeError(f"rank {rank}: {role} does not take structured arrays (dtype {dtype}); "
                        "send each field as its own array.")
    return array


def rank_in_group(group, rank, group_rank, role: str, call: str, *, default=0):
    """torch.distributed's ``src=`` / ``dst=`` (a GLOBAL rank) or ``group_src=`` /
    ``group_dst=`` (a rank of ``group``), as the rank of ``group`` the call runs on.

    The module-level calls (``dist.broadcast(x, src=1, group=g)``,
    ``dist.send(x, dst=2, group=g)``) take global ranks, as torch does; the
    methods of :class:`ProcessGroup` and every algorithm below them number the
    members 0..size-1. This is the one place that turns the first into the
    second. A global rank outside the group is refused, naming its members.
    Neither given: ``default`` (a group rank; None: any source, for receives).
    """
    if rank is not None and group_rank is not None:
        raise ValueError(f"rank {group._global_rank}: {call} takes {role}= (a global rank) or "
                         f"group_{role}= (a rank of the group), not both.")
    if rank is None:
        if group_rank is None:
            return default
        rank, global_ = group_rank, False
    else:
        global_ = not group._identity
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"rank {group._global_rank}: {call} "
                        f"{role if rank is not group_rank else 'group_' + role} must be an int, "
                        f"got {type(rank).__name__}")
    rank = int(rank)
    if not global_:
        if not 0 <= rank < group.size:
            name = role if group_rank is None else f"group_{role}"
            raise ValueError(f"rank {group._global_rank}: {call} {name}={rank} is out of range; "
                             f"the group has ranks 0..{group.size - 1}.")
        return rank
    member = group.group_rank(rank)
    if member < 0:
        raise ValueError(
            f"rank {group._global_rank}: {call} {role}={rank}: global rank {rank} is not in the "
            f"group, whose members are global ranks {list(group.ranks)}. {role}= is a global "
            f"rank, as in torch.distributed; to number the group's members 0..{group.size - 1} "
            f"pass group_{role}= instead.")
    return member


@functools.lru_cache(maxsize=8)
def _every_rank(world_size: int) -> tuple:
    """(0, 1, ..., world_size - 1), one tuple per world size."""
    return tuple(range(world_size))


class ProcessGroup:
    """Members (global ranks), this process's rank among them, and p2p calls."""

    def __init__(self, transport, ranks, group_id: int, channel: int = 0, purpose: str = ""):
        self._transport = transport
        world = _every_rank(transport.world_size)
        me = transport.rank
        if ranks is world or (type(ranks) is range and ranks == range(len(world))):
            # The whole world: one tuple shared by every group of it, and no
            # search, so that the simulator's n ranks do not each build and
            # scan n numbers (n^2 in all: 0.8 GB at 4,096 ranks).
            self.ranks = world
            self.rank = me
            self._identity = True
        else:
            self.ranks = tuple(int(r) for r in ranks)
            self.rank = self.ranks.index(me) if me in self.ranks else -1
            self._identity = self.ranks == world
        self.group_id = group_id
        self.channel = channel
        self.purpose = purpose
        self.context = (group_id << 32) | channel
        self.size = len(self.ranks)
        self._global_rank = me
        self._barrier_group = None
        self._token = np.empty(0, np.uint8)
        self._token_in = np.empty(0, np.uint8)

    def __repr__(self) -> str:
        name = "world" if self.group_id == 0 else f"group {self.group_id}"
        if self.purpose:
            name += f" / {self.purpose}"
        return f"ProcessGroup({name}, ranks={list(self.ranks)}, rank={self.rank})"

    # ---------------------------------------------------------------- membership

    @property
    def is_member(self) -> bool:
        return self.rank >= 0

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def group_rank(self, global_rank: int) -> int:
        """The group rank of a global rank, or -1 if it is not a member."""
        return self.ranks.index(global_rank) if global_rank in self.ranks else -1

    def with_context(self, purpose: str) -> ProcessGroup:
        """The same members in a separate message context named ``purpose``."""
        if not purpose:
            raise ValueError("with_context needs a non-empty purpose, e.g. 'all_reduce'")
        return ProcessGroup(self._transport, self.ranks, self.group_id, channel_id(purpose),
                            purpose)

    @property
    def transport(self):
        return self._transport

    # ---------------------------------------------------------------- checks

    def _require_member(self, what: str) -> None:
        if self.rank < 0:
            raise ValueError(f"rank {self._global_rank} is not a member of {self!r}, so it "
                             f"cannot {what} in it; only ranks {list(self.ranks)} can.")

    def _peer(self, peer, role: str, allow_any: bool) -> int:
        if peer is None and allow_any:
            return ANY_SOURCE
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)):
            raise TypeError(f"rank {self._global_rank}: {role} rank must be an int, "
                            f"got {type(peer).__name__}")
        peer = int(peer)
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {self._global_rank}: {role} rank {peer} is out of range; "
                             f"{self!r} has ranks 0..{self.size - 1}.")
        if peer == self.rank:
            raise ValueError(
                f"rank {self._global_rank}: cannot {'send to' if role == 'destination' else 'receive from'} "
                "itself. A message to yourself is just a copy: use np.copyto(destination, source).")
        return self.ranks[peer] if not self._identity else peer

    def _tag(self, tag, allow_any: bool) -> int:
        if tag is None and allow_any:
            return ANY_TAG
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
            raise TypeError(f"rank {self._global_rank}: tag must be an int, got "
                            f"{type(tag).__name__}")
        if not 0 <= tag <= MAX_TAG:
            raise ValueError(f"rank {self._global_rank}: tag {tag} is out of range; tags are "
                             f"0..{MAX_TAG}")
        return int(tag)

    def _send_array(self, tensor) -> np.ndarray:
        array = _as_array(tensor, "send", self._global_rank)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)  # one copy; the transports move flat bytes
        return array

    def _recv_buffer(self, tensor, verb: str) -> np.ndarray:
        array = _as_array(tensor, verb, self._global_rank)
        if not array.flags.writeable:
            raise ValueError(f"rank {self._global_rank}: {verb} needs a writeable buffer; this "
                             "one is read-only (a broadcast view, or np.frombuffer of bytes?). "
                             "Pass a copy: array.copy().")
        return array

    def _track(self, request):
        if not self._identity:
            request.group_ranks = self.ranks
        return request

    def _source(self, request) -> int:
        return request.source if self._identity else self.ranks.index(request.source)

    # ---------------------------------------------------------------- sending

    def isend(self, tensor, dst: int, tag: int = 0, *, label: str = ""):
        """Start sending; returns a request. Do not modify ``tensor`` until it completes.
        (A small message often completes at once: it is copied to the transport.)"""
        self._require_member("send")
        dst = self._peer(dst, "destination", allow_any=False)
        tag = self._tag(tag, allow_any=False)
        array = self._send_array(tensor)
        return self._transport.isend(array, dst, tag, self.context, label or self.purpose)

    def send(self, tensor, dst: int, tag: int = 0, *, label: str = "", timeout=_DEFAULT) -> None:
        """Send and return once the message is handed to the transport (the
        buffer may be reused at once). Cost: alpha + nbytes * beta."""
        self.isend(tensor, dst, tag, label=label).wait(timeout)

    # ---------------------------------------------------------------- receiving

    def irecv(self, tensor, src: int | None = None, tag: int | None = 0, *, label: str = ""):
        """Start receiving into ``tensor`` (same shape and dtype as the message)."""
        self._require_member("receive")
        buffer = self._recv_buffer(tensor, "recv")
        request = self._transport.irecv(self._peer(src, "source", True), self._tag(tag, True),
                                        self.context, into=buffer, label=label or self.purpose)
        return self._track(request)

    def recv(self, tensor, src: int | None = None, tag: int | None = 0, *, label: str = "",
             timeout=_DEFAULT) -> int:
        """Receive into ``tensor`` in place (torch style); returns the sender's rank.
        ``src=None`` takes any sender, ``tag=None`` any tag."""
        request = self.irecv(tensor, src, tag, label=label)
        request.wait(timeout)
        return self._source(request)

    def irecv_array(self, src: int | None = None, tag: int | None = 0, *, label: str = ""):
        """Start receiving a message of any shape and dtype; the array is
        ``request.array`` once done."""
        self._require_member("receive")
        request = self._transport.irecv(self._peer(src, "source", True), self._tag(tag, True),
                                        self.context, label=label or self.purpose)
        return self._track(request)

    def recv_array(self, src: int | None = None, tag: int | None = 0, *, label: str = "",
                   timeout=_DEFAULT) -> np.ndarray:
        """Receive a message as a new array (shape and dtype from the sender)."""
        request = self.irecv_array(src, tag, label=label)
        request.wait(timeout)
        return request.array

    def irecv_reduce(self, tensor, src: int, op=ReduceOp.SUM, tag: int | None = 0, *,
                     label: str = ""):
        """Start receiving and combining into ``tensor``: ``tensor = op(tensor, incoming)``."""
        self._require_member("receive")
        buffer = self._recv_buffer(tensor, "recv_reduce")
        ufunc = ufunc_of(op)
        request = self._transport.irecv(self._peer(src, "source", True), self._tag(tag, True),
                                        self.context, reduce_into=buffer, ufunc=ufunc,
                                        label=label or self.purpose)
        return self._track(request)

    def recv_reduce(self, tensor, src: int, op=ReduceOp.SUM, tag: int | None = 0, *,
                    label: str = "", timeout=_DEFAULT) -> int:
        """Receive a message and combine it into ``tensor`` in place
        (``np.add(tensor, incoming, out=tensor)`` for SUM), reading the incoming
        bytes where the transport holds them: no temporary of the message's size.
        Cost: alpha + nbytes * (beta + gamma). Returns the sender's rank."""
        request = self.irecv_reduce(tensor, src, op, tag, label=label)
        request.wait(timeout)
        return self._source(request)

    # ---------------------------------------------------------------- probing

    def _info(self, info: MessageInfo | None) -> MessageInfo | None:
        if info is not None and not self._identity:
            info.source = self.ranks.index(info.source)
        return info

    def iprobe(self, src: int | None = None, tag: int | None = None) -> MessageInfo | None:
        """Describe the next matching message (source, tag, dtype, shape, nbytes)
        if one has arrived, else None; the message stays queued."""
        self._require_member("probe")
        return self._info(self._transport.iprobe(self._peer(src, "source", True),
                                                 self._tag(tag, True), self.context))

    def probe(self, src: int | None = None, tag: int | None = None, *,
              timeout=_DEFAULT) -> MessageInfo:
        """Wait for a matching message and describe it without receiving it."""
        self._require_member("probe")
        return self._info(self._transport.probe(self._peer(src, "source", True),
                                                self._tag(tag, True), self.context, timeout))

    # ---------------------------------------------------------------- helpers

    def wait_all(self, requests, timeout=_DEFAULT) -> None:
        """Wait for several requests together (all make progress meanwhile)."""
        self._transport.wait_all(list(requests), timeout)

    def send_object(self, obj, dst: int, tag: int = 0, *, timeout=_DEFAULT) -> None:
        """Send any picklable Python object (pickled into a uint8 array).
        Only for trusted peers: unpickling runs code."""
        payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        self.send(payload, dst, tag, label="object", timeout=timeout)

    def recv_object(self, src: int | None = None, tag: int | None = 0, *, timeout=_DEFAULT):
        """Receive an object sent with :meth:`send_object`."""
        return pickle.loads(self.recv_array(src, tag, label="object", timeout=timeout).tobytes())

    def barrier(self, *, timeout=_DEFAULT) -> None:
        """Return once every member has entered the barrier.

        Dissemination barrier: in round k each rank sends an empty message to
        rank + 2^k and receives one from rank - 2^k; after ceil(log2 n) rounds
        everyone has heard, directly or not, from everyone. Cost:
        ceil(log2 n) * alpha. Runs in its own context ("barrier").
        """
        self._require_member("enter a barrier")
        if self._barrier_group is None:
            self._barrier_group = self.with_context("barrier")
        group, size, rank = self._barrier_group, self.size, self.rank
        distance, round_ = 1, 0
        while distance < size:
            request = group.isend(self._token, (rank + distance) % size, round_)
            group.recv(self._token_in, (rank - distance) % size, round_, timeout=timeout)
            request.wait(timeout)
            distance *= 2
            round_ += 1


# The fast paths' small sends and receives (shortcut 1 of fast_paths.py),
# installed over the methods above only when the shortcuts are on at import.
fast_paths.install_small_messages(ProcessGroup)
