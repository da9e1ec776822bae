"""Activation recomputation (gradient checkpointing) for any Sequential model.

A normal forward keeps, for the backward, every layer's output (and what the
layers' backward closures hold: dropout masks, im2col columns, ...).
Recomputation trades that memory for compute:

1. **Forward**: cut the layers into segments; run each segment under
   ``no_grad()``, so nothing inside it is kept, and keep only the segment's
   *input*. The segment's output becomes one graph node, "checkpoint".
2. **Backward**: when the gradient reaches that node, run the segment's
   forward again *with* recording, from the kept input, which rebuilds the
   segment's graph; backpropagate the incoming gradient through it (the
   parameters' ``.grad`` fill as usual, their hooks fire, so data parallel
   training is unchanged); hand the input's gradient on to the segment before.

Memory for the activations, with n layers in s segments: about s segment
inputs plus one segment's layers at a time, instead of all n layers'
(s = sqrt(n) gives O(sqrt(n))). Cost: one more forward per segment, about a
third more compute per step. The results are the same bits: the recomputed
forward does the same operations on the same data.

Two kinds of layer remember something of their forward besides their output,
and the replay (:class:`ForwardState`) makes the second forward match the
first:

* **Randomness** (Dropout): the generators' states are saved before the
  forward and put back for the replay, so the same mask is drawn; after the
  replay the generators go back to where they were, so the rest of the run
  draws what it would have drawn without recomputation.
* **Running statistics** (BatchNorm's buffers): the replay updates them a
  second time, so every buffer is saved before the replay and restored after.

The same replay serves the pipeline's ``recompute=True``
(``minidist/parallel/pipeline/held_activations.py``), which keeps each
stage's input.

Usage, like ``torch.utils.checkpoint``::

    out = checkpoint_sequential(model, 3, x)      # 3 segments, the last not recomputed
    model = CheckpointedSequential(model, every=2) # a Sequential recomputing every 2 layers
    out = checkpoint(model[0:4], x)                # any module or function of one tensor
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy

from minidist.nn import init
from minidist.nn.container import Sequential
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter
from minidist.tensor import Tensor, _split_by_requires_grad, enable_grad, is_grad_enabled, no_grad


class ForwardState:
    """What a forward's replay needs to repeat it exactly: the states of the
    random generators the modules may draw from (the default generator of
    :mod:`minidist.nn.init` and any generator a module holds, such as
    ``Dropout(rng=...)``), taken now, before the first forward.

    ``with state.replay():`` runs the second forward with those generator
    states and with every buffer (running statistics) restored afterwards, so
    the replay changes nothing that the first forward already changed."""

    def __init__(self, modules):
        modules = [modules] if isinstance(modules, Module) else list(modules)
        self.modules = modules
        generators = [init.default_generator()]
        for module in _all_modules(modules):
            for value in vars(module).values():
                if isinstance(value, numpy.random.Generator):
                    generators.append(value)
        self.generators = list({id(g): g for g in generators}.values())
        self.states = [g.bit_generator.state for g in self.generators]

    def replay(self):
        return _Replay(self)


class _Replay:
    def __init__(self, state: ForwardState):
        self.state = state

    def __enter__(self):
        state = self.state
        self.current = [g.bit_generator.state for g in state.generators]
        for generator, saved in zip(state.generators, state.states):
            generator.bit_generator.state = saved
        self.buffers = [(buffer, buffer.data.copy())
                        for module in _all_modules(state.modules)
                        for buffer in module.buffers(recurse=False) if buffer is not None]
        return self

    def __exit__(self, *exc):
        for generator, current in zip(self.state.generators, self.current):
            generator.bit_generator.state = current
        for buffer, saved in self.buffers:
            if buffer.data.shape == saved.shape:
                buffer.data[...] = saved
            else:
                buffer.data = saved
        return False


def _all_modules(modules) -> list:
    seen, found = set(), []
    for module in modules:
        for inner in module.modules():
            if id(inner) not in seen:
                seen.add(id(inner))
                found.append(inner)
    return found


def checkpoint(function, inputs, modules=None) -> Tensor:
    """``function(inputs)``, keeping only ``inputs`` for the backward, which
    recomputes the forward. ``function`` is a Module (its parameters and
    buffers are found) or any function of one tensor together with
    ``modules``, the modules it uses (their parameters get gradients, their
    generators and buffers are replayed). Outside grad mode it is just
    ``function(inputs)``."""
    inputs = inputs if isinstance(inputs, Tensor) else Tensor(inputs)
    if modules is None:
        modules = [function] if isinstance(function, Module) else []
    elif isinstance(modules, Module):
        modules = [modules]
    if not is_grad_enabled():
        return function(inputs)
    parameters = list({id(p): p for m in modules for p in m.parameters()
                       if p.requires_grad}.values())
    state = ForwardState(modules)
    with no_grad():
        outputs = function(inputs)

    # The replay records only what requires a gradient when it runs: a split
    # backward's input half (the parameters cleared) rebuilds the input's
    # path alone, its weight half (the input cleared) the parameters' alone.
    @_split_by_requires_grad
    def backward(gradient):
        # A fresh leaf: the replayed graph ends here, and its .grad is what
        # the segment before receives.
        start = Tensor(inputs.data, requires_grad=inputs.requires_grad)
        with state.replay(), enable_grad():
            rebuilt = function(start)
        if rebuilt.requires_grad:
            rebuilt.backward(gradient)
        # The parameters are parents only so that this node is recorded when
        # the input needs no gradient; their .grad was filled just now.
        return (start.grad if inputs.requires_grad else None,) + (None,) * len(parameters)

    return Tensor._make(outputs.data, (inputs, *parameters), backward, "checkpoint")


def segment_layers(layers, segments: int) -> list[list]:
    """Cut ``layers`` into ``segments`` contiguous runs of ceil(n / segments)
    layers (fewer runs when there are fewer layers)."""
    layers = list(layers)
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    size = max(1, math.ceil(len(layers) / segments))
    return [layers[start:start + size] for start in range(0, len(layers), size)]


def _run(layers):
    def run(x):
        for layer in layers:
            x = layer(x)
        return x
    return run


def _checkpointed_forward(groups, x):
    # As torch does: the last segment is run normally, its activations are
    # needed by the backward at once, recomputing them would gain nothing.
    for group in groups[:-1]:
        x = checkpoint(_run(group), x, modules=group)
    return _run(groups[-1])(x) if groups else x


def checkpoint_sequential(model, segments: int, inputs) -> Tensor:
    """``model(inputs)`` for a Sequential (or a list of modules) cut into
    ``segments`` segments, every one but the last recomputed in backward
    (``torch.utils.checkpoint.checkpoint_sequential``)."""
    inputs = inputs if isinstance(inputs, Tensor) else Tensor(inputs)
    return _checkpointed_forward(segment_layers(model, segments), inputs)


class CheckpointedSequential(Sequential):
    """``CheckpointedSequential(model, every=k)``: the same layers as the
    Sequential ``model`` (the same module objects, the same parameter names,
    so state dicts are interchangeable), whose forward recomputes every run
    of ``k`` layers in backward except the last run. Wrap it in
    DistributedDataParallel like any model."""

    def __init__(self, model: Sequential, every: int = 1):
        super().__init__(OrderedDict(model.named_children()))
        if every < 1:
            raise ValueError(f"every must be >= 1 (layers per recomputed segment), got {every}")
        self.every = int(every)

    def forward(self, x):
        layers = list(self)
        groups = [layers[start:start + self.every] for start in range(0, len(layers), self.every)]
        return _checkpointed_forward(groups, x if isinstance(x, Tensor) else Tensor(x))

    def extra_repr(self) -> str:
        return f"every={self.every}"


def kept_for_backward(outputs: Tensor, exclude=()) -> tuple[int, int]:
    """(number, bytes) of the distinct arrays the graph behind ``outputs``
    keeps for its backward: every node's data and the arrays its backward
    closure holds, leaving out the parameters (and whatever else is in
    ``exclude``), which are kept anyway. Views count as their base."""
    excluded = {id(_base(p.data if isinstance(p, Tensor) else p)) for p in exclude}
    arrays, seen, stack = {}, {id(outputs)}, [outputs]

    def note(value):
        if isinstance(value, Parameter):
            return
        if isinstance(value, Tensor):
            value = value.data
        if hasattr(value, "nbytes") and hasattr(value, "shape"):
            base = _base(value)
            if id(base) not in excluded:
                arrays[id(base)] = base

    while stack:
        node = stack.pop()
        note(node)
        for cell in getattr(node._backward, "__closure__", None) or ():
            try:
                note(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        for parent in node._parents:
            if id(parent) not in seen:
                seen.add(id(parent))
                stack.append(parent)
    return len(arrays), sum(int(a.nbytes) for a in arrays.values())


def _base(array):
    while getattr(array, "base", None) is not None and hasattr(array.base, "nbytes"):
        array = array.base
    return array
