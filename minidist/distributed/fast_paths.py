"""The fast paths: every shortcut minidist takes for speed, in one place, and one switch.

None of them changes a result: each does the very same arithmetic, in the
same order, as the plain road it stands in for, so the bits are identical
with the fast paths on or off (``tests/transport/test_fast_paths.py`` checks
it, and that "off" takes none of them). They exist because in Python the
fixed cost of a call, not the bytes, is what a small message or a small
all_reduce spends its time on. Read the algorithms in
:mod:`~minidist.distributed.collectives`, the engine in
:mod:`~minidist.distributed.transport.base` and the transports
:mod:`~minidist.distributed.transport.pipe` and
:mod:`~minidist.distributed.transport.shm` as if the shortcuts did not exist;
then read this list to see where the microseconds went.

The switch. ``MINIDIST_FAST_PATHS=0`` in the environment (read at import,
so set it before starting a run: the workers inherit it) turns every one of
them off; so does :func:`enabled` ``(False)``, or ``with fast_paths.disabled():``
for a stretch of code. Shortcuts 1 to 3 are decided call by call; 4 to 6
belong to the transport, which takes them (its fast class) or not (the plain
class) when it connects, at the rank's first communication. Switch on every rank at the
same point of the program (between collectives, or before the first): two
ranks must agree on how one all_reduce exchanges its arrays and on how a
big message travels. Compare, on 2 ranks and shm
(``benchmarks/bench_revisions.py`` times the same things)::

    MINIDIST_FAST_PATHS=0 minidist run -n 2 my_script.py

Two of the transport's shortcuts also have a knob of their own, for
benchmarks and odd systems (neither turns anything on under
``MINIDIST_FAST_PATHS=0``): ``MINIDIST_SHM_CMA=0`` keeps big messages in the
ring (for a system that refuses ``process_vm_readv``), ``MINIDIST_SPIN_US``
sets how long a rank spins.

**1. Small messages** (:func:`send`, :func:`recv`; the mechanism is
:meth:`~minidist.distributed.transport.shm_fast.FastShmTransport.send_small`
and ``recv_small``). Replaces, for a blocking send or receive of a small
array between two ranks with nothing else queued, the progress engine
(request objects, matching lists, sinks): the message is written or read in
its ring slot straight away, in the same format, so the other side may take
either road. The argument checks of
:class:`~minidist.distributed.process_group.ProcessGroup` are also skipped
when the arguments are plainly right (the guard below). Gains: the engine's
Python per message, which is most of a small message's time.

**2. Shared slots for the one-shot exchange** (:func:`exchange_with_all`;
the mechanism is :mod:`~minidist.distributed.transport.shared_slots`). The
one-shot all_reduce is written on one point-to-point step,
``comm.exchange_with_all(buffer)``: hand my whole array to every other rank,
get every other rank's. Plainly that is n - 1 isends and n - 1 irecvs. When
the ranks share memory (shm, a world of at most 16, a group among the first
few, an array of at most 32 KiB, a blocking call, tracing off) each rank
instead writes its array once into its own shared slot and reads the
others' slots where they lie: no messages at all. The algorithm then
combines the same n arrays in the same rank order either way. Each
publication carries the call's fingerprint (its tag) and element count; a
peer whose slot carries another is a :class:`CollectiveMismatchError` here,
as a message with another tag is in the engine. While it waits, the rank's
status record says "in a collective" with the call's tag, so the group's
failure checks (``CallRecord.check_group``) see it as they see a rank
waiting for messages. Gains: 2(n - 1) messages per call.

**3. The one-shot lane** (:data:`LANES`, filled and taken by
:mod:`minidist.distributed.collectives.one_shot_shortcut`). Even through
the slots, the general call (argument checks, the plan, a Comm, the
generator's driver) costs as much again as the exchange. Once a blocking
call of one shape has gone the general way through the slots, later calls
of the same group, dtype, shape, op and algorithm jump straight from
``all_reduce()`` to the slots and the combine: same call numbering and
fingerprint, same rank order, same bits. Traced runs, async calls and
strided or read-only arrays never take it. Gains: the general call's
Python, about half of a small all_reduce.

**4. Spinning before sleeping** (:mod:`~minidist.distributed.transport.spin`,
mixed into every transport's fast class). Replaces going to sleep (on a
doorbell, in ``poll``) as soon as nothing moves: a rank that has a core of
its own keeps making progress for a while first. Gains: the wake-up (a
system call on each side and the scheduler) on every message that arrives
within the spin.

**5. Rendezvous for big messages** (:mod:`~minidist.distributed.transport.cma`,
in :class:`~minidist.distributed.transport.shm_fast.FastShmTransport`).
Replaces streaming a message bigger than the whole ring through its slots:
only its header and the sender's address travel, and the receiver copies the
bytes straight out of the sender's memory. Gains: one copy instead of two,
and the sender no longer waits on the receiver slot by slot.

**6. Copies around slow page distances**
(:mod:`~minidist.distributed.transport.memcopy`, in ``FastShmTransport``).
Replaces the plain ``memcpy`` of a piece into or out of a slot where source
and destination are a few bytes apart modulo the page, which some processors
copy many times slower. Gains: full copy speed at every alignment.

Where the transport's part lives. The shm transport's fast class
(:class:`~minidist.distributed.transport.shm_fast.FastShmTransport`) holds
the mechanisms of 1, 2, 4, 5 and 6; with the fast paths off a rank connects
the plain :class:`~minidist.distributed.transport.shm.ShmTransport` instead,
which has none of them, and the plain
:class:`~minidist.distributed.transport.pipe.PipeTransport`, which does not
spin.
"""

