"""The quorum: which replicas train this step, agreed by every live rank.

torchft's ``Manager`` asks a lighthouse server at each step who is alive,
and the replicas that answer form the step's *quorum*. Here the runtime
already knows who is gone: the launcher's supervisor writes FAILED into a
rank's status record the moment it sees the rank raise, die, exit or stay
stopped (``dist.failed_ranks()``). What remains is to make every live rank
*use the same* quorum, although each reads the records at its own moment
and one may see a death that another does not see yet.

The agreement, at every step boundary:

1. the *candidates* are every rank not failed: the replicas and the spares
   waiting to join. Each makes the group of exactly those ranks
   (``new_group(..., use_local_synchronization=True)``: its context comes
   from its members, so ranks that see different deaths talk in different
   contexts and never mix);
2. each candidate writes one row of a small matrix: its role (a replica
   holding the weights, a replica without them yet, a spare), its steps
   committed, its last quorum id, how many steps in a row it trained short
   of the full count; one ``all_reduce(SUM)`` of the matrix gives every
   candidate every row (an all-gather, in a form every algorithm has);
3. :func:`decide` turns the rows into the quorum. It is a pure function
   of the rows, so every rank that finished the all_reduce holds the same
   quorum; a rank whose all_reduce raised ``PeerGoneError`` (a candidate
   died during it) reads the records again and retries with fewer.

Two replicas therefore never train one step in two quorums: an all_reduce
over a group completes only if every member took part with the same group.
A quorum id counts the changes: it grows by one whenever the members
differ from the last quorum's.

Replicas that disagree on the steps committed are the trace of a death in
the last gradient all_reduce: it completed on some ranks and not on others.
The ones ahead *roll back* their last step (:mod:`.fault_tolerant_ddp`
keeps the state before it), so the step is applied by nobody and redone by
every member of the new quorum.

Spares. A replacement joins when the group has trained
``spare_joins_after`` steps short-handed, taking the lowest spares first;
the lowest replica holding the weights sends them (:mod:`.recovery`).

Cost per step: one all_reduce of ``6 W`` int64 (W the world size, 48 W
bytes) over the ``c`` candidates: with the ring 2 (c - 1) messages of
about 48 W / c bytes per rank, 2 (c - 1) alpha. Nothing else when nobody
failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

import minidist.distributed as dist
from minidist import trace

logger = logging.getLogger("minidist.resilience")

#: The roles a rank writes in its row.
SPARE, FRESH, HOLDER = 0, 1, 2
ROLE_NAMES = {SPARE: "spare", FRESH: "replica without the weights yet", HOLDER: "replica"}

#: The columns of a rank's row: present (1), role, steps committed, last
#: quorum id, steps trained short in a row, last quorum's members (bitmask).
PRESENT, ROLE, COMMITTED, QUORUM_ID, SHORT, MEMBERS = range(6)
COLUMNS = 6


@dataclass(frozen=True)
class Quorum:
    """Who trains ``step``: ``members`` (world ranks, sorted; a member's
    place in it is its replica rank); ``joining``, the members that receive
    the state from ``source`` first; ``rollback``, the ranks that undo their
    last step first; ``spares``, live ranks that wait. ``done``: every
    replica has committed the run's steps."""

    quorum_id: int
    step: int
    members: tuple
    joining: tuple = ()
    source: int = -1
    rollback: tuple = ()
    spares: tuple = ()
    done: bool = False

    def replica_rank(self, rank: int) -> int:
        """``rank``'s place among the members (its shard of the data); -1 outside."""
        return self.members.index(rank) if rank in self.members else -1


@dataclass
class QuorumRow:
    """What this rank brings to the agreement."""

    role: int
    committed: int = 0
    quorum_id: int = 0
    short: int = 0
    members: tuple = field(default_factory=tuple)

    def as_row(self, world_size: int) -> np.ndarray:
        mask = sum(1 << rank for rank in self.members)
        return np.array([1, self.role, self.committed, self.quorum_id, self.short, mask],
                        np.int64)


