"""The one way minidist writes an amount of bytes: binary units, whole values
without decimals, the rest with one, and the unit chosen after rounding."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.units import UNITS, format_bytes


@pytest.mark.parametrize("nbytes, text", [
    (0, "0 B"),
    (1, "1 B"),
    (1023, "1023 B"),
    (1024, "1 KiB"),
    (1044, "1.0 KiB"),  # not exactly 1 KiB: the decimal says it was rounded
    (1536, "1.5 KiB"),
    (4096, "4 KiB"),
    (1023.96, "1.0 KiB"),  # would round to "1024.0 B": the next unit instead
    ((1 << 20) - 1, "1.0 MiB"),  # 1023.999 KiB, not "1024.0 KiB"
    (64 << 20, "64 MiB"),
    (100_000_000, "95.4 MiB"),
    (1 << 30, "1 GiB"),
    (3 << 40, "3 TiB"),
    (5 << 50, "5120 TiB"),  # the largest unit takes whatever is above it
    (12.5, "12.5 B"),  # a mean or a rate need not be whole
    (np.int64(256), "256 B"),
    (np.float32(2048.0), "2 KiB"),
])
def test_boundaries_and_style(nbytes, text):
    assert format_bytes(nbytes) == text


@pytest.mark.parametrize("nbytes", [-1, -0.5, math.inf, math.nan])
def test_what_is_no_amount_of_bytes_is_refused(nbytes):
    with pytest.raises(ValueError, match="not an amount of bytes"):
        format_bytes(nbytes)


@pytest.mark.parametrize("nbytes", ["1024", None, True])
def test_what_is_no_number_is_refused(nbytes):
    with pytest.raises(TypeError, match="number of bytes"):
        format_bytes(nbytes)


@given(st.integers(0, 1 << 60))
def test_the_text_reads_back_to_the_amount(nbytes):
    """Against a reference: the shown number times its unit is the amount,
    exactly when whole and within the shown rounding otherwise, and in
    [1, 1024) of its unit (0 aside; the largest unit has no top)."""
    number, unit = format_bytes(nbytes).split(" ")
    scale = 1024 ** UNITS.index(unit)
    shown = float(number)
    if "." in number:
        # Rounded to one decimal: at most half a unit of it off (1792 B is 1.75 KiB,
        # shown 1.8: exactly half, give or take the float arithmetic).
        assert abs(shown * scale - nbytes) <= 0.05 * scale * (1 + 1e-9)
    else:
        assert int(number) * scale == nbytes
    assert nbytes == 0 or 1 <= shown
    assert unit == UNITS[-1] or shown < 1024
