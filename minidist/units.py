"""How minidist writes an amount of bytes: one convention, binary units.

Every table, header and label that shows a size (a message, a buffer, the
memory a rank holds, a link's bytes per second) goes through
:func:`format_bytes`, so that the same number reads the same in the terminal
replay, the GIF, the benchmarks and ``minidist simulate``.

Why binary (KiB = 1024 B, MiB, GiB, TiB). The sizes the course measures and
talks about are powers of two: the 64 MiB all_reduce buffer, 4 KiB pages,
the 1 MiB pipe and shared-memory slots, the benchmark sweeps of 4 KiB to
256 MiB. In binary units they print exactly ("64 MiB"); in decimal ones
they would not ("67.1 MB"). A round decimal input (``--size 100MB``, 10^8
bytes) prints as what it is in these units, "95.4 MiB".

The style. A whole number of the unit prints without decimals ("1 KiB",
"64 MiB", "1023 B"); anything else with one ("1.5 KiB", and "1.0 KiB" for
1,044 B: the decimal says the value was rounded). The unit is the largest
one in which the value is at least 1, after rounding, so 1,048,575 B is
"1.0 MiB", never "1024.0 KiB".

Imports nothing: both minidist and viz use it.
"""

from __future__ import annotations

import math
import numbers

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
STEP = 1024


def format_bytes(nbytes: float) -> str:
    """``0`` -> '0 B', ``1024`` -> '1 KiB', ``1536`` -> '1.5 KiB', ``64 << 20`` -> '64 MiB'.

    Takes whole or fractional bytes (a mean, a rate); a negative, infinite or
    NaN amount raises ValueError, as no count of bytes is one.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real):
        raise TypeError(f"format_bytes takes a number of bytes, not {type(nbytes).__name__}")
    if not math.isfinite(nbytes) or nbytes < 0:
        raise ValueError(f"format_bytes: {nbytes!r} is not an amount of bytes "
                         "(it must be finite and at least 0)")
    if isinstance(nbytes, numbers.Integral):
        nbytes = int(nbytes)  # a NumPy integer, as a Python one: exact at any size
    for power, unit in enumerate(UNITS):
        scale = STEP ** power
        # Whole is asked of the amount itself, not of amount / scale: an int
        # above 2^53 is not exact as a float. (A float divided by a power of
        # two is exact, so floats may take either way.)
        whole = nbytes % scale == 0
        value = nbytes // scale if whole else nbytes / scale
        # Rounded to the one decimal it will be shown with, does it still fit
        # below the next unit? (1023.96 B shows as 1.0 KiB, not 1024.0 B.)
        if (value if whole else round(value, 1)) < STEP or unit == UNITS[-1]:
            return f"{int(value)} {unit}" if whole else f"{value:.1f} {unit}"
    raise AssertionError("unreachable: the last unit always returns")
