"""Copying bytes at full speed around a processor quirk: page-distance aliasing.

What goes wrong. glibc's ``memcpy`` (which NumPy and ``memoryview`` slice
assignment call) moves blocks from about 2 KiB to about half a MiB with the
``rep movsb`` instruction, and Linux copies between processes
(``process_vm_readv``, pipes) with it too. On AMD Zen processors that
instruction runs about ten times slower when the destination starts a few
bytes *after* the source, counted modulo the 4 KiB page (reported as glibc
bug 30994; whether a given glibc still uses ``rep movsb`` here depends on its
version and tunables, and the kernel's copy has no such choice).
In the slow band a copy runs about ten times slower than elsewhere
(benchmarks/results/p2p.md has the figures, ``bench_p2p.py`` the measurement),
and it is the *usual* case for a message: a NumPy array from ``malloc``
starts 16 bytes into a page, a shared-memory slot at the start of one, so a
receiver copying a piece out of its ring into the user's array hit it on
every piece, so a 1 MiB ping-pong took nearly as long as a 4 MiB one.

What we do. A copy whose distance falls in the slow band (``1 <=
(dst - src) % 4096 < SLOW_BAND``) goes through NumPy's ``positive`` loop on
bytes instead: plain vector loads and stores, no ``rep movsb``, as fast as a
good ``memcpy``. Everything else stays ``memcpy``.
A copy the kernel makes (``process_vm_readv``) cannot change its
instruction; the rendezvous reads such a message into a block placed at
distance 0 from the source and copies the block out in user space
(:func:`aligned_block`).

Cost: one subtraction and one comparison per copy; nothing for copies under
:data:`MIN_BYTES`, which ``memcpy`` does without ``rep movsb``.
"""

from __future__ import annotations

import numpy as np

PAGE = 4096
#: Distances 1 .. SLOW_BAND - 1 (mod PAGE) are slow (measured: 8 to 24; the
#: band is kept wider, to 63, as other Zen parts report up to a cache line).
SLOW_BAND = 64
#: Below this glibc does not use ``rep movsb`` (its rep_movsb_threshold is
#: 2 KiB and more), so the check is skipped.
MIN_BYTES = 2048


def slow(dst_address: int, src_address: int) -> bool:
    """True when a copy from ``src_address`` to ``dst_address`` is in the slow band."""
    return 0 < (dst_address - src_address) % PAGE < SLOW_BAND


def copy(dst: np.ndarray, src, dst_address: int, src_address: int) -> None:
    """``dst[:] = src`` for flat uint8 ``dst``; ``src`` any bytes-like of the
    same length. The addresses are those of the first byte of each."""
    if len(dst) >= MIN_BYTES and 0 < (dst_address - src_address) % PAGE < SLOW_BAND:
        if not isinstance(src, np.ndarray):
            src = np.frombuffer(src, np.uint8)
        np.positive(src, out=dst)  # vector loads and stores: not rep movsb
    else:
        dst[:] = src


def aligned_block(raw: np.ndarray, address: int, nbytes: int) -> np.ndarray:
    """A ``nbytes`` view of ``raw`` (flat uint8, ``nbytes + PAGE`` long at least)
    that starts at the same offset in its page as ``address``: a kernel copy
    from ``address`` into it is at distance 0, never in the slow band."""
    start = (address - raw.ctypes.data) % PAGE
    return raw[start:start + nbytes]


def address_of(array: np.ndarray) -> int:
    """The address of an array's first byte."""
    return array.__array_interface__["data"][0]
