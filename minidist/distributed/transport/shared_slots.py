"""Shared slots: the one-shot all_reduce of small arrays, without messages.

A small all_reduce is all latency: on two ranks the array is 4 KiB and the
time goes to Python building, matching and checking messages. The one-shot
algorithm (:func:`minidist.distributed.collectives.all_reduce.one_shot`) has
every rank hand its whole array to every other rank and every rank combine
all n arrays, in rank order, so that every rank computes the very same sum.
On one machine "hand to every rank" needs no messages at all: each rank
writes its array once into its own slot of shared memory and raises a
counter; every rank then reads the n slots and combines them. One write, one
wait, one combine.

Layout, per rank and per *channel* (a group: the world is channel 0, the
first subgroups made with ``new_group`` take the next ones)::

    line 0:  published (calls written) | tag, count of slot 0 | of slot 1   (the owner's)
    line 1:  done (calls whose slots it has finished reading)  written by the owner
    slot 0, slot 1                     two buffers, used by even and odd calls

Call c of a group writes slot c % 2. Before writing it the rank checks that
every peer has finished reading what it wrote there last time (its ``done``
counter): a peer may still be inside the previous call, so one buffer is not
enough, and two keep the wait off the common path. ``tag`` and ``count`` are
the call's fingerprint (collective, algorithm, op, dtype, count): a rank that
finds a peer's differ raises CollectiveMismatchError instead of adding up
unrelated bytes.

Cost: one write of N bytes, the wait for the slowest rank, (n - 1) N gamma
to combine: about alpha + N beta + (n - 1) N gamma, with an alpha of a few
microseconds (a cache line going from one core to another) instead of a
message's.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.transport.base import _DEFAULT, ANY_SOURCE
from minidist.runtime import control as ctl
from minidist.runtime.errors import CollectiveMismatchError

#: Channels per rank: the world and the first CHANNELS - 1 subgroups.
CHANNELS = 4
#: The largest array (bytes) that goes through the slots.
SLOT_BYTES = 32 << 10
#: Worlds up to this size get slots (the area grows as n * CHANNELS * 2 * SLOT_BYTES).
MAX_WORLD = 16
_LINE = 64
_WORDS = _LINE // 8


def area_bytes(world_size: int) -> int:
    """Bytes of the rings segment the slots take (0: no slots for this world)."""
    if world_size > MAX_WORLD:
        return 0
    return world_size * CHANNELS * stride()


def stride() -> int:
    return 2 * _LINE + 2 * SLOT_BYTES


class _Wait:
    """A request that is done when ``ready()`` says so (see comm's drivers)."""

    __slots__ = ("slots", "ready", "context", "nbytes", "done", "error", "tag")

    def __init__(self, slots, ready, context, nbytes, tag):
        self.slots = slots
        self.ready = ready
        self.context = context
        self.nbytes = nbytes
        self.tag = tag
        self.done = False
        self.error = None

    def test(self) -> bool:
        if not self.done:
            self.done = self.ready()
        return self.done

    is_completed = test

    def wait(self, timeout=_DEFAULT):
        if not self.done:
            self.slots.wait(self.ready, self.context, self.nbytes, self.tag, timeout)
            self.done = True
        return True


class SharedSlots:
    """One rank's view of the slots area of a rings segment."""

    def __init__(self, transport, buf, offset: int, world_size: int):
        self.transport = transport
        self.buf = buf
        self.rank = transport.rank
        self.offset = offset
        self.world_size = world_size
        self.words = buf[offset:offset + area_bytes(world_size)].cast("Q")
        self._last = {}  # (channel, parity) -> the call that last wrote that slot
        self._views = {}  # (rank, channel, parity, dtype, count) -> its array
        self._plans = {}  # (ranks, channel, dtype, count) -> see _plan

    def close(self) -> None:
        self._views.clear()
        self._plans.clear()
        self.words.release()

    # ---------------------------------------------------------------- where

    def _base(self, rank: int, channel: int) -> int:
        return self.offset + (rank * CHANNELS + channel) * stride()

    def _word(self, rank: int, channel: int, line: int) -> int:
        return (self._base(rank, channel) - self.offset) // 8 + line * _WORDS

    def _slot(self, rank, channel, parity, dtype, count) -> np.ndarray:
        key = (rank, channel, parity, dtype, count)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 4096:
                self._views.clear()
            at = self._base(rank, channel) + 2 * _LINE + parity * SLOT_BYTES
            view = self._views[key] = np.frombuffer(self.buf, dtype, count, at)
        return view

    # ---------------------------------------------------------------- waiting

    def wait(self, ready, context: int, nbytes: int, tag: int, timeout) -> None:
        """Spin a little (when each rank has a core), then let the transport's
        waiting loop sleep, watch for aborts, time out, and read the group's
        status records (a rank that finished without joining this call, or
        one in another collective, ends the wait: see ``check_group``). The
        wait is recorded as one for the whole group, not for a message from
        one peer, so that a timeout's report tells it as it is."""
        transport = self.transport
        spin = transport._spin_ns
        if spin:
            limit = transport.now_ns() + spin
            spins = 0
            while not ready():
                spins += 1
                if not spins & 15 and transport.now_ns() > limit:
                    break
            else:
                return
        transport._wait_until(ready, timeout, ctl.OP_COLLECTIVE, ANY_SOURCE, tag, context,
                              nbytes)

    # ---------------------------------------------------------------- the algorithm

    def usable(self, channel: int, nbytes: int) -> bool:
        return 0 <= channel < CHANNELS and 0 < nbytes <= SLOT_BYTES \
            and self.world_size <= MAX_WORLD

    def _plan(self, ranks, channel: int, dtype, count: int):
        """Everything a call of this shape needs that does not change between
        calls: counter indexes and the arrays over the slots."""
        key = (ranks, channel, dtype, count)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 1024:
                self._plans.clear()
            me = self.rank
            peers = [rank for rank in ranks if rank != me]
            plan = self._plans[key] = (
                peers,
                [self._word(peer, channel, 0) for peer in peers],  # their "published"
                [self._word(peer, channel, 1) for peer in peers],  # their "done"
                self._word(me, channel, 0),
                self._word(me, channel, 1),
                [[self._slot(rank, channel, parity, dtype, count) for rank in ranks]
                 for parity in (0, 1)],
                [self._slot(me, channel, parity, dtype, count) for parity in (0, 1)],
            )
        return plan

    def all_reduce(self, flat: np.ndarray, ufunc, ranks, channel: int, call: int, tag: int,
                   context: int = 0):
        """The one-shot all_reduce of ``flat`` among global ``ranks`` (in group
        order), as a generator of waits (run blocking, or as an async Work).
        ``context`` is the group's collective context (for the status record)."""
        words, parity, count = self.words, call & 1, flat.size
        peers, published, done_at, head, done_me, slots, mine = self._plan(
            ranks, channel, flat.dtype, count)
        # 1. The slot is free once every peer has read what we last wrote in it.
        last = self._last.get((channel, parity))
        if last is not None:
            for index in done_at:
                if words[index] <= last:
                    yield [_Wait(self, lambda: all(words[i] > last for i in done_at),
                                 context, flat.nbytes, tag)]
                    break
        # 2. Write, then publish (the store of the counter comes after the data's).
        np.copyto(mine[parity], flat)
        words[head + 1 + 2 * parity] = tag  # per slot: a peer may already be in the next call
        words[head + 2 + 2 * parity] = count
        words[head] = call + 1
        self._last[(channel, parity)] = call
        notify = self.transport.notify_all
        notify(peers)
        # 3. Wait for everyone's array of this call.
        for index in published:
            if words[index] <= call:
                yield [_Wait(self, lambda: all(words[i] > call for i in published),
                             context, flat.nbytes, tag)]
                break
        for peer, index in zip(peers, published):
            if words[index + 1 + 2 * parity] != tag or words[index + 2 + 2 * parity] != count:
                their_tag = words[index + 1 + 2 * parity]
                their_count = words[index + 2 + 2 * parity]
                raise CollectiveMismatchError(
                    f"rank {self.rank}: collective mismatch in call {call} of this group: "
                    f"rank {self.rank} runs the one-shot all_reduce of {count} {flat.dtype} "
                    f"elements (tag {tag}), but rank {peer}'s slot holds tag {their_tag} and "
                    f"{their_count} elements. Every rank of a group must make the same "
                    "collective calls, in the same order, with the same count, dtype, op and "
                    "algorithm.")
        # 4. Combine all n arrays in rank order: the same sum, bit for bit, everywhere.
        arrays = slots[parity]
        ufunc(arrays[0], arrays[1], out=flat)
        for array in arrays[2:]:
            ufunc(flat, array, out=flat)
        words[done_me] = call + 1  # done reading: our peers may reuse their slots
        notify(peers)
