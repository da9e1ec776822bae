"""Module-level point-to-point calls, torch.distributed style: ``group=None``
means the world. Each is a thin forward to :class:`ProcessGroup`; see there
for what each costs and guarantees."""

from __future__ import annotations

from minidist.distributed import world
from minidist.distributed.process_group import ProcessGroup
from minidist.distributed.reduce_op import ReduceOp
from minidist.distributed.transport.base import _DEFAULT
from minidist.distributed.world import group_or_world


def send(tensor, dst: int, group: ProcessGroup | None = None, tag: int = 0, *, label: str = "",
         timeout=_DEFAULT) -> None:
    """Send ``tensor`` to rank ``dst``; returns when the buffer may be reused."""
    # The latency path: the world group without a function call.
    group = world._world.group if group is None and world._world else group_or_world(group)
    group.send(tensor, dst, tag, label=label, timeout=timeout)


def recv(tensor, src: int | None = None, group: ProcessGroup | None = None, tag: int | None = 0,
         *, label: str = "", timeout=_DEFAULT) -> int:
    """Receive into ``tensor`` in place; returns the sender's rank (``src=None``: any)."""
    group = world._world.group if group is None and world._world else group_or_world(group)
    return group.recv(tensor, src, tag, label=label, timeout=timeout)


def isend(tensor, dst: int, group: ProcessGroup | None = None, tag: int = 0, *,
          label: str = ""):
    """Start a send; returns a request with ``wait()`` / ``test()`` / ``is_completed()``."""
    return group_or_world(group).isend(tensor, dst, tag, label=label)


def irecv(tensor, src: int | None = None, group: ProcessGroup | None = None,
          tag: int | None = 0, *, label: str = ""):
    """Start a receive into ``tensor``; returns a request."""
    return group_or_world(group).irecv(tensor, src, tag, label=label)


def recv_array(src: int | None = None, group: ProcessGroup | None = None, tag: int | None = 0,
               *, label: str = "", timeout=_DEFAULT):
    """Receive a message as a new NumPy array (any shape and dtype)."""
    return group_or_world(group).recv_array(src, tag, label=label, timeout=timeout)


def irecv_array(src: int | None = None, group: ProcessGroup | None = None,
                tag: int | None = 0, *, label: str = ""):
    """Start receiving a new array; it is ``request.array`` once done."""
    return group_or_world(group).irecv_array(src, tag, label=label)


def recv_reduce(tensor, src: int, op=ReduceOp.SUM, group: ProcessGroup | None = None,
                tag: int | None = 0, *, label: str = "", timeout=_DEFAULT) -> int:
    """Receive and combine into ``tensor`` in place (``tensor = op(tensor, incoming)``)."""
    return group_or_world(group).recv_reduce(tensor, src, op, tag, label=label,
                                             timeout=timeout)


def irecv_reduce(tensor, src: int, op=ReduceOp.SUM, group: ProcessGroup | None = None,
                 tag: int | None = 0, *, label: str = ""):
    return group_or_world(group).irecv_reduce(tensor, src, op, tag, label=label)


def probe(src: int | None = None, group: ProcessGroup | None = None, tag: int | None = None,
          *, timeout=_DEFAULT):
    """Wait for a matching message; describe it (source, tag, dtype, shape, nbytes)."""
    return group_or_world(group).probe(src, tag, timeout=timeout)


def iprobe(src: int | None = None, group: ProcessGroup | None = None, tag: int | None = None):
    """Describe a matching message if one has arrived, else None."""
    return group_or_world(group).iprobe(src, tag)


def send_object(obj, dst: int, group: ProcessGroup | None = None, tag: int = 0) -> None:
    group_or_world(group).send_object(obj, dst, tag)


def recv_object(src: int | None = None, group: ProcessGroup | None = None, tag: int | None = 0):
    return group_or_world(group).recv_object(src, tag)


def wait_all(requests, group: ProcessGroup | None = None, timeout=_DEFAULT) -> None:
    group_or_world(group).wait_all(requests, timeout)


def barrier(group: ProcessGroup | None = None, *, timeout=_DEFAULT) -> None:
    """Wait until every rank of the group has entered (dissemination barrier)."""
    group_or_world(group).barrier(timeout=timeout)


class P2POp:
    """One point-to-point operation for :func:`batch_isend_irecv` (torch's P2POp).

    ``op`` is :func:`isend` or :func:`irecv` (``dist.isend`` / ``dist.irecv``);
    ``peer`` is the rank to send to or receive from, a rank of ``group``
    (None: the world), as in every call of this module.
    """

    __slots__ = ("op", "tensor", "peer", "group", "tag")

    def __init__(self, op, tensor, peer: int, group: ProcessGroup | None = None, tag: int = 0):
        # dist.isend / dist.irecv are these, wrapped to take GPU arrays (device_arrays.py).
        if getattr(op, "__wrapped__", op) not in (isend, irecv):
            name = getattr(op, "__name__", type(op).__name__)
            raise ValueError(f"P2POp: op must be dist.isend or dist.irecv, got {name}; "
                             "a batch is made of sends and receives only.")
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


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
    return [operation.op(operation.tensor, operation.peer, operation.group, operation.tag)
            for operation in operations]
