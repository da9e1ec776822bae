"""The rule that names the odd rank when ranks disagree: the majority is the reference.

Every rank of a group holds a value (the arguments it passed, the collective
call it is in); the **reference** is the value most ranks hold, and every rank
holding another is **odd**. A tie (and with two ranks there is always one)
goes to the value of the lowest rank among the tied: a rule a student can
predict, and one that every rank, judging the same values, applies alike.

Pure: it knows nothing of processes or messages. Ranks that agree before a
call (:mod:`minidist.distributed.agreement`) and ranks that find themselves
in different collective calls (the collectives' ``CallRecord``, reading the
group's status records) both judge with it.
"""

from __future__ import annotations


def odd_ones(values) -> tuple[object, list[int], list[int]]:
    """(the reference value, the ranks that hold it, the odd ranks) of
    ``values``, one per rank in rank order (a list, or a dict rank -> value).

    The reference is the value most ranks hold; a tie goes to the value of
    the lowest tied rank (with two ranks: the lower rank's value)."""
    items = sorted(values.items()) if isinstance(values, dict) else list(enumerate(values))
    holders: dict = {}
    for rank, value in items:
        holders.setdefault(_key(value), []).append(rank)
    # Most holders first; among equals, the value whose lowest holder is lowest.
    best = min(holders.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    reference = dict(items)[best[0]]
    odd = [rank for rank, value in items if _key(value) != _key(reference)]
    return reference, best, odd


def _key(value):
    return repr(value)  # lists, tuples and numbers compare by what they print
