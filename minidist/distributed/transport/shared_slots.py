"""Shared slots: every rank of a group publishes one small array, every rank reads them all.

The mechanism under the one-shot all_reduce's exchange on one machine (see
:mod:`minidist.distributed.fast_paths`, which decides when it is used, checks
the calls' fingerprints and combines): "hand my whole array to every other
rank" needs no messages when the ranks share memory. Each rank writes its
array once into its own slot and raises a counter; every rank then reads the
n slots where they lie. One write, one wait, no message headers to build,
match or check.

Layout, per rank and per *channel* (a group: the world is channel 0, the
first subgroups made with ``new_group`` take the next ones)::

    line 0:  published (calls written) | label of slot 0 | label of slot 1  (the owner's)
    line 1:  done (calls whose slots it has finished reading)  written by the owner
    slot 0, slot 1                     two buffers, used by even and odd calls

Call c of a group writes slot c % 2. Before writing it the rank waits until
every peer has finished reading what it wrote there last time (its ``done``
counter): a peer may still be inside the previous call, so one buffer is not
enough, and two keep the wait off the common path. A publication carries a
*label* of two words (whatever the caller says: the collectives put the
call's tag and element count there), which readers compare with their own
(:meth:`SharedSlots.collect`) before trusting the bytes.

This module knows counters and bytes only; what the arrays mean is the
caller's business.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.transport.base import _DEFAULT, ANY_SOURCE
from minidist.distributed.transport.slots_area import (  # noqa: F401 - also this module's names
    CHANNELS,
    MAX_WORLD,
    SLOT_BYTES,
    area_bytes,
    stride,
)
from minidist.distributed.transport.slots_area import LINE as _LINE
from minidist.runtime import control as ctl

_WORDS = _LINE // 8


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
        self._plans = {}  # (ranks, channel, dtype, count) -> see plan

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
        one peer, so that a timeout's report tells it as it is. ``tag`` goes
        into this rank's status record: the collectives pass the call's tag
        (their label), which ``check_group`` compares with the peers'."""
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

    # ---------------------------------------------------------------- publishing and reading

    def usable(self, channel: int, nbytes: int) -> bool:
        return 0 <= channel < CHANNELS and 0 < nbytes <= SLOT_BYTES \
            and self.world_size <= MAX_WORLD

    def plan(self, ranks, channel: int, dtype, count: int):
        """Everything a publication of this shape needs that does not change
        between calls: counter indexes and the arrays over the slots."""
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
                 for parity in (0, 1)],  # every member's slot, in group order
                [self._slot(me, channel, parity, dtype, count) for parity in (0, 1)],
                channel,
            )
        return plan

    def publish(self, plan, flat: np.ndarray, call: int, label: int, context: int,
                timeout=_DEFAULT) -> None:
        """Write ``flat`` into this rank's slot for call ``call``, labelled
        ``label`` (and its element count), once every peer has finished reading
        what was written there two calls ago; then tell the peers."""
        words, parity = self.words, call & 1
        peers, _, done_at, head, _, _, mine, channel = plan
        last = self._last.get((channel, parity))
        if last is not None:
            for index in done_at:
                if words[index] <= last:
                    self.wait(lambda: all(words[i] > last for i in done_at), context,
                              flat.nbytes, label, timeout)
                    break
        # Write, then publish (the store of the counter comes after the data's).
        np.copyto(mine[parity], flat)
        words[head + 1 + 2 * parity] = label  # per slot: a peer may already be in the next call
        words[head + 2 + 2 * parity] = flat.size
        words[head] = call + 1
        self._last[(channel, parity)] = call
        self.transport.notify_all(peers)

    def collect(self, plan, call: int, label: int, count: int, context: int, nbytes: int,
                timeout=_DEFAULT):
        """Wait until every member has published call ``call``; return the
        arrays of every member's slot, in group order (this rank's included),
        and None, or the first peer whose publication carries another label or
        count, as (global rank, its label, its count). Read-only, and valid
        until :meth:`done_reading`."""
        words, parity = self.words, call & 1
        peers, published = plan[0], plan[1]
        for index in published:
            if words[index] <= call:
                self.wait(lambda: all(words[i] > call for i in published), context, nbytes,
                          label, timeout)
                break
        for peer, index in zip(peers, published):
            if words[index + 1 + 2 * parity] != label or words[index + 2 + 2 * parity] != count:
                return plan[5][parity], (peer, words[index + 1 + 2 * parity],
                                         words[index + 2 + 2 * parity])
        return plan[5][parity], None

    def done_reading(self, plan, call: int) -> None:
        """This rank has read every slot of call ``call``: the peers may reuse them."""
        self.words[plan[4]] = call + 1
        self.transport.notify_all(plan[0])
