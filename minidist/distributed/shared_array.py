"""Arrays every rank of a run maps at once: ``dist.shared_array(name)``.

Declared when the run starts, with their initial contents::

    def worker():
        weights = dist.shared_array("weights")      # the same memory on every rank
        weights[dist.get_rank()] += 1.0              # no lock, no message
        dist.barrier()
        return weights.copy()

    minidist.launch(worker, world_size=4, shared_arrays={"weights": np.zeros(4)})

The launching process creates one named shared-memory segment per array
(see :mod:`.shared_segment`), copies the initial values in, and is the only
one that unlinks them, on every exit path, a failing or killed worker
included. Forked workers inherit the mappings, so nothing is copied or
pickled on the way in.

What sharing means here: a store by one rank is visible to the others as
soon as the CPU makes it so, with no lock and no ordering between ranks.
``a[i] += 1`` on two ranks at once may lose one increment (each reads the
old value, each writes old + 1): that is the point of Hogwild, and the
reason to order phases with :func:`~minidist.distributed.barrier` when they
must not overlap. A world of one (``init_process_group(world_size=1)``) and
``minidist run`` declare no shared arrays.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from minidist.distributed import world
from minidist.runtime.segments import Segment

if TYPE_CHECKING:
    import numpy as np

# NumPy is imported where an array is made, not at the top: `import
# minidist.distributed` imports this module at once (its function has the
# module's name, see the package's __init__), and a process that never maps
# an array (`minidist run`'s launcher, while its workers start) goes without.

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class SharedArrays:
    """The segments of one run's shared arrays, by name (owned by the launcher)."""

    def __init__(self):
        self._segments: dict[str, tuple[Segment, tuple, np.dtype]] = {}

    @classmethod
    def create(cls, declared) -> SharedArrays:
        """One segment per ``name: initial array``; nothing is left behind if one fails."""
        if declared is None:
            declared = {}
        if not isinstance(declared, dict):
            raise TypeError("shared_arrays must be a dict of name -> initial NumPy array, "
                            f"got {type(declared).__name__}")
        checked = {name: _check_declaration(name, value) for name, value in declared.items()}
        arrays = cls()
        try:
            for name, initial in checked.items():
                segment = Segment.create(initial.nbytes, f"array-{name}")
                arrays._segments[name] = (segment, initial.shape, initial.dtype)
                view = _view(segment, initial.shape, initial.dtype)
                view[...] = initial
                del view  # the launcher keeps no export, so the segment can be unmapped
        except BaseException:
            arrays.release()
            raise
        return arrays

    def names(self) -> list[str]:
        return list(self._segments)

    def views(self) -> dict[str, np.ndarray]:
        """Each array as a NumPy array over the shared memory (in a worker)."""
        return {name: _view(segment, shape, dtype)
                for name, (segment, shape, dtype) in self._segments.items()}

    def release(self) -> None:
        """Unlink every name, then unmap (names first: a named segment is always in use)."""
        segments = [segment for segment, _, _ in self._segments.values()]
        try:
            for segment in segments:
                segment.unlink()
        finally:
            for segment in segments:
                segment.close()
            self._segments = {}


def _check_declaration(name, value) -> np.ndarray:
    import numpy as np

    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"shared array name {name!r} must be 1 to 64 letters, digits, '_', "
                         "'.' or '-' (it becomes part of a file name in /dev/shm)")
    if not isinstance(value, np.ndarray):
        raise TypeError(f"shared array {name!r} must be declared with its initial NumPy array "
                        f"(e.g. np.zeros(100)), got {type(value).__name__}")
    if value.dtype.hasobject or value.dtype.fields is not None:
        raise TypeError(f"shared array {name!r} has dtype {value.dtype}; only plain numeric "
                        "dtypes can live in shared memory")
    return np.ascontiguousarray(value)


def _view(segment: Segment, shape, dtype) -> np.ndarray:
    import numpy as np

    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(segment.buf, dtype=dtype, count=count).reshape(shape)


def shared_array(name: str) -> np.ndarray:
    """The shared array ``name`` declared by ``minidist.launch(..., shared_arrays=...)``.

    Every rank gets a NumPy array over the same memory: writes are seen by
    all ranks without messages and without locks. Cost: no message; a store
    reaches the other cores through the cache-coherence protocol (about a
    cache line per written line), and two ranks writing nearby elements at
    once contend for the same lines.
    """
    current = world.current()
    arrays = current.shared_arrays
    if name not in arrays:
        declared = ", ".join(sorted(arrays)) or "none"
        raise KeyError(f"rank {current.rank}: no shared array named {name!r} (declared: "
                       f"{declared}). Declare it when starting the run: minidist.launch(fn, "
                       f"world_size=..., shared_arrays={{{name!r}: np.zeros(shape)}}).")
    return arrays[name]
