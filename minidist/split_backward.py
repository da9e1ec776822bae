"""The backward in two halves: the input's gradient now, the weights' later.

Zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024) split each stage's backward in two. I (the paper's
B) is the gradient with respect to the stage's input, which the previous
stage is waiting for; W is the gradients with respect to the weights, which
only the optimizer step needs, so it can run later, in what would have been
the pipeline's bubbles. For a Linear, y = x W^T + b::

    I:  dx = dy W                    one GEMM
    W:  dW = dy^T x,  db = sum(dy)   one GEMM and a reduction

Usage::

    pending = backward_input(output, gradient, inputs=[x])   # I: x.grad is set
    send(x.grad)                                              # the stage before waits for it
    ...
    pending.backward_weight()                                 # W: the parameters' .grad

The algorithm, on the graph that ``output.backward(gradient)`` would walk:

1. The order. The plain backward takes the nodes in one fixed order (the
   last-in first-out walk of :meth:`Tensor.backward`: a node once all its
   consumers have sent their gradient). Walk it once without computing
   anything, to have that order as a list.
2. The sides. A node is on the input side if one of ``inputs`` can be
   reached from it; every other node that requires a gradient is on the
   weight side: the parameters, and what is computed from them alone (the
   slice of a packed weight, a weight cast to another dtype). A node on the
   input side with a parent on the weight side is a split node: a Linear,
   whose parents are its input x (input side) and its W and b (weight side).
   A weight-side node has weight-side parents only, so the input side never
   receives anything from the weight side.
3. I: go down the order through the input side. A split node's local
   backward is called for its input-side parents. If it is marked
   :func:`~minidist.tensor._split_by_requires_grad` (linear, conv2d, matmul,
   a recomputed segment), its weight-side parents' ``requires_grad`` is
   cleared for that call, so the weight GEMM is not done, and the node is
   kept with the gradient of its output: it is *deferred*. Otherwise (a
   LayerNorm, a BatchNorm, an elementwise op with a parameter: weight
   gradients that are per-feature sums) the backward runs whole and the
   gradients of its weight-side parents are kept: it is *computed*. The
   inputs' ``.grad`` are then complete, their hooks fired.
4. W: go down the same order through the kept split nodes and the weight
   side. A deferred node's backward is called again, its input-side parents
   cleared; a computed one hands on what it kept; the weight side is walked
   as backward() walks it, down to the parameters, whose ``.grad``
   accumulate and whose hooks fire.

Each gradient is the same bits as one ``output.backward(gradient)`` gives:
every local backward computes what it computes there, and since both
halves follow the plain order, a gradient that is a sum (a tied weight's
two uses, a tensor read twice) adds its terms in the plain order. (Step 1
walks as if every local backward returned a gradient for every parent;
where one returns None, as a recomputed segment does for its parameters,
the halves, like backward(), take a node only once it has all its
consumers' gradients and at least one, which leaves the others' order as
it was.)

Cost: I does the input-side work of the plain backward and W the rest, the
same flops together (for a Linear, one GEMM each), plus the walk of step 1
(Python, a step per node). A recomputed segment (:func:`minidist.nn.checkpoint`)
replays its forward in each half, twice in all. Memory between I and W: I
releases the input side of the graph as backward() would, except the split
nodes; what W keeps is counted by :attr:`WeightGradients.nbytes`.
"""

from __future__ import annotations

from minidist import backend
from minidist.tensor import (
    Tensor,
    _call_backward,
    _closure_arrays,
    _is_backend_array,
    _PendingGradients,
    _shape_str,
)


