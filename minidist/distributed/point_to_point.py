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
