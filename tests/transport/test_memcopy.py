"""memcopy: the copy that steps around the slow page distance of ``rep movsb``.

Exactness at every distance and length (hypothesis), the band itself, and
the block placed for a kernel copy. That the transports use it, at real
distances, is checked in test_shm_fast_paths.py.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.distributed.transport import memcopy

PAGE = memcopy.PAGE


def _page_aligned(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + PAGE, np.uint8)
    start = (-raw.ctypes.data) % PAGE
    return raw[start:start + nbytes]


def test_the_slow_band_is_one_to_sixty_three_bytes_ahead():
    base = 1 << 20
    assert [memcopy.slow(base + d, base) for d in (0, 1, 16, 63, 64, 2048, 4095)] == [
        False, True, True, True, False, False, False]
    # modulo the page, and only with the destination ahead
    assert memcopy.slow(base + PAGE + 16, base)
    assert not memcopy.slow(base, base + 16)


@settings(max_examples=200, deadline=None)
@given(src_offset=st.integers(0, 200), dst_offset=st.integers(0, 200),
       length=st.one_of(st.integers(0, 5000), st.integers(60_000, 300_000)),
       as_memoryview=st.booleans())
def test_copy_is_exact_at_any_distance_and_touches_nothing_else(src_offset, dst_offset, length,
                                                                as_memoryview):
    source = _page_aligned(length + 256)
    source[:] = np.random.default_rng(length).integers(0, 256, source.size, dtype=np.uint8)
    target = _page_aligned(length + 256)
    target[:] = 7
    src = source[src_offset:src_offset + length]
    dst = target[dst_offset:dst_offset + length]
    memcopy.copy(dst, memoryview(src) if as_memoryview else src,
                 memcopy.address_of(dst), memcopy.address_of(src))
    assert np.array_equal(dst, src)
    assert (target[:dst_offset] == 7).all() and (target[dst_offset + length:] == 7).all()


def test_aligned_block_sits_at_distance_zero_from_its_source():
    raw = np.empty((64 << 10) + PAGE, np.uint8)
    source = np.empty(10_000, np.uint8)
    for shift in (0, 1, 16, 100, 4095):
        address = memcopy.address_of(source) + shift
        block = memcopy.aligned_block(raw, address, 64 << 10)
        assert block.size == 64 << 10
        assert (memcopy.address_of(block) - address) % PAGE == 0
        assert not memcopy.slow(memcopy.address_of(block), address)
