"""More ranks than cores: it works, slowly, and the program is told once.

Ranks then take turns on the cores: a message often waits for its receiver
to be scheduled, and timings measure the scheduler as much as the algorithm.
Both launchers (``minidist.launch`` and ``minidist run``) say so, once per
program (:class:`~minidist.runtime.errors.OversubscriptionWarning`).
"""

from __future__ import annotations

import os
import warnings

from minidist.runtime.errors import OversubscriptionWarning


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_warned_oversubscribed = False


def warn_if_oversubscribed(world_size: int, stacklevel: int = 3) -> None:
    """Once per program: more ranks than cores, and what that does to timings."""
    global _warned_oversubscribed
    available = cores()
    if world_size <= available or _warned_oversubscribed:
        return
    _warned_oversubscribed = True
    warning = OversubscriptionWarning(
        f"{world_size} ranks on {available} cores: the ranks take turns on the cores, so "
        "results are right but timings measure the scheduler too, and waits get longer "
        "(pass a larger timeout= if calls time out); simulate big worlds instead "
        "(minidist simulate). Said once per program.")
    # Shown as one plain line ("minidist: ..."), not Python's "file:line: Category:
    # message" plus a source line: the file would be minidist's own, not the
    # student's. Still a warning, which a program can filter or turn into an error.
    original = warnings.formatwarning

    def one_line(message, category, *rest, **keywords):
        if category is OversubscriptionWarning:
            return f"minidist: warning: {message}\n"
        return original(message, category, *rest, **keywords)

    warnings.formatwarning = one_line
    try:
        warnings.warn(warning, stacklevel=stacklevel)
    finally:
        warnings.formatwarning = original
