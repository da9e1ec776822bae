"""Keep freed memory in the process, so a training step does not page it in again.

A NumPy training step allocates the same large arrays every step (im2col
columns, activations, masks, their gradients) and frees them all by its end.
glibc's malloc, which NumPy's arrays come from on Linux, hands memory back to
the kernel eagerly: blocks above ``M_MMAP_THRESHOLD`` get their own ``mmap``,
unmapped at ``free``, and the top of the heap is trimmed whenever more than
``M_TRIM_THRESHOLD`` bytes are free there (both start at 128 KiB and adapt
only partly). The next step then touches fresh pages, and the kernel maps and
zero-fills each 4 KiB page on its first touch: a minor page fault. On the
benchmark CNN (batch 64, 28x28; ``benchmarks/bench_training_step.py``) that
was thousands of faults per step and a noticeable share of its time in the
kernel, mostly in the forward pass, whose arrays are the first to reuse the
freed memory (benchmarks/README.md, "One training step").

:func:`keep_freed_memory` raises both thresholds with ``mallopt``, the knob
glibc provides for this (the ``MALLOC_TRIM_THRESHOLD_`` and
``MALLOC_MMAP_THRESHOLD_`` environment variables set the same values, but
only before the process starts). Freed pages then stay in the heap and the
next step reuses them. The cost: the process keeps its peak memory (one
step's worth of arrays) instead of returning it between steps. It affects
every allocation of the process, PyTorch's included if it runs in the same
process. Other C libraries (macOS, musl) have no ``mallopt``; there it does
nothing and says so by returning False.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# From glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: The largest mmap threshold glibc accepts on 64-bit systems (HEAP_MAX_SIZE / 2).
MAX_MMAP_THRESHOLD = 32 << 20


def keep_freed_memory(trim_threshold: int = 1 << 30, mmap_threshold: int = MAX_MMAP_THRESHOLD) -> bool:
    """Ask glibc to keep up to ``trim_threshold`` free bytes at the top of its
    heap and to serve blocks up to ``mmap_threshold`` bytes from the heap.

    Returns True when both settings took effect, False where the C library
    has no ``mallopt`` (not glibc) or refused a value. Call it once, before
    training; it is idempotent.
    """
    if not 0 <= mmap_threshold <= MAX_MMAP_THRESHOLD:
        raise ValueError(
            f"keep_freed_memory: mmap_threshold must be between 0 and {MAX_MMAP_THRESHOLD} bytes "
            f"(glibc's limit), got {mmap_threshold}"
        )
    if trim_threshold < 0:
        raise ValueError(f"keep_freed_memory: trim_threshold must be >= 0 bytes, got {trim_threshold}")
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt takes an int: clamp so a large trim threshold cannot overflow it.
    trim = min(trim_threshold, 2**31 - 1)
    return bool(mallopt(_M_TRIM_THRESHOLD, trim)) and bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold))


__all__ = ["keep_freed_memory", "MAX_MMAP_THRESHOLD"]