from __future__ import annotations

import contextlib
import functools
import os

import numpy as np

from minidist.distributed.reduce_op import ReduceOp, ufunc_of
from minidist.distributed.transport.base import _DEFAULT, COMPLETED
from minidist.runtime.errors import CollectiveMismatchError

_MAX_TAG = 2**31 - 1  # process_group.MAX_TAG

_on = os.environ.get("MINIDIST_FAST_PATHS", "1").strip().lower() not in ("0", "off", "false",
                                                                         "no")


def enabled(on: bool | None = None) -> bool:
    """Whether the fast paths are on; ``enabled(False)`` turns them all off,
    ``enabled(True)`` back on (in this process; call it on every rank at the
    same point). Returns the setting in force before the call."""
    global _on
    before = _on
    if on is not None:
        _on = bool(on)
        if not _on:
            LANES.clear()
    return before


@contextlib.contextmanager
def disabled():
    """``with fast_paths.disabled():`` runs its body the plain way."""
    before = enabled(False)
    try:
        yield
    finally:
        enabled(before)


# --------------------------------------------------------------------------- 1. small messages


def send(group, tensor, dst, tag, label) -> bool:
    """Send ``tensor`` to group rank ``dst`` at once if the arguments are
    plainly right and the transport has a fast path for it; False: take the
    plain road (checks, then ``isend``)."""
    return (_on and type(tensor) is np.ndarray and type(dst) is int and type(tag) is int
            and 0 <= dst < group.size and dst != group.rank >= 0 and 0 <= tag <= _MAX_TAG
            and group._transport.send_small(tensor, group.ranks[dst], tag, group.context,
                                            label or group.purpose))


def recv(group, tensor, src, tag, label, op=None) -> bool:
    """Receive into ``tensor`` (or combine into it with ``op``) from group
    rank ``src`` at once, or after a short spin, if the arguments are plainly
    right and the transport has a fast path; False: take the plain road."""
    return (_on and type(tensor) is np.ndarray and type(src) is int and type(tag) is int
            and 0 <= src < group.size and src != group.rank >= 0 and 0 <= tag <= _MAX_TAG
            and group._transport.recv_small(tensor, group.ranks[src], tag, group.context,
                                            label or group.purpose,
                                            None if op is None else ufunc_of(op)))


