"""The one-shot all_reduce's shortcuts, installed over the teaching code when
the fast paths are on (see :mod:`minidist.distributed.fast_paths`).

Read :func:`~.all_reduce.all_reduce`, :func:`~.all_reduce.one_shot` and
:meth:`~.comm.Comm.exchange_with_all` as if this module did not exist: with
``MINIDIST_FAST_PATHS=0`` at the start of a run it installs nothing, and
``dist.all_reduce`` is the teaching function itself. With the fast paths on,
:func:`install` (called by the package's ``__init__``) puts two wrappers in
place; each checks the switch on every call, so ``fast_paths.disabled()``
sends the calls the plain way again.

1. **The exchange through shared slots** replaces
   :meth:`~.comm.Comm.exchange_with_all` (n - 1 isends and n - 1 irecvs of
   the whole array) where the ranks share memory: each rank writes its array
   once into its own slot and reads the others' where they lie
   (:func:`minidist.distributed.fast_paths.exchange_with_all`). Gains: no
   message at all, one latency of the slots instead of n - 1 messages.

2. **The shortcut of a repeated call** replaces the whole general call
   (argument checks, the plan, a :class:`~.comm.Comm`, the generator's
   driver) for the second and later blocking one-shot all_reduces of one
   group, dtype, shape, op and algorithm: they go straight to the slots and
   the combine. Same call numbering and fingerprint, same rank order of the
   combine, so the same bits. Gains: the general call costs as much again
   as the exchange through the slots. Traced runs, async calls, strided or
   read-only arrays, and GPU arrays never take it.
"""

from __future__ import annotations

import functools

import numpy as np

from minidist import trace as _trace
from minidist.distributed import fast_paths
from minidist.distributed.collectives import call
from minidist.distributed.collectives.comm import Comm
from minidist.distributed.collectives.fingerprints import with_call_number
from minidist.distributed.reduce_op import ReduceOp


def install(all_reduce):
    """Put the shortcuts in place: the exchange through shared slots under
    :meth:`Comm.exchange_with_all`; returns ``all_reduce`` wrapped with the
    shortcut of repeated calls (what ``dist.all_reduce`` then is)."""
    Comm.exchange_with_all = _through_slots_first(Comm.exchange_with_all)
    return _with_repeat_shortcut(all_reduce)


def _through_slots_first(exchange_by_messages):
    @functools.wraps(exchange_by_messages)
    def exchange_with_all(comm, buffer, label="whole array"):
        through_slots = fast_paths.exchange_with_all(comm, buffer)  # None: not here
        if through_slots is not None:
            return through_slots
        return exchange_by_messages(comm, buffer, label)

    return exchange_with_all


def _with_repeat_shortcut(all_reduce):
    @functools.wraps(all_reduce)
    def all_reduce_with_shortcut(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False,
                                 algorithm: str = "auto"):
        if async_op or type(tensor) is not np.ndarray or not fast_paths.enabled():
            return all_reduce(tensor, op, group, async_op, algorithm)
        group = call.group_of(group)
        key = (group, tensor.dtype, tensor.shape, op, algorithm)
        shortcut = fast_paths.LANES.get(key)
        if shortcut is not None and tensor.flags.c_contiguous and tensor.flags.writeable \
                and not _trace.enabled():
            return shortcut(tensor)
        result = all_reduce(tensor, op, group, async_op, algorithm)
        if tensor.flags.c_contiguous and group.size > 1 \
                and algorithm in ("auto", "one_shot"):
            _open(key, group, tensor, op, algorithm)
        return result

    return all_reduce_with_shortcut


def _open(key, group, tensor, op, algorithm) -> None:
    """After a blocking one_shot all_reduce of ``tensor``'s shape went the
    general way (its call the group's last), let the next ones of the same
    ``key`` go straight to the slots. Does nothing where the slots do not apply."""
    transport = group.transport
    slots = getattr(transport, "shared_slots", None)  # (the simulator has none)
    if slots is None or transport.tracing:
        return
    context_group, calls, _ = call.calls_of(group)
    if not slots.usable(context_group.group_id, tensor.nbytes) \
            or call.choose("all_reduce", algorithm, group, tensor.nbytes)[0] != "one_shot":
        return
    _, ufunc, average = call.reduction(op, tensor.dtype, "all_reduce", group._global_rank)
    if len(fast_paths.LANES) > 256:
        fast_paths.LANES.clear()
    size, context, tag = group.size, context_group.context, calls.last_tag()
    plan = slots.plan(context_group.ranks, context_group.group_id, tensor.dtype, tensor.size)

    def shortcut(array):
        flat = array.reshape(-1)
        number = calls.seq
        calls.seq = number + 1
        this_tag = with_call_number(tag, number)  # the same fingerprint, the next number
        slots.publish(plan, flat, number, this_tag, context)
        arrays, odd = slots.collect(plan, number, this_tag, flat.size, context, flat.nbytes)
        if odd is not None:
            raise fast_paths._mismatch(slots.rank, number, this_tag, flat, odd, calls)
        # one_shot's combine: all n arrays in rank order, the same bits on every rank.
        ufunc(arrays[0], arrays[1], out=flat)
        for other in arrays[2:]:
            ufunc(flat, other, out=flat)
        slots.done_reading(plan, number)
        if average:
            call.finish_average(flat, size)

    fast_paths.LANES[key] = shortcut
