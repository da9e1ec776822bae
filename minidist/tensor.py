"""The autograd Tensor: an array that remembers how it was made.

Every operation builds a new Tensor and, next to its forward computation,
defines its *local* backward: given the gradient of the loss with respect to
its output, the gradients with respect to its inputs (the chain rule, one op
at a time, in the style of micrograd). ``loss.backward()`` orders the graph
topologically and calls the local backwards from the loss down to the leaves,
where gradients are accumulated in place into ``tensor.grad``.

The arrays come from :mod:`minidist.backend` (NumPy, or CuPy on a GPU), so
``tensor.data`` and ``tensor.grad`` are plain backend arrays.

Conventions, as a PyTorch user expects:

* Python numbers and lists become float32; NumPy arrays keep their dtype (so
  tests can use float64), unless ``dtype=`` says otherwise.
* Gradients accumulate: call ``optimizer.zero_grad()`` between steps.
* The graph is freed after ``backward()`` unless ``retain_graph=True``;
  a second backward through a freed graph raises.
* Broadcasting works as in NumPy, and every backward sums the gradient back
  to the input's shape.
"""

from __future__ import annotations

import functools

import numpy

from minidist import backend

# --------------------------------------------------------------------------
# Gradient mode


_grad_enabled = True


def is_grad_enabled() -> bool:
    return _grad_enabled