def decide(rows: np.ndarray, replicas: int, total_steps: int,
           spare_joins_after: int = 1) -> Quorum:
    """The quorum the agreement's ``rows`` (one per world rank; absent ranks
    all zeros) give. Pure: the same rows, the same quorum on every rank."""
    present = [int(rank) for rank in np.flatnonzero(rows[:, PRESENT])]
    holders = [rank for rank in present if rows[rank, ROLE] == HOLDER]
    fresh = [rank for rank in present if rows[rank, ROLE] == FRESH]
    spares = [rank for rank in present if rows[rank, ROLE] == SPARE]
    last_id = int(rows[present, QUORUM_ID].max()) if present else 0
    if not holders:
        if last_id > 0 or not fresh:
            raise dist.PeerGoneError(
                f"every replica that held the weights is gone "
                f"(live ranks: {present}); nothing is left to recover from. Keep a checkpoint "
                "and restart the run (elastic restarts), or give it more replicas.")
        holders, fresh = fresh[:1], fresh[1:]  # the run's start: the lowest replica's weights
    committed = rows[holders, COMMITTED]
    step = int(committed.min())
    rollback = tuple(rank for rank in holders if rows[rank, COMMITTED] > step)
    members = sorted(holders + fresh)
    short = int(rows[holders, SHORT].max())
    admitted = []
    if len(members) < replicas and spares and short >= spare_joins_after:
        admitted = spares[:replicas - len(members)]
    members = sorted(members + admitted)
    done = step >= total_steps and not rollback
    # The last quorum: the one of the holder that saw the newest id (the
    # lowest such rank, for a rule every rank applies the same way).
    newest = min(holders, key=lambda rank: (-int(rows[rank, QUORUM_ID]), rank))
    last_members = int(rows[newest, MEMBERS])
    mask = sum(1 << rank for rank in members)
    quorum_id = last_id + (mask != last_members)
    return Quorum(quorum_id, step, tuple(members), tuple(sorted(fresh + admitted)),
                  holders[0], rollback, tuple(r for r in spares if r not in admitted), done)


class QuorumAgreement:
    """Runs the agreement for one rank: :meth:`agree` until it completes."""

    def __init__(self, replicas: int, total_steps: int, spare_joins_after: int = 1):
        self.replicas = replicas
        self.total_steps = total_steps
        self.spare_joins_after = spare_joins_after
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.attempts = 0  # agreements that a death interrupted

    def candidates(self) -> list[int]:
        gone = dist.failed_ranks()
        return [rank for rank in range(self.world_size) if rank not in gone]

    def agree(self, row: QuorumRow) -> Quorum:
        """The quorum of this step boundary; the same on every rank that returns it."""
        while True:
            if dist.finished_ranks():
                # A rank returns only after an agreement in which every
                # replica had committed the last step: this one had too.
                return Quorum(row.quorum_id, row.committed, row.members, done=True)
            candidates = self.candidates()
            group = dist.new_group(candidates, use_local_synchronization=True,
                                   group_desc="quorum")
            rows = np.zeros((self.world_size, COLUMNS), np.int64)
            rows[self.rank] = row.as_row(self.world_size)
            label = trace.with_info("quorum agreement", kind="quorum", step=row.committed,
                                    candidates=len(candidates))
            try:
                with trace.region(label, kind="quorum"):
                    dist.all_reduce(rows, op=dist.ReduceOp.SUM, group=group, algorithm="ring")
            except dist.PeerGoneError as error:
                self.attempts += 1
                logger.info("rank %d: the quorum agreement over %s was interrupted (%s); "
                            "again without the failed ranks", self.rank, candidates, error)
                continue
            return decide(rows, self.replicas, self.total_steps, self.spare_joins_after)


def describe(quorum: Quorum, replicas: int) -> str:
    """'quorum 3 at step 5: ranks [0, 1, 3] (3 of 4), rank 4 joining' for a log line."""
    text = (f"quorum {quorum.quorum_id} at step {quorum.step}: ranks {list(quorum.members)} "
            f"({len(quorum.members)} of {replicas})")
    if quorum.joining:
        text += f", joining {list(quorum.joining)} (state from rank {quorum.source})"
    if quorum.rollback:
        text += f", rolling back {list(quorum.rollback)}"
    return text
