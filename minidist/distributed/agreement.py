"""Ranks that must call something alike agree first, and the odd rank is named.

A mesh's shape, a pipeline's schedule: every rank of a group must pass the
same, and a rank that passes another one does not fail where it is wrong,
it fails later, somewhere else (a wait on a group the others never made),
or not at all (weights that quietly differ). So such a call begins with one
agreement: every rank's value travels to group rank 0, which hands the whole
list back, and every rank then judges the same list the same way:

* the **reference** is the value most ranks hold (with two ranks, or a tie,
  the value of the lowest rank among the tied: the rule a student can
  predict, :func:`~minidist.runtime.majority.odd_ones`);
* every rank holding another value is **odd**, and the error names it first:
  "rank 1 called init_device_mesh with mesh_shape (4, 1) where ranks 0, 2 and
  3 call it with (2, 2)".

Because every rank judges the same list, the error reads the same whichever
rank reports it first, and :class:`~minidist.runtime.errors.CollectiveMismatchError`
carries the odd ranks (``odd``) so that the launcher names them, not the rank
that happened to notice.

Cost: 2 (n - 1) small messages, once per call that agrees (building a mesh,
a pipeline), never per collective.
"""

from __future__ import annotations

from minidist.distributed.world import group_or_world
from minidist.runtime.errors import CollectiveMismatchError, name_ranks
from minidist.runtime.majority import odd_ones  # the rule; also the collectives'


def disagreement(what: str, values, describe=repr) -> str | None:
    """The first line that names the odd ranks of ``values`` (None: all agree).

    ``what`` is the call ("init_device_mesh"); ``describe(value)`` says a
    value in words ("mesh_shape (4, 1)")."""
    reference, holders, odd = odd_ones(values)
    if not odd:
        return None
    items = dict(sorted(values.items()) if isinstance(values, dict) else enumerate(values))
    parts = [f"rank {rank} called {what} with {describe(items[rank])}" for rank in odd]
    verb = "calls" if len(holders) == 1 else "call"
    return (f"{'; '.join(parts)} where {name_ranks(holders, most=8)} {verb} it with "
            f"{describe(reference)}")


def agree(what: str, value, group=None, describe=repr, hint: str = "") -> None:
    """Check that every rank of ``group`` (None: the world) passes the same
    ``value`` (small, picklable) to ``what``; raise
    :class:`CollectiveMismatchError` naming the odd ranks if not. Every rank
    of the group must call it, as a collective."""
    group = group_or_world(group)
    if group.size == 1:
        return
    # By global rank, so that the error names the ranks a user knows.
    values = dict(zip(group.ranks, _gathered(value, group.with_context("agreement"))))
    line = disagreement(what, values, describe)
    if line is None:
        return
    raise CollectiveMismatchError(
        f"{line}. Every rank must call {what} with the same arguments."
        + (f" {hint}" if hint else ""), odd=odd_ones(values)[2])


def _gathered(value, group) -> list:
    """Every rank's ``value``, in group order, on every rank: to group rank 0
    and back (no two ranks ever both wait to send to each other)."""
    if group.rank == 0:
        values = [value] + [group.recv_object(peer, 0) for peer in range(1, group.size)]
        for peer in range(1, group.size):
            group.send_object(values, peer, 0)
        return values
    group.send_object(value, 0, 0)
    return group.recv_object(0, 0)