def backward_input(output: Tensor, gradient=None, inputs=None, retain_graph: bool = False) -> WeightGradients:
    """The input half I of ``output.backward(gradient)``: every tensor of
    ``inputs`` gets its gradient accumulated into ``.grad`` (its hooks
    fired), exactly as ``output.backward(gradient)`` would give it, and no
    parameter's ``.grad`` changes. Returns the weight half, W, to run later
    with :meth:`WeightGradients.backward_weight`.

    ``output`` and ``gradient`` are those of :meth:`Tensor.backward` (a
    scalar loss and None, or a gradient of the output's shape), with its
    errors. ``inputs``: a Tensor or a list of them, the leaves with
    ``requires_grad=True`` that the gradient must reach now (a stage's input
    activations); every other leaf that requires a gradient is a weight. A
    first stage, whose input needs no gradient, passes ``inputs=[]`` (or
    None): I then does nothing and W the whole backward. ``retain_graph``:
    as backward()'s, for both halves (False: I releases what only it needs,
    W the rest)."""
    if not isinstance(output, Tensor):
        raise TypeError(f"backward_input: output must be a Tensor, got {type(output).__name__}")
    seed = output._seed_gradient(gradient)  # backward()'s own checks and errors
    inputs = _checked_inputs(inputs)
    consumers = output._count_consumers()
    order = _plain_order(output, consumers)
    in_graph = {id(node) for node in order}
    for position, tensor in inputs:
        if id(tensor) not in in_graph:
            raise ValueError(
                f"backward_input: inputs[{position}] (shape {_shape_str(tensor.shape)}) is not in "
                "the graph of the output: the output was not computed from it (or only through "
                "detach() or no_grad()); pass the leaf the stage's forward started from")
    input_ids = {id(tensor) for _, tensor in inputs}
    input_side = _input_side(order, input_ids)
    # W may hold the gradient arrays I received; an array of the caller's
    # (a pipeline's receive buffer, reused for the next micro-batch) is
    # copied before it is kept.
    caller = gradient.data if isinstance(gradient, Tensor) else gradient
    keep = _Keeper(caller if _is_backend_array(caller) else None)
    walk = _Walk(output, seed, consumers)
    kept = {}
    for node in order:
        if input_side[id(node)] and walk.is_ready(node):
            piece = _input_half(walk, node, input_side, keep, retain_graph)
            if piece is not None:
                kept[id(node)] = piece
    steps = [kept[id(node)] if id(node) in kept else node
             for node in order if id(node) in kept or not input_side[id(node)]]
    walk.forget_all_but({id(node) for node in order if not input_side[id(node)]}, keep)
    parameters = [node for node in order if not input_side[id(node)] and node._backward is None
                  and not node._freed]
    return WeightGradients(walk, steps, parameters, retain_graph)


