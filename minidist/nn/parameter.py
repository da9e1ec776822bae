"""Parameter: a Tensor that a Module learns.

A Parameter is an ordinary :class:`~minidist.tensor.Tensor` with
``requires_grad=True`` whose only extra meaning is *registration*: assigning
one to an attribute of a :class:`~minidist.nn.Module` adds it to that module's
``parameters()``, which is the list an optimizer updates and a data-parallel
strategy all-reduces. Operations on a Parameter return plain Tensors.
"""

from __future__ import annotations

from minidist.tensor import Tensor


class Parameter(Tensor):
    """``Parameter(data, requires_grad=True)``: a learnable Tensor.

    ``data`` is used as it is (a NumPy array keeps its dtype and is not
    copied), so a layer allocates its array, wraps it, then fills it in place
    with an initialiser from :mod:`minidist.nn.init`.
    """

    def __new__(cls, data=None, requires_grad: bool = True):
        # nn.Parameter(dtensor) keeps the layout: the DTensor makes its own
        # Parameter kind (minidist.distributed.tensor), as torch's does.
        as_parameter = getattr(data, "_as_parameter", None)
        if cls is Parameter and as_parameter is not None:
            return as_parameter(requires_grad)
        return super().__new__(cls)

    def __init__(self, data, requires_grad: bool = True):
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()
