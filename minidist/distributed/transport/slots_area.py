"""The size of the shared slots' area in a rings segment (see :mod:`.shared_slots`,
which reads and writes it, and :mod:`.shm_rings`, which makes room for it).

On its own so that making a run's segment needs neither the slots' code nor
NumPy (see :mod:`.shm_rings`).
"""

from __future__ import annotations

#: Channels per rank: the world and the first CHANNELS - 1 subgroups.
CHANNELS = 4
#: The largest array (bytes) that goes through the slots.
SLOT_BYTES = 32 << 10
#: Worlds up to this size get slots (the area grows as n * CHANNELS * 2 * SLOT_BYTES).
MAX_WORLD = 16
LINE = 64


def area_bytes(world_size: int) -> int:
    """Bytes of the rings segment the slots take (0: no slots for this world)."""
    if world_size > MAX_WORLD:
        return 0
    return world_size * CHANNELS * stride()


def stride() -> int:
    """Bytes of one rank's channel: two lines of counters, two slots."""
    return 2 * LINE + 2 * SLOT_BYTES
