"""Containers: Sequential (a pipeline of layers) and ModuleList (a list of
layers whose parameters are registered)."""

from __future__ import annotations

from collections import OrderedDict

from minidist.nn.module import Module


def _index(position, length: int, kind: str) -> int:
    if not isinstance(position, int):
        raise TypeError(f"{kind} indices must be ints or slices, got {type(position).__name__}")
    if not -length <= position < length:
        raise IndexError(f"index {position} is out of range for a {kind} of {length} modules")
    return position % length


class Sequential(Module):
    """``Sequential(layer0, layer1, ...)`` or ``Sequential(OrderedDict(name=layer))``:
    ``forward(x)`` applies the layers in order. Children are named "0", "1",
    ... (or by the dict keys), so parameters are named "0.weight", ...

    Indexable (``model[0]``, ``model[-1]``, ``model[1:3]`` gives a Sequential
    of the same module objects), iterable, and ``len(model)`` counts layers.
    Cutting a Sequential into slices is exactly how pipeline parallelism
    splits a model into stages.
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for name, module in modules[0].items():
                self._add(str(name), module)
        else:
            for position, module in enumerate(modules):
                self._add(str(position), module)

    def _add(self, name, module):
        if not isinstance(module, Module):
            raise TypeError(
                f"Sequential takes Modules, got {type(module).__name__} at position {name}; "
                "wrap functions in a Module (e.g. nn.ReLU() instead of F.relu)"
            )
        self.add_module(name, module)

    def append(self, module: Module) -> Sequential:
        self._add(str(len(self._modules)), module)
        return self

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x

    def __getitem__(self, position):
        items = list(self._modules.items())
        if isinstance(position, slice):
            return Sequential(OrderedDict(items[position]))
        return items[_index(position, len(items), "Sequential")][1]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(Module):
    """``ModuleList([layer, ...])``: a Python list of modules whose parameters
    belong to the owner (a plain list would hide them from ``parameters()``).
    Has no forward of its own: the owner decides how to call its items."""

    def __init__(self, modules=()):
        super().__init__()
        for module in modules:
            self.append(module)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList takes Modules, got {type(module).__name__}")
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def forward(self, *args, **kwargs):
        raise NotImplementedError(
            "ModuleList has no forward(); iterate over it in the owner's forward, "
            "or use Sequential to apply the layers in order"
        )

    def __getitem__(self, position):
        items = list(self._modules.values())
        if isinstance(position, slice):
            return ModuleList(items[position])
        return items[_index(position, len(items), "ModuleList")]

    def __setitem__(self, position, module):
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList takes Modules, got {type(module).__name__}")
        self.add_module(str(_index(position, len(self._modules), "ModuleList")), module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())