class WeightGradients:
    """The weight half W of a split backward, waiting to run: what
    :func:`backward_input` returns.

    ``backward_weight()`` runs it, once. ``done`` says whether it has run.
    ``nbytes`` is what it keeps alive until then (0 after)."""

    def __init__(self, walk, steps, parameters, retain_graph: bool):
        self._walk = walk
        self._steps = steps            # the W order: deferred and computed nodes, weight-side nodes
        self._parameters = parameters  # kept by the model anyway: left out of nbytes
        self._retain_graph = retain_graph
        self._started = False
        self._done = False

    @property
    def done(self) -> bool:
        """Whether :meth:`backward_weight` has run to its end."""
        return self._done

    def backward_weight(self) -> None:
        """W: every leaf of the graph that requires a gradient and was not an
        input (the parameters) gets its gradient accumulated into ``.grad``,
        its hooks (``register_hook``, post-accumulate) fired, in the order
        ``output.backward(gradient)`` would have; then everything kept is
        released (and the graph, unless ``retain_graph=True``)."""
        if self._started:
            raise RuntimeError(
                "backward_weight() was already called for this split backward"
                + ("" if self._done else " (and stopped on an error)")
                + ": its weight half runs once; to go through the graph again, call "
                "backward_input(..., retain_graph=True) the first time, then backward_input again")
        self._refuse_freed()
        self._started = True
        walk, retain_graph = self._walk, self._retain_graph
        try:
            for step in self._steps:
                if isinstance(step, _Deferred):
                    step.weight_half(walk)
                elif isinstance(step, _Computed):
                    for parent, grad in step.pairs:
                        walk.receive(parent, grad, step.new_arrays)
                    step.pairs = ()
                elif walk.is_ready(step):
                    _whole(walk, step, retain_graph)
        finally:
            self._steps, self._walk, self._parameters = [], None, []
        self._done = True

    def arrays(self) -> list:
        """The distinct arrays this weight half keeps alive (each by the
        memory it keeps: a view as its base), the parameters' data left out;
        see :attr:`nbytes`. Empty once it has run."""
        excluded = {id(_root(param.data)) for param in self._parameters}
        found = {}

        def note(array):
            if array is None or not hasattr(array, "nbytes"):
                return
            root = _root(array)
            if id(root) not in excluded:
                found.setdefault(id(root), root)

        for step in self._steps:
            if isinstance(step, _Deferred):
                note(step.gradient)
                saved, seen = [], set()
                _closure_arrays(step.backward, saved, seen)
                for array in saved:
                    note(array)
                for parent in step.parents:
                    note(parent.data)
            elif isinstance(step, _Computed):
                for _, grad in step.pairs:
                    note(grad)
            else:
                note(step.data)
                for array in step.saved_arrays():
                    note(array)
        if self._walk is not None:
            for grad in self._walk.gradients.grads.values():
                note(grad)
        return list(found.values())

    @property
    def nbytes(self) -> int:
        """Bytes kept alive for W alone: every distinct byte of

        * the gradients kept at the split nodes: a deferred node's output
          gradient (dy of a Linear), a computed node's weight-side
          gradients (a LayerNorm's dweight and dbias);
        * what the deferred nodes' backwards saved, and their parents' data
          (a Linear's x, a convolution's im2col columns and its input);
        * the weight-side nodes' data and saved arrays (a slice of a packed
          weight, a cast weight), and the output's gradient when the whole
          backward is W's (a first stage).

        Not counted: the parameters' data, which the model keeps anyway.
        Counted even where someone else holds it too (the stage's input, if
        the caller keeps it): after I, W is what needs it. A view counts as
        the array it views, each byte once. With ``retain_graph=True`` the
        rest of the graph stays alive as well, not counted here. 0 after W."""
        return sum(int(array.nbytes) for array in self.arrays())

    def __repr__(self):
        if self._started:
            return f"WeightGradients({'done' if self._done else 'failed'})"
        deferred = sum(isinstance(step, _Deferred) for step in self._steps)
        computed = sum(isinstance(step, _Computed) for step in self._steps)
        return (f"WeightGradients(deferred={deferred}, computed={computed}, "
                f"weight_side={len(self._steps) - deferred - computed}, nbytes={self.nbytes})")

    def _refuse_freed(self):
        """Refuse, before any work, a weight half whose graph a backward()
        released after the input half ran."""
        for step in self._steps:
            node = step.node if isinstance(step, _Deferred) else step if isinstance(step, Tensor) else None
            if node is not None and node._freed:
                raise RuntimeError(
                    f"backward_weight(): a '{node._op}' node of the graph its weight half needs was "
                    "freed, by a backward() through the graph after backward_input; use "
                    "backward_input(..., retain_graph=True) if the graph must be gone through again")


# --------------------------------------------------------------------------
# The two halves at one node


class _Deferred:
    """A split node whose weight half runs in W: its backward, its parents,
    which of them are on the weight side, and the gradient of its output.
    W needs the node's backward, not the node: without ``retain_graph`` the
    node is released at once (its data may go, and a backward() through it
    finds a freed graph rather than computing its weight gradient twice);
    with it, the node is kept, and W checks that no backward() freed it."""

    __slots__ = ("node", "backward", "parents", "weight_side", "gradient", "new_arrays")

    def __init__(self, node, gradient, weight_side, new_arrays, retain_graph: bool):
        self.node = node if retain_graph else None
        self.backward = node._backward
        self.parents = node._parents
        self.weight_side = weight_side
        self.gradient = gradient
        self.new_arrays = new_arrays

    def weight_half(self, walk) -> None:
        input_side = tuple(not weight for weight in self.weight_side)
        results = _without_gradients(self.backward, self.gradient, self.parents, input_side)
        for parent, grad, weight in zip(self.parents, results, self.weight_side):
            if parent.requires_grad and weight:
                walk.receive(parent, grad, self.new_arrays)
        self.backward = self.parents = self.gradient = None


