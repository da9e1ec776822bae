"""Module-level point-to-point calls, torch.distributed style: ``group=None``
means the world, and ``src=`` / ``dst=`` are GLOBAL ranks whatever the group
(``group_src=`` / ``group_dst=``: the same numbered within the group), so a
torch script ported line by line talks to the same processes. Each is a thin
forward to :class:`ProcessGroup`, whose methods number the group's members
0..size-1; see there for what each costs and guarantees."""

from __future__ import annotations

import pickle

from minidist.distributed import world
from minidist.distributed.process_group import ProcessGroup, rank_in_group
from minidist.distributed.reduce_op import ReduceOp
from minidist.distributed.transport.base import _DEFAULT
from minidist.distributed.world import group_or_world

#: send_object_list / recv_object_list travel on tag 0, as torch's do.
OBJECT_LIST_TAG = 0


def _world_fast(group):
    """The world group when ``group`` is None (the latency path: no call)."""
    return world._world.group if group is None and world._world else group_or_world(group)


def _peer(group, rank, group_rank, role, call, default=0):
    """``src=`` / ``dst=`` (a global rank) or ``group_src=`` / ``group_dst=`` as a
    rank of ``group``; on the world the two are the same number."""
    if rank is None and group_rank is None and role == "dst":
        raise ValueError(f"rank {group._global_rank}: {call} needs dst= (a global rank, as in "
                         "torch.distributed) or group_dst= (a rank of the group).")
    if group._identity and group_rank is None:
        return default if rank is None else rank  # checked by the group's call
    return rank_in_group(group, rank, group_rank, role, call, default=default)


def _global(group, group_rank):
    """A sender's rank in ``group`` as its global rank (what torch returns)."""
    return group_rank if group._identity or group_rank is None else group.ranks[group_rank]


def send(tensor, dst: int | None = None, group: ProcessGroup | None = None, tag: int = 0, *,
         group_dst: int | None = None, label: str = "", timeout=_DEFAULT) -> None:
    """Send ``tensor`` to rank ``dst``; returns when the buffer may be reused."""
    group = _world_fast(group)
    group.send(tensor, _peer(group, dst, group_dst, "dst", "send", None), tag, label=label,
               timeout=timeout)


def recv(tensor, src: int | None = None, group: ProcessGroup | None = None, tag: int | None = 0,
         *, group_src: int | None = None, label: str = "", timeout=_DEFAULT) -> int:
    """Receive into ``tensor`` in place; returns the sender's global rank (``src=None``: any)."""
    group = _world_fast(group)
    source = group.recv(tensor, _peer(group, src, group_src, "src", "recv", None), tag,
                        label=label, timeout=timeout)
    return _global(group, source)


def isend(tensor, dst: int | None = None, group: ProcessGroup | None = None, tag: int = 0, *,
          group_dst: int | None = None, label: str = ""):
    """Start a send; returns a request with ``wait()`` / ``test()`` / ``is_completed()``."""
    group = group_or_world(group)
    return group.isend(tensor, _peer(group, dst, group_dst, "dst", "isend", None), tag,
                       label=label)


def irecv(tensor, src: int | None = None, group: ProcessGroup | None = None,
          tag: int | None = 0, *, group_src: int | None = None, label: str = ""):
    """Start a receive into ``tensor``; returns a request."""
    group = group_or_world(group)
    return group.irecv(tensor, _peer(group, src, group_src, "src", "irecv", None), tag,
                       label=label)


def recv_array(src: int | None = None, group: ProcessGroup | None = None, tag: int | None = 0,
               *, group_src: int | None = None, label: str = "", timeout=_DEFAULT):
    """Receive a message as a new NumPy array (any shape and dtype)."""
    group = group_or_world(group)
    return group.recv_array(_peer(group, src, group_src, "src", "recv_array", None), tag,
                            label=label, timeout=timeout)


