"""Sets of time as sorted lists of disjoint intervals, and the four
operations a breakdown needs: union, intersection, difference, length.

A set of time is a list of ``(start, end)`` pairs, in nanoseconds, sorted,
disjoint, none empty; :func:`union` makes one from any intervals (they may
overlap, nest or repeat). Every class of a profile (compute, overlapped
communication, ...) is such a set, so a number of the profile is always
:func:`length` of a set it can hand back, and two classes that should not
share a moment can be checked to share none (:func:`intersect` is empty).
"""

from __future__ import annotations

from bisect import bisect_right

Interval = tuple[int, int]


def union(intervals) -> list[Interval]:
    """The time covered by any of ``intervals``, as a sorted list of disjoint intervals."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue  # an instant (a mark, a memory note) covers no time
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The time in both sets (each sorted and disjoint): one walk along the two."""
    found, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            found.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return found


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The time in ``a`` and not in ``b`` (each sorted and disjoint)."""
    found, j = [], 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                found.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            found.append((cursor, end))
    return found


def clip(a: list[Interval], start: int, end: int) -> list[Interval]:
    """The part of ``a`` (sorted, disjoint) inside ``[start, end)``: a binary
    search to the first interval that may reach it, so that cutting a long
    run into many steps reads each step's intervals only."""
    if start >= end:
        return []
    found = []
    for first, last in a[max(bisect_right(a, (start, start)) - 1, 0):]:
        if first >= end:
            break
        if last > start:
            found.append((max(first, start), min(last, end)))
    return found


def length(a) -> int:
    """The time an interval list covers, in its unit (a sum: overlaps count twice,
    which a set made by :func:`union` has none of)."""
    return sum(end - start for start, end in a)