class _Computed:
    """A split node whose backward ran whole in I: the gradients its
    weight-side parents received, handed on in W at the node's place."""

    __slots__ = ("pairs", "new_arrays")

    def __init__(self, pairs, new_arrays):
        self.pairs = pairs
        self.new_arrays = new_arrays


def _input_half(walk, node, input_side, keep, retain_graph: bool):
    """I at one node of the input side: a node without weight-side parents
    as backward() runs it (None returned); a split node's input half, and
    what W needs of it."""
    weight_side = tuple(parent.requires_grad and not input_side[id(parent)] for parent in node._parents)
    if not any(weight_side):
        _whole(walk, node, retain_graph)
        return None
    grad, owned = walk.take(node)
    if node._grad_hooks:
        grad, owned = node._run_grad_hooks(grad, owned)
    if node._retain:
        node._accumulate(grad)
    local = node._backward
    new_arrays = getattr(local, "gives_new_arrays", False)
    if getattr(local, "splits_by_requires_grad", False):
        # Not handed as owned: W reads this gradient again.
        results = _without_gradients(local, grad, node._parents, weight_side)
        for parent, parent_grad, weight in zip(node._parents, results, weight_side):
            if parent.requires_grad and not weight:
                walk.receive(parent, parent_grad, new_arrays)
        piece = _Deferred(node, keep(grad), weight_side, new_arrays, retain_graph)
        if not retain_graph:
            node._release()
        return piece
    pairs = []
    for parent, parent_grad in zip(node._parents, _call_backward(local, grad, owned)):
        if parent.requires_grad:
            if input_side[id(parent)]:
                walk.receive(parent, parent_grad, new_arrays)
            else:
                pairs.append((parent, keep(parent_grad)))
    if not retain_graph:
        node._release()
    return _Computed(pairs, new_arrays)


def _whole(walk, node, retain_graph: bool) -> None:
    """One step of :meth:`Tensor.backward`, at a node whose parents are all
    on one side."""
    grad, owned = walk.take(node)
    if node._grad_hooks:
        grad, owned = node._run_grad_hooks(grad, owned)
    if node._backward is None:
        node._reach_leaf(grad)
        return
    if node._retain:
        node._accumulate(grad)
    local = node._backward
    new_arrays = getattr(local, "gives_new_arrays", False)
    for parent, parent_grad in zip(node._parents, _call_backward(local, grad, owned)):
        if parent.requires_grad:
            walk.receive(parent, parent_grad, new_arrays)
    if not retain_graph:
        node._release()


def _without_gradients(local, grad, parents, cleared):
    """``local(grad)`` with the ``requires_grad`` of the parents flagged in
    ``cleared`` off for the call (and back on after, whatever happens),
    checking that the backward computed nothing for them."""
    off = list({id(parent): parent for parent, flag in zip(parents, cleared)
                if flag and parent.requires_grad}.values())
    for parent in off:
        parent.requires_grad = False
    try:
        results = tuple(local(grad))
    finally:
        for parent in off:
            parent.requires_grad = True
    for parent_grad, flag in zip(results, cleared):
        if flag and parent_grad is not None:
            raise RuntimeError(
                f"a local backward marked _split_by_requires_grad "
                f"({getattr(local, '__qualname__', local)}) computed a gradient for a parent whose "
                "requires_grad was off: it must check parent.requires_grad when it runs, or lose "
                "the mark")
    return results


# --------------------------------------------------------------------------
# The walk


