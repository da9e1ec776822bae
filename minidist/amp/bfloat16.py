"""bfloat16's rounding, on float32 arrays: what minidist offers instead of a
bfloat16 dtype.

bfloat16 is the top half of a float32: the same sign bit and 8 exponent
bits (so the same range, to about 3.4e38, and no underflow where float32
has none), but 7 stored mantissa bits instead of 23 (about 2 to 3 decimal
digits). float16 splits its 16 bits the other way: 5 exponent bits (range
6e-8 to 65504) and 10 mantissa bits. That is why bfloat16 training needs no
loss scaling and float16 training does.

NumPy has no bfloat16, and ``Module.bfloat16()`` says why minidist does
not use the one the ml_dtypes package adds. To *see* what bfloat16 does to
numbers, :func:`round_to_bfloat16` rounds float32 values to the nearest
bfloat16 (round half to even, as every bfloat16 conversion in torch and
ml_dtypes does) and returns them as float32: bfloat16's numbers, float32's
arithmetic. torch's ``tensor.bfloat16().float()`` computes the same
(tests/core/test_amp.py checks it against ml_dtypes where installed).

Cost: a few integer passes over the array (view, add, mask), one output.
"""

from __future__ import annotations

import numpy

from minidist import backend


def round_to_bfloat16(array):
    """``array`` rounded to bfloat16's precision, as a new float32 array
    (a float64 input is first rounded to float32). NaN stays NaN; a value
    beyond bfloat16's largest finite one (about 3.39e38) becomes inf."""
    xp = backend.of(array)
    values = xp.asarray(array, dtype=numpy.float32)
    bits = values.view(numpy.uint32)
    # Round half to even on the 16 bits that are dropped: add 0x7FFF, plus 1
    # when the lowest kept bit is 1, and let the carry propagate (into the
    # exponent, too: that is how a value rounds up to the next power of two,
    # or to inf).
    lowest_kept = (bits >> 16) & numpy.uint32(1)
    rounded = (bits + numpy.uint32(0x7FFF) + lowest_kept) & numpy.uint32(0xFFFF0000)
    out = rounded.view(numpy.float32)
    # A NaN whose payload sits in the dropped bits would round to inf.
    return xp.where(xp.isnan(values), values, out)