def irecv_array(src: int | None = None, group: ProcessGroup | None = None,
                tag: int | None = 0, *, group_src: int | None = None, label: str = ""):
    """Start receiving a new array; it is ``request.array`` once done."""
    group = group_or_world(group)
    return group.irecv_array(_peer(group, src, group_src, "src", "irecv_array", None), tag,
                             label=label)


def recv_reduce(tensor, src: int | None = None, op=ReduceOp.SUM,
                group: ProcessGroup | None = None, tag: int | None = 0, *,
                group_src: int | None = None, label: str = "", timeout=_DEFAULT) -> int:
    """Receive and combine into ``tensor`` in place (``tensor = op(tensor, incoming)``);
    returns the sender's global rank."""
    group = group_or_world(group)
    source = group.recv_reduce(tensor, _peer(group, src, group_src, "src", "recv_reduce", None),
                               op, tag, label=label, timeout=timeout)
    return _global(group, source)


def irecv_reduce(tensor, src: int | None = None, op=ReduceOp.SUM,
                 group: ProcessGroup | None = None, tag: int | None = 0, *,
                 group_src: int | None = None, label: str = ""):
    group = group_or_world(group)
    return group.irecv_reduce(tensor, _peer(group, src, group_src, "src", "irecv_reduce", None),
                              op, tag, label=label)


def _info_global(group, info):
    if info is not None and not group._identity:
        info.source = group.ranks[info.source]
    return info


def probe(src: int | None = None, group: ProcessGroup | None = None, tag: int | None = None,
          *, group_src: int | None = None, timeout=_DEFAULT):
    """Wait for a matching message; describe it (source as a global rank, tag, dtype,
    shape, nbytes)."""
    group = group_or_world(group)
    return _info_global(group, group.probe(_peer(group, src, group_src, "src", "probe", None),
                                           tag, timeout=timeout))


def iprobe(src: int | None = None, group: ProcessGroup | None = None, tag: int | None = None,
           *, group_src: int | None = None):
    """Describe a matching message if one has arrived, else None."""
    group = group_or_world(group)
    return _info_global(group, group.iprobe(_peer(group, src, group_src, "src", "iprobe", None),
                                            tag))


def send_object(obj, dst: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
                *, group_dst: int | None = None) -> None:
    """Send any picklable object to rank ``dst`` (one message; see :func:`recv_object`)."""
    group = group_or_world(group)
    group.send_object(obj, _peer(group, dst, group_dst, "dst", "send_object", None), tag)


def recv_object(src: int | None = None, group: ProcessGroup | None = None, tag: int | None = 0,
                *, group_src: int | None = None):
    """Receive an object sent with :func:`send_object`. Only from trusted peers:
    unpickling runs code."""
    group = group_or_world(group)
    return group.recv_object(_peer(group, src, group_src, "src", "recv_object", None), tag)


def send_object_list(object_list: list, dst: int | None = None,
                     group: ProcessGroup | None = None, device=None, *,
                     group_dst: int | None = None) -> None:
    """torch's ``send_object_list``: send the picklable objects of ``object_list``
    to rank ``dst`` (a global rank; ``group_dst``: numbered within ``group``).
    ``device`` is accepted for torch's signature and unused (objects travel as
    host bytes). Cost: one message of the pickled list (torch sends two: the
    sizes, then the bytes; minidist's messages carry their own length)."""
    if not isinstance(object_list, (list, tuple)):
        raise TypeError(f"send_object_list sends a list of objects, got "
                        f"{type(object_list).__name__}; wrap one object as [obj].")
    group = group_or_world(group)
    group.send_object(list(object_list),
                      _peer(group, dst, group_dst, "dst", "send_object_list", None),
                      OBJECT_LIST_TAG)


