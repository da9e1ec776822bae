"""Reduction operators, named as in torch.distributed.

A reduction combines two arrays element by element into the first:
``ufunc(buffer, incoming, out=buffer)``. ``AVG`` is not an element-wise
combination of two arrays (it is a SUM followed by one division by the group
size), so the point-to-point layer refuses it and collectives handle it.
"""

from __future__ import annotations

import enum

import numpy as np


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"

    # Members are singletons compared by identity, so the C identity hash is
    # exact and several times cheaper than Enum's (a Python call per lookup
    # on every collective call's caches).
    __hash__ = object.__hash__


_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}


def parse(op):
    """``op`` with a name ("sum", "MAX", ...) turned into its :class:`ReduceOp`;
    ReduceOps and ufuncs are returned as they are."""
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            raise ValueError(f"unknown reduction {op!r}; choose one of "
                             f"{[o.name for o in ReduceOp]}") from None
    return op


def ufunc_of(op) -> np.ufunc:
    """The binary NumPy ufunc that combines two arrays for ``op``.

    Accepts a :class:`ReduceOp`, its name ("sum", "max", ...), or any binary
    NumPy ufunc (``np.add``, ``np.logaddexp``, ...).
    """
    if isinstance(op, np.ufunc):
        if op.nin != 2 or op.nout != 1:
            raise ValueError(f"a reduction needs a binary ufunc (2 inputs, 1 output); {op.__name__} "
                             f"takes {op.nin} and gives {op.nout}")
        return op
    op = parse(op)
    if op is ReduceOp.AVG:
        raise ValueError(
            "ReduceOp.AVG is a SUM followed by a division by the group size, not an "
            "element-wise combination; receive with ReduceOp.SUM and divide once at the end"
        )
    if op not in _UFUNCS:
        raise TypeError(f"op must be a ReduceOp, its name, or a binary NumPy ufunc; got {op!r}")
    return _UFUNCS[op]
