"""FSDP2's mixed precision: which dtype each of a unit's arrays has
(torch's ``torch.distributed.fsdp.MixedPrecisionPolicy``).

The sharded parameters stay in their own dtype (float32 master shards: the
optimizer updates them); the policy says what the copies around them are:

* ``param_dtype``: the dtype a unit's shards are cast to *before* the
  all_gather, so the gathered, unsharded weights the module computes with
  are in it (and the all_gather sends its bytes: float16 halves them);
* ``reduce_dtype``: the dtype the gradients are reduce_scattered (and, with
  HSDP, all-reduced) in, then cast to the shard's dtype and added to its
  ``.grad``; None: ``param_dtype`` (torch's rule);
* ``output_dtype``: the dtype the unit's floating point outputs are cast to
  (None: left as computed);
* ``cast_forward_inputs``: the unit's floating point inputs cast to
  ``param_dtype`` before its forward (minidist's layers compute in their
  weights' dtype and refuse to mix).

minidist has no bfloat16 dtype (``Module.bfloat16()`` says why): a policy
asking for it is refused, with float16 as the way out. A float16 unit's
gradients can underflow; torch pairs float16 with a gradient scaler, and so
does :mod:`minidist.amp`.

Cost: the casts are one pass over the arrays they cast; the messages are
sized by the dtypes chosen (the all_gather by ``param_dtype``, the
reduce_scatter by ``reduce_dtype``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _floating(value, what: str):
    if value is None:
        return None
    if "bfloat16" in str(getattr(value, "__name__", value)):
        raise TypeError(f"MixedPrecisionPolicy({what}=bfloat16): minidist has no bfloat16 dtype "
                        "(Module.bfloat16() says why); use numpy.float16 (with a GradScaler "
                        "from minidist.amp) or numpy.float32")
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or not np.issubdtype(dtype, np.floating):
        raise TypeError(f"MixedPrecisionPolicy({what}={value!r}): give a floating dtype "
                        "(numpy.float16, numpy.float32, numpy.float64) or None")
    return dtype


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None,
    output_dtype=None, cast_forward_inputs=True)``, torch's fields and
    defaults (the module docstring); dtypes are NumPy's (``numpy.float16``)."""

    param_dtype: object = None
    reduce_dtype: object = None
    output_dtype: object = None
    cast_forward_inputs: bool = True

    def __post_init__(self):
        for name in ("param_dtype", "reduce_dtype", "output_dtype"):
            object.__setattr__(self, name, _floating(getattr(self, name), name))

    def compute_dtype(self, master) -> np.dtype:
        """The unsharded weights' dtype for a shard of dtype ``master``."""
        return np.dtype(master) if self.param_dtype is None else self.param_dtype

    def gradient_dtype(self, master) -> np.dtype:
        """The dtype gradients are reduced in: reduce_dtype, else param_dtype."""
        if self.reduce_dtype is not None:
            return self.reduce_dtype
        return self.compute_dtype(master)