class _Walk:
    """What backward() keeps while it walks: the gradients received by nodes
    not reached yet, how many consumers each node still waits for, and the
    nodes whose gradient is complete."""

    __slots__ = ("gradients", "consumers", "ready")

    def __init__(self, root, seed, consumers):
        self.gradients = _PendingGradients(root, seed)
        self.consumers = consumers
        self.ready = {id(root)}

    def is_ready(self, node) -> bool:
        return id(node) in self.ready

    def take(self, node):
        self.ready.discard(id(node))
        return self.gradients.take(node)

    def receive(self, parent, grad, new_array: bool) -> None:
        """``parent`` receives ``grad`` from one of its consumers (as in
        :meth:`Tensor.backward`: ready once all have sent theirs)."""
        self.gradients.add(parent, grad, new_array)
        key = id(parent)
        self.consumers[key] -= 1
        if self.consumers[key] == 0 and self.gradients.has(parent):
            self.ready.add(key)

    def forget_all_but(self, keys, keep) -> None:
        """After I: only the weight side's bookkeeping is still needed (an
        input-side node still waiting is one backward() would never reach)."""
        grads = self.gradients.grads
        for key in [key for key in grads if key not in keys]:
            del grads[key]
            self.gradients.owned.discard(key)
        for key in grads:
            grads[key] = keep(grads[key])
        self.consumers = {key: count for key, count in self.consumers.items() if key in keys}
        self.ready &= keys


def _plain_order(root, consumers) -> list:
    """The nodes in the order :meth:`Tensor.backward` takes them: its
    last-in first-out walk, a node once every consumer has sent its
    gradient, run on the counts alone."""
    waiting = dict(consumers)
    order, ready = [], [root]
    while ready:
        node = ready.pop()
        order.append(node)
        for parent in node._parents:
            if parent.requires_grad:
                waiting[id(parent)] -= 1
                if waiting[id(parent)] == 0:
                    ready.append(parent)
    return order


def _input_side(order, input_ids) -> dict:
    """For every node of ``order``, whether one of the inputs can be
    reached from it (parents come after their consumers in ``order``)."""
    side = {}
    for node in reversed(order):
        side[id(node)] = id(node) in input_ids or any(
            side.get(id(parent), False) for parent in node._parents if parent.requires_grad)
    return side


def _checked_inputs(inputs) -> list:
    """``[(position, tensor)]``, each a leaf that requires a gradient."""
    if inputs is None:
        return []
    if isinstance(inputs, Tensor):
        inputs = [inputs]
    checked, seen = [], set()
    for position, tensor in enumerate(inputs):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"backward_input: inputs[{position}] must be a Tensor (a leaf the "
                            f"stage's input gradient goes to), got {type(tensor).__name__}")
        shape = _shape_str(tensor.shape)
        if tensor._freed:
            raise ValueError(f"backward_input: inputs[{position}] (shape {shape}) is a node of a "
                             "graph already freed by a backward(), not a leaf; pass the leaf the "
                             "stage's forward started from")
        if tensor._backward is not None:
            raise ValueError(
                f"backward_input: inputs[{position}] (shape {shape}) is not a leaf but the output "
                f"of '{tensor._op}'; pass the leaf the stage's forward started from, e.g. "
                "x = Tensor(received, requires_grad=True) made before the forward")
        if not tensor.requires_grad:
            raise ValueError(
                f"backward_input: inputs[{position}] (shape {shape}) does not require grad, so no "
                "gradient can reach it; make it with requires_grad=True, or leave it out "
                "(inputs=[] for a first stage, whose input needs no gradient: W then does the "
                "whole backward)")
        if id(tensor) not in seen:
            seen.add(id(tensor))
            checked.append((position, tensor))
    return checked


class _Keeper:
    """What W keeps of I's gradients, as an array of its own where it
    shares memory with the caller's gradient."""

    __slots__ = ("caller",)

    def __init__(self, caller):
        self.caller = caller

    def __call__(self, array):
        if self.caller is None or array is None:
            return array
        shares = getattr(backend.of(array), "may_share_memory", None)
        if shares is None or shares(array, self.caller):
            return array.copy()
        return array


def _root(array):
    """The array whose memory ``array`` keeps alive (a view keeps its base)."""
    while getattr(array, "base", None) is not None and hasattr(array.base, "nbytes"):
        array = array.base
    return array
