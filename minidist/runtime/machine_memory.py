"""How much memory this machine can still give, and how much of it a command
lets one run take.

``minidist simulate`` and ``minidist train --model gpt`` estimate the bytes a
run will hold before they start it, and refuse one estimated over
:func:`memory_budget`: a run that outgrows the machine is stopped by the
kernel, or ends in a MemoryError deep inside NumPy, minutes after it
started, where the estimate is a few multiplications. The budget is a share
of what is available, not all of it: the estimates count the arrays a run
keeps, not every temporary array NumPy makes for a moment, nor what other
programs take meanwhile.
"""

from __future__ import annotations

import math
import os

#: The share of the machine's available memory a run may be estimated to take.
MEMORY_SHARE = 0.5


def memory_available() -> float:
    """Bytes this machine can still give (MemAvailable of /proc/meminfo)."""
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return math.inf


def memory_budget() -> float:
    """The bytes one run may be estimated to take: :data:`MEMORY_SHARE` of
    :func:`memory_available`."""
    return MEMORY_SHARE * memory_available()
