"""Module: the base class of every layer and model.

A Module owns three ordered registries, filled by plain attribute
assignment in ``__init__``, as in PyTorch::

    self.weight = Parameter(...)         -> _parameters  (learned; in parameters())
    self.register_buffer("running_mean", ...) -> _buffers (state, not learned)
    self.fc1 = Linear(...)               -> _modules     (children)

Everything else follows from walking that tree in *registration order*:

* ``parameters()`` / ``named_parameters()``: a module's own parameters first,
  then each child's, depth first. The order is a contract: optimizers index
  their state by it, and every rank of a distributed job must enumerate the
  same parameters in the same order so that its collectives pair up.
* ``state_dict()``: parameters and persistent buffers under dotted names
  (``"0.weight"``, ``"block.bn.running_mean"``), as copies;
  ``load_state_dict()`` checks every name and shape before copying anything.
* ``train()`` / ``eval()``: set the ``training`` flag on the whole tree;
  Dropout and BatchNorm read it.

Attributes are stored twice: in the registry (for the walks) and in the
instance ``__dict__``, so that ``self.weight`` inside ``forward`` is an
ordinary attribute lookup with no ``__getattr__`` detour on the hot path.
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import numpy

from minidist import backend
from minidist.nn.parameter import Parameter
from minidist.tensor import RemovableHandle, Tensor, _shape_str

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class Module:
    """Base class: subclass it, create parameters and children in
    ``__init__`` (after ``super().__init__()``), compute in ``forward``.

    >>> class TwoLayer(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc1 = Linear(4, 8)
    ...         self.fc2 = Linear(8, 2)
    ...     def forward(self, x):
    ...         return self.fc2(self.fc1(x).relu())
    """

    def __init__(self):
        # object.__setattr__: our own __setattr__ needs these to exist first.
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        # Hooks, as (hook, with_kwargs) pairs in calling order (see "hooks" below).
        object.__setattr__(self, "_forward_pre_hooks", [])
        object.__setattr__(self, "_forward_hooks", [])
        object.__setattr__(self, "_backward_pre_hooks", [])

    # -- computing ----------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__} has no forward(); define forward(self, ...) in the subclass"
        )

    def __call__(self, *args, **kwargs):
        if self._forward_pre_hooks or self._forward_hooks or self._backward_pre_hooks:
            return self._call_with_hooks(args, kwargs)
        return self.forward(*args, **kwargs)

    # -- hooks ----------------------------------------------------------------
    # torch.nn.Module's, with its names and meaning: they let a strategy act
    # around a layer's forward and backward without touching the layer
    # (FullyShardedDataParallel gathers a layer's weights in a forward
    # pre-hook and frees them in a forward hook).
    def register_forward_pre_hook(self, hook, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """Call ``hook(module, args)`` before every ``forward``. It returns
        None, or new positional arguments (a tuple; a single value is made
        a 1-tuple). With ``with_kwargs=True``: ``hook(module, args, kwargs)``,
        returning None or ``(args, kwargs)``. Hooks run in registration order,
        ``prepend=True`` puts this one first. Returns a handle with ``remove()``."""
        return _add_hook(self._forward_pre_hooks, (hook, with_kwargs), prepend)

    def register_forward_hook(self, hook, *, prepend: bool = False,
                              with_kwargs: bool = False) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after every ``forward`` (``args``
        as the pre-hooks left them). It returns None, or a value that replaces
        the output. With ``with_kwargs=True``: ``hook(module, args, kwargs, output)``."""
        return _add_hook(self._forward_hooks, (hook, with_kwargs), prepend)

    def register_full_backward_pre_hook(self, hook, *, prepend: bool = False) -> RemovableHandle:
        """Call ``hook(module, grad_output)`` when the gradient with respect
        to the module's output is complete, before the module's backward uses
        it; ``grad_output`` is a 1-tuple, and the hook returns None or a tuple
        that replaces it. The module's output must be one Tensor here (torch
        allows several). The output is an identity node the hooks run in, as
        torch's ``BackwardHookFunction``."""
        return _add_hook(self._backward_pre_hooks, (hook, False), prepend)

    def _call_with_hooks(self, args, kwargs):
        for hook, with_kwargs in list(self._forward_pre_hooks):
            if with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError(f"a forward pre-hook with kwargs must return None "
                                           f"or (args, kwargs), got {result!r}")
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        output = self.forward(*args, **kwargs)
        for hook, with_kwargs in list(self._forward_hooks):
            result = hook(self, args, kwargs, output) if with_kwargs else hook(self, args, output)
            if result is not None:
                output = result
        if self._backward_pre_hooks:
            output = self._before_backward(output)
        return output

    def _before_backward(self, output):
        """``output`` behind an identity node whose backward runs the
        backward pre-hooks on its gradient."""
        if not isinstance(output, Tensor):
            raise TypeError(f"{type(self).__name__}: register_full_backward_pre_hook needs the "
                            f"module's output to be one Tensor, got {type(output).__name__}")
        hooks = [hook for hook, _ in self._backward_pre_hooks]

        def backward(grad):
            grad_output = (grad,)
            for hook in hooks:
                result = hook(self, grad_output)
                if result is not None:
                    grad_output = tuple(result) if isinstance(result, (tuple, list)) else (result,)
            return grad_output

        return Tensor._make(output.data, (output,), backward, "backward_pre_hook")

    # -- registration -------------------------------------------------------
    def _registries(self):
        registries = self.__dict__.get("_parameters")
        if registries is None:
            raise AttributeError(
                f"cannot assign parameters, buffers or modules to {type(self).__name__} before "
                "Module.__init__() has run; call super().__init__() first in __init__"
            )
        return self._parameters, self._buffers, self._modules

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            parameters, buffers, modules = self._registries()
            buffers.pop(name, None)
            modules.pop(name, None)
            parameters[name] = value
        elif isinstance(value, Module):
            parameters, buffers, modules = self._registries()
            parameters.pop(name, None)
            buffers.pop(name, None)
            modules[name] = value
        else:
            registries = self.__dict__.get("_parameters")
            if registries is not None and name in self._parameters:
                if value is not None:
                    raise TypeError(
                        f"cannot assign a {type(value).__name__} to {type(self).__name__}.{name}, "
                        "which is a parameter: assign a minidist.nn.Parameter (or None to drop it)"
                    )
                self._parameters[name] = None
            elif registries is not None and name in self._buffers:
                self._buffers[name] = _as_buffer(value)
                value = self._buffers[name]
            elif registries is not None and name in self._modules:
                if value is not None:
                    raise TypeError(
                        f"cannot assign a {type(value).__name__} to {type(self).__name__}.{name}, "
                        "which is a child module: assign a Module (or None to drop it)"
                    )
                self._modules[name] = None
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        for registry in (self._parameters, self._buffers, self._modules):
            registry.pop(name, None)
        self._non_persistent_buffers.discard(name)
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None):
        """Add ``param`` (or None, a placeholder) under ``name``."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"register_parameter({name!r}, ...) needs a minidist.nn.Parameter or None, got "
                f"{type(param).__name__}; wrap the array: Parameter(array)"
            )
        self._registries()
        _check_name(self, name)
        self._buffers.pop(name, None)
        self._modules.pop(name, None)
        self._parameters[name] = param
        object.__setattr__(self, name, param)

    def register_buffer(self, name: str, value, persistent: bool = True):
        """Add a state array that is saved and moved with the module but not
        learned (BatchNorm's running statistics). ``value`` may be an array, a
        Tensor or None; it is stored as a Tensor without gradient. A buffer
        with ``persistent=False`` is left out of ``state_dict()``."""
        self._registries()
        _check_name(self, name)
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers[name] = _as_buffer(value)
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)
        object.__setattr__(self, name, self._buffers[name])

    def add_module(self, name: str, module: Module | None):
        """Add a child under ``name`` (names may be any string, e.g. "0")."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module({name!r}, ...) needs a Module, got {type(module).__name__}")
        self._registries()
        self._modules[name] = module
        object.__setattr__(self, name, module)

    # -- walking the tree ---------------------------------------------------
    def named_modules(self, prefix: str = "", _seen=None):
        """Yield ``(dotted_name, module)`` for this module and every
        descendant, depth first in registration order; a module reachable
        twice is yielded once."""
        seen = set() if _seen is None else _seen
        if id(self) in seen:
            return
        seen.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(prefix + ("." if prefix else "") + name, seen)

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def named_children(self):
        for name, child in self._modules.items():
            if child is not None:
                yield name, child

    def children(self):
        for _, child in self.named_children():
            yield child

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        """Yield ``(dotted_name, parameter)``: own parameters first, then each
        child's, in registration order. A parameter shared by two layers is
        yielded once, under its first name."""
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, param in module._parameters.items():
                if param is None or id(param) in seen:
                    continue
                seen.add(id(param))
                yield module_prefix + ("." if module_prefix else "") + name, param

    def parameters(self, recurse: bool = True):
        """The learnable tensors, in the stable order of :meth:`named_parameters`."""
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    yield module_prefix + ("." if module_prefix else "") + name, buffer

    def buffers(self, recurse: bool = True):
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def num_parameters(self, trainable_only: bool = False) -> int:
        """The number of scalars in ``parameters()`` (only those with
        ``requires_grad`` when ``trainable_only``)."""
        return sum(
            int(p.data.size) for p in self.parameters() if p.requires_grad or not trainable_only
        )

    def apply(self, function):
        """Call ``function(module)`` on every child (recursively), then on
        this module; returns self. Used for custom initialisation."""
        for child in self.children():
            child.apply(function)
        function(self)
        return self

    # -- modes and gradients ------------------------------------------------
    def train(self, mode: bool = True):
        """Set training mode (``mode=True``) or evaluation mode on this module
        and all its descendants; returns self. Dropout and BatchNorm behave
        differently in the two modes."""
        if not isinstance(mode, bool):
            raise TypeError(f"train(mode) takes a bool, got {type(mode).__name__}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self):
        """Evaluation mode: same as ``train(False)``."""
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True):
        """Forget every parameter's gradient: drop the arrays
        (``set_to_none=True``) or fill them with zeros in place."""
        for param in self.parameters():
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.fill(0)

    def to(self, dtype):
        """Convert floating-point parameters and buffers to ``dtype`` (e.g.
        ``numpy.float64`` for gradient checks); returns self. Integer buffers
        (a step count) keep their dtype, and a gradient already computed is
        cast with its parameter, as torch's ``Module.to`` does.

        The Parameter objects stay the same, their arrays are replaced:
        an optimizer that holds the parameters steps the new arrays, but
        state it already made (a momentum buffer) keeps the old dtype, and a
        parallel strategy that keeps views of the old arrays loses them. So
        convert before building the optimizer or the strategy."""
        if "bfloat16" in str(getattr(dtype, "__name__", dtype)):
            self.bfloat16()
        dtype = numpy.dtype(dtype)
        if not numpy.issubdtype(dtype, numpy.floating):
            raise TypeError(f"to(dtype) needs a floating dtype such as numpy.float16, "
                            f"numpy.float32 or numpy.float64, got {dtype}")
        for tensor in list(self.parameters()) + list(self.buffers()):
            if numpy.issubdtype(tensor.data.dtype, numpy.floating):
                tensor.data = tensor.data.astype(dtype)
                if tensor.grad is not None:
                    tensor.grad = tensor.grad.astype(dtype)
        return self

    def half(self):
        """Floating-point parameters and buffers to float16 (torch's
        ``Module.half()``); returns self. Every layer then computes in
        float16 (arrays stay in the dtype of the layer's weights). To train
        so, keep float32 master copies: see :mod:`minidist.amp`."""
        return self.to(numpy.float16)

    def float(self):
        """Floating-point parameters and buffers to float32, the default
        (torch's ``Module.float()``); returns self."""
        return self.to(numpy.float32)

    def bfloat16(self):
        """Refused, with the reason: torch's ``Module.bfloat16()`` has no
        honest equivalent on NumPy arrays."""
        raise TypeError(
            "minidist has no bfloat16: NumPy has no such dtype, and the one the ml_dtypes "
            "package adds is not a numpy.floating type (the autograd and optimizers refuse "
            "it), its matrix product returns float32 (so a layer's arrays could not stay in "
            "its weights' dtype, minidist's rule), its elementwise ops run several times "
            "slower than float32's, and CuPy has no bfloat16. Train in float16 with float32 "
            "master weights and loss scaling (minidist.amp), or see what bfloat16's 8-bit "
            "mantissa does to numbers with minidist.amp.round_to_bfloat16(array)")

    def double(self):
        """Floating-point parameters and buffers to float64, for gradient
        checks (torch's ``Module.double()``); returns self."""
        return self.to(numpy.float64)

    # -- checkpoints --------------------------------------------------------
    def _state_tensors(self):
        """``{dotted_name: Tensor}`` of everything a state dict holds, in order:
        each module's parameters, then its persistent buffers, then its
        children's."""
        entries = OrderedDict()
        for prefix, module in self.named_modules():
            dot = prefix + ("." if prefix else "")
            for name, param in module._parameters.items():
                if param is not None:
                    entries[dot + name] = param
            for name, buffer in module._buffers.items():
                if buffer is not None and name not in module._non_persistent_buffers:
                    entries[dot + name] = buffer
        return entries

    def state_dict(self) -> OrderedDict:
        """``{name: array}`` for every parameter and persistent buffer, as
        copies (later training does not change a saved state dict). The
        arrays stay on the backend they live on; ``numpy.savez(path,
        **{k: backend.to_numpy(v) ...})`` writes a checkpoint. A DTensor
        parameter (tensor parallel, FSDP2) gives a DTensor of its layout
        holding a copy of this rank's shard, as torch's does (save it with
        ``minidist.distributed.checkpoint``)."""
        return OrderedDict(
            (name, _state_value(tensor)) for name, tensor in self._state_tensors().items()
        )

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy ``state_dict``'s arrays into this module's parameters and
        buffers, in place (views of them stay valid) and cast to their dtype.

        Every key and shape is checked before anything is copied, so a failed
        load leaves the module unchanged. Shape mismatches always raise;
        missing and unexpected keys raise when ``strict`` (the default) and
        are returned otherwise.
        """
        targets = self._state_tensors()
        missing = [name for name in targets if name not in state_dict]
        unexpected = [name for name in state_dict if name not in targets]
        mismatched = []
        for name, target in targets.items():
            if name in state_dict:
                shape = _global_shape(state_dict[name])
                if shape != _global_shape(target):
                    mismatched.append((name, shape, _global_shape(target)))
                else:
                    problem = _layout_problem(name, state_dict[name], target)
                    if problem:
                        mismatched.append(problem)

        problems = []
        for name, saved_shape, model_shape in (m for m in mismatched if len(m) == 3):
            problems.append(
                f"size mismatch for {name!r}: the state dict has shape {_shape_str(saved_shape)}, "
                f"this model has shape {_shape_str(model_shape)}"
            )
        problems += [m[0] for m in mismatched if len(m) == 1]
        if strict:
            for name in missing:
                problems.append(
                    f"missing key {name!r} (this model has it with shape "
                    f"{_shape_str(_global_shape(targets[name]))}) is not in the state dict"
                )
            for name in unexpected:
                shape = _global_shape(state_dict[name])
                problems.append(
                    f"unexpected key {name!r} (shape {_shape_str(shape)}) in the state dict: "
                    "this model has no such parameter or buffer"
                )
        if problems:
            advice = (
                "Build the model with the same layers and sizes as the one that was saved"
                + ("" if mismatched else ", or pass strict=False to skip missing and unexpected keys")
                + "."
            )
            raise RuntimeError(
                f"Error(s) loading state_dict into {type(self).__name__}:\n  "
                + "\n  ".join(problems)
                + "\n"
                + advice
            )

        for name, target in targets.items():
            if name in state_dict:
                value = _local_of(state_dict[name], target)
                xp = backend.of(target.data)
                if backend.of(value) is not xp:
                    value = xp.asarray(backend.to_numpy(value))
                target.data[...] = value
        return IncompatibleKeys(missing, unexpected)

    # -- printing -----------------------------------------------------------
    def extra_repr(self) -> str:
        """The text inside this module's parentheses, e.g.
        ``in_features=784, out_features=512, bias=True``."""
        return ""

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = []
        for name, child in self._modules.items():
            text = repr(child).replace("\n", "\n  ")
            child_lines.append(f"({name}): {text}")
        body = extra_lines + child_lines
        if not body:
            return f"{type(self).__name__}()"
        if len(extra_lines) == 1 and not child_lines:
            return f"{type(self).__name__}({extra_lines[0]})"
        return f"{type(self).__name__}(\n  " + "\n  ".join(body) + "\n)"


def _add_hook(hooks: list, entry, prepend: bool) -> RemovableHandle:
    handle = RemovableHandle(hooks, entry)
    if prepend:
        hooks.insert(0, hooks.pop())
    return handle


def _as_buffer(value):
    if value is None or isinstance(value, Tensor):
        return value
    return Tensor(value)


def _data_of(value):
    """The array inside a state-dict entry (a Tensor, an array, or a number or list)."""
    if isinstance(value, Tensor):
        return value.data
    return value if hasattr(value, "shape") else numpy.asarray(value)


def _state_value(tensor):
    """A state dict's copy of ``tensor``: its array, or for a DTensor (duck
    typed: nn may not import minidist.distributed) a DTensor of its layout,
    or for a piece that no layout says (a packed shard, which flags
    ``checkpoint_whole``) the whole tensor, gathered."""
    whole = getattr(tensor, "checkpoint_whole", None)
    if whole is not None:
        return whole(tensor.data)
    if getattr(tensor, "_spec", None) is not None:
        out = tensor.detach()
        out.data = tensor.data.copy()
        return out
    return tensor.data.copy()


def _global_shape(value) -> tuple:
    spec = getattr(value, "_spec", None)
    if spec is None and getattr(value, "checkpoint_shape", None) is not None:
        return tuple(value.checkpoint_shape)
    return tuple(spec.shape) if spec is not None else tuple(_data_of(value).shape)


def _layout_problem(name, source, target):
    """``(message,)`` when ``source`` cannot go into ``target`` as laid out."""
    source_spec, target_spec = getattr(source, "_spec", None), getattr(target, "_spec", None)
    if source_spec is not None and target_spec is None:
        return (f"{name!r} is a DTensor in the state dict and a plain tensor in this model: "
                f"pass .full_tensor() of it",)
    if source_spec is not None and (source_spec.placements != target_spec.placements
                                    or source_spec.mesh != target_spec.mesh):
        return (f"{name!r} is laid out {_layout(source_spec)} in the state dict but "
                f"{_layout(target_spec)} in this model: redistribute it, or load through "
                f"minidist.distributed.checkpoint, which reshards",)
    return None


def _layout(spec) -> str:
    return f"{spec.placements} on {spec.mesh!r}"


def _local_of(value, target):
    """The array to copy into ``target``: a plain whole array into a DTensor
    target gives the box this rank holds."""
    spec = getattr(target, "_spec", None)
    data = _data_of(value)
    piece = getattr(target, "checkpoint_piece", None)
    if piece is not None:
        return piece(data)
    if spec is not None and getattr(value, "_spec", None) is None:
        sizes, offsets = spec.local_shape_and_offset()
        data = data[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
    return data


def _check_name(module, name):
    if not isinstance(name, str) or not name or "." in name:
        raise KeyError(f"invalid name {name!r}: use a non-empty string without dots")
    if name in module.__dict__ and not any(
        name in registry for registry in (module._parameters, module._buffers, module._modules)
    ):
        raise KeyError(f"attribute {name!r} already exists on {type(module).__name__}")
