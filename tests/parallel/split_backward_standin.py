"""A stand-in for ``minidist.split_backward`` with its interface, used by the
pipeline tests only while that module is not in the tree (:func:`install`
does nothing once it is).

``backward_input(output, gradient, inputs)`` runs the whole backward but
takes the parameters' gradients aside (and their post-accumulate hooks with
them), so that ``inputs`` get their ``.grad`` and the parameters are left
untouched; ``pending.backward_weight()`` accumulates what was taken aside,
as the backward would have, hooks included. The arithmetic is the whole
backward's, bit for bit; what it does not show is the saving: the weights'
gradients are computed in I, not in W.
"""

from __future__ import annotations

import importlib.util
import sys
import types


class _Pending:
    def __init__(self, gradients):
        self._gradients = gradients
        self.nbytes = sum(grad.nbytes for _, grad in gradients)
        self._done = False

    def backward_weight(self) -> None:
        if self._done:
            raise RuntimeError("backward_weight() called twice")
        self._done = True
        for parameter, grad in self._gradients:
            parameter._accumulate(grad)


def _leaves(output, inputs):
    given = {id(tensor) for tensor in inputs}
    found, seen, stack = [], {id(output)}, [output]
    while stack:
        node = stack.pop()
        if node._backward is None and node.requires_grad and id(node) not in given:
            found.append(node)
        for parent in node._parents:
            if parent.requires_grad and id(parent) not in seen:
                seen.add(id(parent))
                stack.append(parent)
    return found


def backward_input(output, gradient=None, inputs=()):
    leaves = _leaves(output, inputs)
    kept = [(leaf, leaf.grad, leaf._hooks) for leaf in leaves]
    for leaf in leaves:
        leaf.grad, leaf._hooks = None, None
    try:
        output.backward(gradient)
        taken = [(leaf, leaf.grad) for leaf in leaves if leaf.grad is not None]
    finally:
        for leaf, grad, hooks in kept:
            leaf.grad, leaf._hooks = grad, hooks
    return _Pending(taken)


def install() -> bool:
    """Make ``minidist.split_backward`` this stand-in if the module is not
    there; True when the stand-in is in use."""
    if importlib.util.find_spec("minidist.split_backward") is not None:
        return False
    module = types.ModuleType("minidist.split_backward")
    module.backward_input = backward_input
    module.__doc__ = __doc__
    sys.modules["minidist.split_backward"] = module
    return True