class no_grad:
    """Context manager (and decorator) that records no graph: for evaluation
    and for optimizer updates, which must not become part of the next step's
    graph."""

    def __enter__(self):
        global _grad_enabled
        self._previous = _grad_enabled
        _grad_enabled = False
        return self

    def __exit__(self, *exc):
        global _grad_enabled
        _grad_enabled = self._previous
        return False

    def __call__(self, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with no_grad():
                return function(*args, **kwargs)

        return wrapper


class enable_grad(no_grad):
    """Context manager (and decorator) that records the graph again, even
    inside ``no_grad()``: activation recomputation rebuilds a segment's graph
    during a backward that may run with recording off."""

    def __enter__(self):
        global _grad_enabled
        self._previous = _grad_enabled
        _grad_enabled = True
        return self

    def __call__(self, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with enable_grad():
                return function(*args, **kwargs)

        return wrapper


# --------------------------------------------------------------------------
# Helpers


def _unbroadcast(grad, shape):
    """Sum ``grad`` over the axes broadcasting added, back to ``shape``.

    Broadcasting copies an input along new leading axes and along axes of
    size 1; the gradient of a copy is the sum of the copies' gradients.
    """
    if grad.shape == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    if extra > 0:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, size in enumerate(shape) if size == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad.reshape(shape)


def _is_float(dtype) -> bool:
    return numpy.issubdtype(numpy.dtype(dtype), numpy.floating)


def _as_array(data, dtype=None):
    xp = backend.get()
    if isinstance(data, Tensor):
        data = data.data
    module = type(data).__module__
    if isinstance(data, numpy.ndarray) or module.startswith("cupy"):
        array = data
        if backend.of(array) is not xp:
            # Data created on the other backend follows the selected one.
            array = xp.asarray(backend.to_numpy(array))
        if dtype is not None and array.dtype != dtype:
            array = array.astype(dtype)
        return array
    if isinstance(data, numpy.generic):
        return xp.asarray(data, dtype=dtype)
    # Python numbers and (nested) lists: float32 unless told otherwise.
    return xp.asarray(data, dtype=dtype if dtype is not None else numpy.float32)


def _owned_gradients(overwrites: bool = False):
    """Mark a local backward for the autograd's gradient ownership.

    Every backward marked this way returns new arrays (or views of new
    arrays), a different one per parent, that nothing else holds: the engine
    may then let the node that receives one overwrite it. With
    ``overwrites=True`` the backward also takes ``owned=True`` when the
    gradient it receives is such an array, and may then compute its result
    in that array instead of a new one. An elementwise backward saves a pass
    of writes to fresh memory that way. Unmarked backwards are
    never handed an owned gradient and their results are never overwritten:
    they may return ``g`` itself, or a view of it, to several parents."""

    def mark(backward):
        backward.gives_new_arrays = True
        backward.may_overwrite_grad = overwrites
        return backward

    return mark


def _split_by_requires_grad(backward):
    """Mark a local backward whose weight half is worth running later
    (:mod:`minidist.split_backward`, the zero-bubble pipelines' I and W).

    A backward marked this way computes a parent's gradient only if that
    parent requires one, reading ``parent.requires_grad`` when it runs, and
    gives the input's gradient the same bits whether the parameters' are
    computed or not, and the other way round. The split backward calls it
    twice: in the input half with the parameters' ``requires_grad`` cleared
    (only the input's gradient is computed), in the weight half with the
    input's cleared. Mark only the backwards whose weight gradient is
    GEMM-sized (linear, conv2d, matmul; a recomputed segment, whose replay
    holds them): for the others (a LayerNorm's, a BatchNorm's, an
    elementwise product's per-feature sums) the input half computes
    everything at once and keeps the small weight gradients, which holds
    less than the output gradient and saved inputs that deferring keeps."""
    backward.splits_by_requires_grad = True
    return backward


#: Called with every new node's parents once DTensors exist
#: (:mod:`minidist.distributed.tensor` sets it): an op on a DTensor that has
#: no placement rule is refused there, instead of computing on the local
#: shard alone as if it were the whole. None until then: no cost.
_placement_guard = None


def set_placement_guard(guard) -> None:
    """Install the check every new node's parents go through (a DTensor's)."""
    global _placement_guard
    _placement_guard = guard


#: name -> the function computing ``minidist.nn.functional.<name>`` on
#: DTensors, filled by :mod:`minidist.distributed.tensor.ops` when it is
#: imported (nn/ sits below minidist.distributed and may not import it). A
#: function of nn.functional asks ``x._is_distributed`` of its tensor
#: arguments (a class attribute: one look-up each, False on a Tensor) and
#: hands the call here only when one is a DTensor.
placement_rules: dict = {}


def distributed_call(name, *args, **kwargs):
    """``minidist.nn.functional.<name>(*args)`` on DTensors, by its placement
    rule; a clear refusal where the rules are not loaded."""
    rule = placement_rules.get(name)
    if rule is None:
        raise TypeError(f"{name} on a DTensor: no placement rule for it; the rules are listed in "
                        f"minidist.distributed.tensor.ops; call .full_tensor() or .to_local() first")
    return rule(*args, **kwargs)


class RemovableHandle:
    """What ``register_*hook`` returns: ``remove()`` takes the hook out again
    (torch's ``torch.utils.hooks.RemovableHandle``; also a context manager)."""

    def __init__(self, hooks, hook):
        self._hooks = hooks
        self._hook = hook
        hooks.append(hook)

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class _PendingGradients:
    """The gradients backward has received for nodes it has not reached yet,
    and the ownership bookkeeping of :func:`_owned_gradients`: which of them
    no one else holds (a sum of two gradients, or what a backward marked
    ``gives_new_arrays`` returned), so that a backward marked
    ``may_overwrite_grad`` may receive one with ``owned=True`` and compute
    its result in it."""

    __slots__ = ("grads", "owned")

    def __init__(self, root, gradient):
        self.grads = {id(root): gradient}
        self.owned = set()

    def take(self, node):
        """``(gradient, whether no one else holds it)``, no longer pending."""
        key = id(node)
        owned = key in self.owned
        self.owned.discard(key)
        return self.grads.pop(key), owned

    def has(self, node) -> bool:
        return id(node) in self.grads

    def add(self, parent, grad, new_array: bool) -> None:
        """Add a gradient ``parent`` receives; ``new_array``: from a backward
        marked ``gives_new_arrays``."""
        if grad is None:
            return
        key = id(parent)
        if key in self.grads:
            self.grads[key] = self.grads[key] + grad
            self.owned.add(key)
        else:
            self.grads[key] = grad
            if new_array:
                self.owned.add(key)


def _call_backward(local, grad, owned: bool):
    """A node's local backward on ``grad``; ``owned=True`` where it may
    compute its result in ``grad`` (see :func:`_owned_gradients`)."""
    if owned and getattr(local, "may_overwrite_grad", False):
        return local(grad, owned=True)
    return local(grad)


def _shape_str(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


# --------------------------------------------------------------------------
# The Tensor


class Tensor:
    """An n-dimensional array with an optional gradient.

    >>> x = Tensor([[1.0, 2.0]], requires_grad=True)
    >>> y = (x * x).sum()
    >>> y.backward()
    >>> x.grad
    array([[2., 4.]], dtype=float32)
    """

    __slots__ = (
        "data",
        "grad",
        "requires_grad",
        "name",
        "_parents",
        "_backward",
        "_op",
        "_freed",
        "_retain",
        "_hooks",
        "_grad_hooks",
        "__weakref__",
    )
    # NumPy defers to our reflected operators (array * tensor -> Tensor).
    __array_priority__ = 1000
    #: True on a DTensor: nn.functional hands the call to its placement rule
    _is_distributed = False

    def __init__(self, data, requires_grad: bool = False, dtype=None, name: str | None = None):
        self.data = _as_array(data, dtype)
        if requires_grad and not _is_float(self.data.dtype):
            raise TypeError(
                f"only floating-point tensors can require gradients, got dtype {self.data.dtype}; "
                "create it with dtype=numpy.float32 (or float64)"
            )
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self.name = name
        self._parents = ()
        self._backward = None
        self._op = ""
        self._freed = False
        self._retain = False
        self._hooks = None
        self._grad_hooks = None

    # -- construction of graph nodes ------------------------------------
    @staticmethod
    def _make(data, parents, backward, op):
        """A new node: ``backward(grad_out)`` returns one gradient (or None)
        per parent. Outside grad mode, or when no parent needs a gradient,
        nothing is recorded and the closure is dropped at once."""
        if _placement_guard is not None:
            _placement_guard(parents, op)
        out = Tensor.__new__(Tensor)
        out.data = data
        out.grad = None
        out.name = None
        out._freed = False
        out._retain = False
        out._hooks = None
        out._grad_hooks = None
        out._op = op
        if _grad_enabled and any(p.requires_grad for p in parents):
            out.requires_grad = True
            out._parents = parents
            out._backward = backward
        else:
            out.requires_grad = False
            out._parents = ()
            out._backward = None
        return out

    def _wrap(self, other):
        if isinstance(other, Tensor):
            return other
        if isinstance(other, (int, float, bool)):
            # A Python number takes this tensor's dtype, as in NumPy 2.
            return Tensor(backend.of(self.data).asarray(other, dtype=self.data.dtype))
        return Tensor(other)

    # -- properties -----------------------------------------------------
    @property
    def shape(self):
        return self.data.shape

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def size(self):
        return self.data.size

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def is_leaf(self) -> bool:
        return self._backward is None and not self._freed

    @property
    def T(self):
        return self.transpose()

    def numel(self) -> int:
        return int(self.data.size)

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        body = numpy.array2string(backend.to_numpy(self.data), precision=4, separator=", ")
        return f"Tensor({body}, dtype={self.data.dtype}{grad})"

    def numpy(self):
        """The data as a NumPy array (copied from the GPU if needed)."""
        return backend.to_numpy(self.data)

    def item(self):
        if self.data.size != 1:
            raise ValueError(
                f"item() needs a tensor with one element, this one has shape {_shape_str(self.shape)}"
            )
        return self.data.reshape(()).item()

    def detach(self) -> Tensor:
        """The same data, cut from the graph."""
        return Tensor(self.data)

    def tolist(self):
        return self.numpy().tolist()

    def argmax(self, axis=None):
        return self.data.argmax(axis=axis)

    def astype(self, dtype) -> Tensor:
        source = self.data.dtype
        return Tensor._make(self.data.astype(dtype), (self,), lambda g: (g.astype(source),), "astype")

    def retain_grad(self):
        """Keep ``.grad`` on this intermediate tensor after backward."""
        self._retain = True
        return self

    def register_hook(self, hook):
        """Call ``hook(grad)`` when this tensor's gradient is complete, before
        it is used: before a leaf accumulates it into ``.grad``, before an
        intermediate tensor's node passes it on. A hook returns None, or an
        array that replaces the gradient (torch's ``Tensor.register_hook``).
        Hooks run in the order they were registered; ``retain_grad()`` keeps
        the gradient as the hooks leave it. Returns a handle with ``remove()``."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that does not require a "
                               "gradient: no gradient will ever reach it")
        if self._grad_hooks is None:
            self._grad_hooks = []
        return RemovableHandle(self._grad_hooks, hook)

    def register_post_accumulate_grad_hook(self, hook):
        """Call ``hook(tensor)`` each time backward has accumulated into this
        leaf's ``.grad``: the moment its gradient is ready. Data parallel
        training uses it to start communicating a bucket while backward goes
        on with earlier layers. Returns a handle with ``remove()``."""
        if self._hooks is None:
            self._hooks = []
        return RemovableHandle(self._hooks, hook)

    def saved_arrays(self) -> list:
        """The arrays this node keeps alive for its backward: what its local
        backward captured (arrays, tensors' data, nested functions' captures).
        Empty for a leaf and for a node freed by backward. The autograd never
        calls it; a memory ledger does, to measure activations without each op
        having to declare what it saves."""
        found, seen = [], set()
        _closure_arrays(self._backward, found, seen)
        return found

    # -- backward -------------------------------------------------------
    def _accumulate(self, grad):
        if self.grad is None:
            # Own copy: the incoming array may be shared with another branch.
            self.grad = grad.astype(self.data.dtype, copy=True)
        else:
            # In place, so a .grad that is a view into a larger buffer (as
            # data-parallel bucketing arranges) receives the sum.
            self.grad += grad
        if self._hooks:
            for hook in list(self._hooks):
                hook(self)

    def _count_consumers(self):
        """For every node that needs a gradient, how many nodes of this graph
        consume it: its gradient is complete once that many have sent theirs."""
        consumers = {}
        seen = {id(self)}
        stack = [self]
        while stack:
            node = stack.pop()
            for parent in node._parents:
                if parent.requires_grad:
                    consumers[id(parent)] = consumers.get(id(parent), 0) + 1
                    if id(parent) not in seen:
                        seen.add(id(parent))
                        stack.append(parent)
        return consumers

    def _seed_gradient(self, gradient):
        """The gradient backward() starts from (ones for a scalar), after
        checking that there is a graph to go through."""
        if not self.requires_grad:
            raise RuntimeError(
                "backward() called on a tensor that does not require grad: none of the "
                "tensors it was computed from has requires_grad=True (or it was computed "
                "inside no_grad())"
            )
        if self._freed:
            raise RuntimeError(
                "backward() through a graph that was already freed: the first backward() "
                "released the saved intermediate values. Call backward(retain_graph=True) "
                "the first time if you need to go through the graph twice."
            )
        if gradient is None:
            if self.data.size != 1:
                raise RuntimeError(
                    f"backward() on a non-scalar tensor of shape {_shape_str(self.shape)} needs "
                    "a gradient of the same shape, e.g. t.backward(numpy.ones_like(t.data)); "
                    "or reduce it first, e.g. t.sum().backward()"
                )
            return backend.of(self.data).ones_like(self.data)
        gradient = _as_array(gradient, self.data.dtype)
        if gradient.shape != self.data.shape:
            raise ValueError(
                f"backward(gradient): gradient shape {_shape_str(gradient.shape)} does not "
                f"match the tensor's shape {_shape_str(self.shape)}"
            )
        return gradient

    def _run_grad_hooks(self, grad, owned: bool):
        """``(grad, owned)`` as this tensor's :meth:`register_hook` hooks
        leave them: a gradient a hook returned is not the engine's to overwrite."""
        for hook in list(self._grad_hooks):
            result = hook(grad)
            if result is not None:
                grad, owned = result, False
        return grad, owned

    def _reach_leaf(self, grad):
        """A node without a local backward: a leaf takes its gradient."""
        if self._freed:
            raise RuntimeError(
                "backward() reached a part of the graph freed by an earlier "
                "backward(); use retain_graph=True on the first call"
            )
        self._accumulate(grad)

    def _release(self):
        """Drop what this node saved for backward (retain_graph=False)."""
        self._backward = None
        self._parents = ()
        self._freed = True

    def backward(self, gradient=None, retain_graph: bool = False):
        """Compute the gradient of this tensor with respect to every leaf that
        requires one, and add it to that leaf's ``.grad``.

        The graph is walked from this tensor down, in dependency order: a node
        runs its local backward once all its consumers have sent their
        gradient (``consumers`` counts them). Ready nodes are taken last-in
        first-out, so a parameter's gradient is accumulated (and its hooks
        fire) as soon as it is complete: the last layer's first, which is what
        lets data parallel training start an all-reduce while backward is
        still working on earlier layers."""
        gradients = _PendingGradients(self, self._seed_gradient(gradient))
        consumers = self._count_consumers()
        ready = [self]
        while ready:
            node = ready.pop()
            grad, owned = gradients.take(node)
            if node._grad_hooks:
                grad, owned = node._run_grad_hooks(grad, owned)
            if node._backward is None:
                node._reach_leaf(grad)
                continue
            if node._retain:
                node._accumulate(grad)  # a copy: grad may be overwritten below
            local = node._backward
            new_arrays = getattr(local, "gives_new_arrays", False)
            for parent, parent_grad in zip(node._parents, _call_backward(local, grad, owned)):
                if parent.requires_grad:
                    gradients.add(parent, parent_grad, new_arrays)
                    consumers[id(parent)] -= 1
                    if consumers[id(parent)] == 0 and gradients.has(parent):
                        ready.append(parent)
            if not retain_graph:
                node._release()

    # -- elementwise arithmetic -----------------------------------------
    def __add__(self, other):
        other = self._wrap(other)
        a, b = self, other

        def backward(g):
            return (
                _unbroadcast(g, a.shape) if a.requires_grad else None,
                _unbroadcast(g, b.shape) if b.requires_grad else None,
            )

        return Tensor._make(a.data + b.data, (a, b), backward, "add")

    def __radd__(self, other):
        return self._wrap(other) + self

    def __sub__(self, other):
        other = self._wrap(other)
        a, b = self, other

        def backward(g):
            return (
                _unbroadcast(g, a.shape) if a.requires_grad else None,
                _unbroadcast(-g, b.shape) if b.requires_grad else None,
            )

        return Tensor._make(a.data - b.data, (a, b), backward, "sub")

    def __rsub__(self, other):
        return self._wrap(other) - self

    def __neg__(self):
        return Tensor._make(-self.data, (self,), lambda g: (-g,), "neg")

    def __mul__(self, other):
        other = self._wrap(other)
        a, b = self, other

        def backward(g):
            return (
                _unbroadcast(g * b.data, a.shape) if a.requires_grad else None,
                _unbroadcast(g * a.data, b.shape) if b.requires_grad else None,
            )

        return Tensor._make(a.data * b.data, (a, b), backward, "mul")

    def __rmul__(self, other):
        return self._wrap(other) * self

    def __truediv__(self, other):
        other = self._wrap(other)
        a, b = self, other

        def backward(g):
            return (
                _unbroadcast(g / b.data, a.shape) if a.requires_grad else None,
                _unbroadcast(-g * a.data / (b.data * b.data), b.shape) if b.requires_grad else None,
            )

        return Tensor._make(a.data / b.data, (a, b), backward, "div")

    def __rtruediv__(self, other):
        return self._wrap(other) / self

    def __pow__(self, exponent):
        a = self
        if isinstance(exponent, Tensor):
            b = exponent
            out = a.data**b.data
            xp = backend.of(out)

            def backward(g):
                grad_a = grad_b = None
                if a.requires_grad:
                    grad_a = _unbroadcast(g * b.data * a.data ** (b.data - 1), a.shape)
                if b.requires_grad:
                    grad_b = _unbroadcast(g * out * xp.log(a.data), b.shape)
                return grad_a, grad_b

            return Tensor._make(out, (a, b), backward, "pow")
        if not isinstance(exponent, (int, float)):
            raise TypeError(f"pow: exponent must be a number or a Tensor, got {type(exponent).__name__}")
        out = a.data**exponent
        return Tensor._make(
            out, (a,), lambda g: (g * exponent * a.data ** (exponent - 1),), "pow"
        )

    def __rpow__(self, base):
        return self._wrap(base) ** self

    def __matmul__(self, other):
        return matmul(self, self._wrap(other))

    def __rmatmul__(self, other):
        return matmul(self._wrap(other), self)

    # Comparisons give plain boolean tensors (no gradient flows through them).
    def __gt__(self, other):
        return Tensor(self.data > _data(other))

    def __ge__(self, other):
        return Tensor(self.data >= _data(other))

    def __lt__(self, other):
        return Tensor(self.data < _data(other))

    def __le__(self, other):
        return Tensor(self.data <= _data(other))

    # Identity-based hashing keeps tensors usable as dict keys and in sets.
    __hash__ = object.__hash__

    # -- elementwise functions ------------------------------------------
    def exp(self):
        out = backend.of(self.data).exp(self.data)
        return Tensor._make(out, (self,), lambda g: (g * out,), "exp")

    def log(self):
        x = self.data
        return Tensor._make(backend.of(x).log(x), (self,), lambda g: (g / x,), "log")

    def sqrt(self):
        out = backend.of(self.data).sqrt(self.data)
        return Tensor._make(out, (self,), lambda g: (g / (2 * out),), "sqrt")

    def tanh(self):
        out = backend.of(self.data).tanh(self.data)
        return Tensor._make(out, (self,), lambda g: (g * (1 - out * out),), "tanh")

    def sigmoid(self):
        xp = backend.of(self.data)
        x = self.data
        # Split by sign so exp never overflows.
        z = xp.exp(-xp.abs(x))
        out = xp.where(x >= 0, 1 / (1 + z), z / (1 + z)).astype(x.dtype, copy=False)
        return Tensor._make(out, (self,), lambda g: (g * out * (1 - out),), "sigmoid")

    def relu(self):
        x = self.data
        xp = backend.of(x)
        mask = x > 0
        # maximum, not x * mask: one float pass instead of a float-by-bool
        # product, and relu(-inf) = 0.
        out = xp.maximum(x, x.dtype.type(0))

        @_owned_gradients(overwrites=True)
        def backward(g, owned=False):
            # A gradient no one else holds (a max-pool's or a convolution's
            # input gradient, usually) is masked in place: no new array is
            # written, about half the time of g * mask (bench_training_step).
            return (xp.multiply(g, mask, out=g) if owned else g * mask,)

        return Tensor._make(out, (self,), backward, "relu")

    def abs(self):
        xp = backend.of(self.data)
        x = self.data
        return Tensor._make(xp.abs(x), (self,), lambda g: (g * xp.sign(x),), "abs")

    def clip(self, min=None, max=None):
        """Values limited to [min, max]; the gradient is passed only where the
        value was inside the range."""
        xp = backend.of(self.data)
        x = self.data
        out = xp.clip(x, min, max)
        inside = xp.ones(x.shape, dtype=bool)
        if min is not None:
            inside &= x >= min
        if max is not None:
            inside &= x <= max
        return Tensor._make(out, (self,), lambda g: (g * inside,), "clip")

    # -- reductions -----------------------------------------------------
    def sum(self, axis=None, keepdims=False):
        x = self.data
        xp = backend.of(x)
        out = x.sum(axis=axis, keepdims=keepdims)

        def backward(g):
            if axis is not None and not keepdims:
                g = xp.expand_dims(g, _normalise_axes(axis, x.ndim))
            return (xp.broadcast_to(g, x.shape),)

        return Tensor._make(out, (self,), backward, "sum")

    def mean(self, axis=None, keepdims=False):
        x = self.data
        count = x.size if axis is None else int(numpy.prod([x.shape[i] for i in _normalise_axes(axis, x.ndim)]))
        return self.sum(axis=axis, keepdims=keepdims) * (1.0 / max(count, 1))

    def _extreme(self, axis, keepdims, take, op):
        x = self.data
        xp = backend.of(x)
        out = take(x, axis=axis, keepdims=True)

        def backward(g):
            if axis is not None and not keepdims:
                g = xp.expand_dims(g, _normalise_axes(axis, x.ndim))
            elif axis is None and not keepdims:
                g = g.reshape((1,) * x.ndim)
            # Ties share the gradient equally, so the sum of gradients is kept.
            mask = x == out
            return (mask * (g / mask.sum(axis=axis, keepdims=True)),)

        result = out if keepdims else (out.reshape(()) if axis is None else out.squeeze(axis=axis))
        return Tensor._make(result, (self,), backward, op)

    def max(self, axis=None, keepdims=False):
        return self._extreme(axis, keepdims, lambda x, **kw: x.max(**kw), "max")

    def min(self, axis=None, keepdims=False):
        return self._extreme(axis, keepdims, lambda x, **kw: x.min(**kw), "min")

    # -- shape ----------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        source = self.shape
        try:
            out = self.data.reshape(shape)
        except ValueError:
            raise ValueError(
                f"cannot reshape a tensor of shape {_shape_str(source)} ({self.size} elements) "
                f"into shape {_shape_str(shape)}"
            ) from None
        return Tensor._make(out, (self,), lambda g: (g.reshape(source),), "reshape")

    def view(self, *shape):
        return self.reshape(*shape)

    def flatten(self, start_dim=0, end_dim=-1):
        """torch's ``Tensor.flatten``: merge dims start_dim..end_dim (negative:
        from the end) into one; a 0-d tensor becomes one element. A reshape."""
        ndim = self.ndim
        if ndim == 0:
            return self.reshape(1)
        if not (-ndim <= start_dim < ndim and -ndim <= end_dim < ndim) \
                or start_dim % ndim > end_dim % ndim:
            raise ValueError(f"flatten: cannot merge dims {start_dim}..{end_dim} of a tensor "
                             f"of shape {_shape_str(self.shape)}")
        start, end = start_dim % ndim, end_dim % ndim
        merged = int(numpy.prod(self.shape[start:end + 1], dtype=numpy.int64))
        return self.reshape(self.shape[:start] + (merged,) + self.shape[end + 1:])

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        xp = backend.of(self.data)
        if not axes:
            axes = tuple(reversed(range(self.ndim)))
        inverse = tuple(numpy.argsort(axes))
        out = xp.transpose(self.data, axes)
        return Tensor._make(out, (self,), lambda g: (xp.transpose(g, inverse),), "transpose")

    def __getitem__(self, index):
        if isinstance(index, Tensor):
            index = index.data
        x = self.data
        xp = backend.of(x)
        out = x[index]

        def backward(g):
            grad = xp.zeros_like(x)
            if _is_basic_index(index):
                grad[index] = g
            else:
                # Fancy indices may repeat; add.at adds every occurrence.
                xp.add.at(grad, index, g)
            return (grad,)

        return Tensor._make(out, (self,), backward, "getitem")

    # -- softmax family (along one axis) --------------------------------
    def softmax(self, axis=-1):
        x = self.data
        xp = backend.of(x)
        shifted = xp.exp(x - x.max(axis=axis, keepdims=True))
        out = shifted / shifted.sum(axis=axis, keepdims=True)

        def backward(g):
            return (out * (g - (g * out).sum(axis=axis, keepdims=True)),)

        return Tensor._make(out, (self,), backward, "softmax")

    def log_softmax(self, axis=-1):
        x = self.data
        xp = backend.of(x)
        # log softmax = x - max - log(sum exp(x - max)): never overflows.
        shifted = x - x.max(axis=axis, keepdims=True)
        out = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))

        def backward(g):
            return (g - xp.exp(out) * g.sum(axis=axis, keepdims=True),)

        return Tensor._make(out, (self,), backward, "log_softmax")


def _is_backend_array(value) -> bool:
    return isinstance(value, numpy.ndarray) or type(value).__module__.startswith("cupy")


def _closure_arrays(value, found: list, seen: set) -> None:
    """Collect the arrays reachable from a backward closure's captured
    variables: arrays, tensors (their data), tuples and lists of them, and the
    captures of nested functions. Nothing else is followed (a captured module
    or process group holds no activation)."""
    if value is None or id(value) in seen:
        return
    seen.add(id(value))
    if _is_backend_array(value):
        found.append(value)
    elif isinstance(value, Tensor):
        found.append(value.data)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _closure_arrays(item, found, seen)
    elif isinstance(value, functools.partial):
        _closure_arrays(value.func, found, seen)
        _closure_arrays(value.args, found, seen)
    elif callable(value) and getattr(value, "__closure__", None):
        for cell in value.__closure__:
            try:
                contents = cell.cell_contents
            except ValueError:  # a variable not yet bound
                continue
            _closure_arrays(contents, found, seen)


def graph_nodes(*roots):
    """Every tensor of the autograd graphs that end in ``roots`` (the roots
    included, each tensor once): the nodes and the leaves they were made
    from. A graph freed by backward ends at its root."""
    seen = set()
    stack = [root for root in roots if isinstance(root, Tensor)]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(node._parents)


def _data(value):
    return value.data if isinstance(value, Tensor) else value


def _normalise_axes(axis, ndim):
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted(a % ndim for a in axes))


