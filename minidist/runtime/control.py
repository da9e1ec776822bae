"""The run's control block: one small shared-memory segment every process maps.

It holds:

* the **abort flag**. The parent raises it when any rank fails, dies or the run
  is interrupted; every blocking wait in every transport checks it at least
  every :data:`WAIT_SLICE` seconds (and the shared-memory transport is also
  woken at once), so all ranks unblock promptly and nobody hangs.
* one **status record per rank**: what that rank is doing now (waiting in a
  send to 3 with tag 7 since t, running its own code, finished...). A rank
  writes its record only when it starts or stops *waiting*, so a message that
  completes without waiting costs nothing here. When a wait times out, the
  records of all ranks become the desync report (see :mod:`.desync`); while a
  rank waits in a collective, its peers' records tell it at once when they
  are in a different collective call (see ``CallRecord.check_group`` in
  distributed/collectives/fingerprints.py).
* one **call count table per rank**, written once, when the rank returns
  from its function: how many collective calls it made in each of its
  groups. A rank still waiting in call c of a group whose member finished
  after fewer than c + 1 calls knows that member will never join, and says
  so instead of waiting out its timeout.
* one **shown call per rank**: the shape of the call the rank is in, a few
  integers under a key (the group's context and the call's number), written
  as the rank enters a call whose ranks' arguments must fit together but
  may rightly differ (an uneven all_to_all's split sizes; ring attention's
  length). A rank that receives a message that does not fit its buffer
  reads its peers' shown calls and names the rank whose arguments are odd,
  without a message more (see ``distributed/shown_calls.py``).

Records are read without locking: a report may catch a record half-updated,
which for a diagnostic is an acceptable price for never slowing the fast path.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from minidist.runtime.segments import LocalSegment, Segment

#: Longest a blocking wait sleeps before it looks at the abort flag again.
WAIT_SLICE = 0.05

_MAGIC = 0x6D696E6964697374  # "minidist"
_HEADER_BYTES = 64
_RECORD_BYTES = 64
_RECORD = struct.Struct("<IIiIqQQQ")  # state op peer pid tag context nbytes since_ns

# word indices in the header
_W_MAGIC, _W_WORLD, _W_ABORT, _W_CULPRIT = 0, 1, 2, 3

# states
STARTING, RUNNING, WAITING, FINISHED, FAILED = range(5)
STATE_NAMES = {STARTING: "starting", RUNNING: "running", WAITING: "waiting",
               FINISHED: "finished", FAILED: "failed"}

# operations a rank can be waiting in (OP_COLLECTIVE: for the whole group at
# once, in shared memory, as the one-shot all_reduce's shared slots do)
OP_NONE, OP_SEND, OP_RECV, OP_PROBE, OP_WAIT_MANY, OP_COLLECTIVE = range(6)
OP_NAMES = {OP_NONE: "", OP_SEND: "send", OP_RECV: "recv", OP_PROBE: "probe",
            OP_WAIT_MANY: "wait", OP_COLLECTIVE: "collective"}

# The call count table: per rank a count of entries, an overflow flag, then
# CALL_ENTRIES (context, calls, tag of the last call) triples.
CALL_ENTRIES = 8
_ENTRY = struct.Struct("<QQq")
_CALLS_BYTES = 16 + _ENTRY.size * CALL_ENTRIES

# The shown call: per rank a guard (odd while the rank writes), the key
# (context, number), how many values, then the values. Room for an
# all_to_all's split sizes on 64 ranks (sent and received) and a few more.
SHOWN_VALUES = 2 * 64 + 8
_SHOWN_HEAD = struct.Struct("<qQqq")  # guard context number length
_SHOWN_BYTES = _SHOWN_HEAD.size + 8 * SHOWN_VALUES

ANY = -1  # peer or tag wildcard as stored in a record
NO_CULPRIT = -1


@dataclass
class RankStatus:
    rank: int
    state: int
    op: int
    peer: int
    pid: int
    tag: int
    context: int
    nbytes: int
    since_ns: int

    @property
    def state_name(self) -> str:
        return STATE_NAMES.get(self.state, f"state {self.state}")

    @property
    def op_name(self) -> str:
        return OP_NAMES.get(self.op, f"op {self.op}")


class ControlBlock:
    """Abort flag and per-rank status records in shared memory."""

    def __init__(self, segment: Segment, world_size: int, owner: bool):
        self.segment = segment
        self.world_size = world_size
        self.owner = owner
        self._words = segment.buf[:_HEADER_BYTES].cast("Q")
        self._buf = segment.buf

    @classmethod
    def create(cls, world_size: int, shared: bool = True) -> ControlBlock:
        size = _HEADER_BYTES + (_RECORD_BYTES + _CALLS_BYTES + _SHOWN_BYTES) * world_size
        segment = Segment.create(size, "control") if shared else LocalSegment(size)
        block = cls(segment, world_size, owner=True)
        block._words[_W_MAGIC] = _MAGIC
        block._words[_W_WORLD] = world_size
        block._words[_W_CULPRIT] = 0
        for rank in range(world_size):
            block._write(rank, STARTING, OP_NONE, -2, 0, 0, 0, 0, 0)
            _SHOWN_HEAD.pack_into(block._buf, block._shown_offset(rank), 0, 0, -1, 0)
        return block

    @classmethod
    def local(cls, world_size: int) -> ControlBlock:
        """A control block in private memory, for a world of one."""
        return cls.create(world_size, shared=False)

    @classmethod
    def attach(cls, name: str) -> ControlBlock:
        segment = Segment.attach(name)
        words = segment.buf[:_HEADER_BYTES].cast("Q")
        magic, world_size = words[_W_MAGIC], words[_W_WORLD]
        words.release()
        if magic != _MAGIC:
            segment.close()
            raise RuntimeError(f"shared-memory segment {name} is not a minidist control block")
        return cls(segment, int(world_size), owner=False)

    @property
    def name(self) -> str:
        return self.segment.name

    # ------------------------------------------------------------------ abort

    @property
    def aborted(self) -> bool:
        return self._words[_W_ABORT] != 0

    def abort(self, culprit: int = NO_CULPRIT) -> None:
        """Raise the abort flag (first culprit wins); waits notice within WAIT_SLICE."""
        if self._words[_W_ABORT] == 0:
            self._words[_W_CULPRIT] = culprit + 1
            self._words[_W_ABORT] = 1

    @property
    def culprit(self) -> int:
        """The rank whose failure stopped the run, or -1 (interrupted / unknown)."""
        return int(self._words[_W_CULPRIT]) - 1

    # ------------------------------------------------------------------ status

    def _write(self, rank, state, op, peer, pid, tag, context, nbytes, since_ns):
        _RECORD.pack_into(self._buf, _HEADER_BYTES + rank * _RECORD_BYTES,
                          state, op, peer, pid, tag, context, nbytes, since_ns)

    def set_waiting(self, rank, op, peer, tag, context, nbytes, since_ns):
        self._write(rank, WAITING, op, ANY if peer is None else peer, os.getpid(),
                    ANY if tag is None else tag, context, nbytes, since_ns)

    def set_running(self, rank, now_ns):
        """Back in user code; keep the last wait's op/peer/tag for the report."""
        offset = _HEADER_BYTES + rank * _RECORD_BYTES
        _, op, peer, _, tag, context, nbytes, _ = _RECORD.unpack_from(self._buf, offset)
        self._write(rank, RUNNING, op, peer, os.getpid(), tag, context, nbytes, now_ns)

    def set_state(self, rank, state, now_ns=0):
        offset = _HEADER_BYTES + rank * _RECORD_BYTES
        _, op, peer, pid, tag, context, nbytes, since = _RECORD.unpack_from(self._buf, offset)
        self._write(rank, state, op, peer, pid or os.getpid(), tag, context, nbytes,
                    now_ns or since)

    def state_of(self, rank: int) -> int:
        return _RECORD.unpack_from(self._buf, _HEADER_BYTES + rank * _RECORD_BYTES)[0]

    def status(self, rank: int) -> RankStatus:
        return RankStatus(rank, *_RECORD.unpack_from(self._buf,
                                                      _HEADER_BYTES + rank * _RECORD_BYTES))

    def statuses(self) -> list[RankStatus]:
        return [self.status(rank) for rank in range(self.world_size)]

    # ------------------------------------------------------------------ call counts

    def _calls_offset(self, rank: int) -> int:
        return _HEADER_BYTES + _RECORD_BYTES * self.world_size + _CALLS_BYTES * rank

    def record_calls(self, rank: int, calls: dict, last_tags: dict | None = None) -> None:
        """Write how many collective calls ``rank`` made per context, and the tag
        of its last call in each (once, as it finishes, before its state says
        FINISHED)."""
        offset = self._calls_offset(rank)
        entries = list(calls.items())[:CALL_ENTRIES]
        last_tags = last_tags or {}
        for index, (context, count) in enumerate(entries):
            _ENTRY.pack_into(self._buf, offset + 16 + _ENTRY.size * index, context, count,
                             last_tags.get(context, -1))
        struct.pack_into("<QQ", self._buf, offset, len(entries), len(calls) > CALL_ENTRIES)

    def calls_of(self, rank: int, context: int) -> int | None:
        """How many collective calls finished ``rank`` made in ``context`` (0 if
        it never used it), or None if its table overflowed without this context."""
        entry = self._calls_entry(rank, context)
        if entry is False:
            return None
        return 0 if entry is None else entry[1]

    def last_call_of(self, rank: int, context: int) -> int | None:
        """The tag of the last collective call finished ``rank`` made in
        ``context``, if it recorded one."""
        entry = self._calls_entry(rank, context)
        return entry[2] if entry and entry[2] >= 0 else None

    def _calls_entry(self, rank: int, context: int):
        """(context, calls, last tag) of ``rank``; None: no such context; False:
        the table overflowed without it."""
        offset = self._calls_offset(rank)
        count, overflow = struct.unpack_from("<QQ", self._buf, offset)
        for index in range(min(count, CALL_ENTRIES)):
            entry = _ENTRY.unpack_from(self._buf, offset + 16 + _ENTRY.size * index)
            if entry[0] == context:
                return entry
        return False if overflow else None

    # ------------------------------------------------------------------ shown calls

    def _shown_offset(self, rank: int) -> int:
        return (_HEADER_BYTES + (_RECORD_BYTES + _CALLS_BYTES) * self.world_size
                + _SHOWN_BYTES * rank)

    def show_call(self, rank: int, context: int, number: int, values) -> bool:
        """Show that ``rank`` is in call ``number`` of ``context`` with these
        ``values`` (ints); False, and nothing shown, when there are more than
        SHOWN_VALUES. Cost: one write of 32 + 8 len(values) bytes."""
        if len(values) > SHOWN_VALUES:
            return False
        offset = self._shown_offset(rank)
        guard = _SHOWN_HEAD.unpack_from(self._buf, offset)[0]
        # A seqlock: a reader that sees an odd guard, or the guard change
        # while it reads, reads again.
        _SHOWN_HEAD.pack_into(self._buf, offset, guard + 1, 0, -1, 0)
        struct.pack_into(f"<{len(values)}q", self._buf, offset + _SHOWN_HEAD.size, *values)
        _SHOWN_HEAD.pack_into(self._buf, offset, guard + 2, context, number, len(values))
        return True

    def shown_call(self, rank: int):
        """(context, number, values) of the call ``rank`` showed last, None if
        it showed none (or was writing one: read again)."""
        offset = self._shown_offset(rank)
        guard, context, number, length = _SHOWN_HEAD.unpack_from(self._buf, offset)
        if guard % 2 or number < 0:
            return None
        values = struct.unpack_from(f"<{length}q", self._buf, offset + _SHOWN_HEAD.size)
        if _SHOWN_HEAD.unpack_from(self._buf, offset)[0] != guard:
            return None
        return context, number, values

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        self._words.release()
        self._buf = None
        self.segment.close()

    def unlink(self) -> None:
        if self.owner:
            self.segment.unlink()