def install_small_messages(group_class) -> None:
    """Put :func:`send` / :func:`recv` in front of ``group_class``'s (the
    ProcessGroup's) ``isend``, ``send``, ``recv`` and ``recv_reduce``, only
    when the fast paths are on at import; each wrapper checks the switch on
    every call, and takes the plain method whenever the shortcut declines."""
    if not _on:
        return
    plain_isend, plain_send = group_class.isend, group_class.send
    plain_recv, plain_recv_reduce = group_class.recv, group_class.recv_reduce

    @functools.wraps(plain_isend)
    def isend(group, tensor, dst, tag=0, *, label=""):
        if send(group, tensor, dst, tag, label):
            return COMPLETED
        return plain_isend(group, tensor, dst, tag, label=label)

    @functools.wraps(plain_send)
    def send_now(group, tensor, dst, tag=0, *, label="", timeout=_DEFAULT):
        if not send(group, tensor, dst, tag, label):
            plain_send(group, tensor, dst, tag, label=label, timeout=timeout)

    @functools.wraps(plain_recv)
    def recv_now(group, tensor, src=None, tag=0, *, label="", timeout=_DEFAULT):
        if recv(group, tensor, src, tag, label):
            return src
        return plain_recv(group, tensor, src, tag, label=label, timeout=timeout)

    @functools.wraps(plain_recv_reduce)
    def recv_reduce(group, tensor, src, op=ReduceOp.SUM, tag=0, *, label="", timeout=_DEFAULT):
        if recv(group, tensor, src, tag, label, op):
            return src
        return plain_recv_reduce(group, tensor, src, op, tag, label=label, timeout=timeout)

    group_class.isend, group_class.send = isend, send_now
    group_class.recv, group_class.recv_reduce = recv_now, recv_reduce


# --------------------------------------------------------------------------- 2. shared slots


def exchange_with_all(comm, buffer):
    """``comm.exchange_with_all(buffer)`` through the transport's shared slots
    (a generator, as the plain one), or None where they do not apply: another
    transport, an array too big for a slot, a group without a channel, tracing
    on (a traced run sends the messages, so the trace shows them), or an async
    call (several unfinished calls would compete for the two slots; as in MPI,
    a blocking and a non-blocking call must not be matched with each other)."""
    if not _on:
        return None
    slots = getattr(comm.group.transport, "shared_slots", None)  # (the simulator has none)
    if slots is None or comm.tracing or not comm.blocking \
            or not slots.usable(comm.group.group_id, buffer.nbytes):
        return None
    return _through_slots(comm, slots, buffer)


def _through_slots(comm, slots, buffer):
    group, call, tag = comm.group, comm.call, comm.tag
    plan = slots.plan(group.ranks, group.group_id, buffer.dtype, buffer.size)
    slots.publish(plan, buffer, call, tag, group.context)
    arrays, odd = slots.collect(plan, call, tag, buffer.size, group.context, buffer.nbytes)
    if odd is not None:
        raise _mismatch(slots.rank, call, tag, buffer, odd, comm.calls)
    comm.when_released(lambda: slots.done_reading(plan, call))
    return arrays
    yield  # a generator that never yields: it waits in place (blocking calls only)


def _mismatch(me, call, tag, flat, odd, calls) -> CollectiveMismatchError:
    """A peer's slot holds another call's array (its tag or count differs)."""
    peer, their_tag, their_count = odd
    return CollectiveMismatchError(
        f"rank {me}: collective mismatch in call {call} of this group: rank {me} is in "
        f"{calls._what(tag)} with {flat.size} {flat.dtype} elements (the one-shot "
        f"all_reduce's exchange through shared slots), but rank {peer} published "
        f"{their_count} elements for {calls._what(their_tag)}. Every rank of a group must "
        "make the same collective calls, in the same order, with the same count, dtype, op "
        "and algorithm.")


# --------------------------------------------------------------------------- 3. the lane

#: (group, dtype, shape, op, algorithm) -> the shortcut of blocking all_reduces of
#: that shape, filled by :mod:`minidist.distributed.collectives.one_shot_shortcut`.
LANES: dict = {}