def _is_basic_index(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(p, (int, slice, type(None), type(Ellipsis))) or numpy.isscalar(p) for p in parts)


# --------------------------------------------------------------------------
# Functions of several tensors


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product with NumPy's rules (1-D operands, batched stacks).

    Backward of C = A B: dA = dC B^T and dB = A^T dC, summed over any
    broadcast batch axes.
    """
    a = a if isinstance(a, Tensor) else Tensor(a)
    b = b if isinstance(b, Tensor) else Tensor(b)
    A, B = a.data, b.data
    if A.ndim == 0 or B.ndim == 0:
        raise ValueError("matmul needs tensors with at least one axis; use * for scalars")
    inner_a = A.shape[-1]
    inner_b = B.shape[0] if B.ndim == 1 else B.shape[-2]
    if inner_a != inner_b:
        raise ValueError(
            f"matmul shape mismatch: {_shape_str(A.shape)} @ {_shape_str(B.shape)}; the last axis "
            f"of the left operand ({inner_a}) must equal the "
            f"{'only' if B.ndim == 1 else 'second-to-last'} axis of the right one ({inner_b})"
        )
    out = A @ B
    xp = backend.of(out)

    @_split_by_requires_grad  # dB = A^T dC is a GEMM of its own: deferred by a split backward
    def backward(g):
        if A.ndim == 2 and B.ndim == 2:
            return (g @ B.T if a.requires_grad else None, A.T @ g if b.requires_grad else None)
        if A.ndim == 1 and B.ndim == 1:
            return (g * B if a.requires_grad else None, g * A if b.requires_grad else None)
        A2 = A[None, :] if A.ndim == 1 else A
        B2 = B[:, None] if B.ndim == 1 else B
        G = g
        if A.ndim == 1:
            G = xp.expand_dims(G, -2)
        if B.ndim == 1:
            G = xp.expand_dims(G, -1)
        grad_a = grad_b = None
        if a.requires_grad:
            grad_a = G @ xp.swapaxes(B2, -1, -2)
            if A.ndim == 1:
                grad_a = grad_a.squeeze(-2)
            grad_a = _unbroadcast(grad_a, A.shape)
        if b.requires_grad:
            grad_b = xp.swapaxes(A2, -1, -2) @ G
            if B.ndim == 1:
                grad_b = grad_b.squeeze(-1)
            grad_b = _unbroadcast(grad_b, B.shape)
        return grad_a, grad_b

    return Tensor._make(out, (a, b), backward, "matmul")


def concatenate(tensors, axis=0) -> Tensor:
    """Join tensors along an existing axis; backward slices the gradient back."""
    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("concatenate needs at least one tensor")
    xp = backend.of(tensors[0].data)
    try:
        out = xp.concatenate([t.data for t in tensors], axis=axis)
    except ValueError:
        shapes = ", ".join(_shape_str(t.shape) for t in tensors)
        raise ValueError(
            f"concatenate along axis {axis}: shapes {shapes} must match on every other axis"
        ) from None
    bounds = numpy.cumsum([t.shape[axis] for t in tensors])[:-1]

    def backward(g):
        return tuple(xp.split(g, bounds, axis=axis))

    return Tensor._make(out, tuple(tensors), backward, "concatenate")


cat = concatenate


def stack(tensors, axis=0) -> Tensor:
    """Join tensors along a new axis."""
    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    shapes = {t.shape for t in tensors}
    if len(shapes) != 1:
        raise ValueError(
            "stack needs tensors of one shape, got " + ", ".join(_shape_str(t.shape) for t in tensors)
        )
    xp = backend.of(tensors[0].data)
    out = xp.stack([t.data for t in tensors], axis=axis)

    def backward(g):
        return tuple(xp.moveaxis(g, axis, 0))

    return Tensor._make(out, tuple(tensors), backward, "stack")


def split(tensor: Tensor, sections, axis=0):
    """Split into pieces like ``numpy.split`` (a count of equal parts, or the
    indices where to cut). Each piece is a view with its own backward."""
    size = tensor.shape[axis]
    if isinstance(sections, int):
        if sections <= 0 or size % sections:
            raise ValueError(
                f"split: axis {axis} has length {size}, which cannot be divided into {sections} "
                "equal parts; pass a list of cut indices instead"
            )
        step = size // sections
        cuts = list(range(step, size, step))
    else:
        cuts = list(sections)
    starts = [0] + cuts
    ends = cuts + [size]
    pieces = []
    for start, end in zip(starts, ends):
        index = [slice(None)] * tensor.ndim
        index[axis] = slice(start, end)
        pieces.append(tensor[tuple(index)])
    return pieces


def where(condition, a, b) -> Tensor:
    """Elementwise choice: ``a`` where ``condition`` holds, else ``b``."""
    condition = _data(condition)
    a = a if isinstance(a, Tensor) else Tensor(backend.get().asarray(a))
    b = b if isinstance(b, Tensor) else Tensor(backend.get().asarray(b))
    xp = backend.of(a.data)
    out = xp.where(condition, a.data, b.data)
    zero = xp.zeros((), dtype=out.dtype)

    def backward(g):
        return (
            _unbroadcast(xp.where(condition, g, zero), a.shape) if a.requires_grad else None,
            _unbroadcast(xp.where(condition, zero, g), b.shape) if b.requires_grad else None,
        )

    return Tensor._make(out, (a, b), backward, "where")


def maximum(a, b) -> Tensor:
    """Elementwise maximum; at ties the gradient goes to ``a``."""
    a_data, b_data = _data(a), _data(b)
    return where(a_data >= b_data, a, b)


def minimum(a, b) -> Tensor:
    """Elementwise minimum; at ties the gradient goes to ``a``."""
    a_data, b_data = _data(a), _data(b)
    return where(a_data <= b_data, a, b)


# --------------------------------------------------------------------------
# Factories


def tensor(data, requires_grad=False, dtype=None) -> Tensor:
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


def zeros(*shape, dtype=numpy.float32, requires_grad=False) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return Tensor(backend.get().zeros(shape, dtype=dtype), requires_grad=requires_grad)


def ones(*shape, dtype=numpy.float32, requires_grad=False) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return Tensor(backend.get().ones(shape, dtype=dtype), requires_grad=requires_grad)