def recv_object_list(object_list: list, src: int | None = None,
                     group: ProcessGroup | None = None, device=None, *,
                     group_src: int | None = None) -> int:
    """torch's ``recv_object_list``: fill ``object_list`` in place with the objects
    rank ``src`` sent by :func:`send_object_list` (``src=None``: any sender); it
    must be exactly as long as the sent list. Returns the sender's global rank.
    Only from trusted peers: unpickling runs code."""
    if not isinstance(object_list, list):
        raise TypeError(f"recv_object_list fills object_list in place, so it must be a list, "
                        f"got {type(object_list).__name__}; pass [None] * (the sender's length).")
    group = group_or_world(group)
    request = group.irecv_array(_peer(group, src, group_src, "src", "recv_object_list", None),
                                OBJECT_LIST_TAG, label="object")
    request.wait()
    received = pickle.loads(request.array.tobytes())
    if len(received) != len(object_list):
        raise ValueError(f"rank {group._global_rank}: recv_object_list got {len(received)} "
                         f"objects into a list of {len(object_list)}; pass a list exactly as "
                         "long as the sender's (e.g. [None] * its length).")
    object_list[:] = received
    return _global(group, group._source(request))


def wait_all(requests, group: ProcessGroup | None = None, timeout=_DEFAULT) -> None:
    group_or_world(group).wait_all(requests, timeout)


def barrier(group: ProcessGroup | None = None, *, timeout=_DEFAULT) -> None:
    """Wait until every rank of the group has entered (dissemination barrier)."""
    group_or_world(group).barrier(timeout=timeout)


class P2POp:
    """One point-to-point operation for :func:`batch_isend_irecv` (torch's P2POp).

    ``op`` is :func:`isend` or :func:`irecv` (``dist.isend`` / ``dist.irecv``);
    ``peer`` is the rank to send to or receive from, a global rank as in every
    call of this module (``group_peer``: the same numbered within ``group``).
    """

    __slots__ = ("op", "tensor", "peer", "group", "tag", "group_peer")

    def __init__(self, op, tensor, peer: int | None = None, group: ProcessGroup | None = None,
                 tag: int = 0, group_peer: int | None = None):
        # dist.isend / dist.irecv are these, wrapped to take GPU arrays (device_arrays.py).
        if getattr(op, "__wrapped__", op) not in (isend, irecv):
            name = getattr(op, "__name__", type(op).__name__)
            raise ValueError(f"P2POp: op must be dist.isend or dist.irecv, got {name}; "
                             "a batch is made of sends and receives only.")
        if (peer is None) == (group_peer is None):
            raise ValueError("P2POp needs exactly one of peer= (a global rank, as in "
                             "torch.distributed) and group_peer= (a rank of the group).")
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag
        self.group_peer = group_peer

    def __repr__(self) -> str:
        peer = f"peer={self.peer}" if self.group_peer is None else f"group_peer={self.group_peer}"
        return f"P2POp({self.op.__name__}, {peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list) -> list:
    """Start every operation of ``p2p_op_list`` and return their requests (in
    the list's order), each with ``wait()``: torch's way to post a ring
    exchange (send right, receive left) without choosing who goes first.

    Every send and receive is posted before any is waited on, so no order of
    the list can deadlock. Cost: that of the operations; nothing is merged.
    """
    operations = list(p2p_op_list)
    if not operations:
        raise ValueError("batch_isend_irecv needs a non-empty list of dist.P2POp")
    for operation in operations:
        if not isinstance(operation, P2POp):
            raise TypeError(f"batch_isend_irecv takes a list of dist.P2POp, got a "
                            f"{type(operation).__name__}; write "
                            "dist.P2POp(dist.isend, tensor, peer).")
    requests = []
    for operation in operations:
        is_send = getattr(operation.op, "__wrapped__", operation.op) is isend
        peer = {"group_dst" if is_send else "group_src": operation.group_peer}
        requests.append(operation.op(operation.tensor, operation.peer, operation.group,
                                     operation.tag, **peer))
    return requests
