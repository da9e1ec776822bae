"""torch's tensor-parallel styles, on DTensors: how one module's parameters,
inputs and outputs are laid out (``torch.distributed.tensor.parallel``).

A style turns a module's parameters into ``DTensorParameter``s
(``nn.Parameter(distribute_tensor(w, mesh, [Shard(0)]))``), so that
``state_dict()``, optimizers and clipping see their layouts, and puts a
forward pre-hook that lays the inputs out and a forward hook that lays the
output out. Between them the module's own forward runs unchanged: its ops
(``F.linear``, ``F.embedding``, ``F.layer_norm``) run by their placement
rules (:mod:`minidist.distributed.tensor`, reached through its face). The
defaults, torch's, on a mesh dim of n ranks:

===================  ==================  ============  ==============  ===============
style on nn.Linear   weight (out, in)    bias          input -> output  messages fwd / bwd
===================  ==================  ============  ==============  ===============
ColwiseParallel      Shard(0)            Shard(0)      R -> S(-1)      none / all_reduce dX
RowwiseParallel      Shard(1)            Replicate     S(-1) -> R      all_reduce Y / none
===================  ==================  ============  ==============  ===============

On an ``nn.Embedding`` (V, C): ``ColwiseParallel`` is ``Shard(1)`` (each
rank its C/n columns, output S(-1), no message), ``RowwiseParallel``
``Shard(0)``, vocab-parallel: each rank looks up the words it holds, zeros
elsewhere, a Partial, all_reduced to the Replicate output. Rowwise's bias
is added once in the Partial sum (the rule of ``F.linear``). Uneven shards
are torch.chunk's: ``ColwiseParallel`` on ``Linear(10, 33)`` over 2 ranks
holds 17 and 16 rows.

``input_layouts`` says how the input the module receives is laid out (a
plain tensor is taken as this rank's piece of that layout);
``output_layouts`` how its output should be left (Rowwise's
``Shard(1)``: a reduce_scatter instead of the all_reduce, sequence
parallelism); ``use_local_output=True`` hands the next module a plain
tensor (this rank's piece), as torch's default.

``SequenceParallel(sequence_dim=1)``: a LayerNorm (or any module of
elementwise ops over the last dim) whose activations are
``Shard(sequence_dim)``; its parameters ``Replicate``, their gradients
all_reduced in the backward (every rank saw only its tokens). No message
forward. ``PrepareModuleInput`` / ``PrepareModuleOutput`` only change
layouts: from ``input_layouts`` to ``desired_input_layouts`` (the
collectives of ``redistribute``).

``PackedColwiseParallel(pieces)`` (Hugging Face transformers' name for
packed weights; torch has none): the column split of a fused projection
whose rows are ``pieces`` blocks (the GPT's q, k, v): rank r takes the r-th
n-th of every block. That is no Shard of the whole weight (rank 0 holds rows
of q, of k and of v, not one run of rows), so no honest DTensor layout says
it: this style builds the tensor family's split layer
(``ColumnParallelLinear`` with those rows, through
:mod:`minidist.parallel.tensor`'s face), whose weight is a plain Parameter
of this rank's rows and whose output is this rank's local columns, as
Colwise's ``use_local_output=True``.

Cost: a copy of each weight's shard (``distribute_tensor`` broadcasts the
whole from coordinate 0 first, so the ranks agree); the messages are the
table's.
"""

from __future__ import annotations

import abc

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.tensor import (
    DTensor,
    Replicate,
    Shard,
    distribute_tensor,
)
from minidist.nn.embedding import Embedding
from minidist.nn.linear import Linear
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter
from minidist.parallel.tensor import ColumnParallelLinear, packed_rows


def _one(layouts, what):
    if layouts is None:
        return None
    if isinstance(layouts, (tuple, list)):
        if len(layouts) != 1:
            raise ValueError(f"{what}: minidist's styles take one layout per tensor on a 1-D mesh, "
                             f"got {layouts}")
        layouts = layouts[0]
    return layouts


def _check_mesh(mesh, style):
    if mesh.ndim != 1:
        raise ValueError(f"{style}: give the 1-D mesh of the tensor-parallel dim "
                         f"(mesh['tp'] of a bigger mesh), got a {mesh.ndim}-D mesh")


def _distribute(module, name, mesh, placement):
    param = getattr(module, name, None)
    if param is None:
        return
    if isinstance(param, DTensor):
        raise ValueError(f"{type(module).__name__}.{name} is already laid out "
                         f"({param.placements}): a module takes one style")
    layout = distribute_tensor(param, mesh, [placement])
    setattr(module, name, Parameter(layout, requires_grad=param.requires_grad))


def _as_layout(x, mesh, layout, desired, shape=None):
    """The module's input ``x`` (a plain tensor: this rank's piece of
    ``layout``) as a DTensor laid out ``desired``."""
    if layout is None or not hasattr(x, "data"):
        return x
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [layout], shape=shape)
    elif x.placements != (layout,):
        raise ValueError(f"the input is a DTensor laid out {x.placements}, but the style says "
                         f"input_layouts={layout!r}; give the input_layouts it has")
    if desired is not None and x.placements != (desired,):
        x = x.redistribute(mesh, [desired])
    return x


def _leave(output, mesh, layout, use_local):
    if isinstance(output, DTensor):
        if layout is not None and output.placements != (layout,):
            output = output.redistribute(mesh, [layout])
        if use_local:
            output = output.to_local()
    return output


class ParallelStyle(abc.ABC):
    """How one module is laid out on a mesh (an abstract class, as torch's):
    ``_apply(module, device_mesh)`` lays it out and returns it."""

    @abc.abstractmethod
    def _apply(self, module: Module, device_mesh) -> Module:
        """``module`` laid out on ``device_mesh`` (in place, returned)."""

    def _refuse(self, module, takes="an nn.Linear or an nn.Embedding"):
        return TypeError(f"{type(self).__name__} lays out {takes}, got "
                         f"{type(module).__name__}; put the style on its submodules (the plan's "
                         f"keys are their names, e.g. 'mlp.c_fc')")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ColwiseParallel(ParallelStyle):
    """The column split (the module docstring): weight Shard(0), input
    Replicate, output Shard(-1)."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        self.input_layouts = _one(input_layouts, "ColwiseParallel(input_layouts)") or Replicate()
        self.output_layouts = _one(output_layouts, "ColwiseParallel(output_layouts)") or Shard(-1)
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        _check_mesh(device_mesh, type(self).__name__)
        if isinstance(module, Linear):
            _distribute(module, "weight", device_mesh, Shard(0))
            _distribute(module, "bias", device_mesh, Shard(0))
        elif isinstance(module, Embedding):
            _distribute(module, "weight", device_mesh, Shard(1))
        else:
            raise self._refuse(module)
        embedding = isinstance(module, Embedding)

        def before(mod, args):
            if embedding:          # indices: every rank's the same (Replicate)
                return None
            return (_as_layout(args[0], device_mesh, self.input_layouts, Replicate()),) + args[1:]

        def after(mod, args, output):
            return _leave(output, device_mesh, self.output_layouts, self.use_local_output)

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)
        return module


class RowwiseParallel(ParallelStyle):
    """The row split (the module docstring): weight Shard(1), input
    Shard(-1), output Replicate (the Partial all_reduced)."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        self.input_layouts = _one(input_layouts, "RowwiseParallel(input_layouts)")
        self.output_layouts = _one(output_layouts, "RowwiseParallel(output_layouts)") or Replicate()
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        _check_mesh(device_mesh, type(self).__name__)
        if isinstance(module, Linear):
            _distribute(module, "weight", device_mesh, Shard(1))
            _distribute(module, "bias", device_mesh, Replicate())
            layout, desired = self.input_layouts or Shard(-1), Shard(-1)
            features = module.weight.shape[1]
        elif isinstance(module, Embedding):
            _distribute(module, "weight", device_mesh, Shard(0))
            layout, desired, features = self.input_layouts or Replicate(), Replicate(), None
        else:
            raise self._refuse(module)

        def before(mod, args):
            x = args[0]
            if features is None:               # an Embedding's indices
                return None if not isinstance(x, DTensor) else (
                    _as_layout(x, device_mesh, layout, desired),) + args[1:]
            shape = None
            if not isinstance(x, DTensor) and layout == Shard(-1):
                shape = tuple(x.data.shape[:-1]) + (features,)   # uneven pieces: the whole's
            return (_as_layout(x, device_mesh, layout, desired, shape),) + args[1:]

        def after(mod, args, output):
            return _leave(output, device_mesh, self.output_layouts, self.use_local_output)

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)
        return module


class SequenceParallel(ParallelStyle):
    """A module of per-token ops (a LayerNorm) on activations
    ``Shard(sequence_dim)``: parameters Replicate, no message forward, their
    gradients all_reduced backward."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False):
        self.sequence_dim, self.use_local_output = sequence_dim, use_local_output

    def _apply(self, module, device_mesh):
        _check_mesh(device_mesh, type(self).__name__)
        for name, _ in list(module.named_parameters(recurse=False)):
            _distribute(module, name, device_mesh, Replicate())
        shard = Shard(self.sequence_dim)

        def before(mod, args):
            x = args[0]
            if isinstance(x, DTensor):
                if x.placements != (shard,):
                    x = x.redistribute(device_mesh, [shard])
            else:
                x = DTensor.from_local(x, device_mesh, [shard])
            return (x,) + args[1:]

        def after(mod, args, output):
            return _leave(output, device_mesh, None, self.use_local_output)

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)
        return module

    def __repr__(self) -> str:
        return f"SequenceParallel(sequence_dim={self.sequence_dim})"


class PrepareModuleInput(ParallelStyle):
    """Lay the module's positional inputs out: each from ``input_layouts``
    (None: leave that input) to ``desired_input_layouts``."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None,
                 input_kwarg_layouts=None, desired_input_kwarg_layouts=None,
                 use_local_output: bool = False):
        if input_kwarg_layouts or desired_input_kwarg_layouts:
            raise NotImplementedError("PrepareModuleInput(input_kwarg_layouts=): minidist lays "
                                      "out positional inputs only; pass the tensor positionally")
        self.input_layouts = _tuple(input_layouts)
        self.desired_input_layouts = _tuple(desired_input_layouts)
        if len(self.input_layouts) != len(self.desired_input_layouts):
            raise ValueError("PrepareModuleInput: input_layouts and desired_input_layouts must "
                             "have one entry per input")
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        _check_mesh(device_mesh, type(self).__name__)

        def before(mod, args):
            out = list(args)
            for k, (layout, desired) in enumerate(zip(self.input_layouts,
                                                      self.desired_input_layouts)):
                if k < len(out) and layout is not None:
                    out[k] = _leave(_as_layout(out[k], device_mesh, layout, desired),
                                    device_mesh, None, self.use_local_output)
            return tuple(out)

        module.register_forward_pre_hook(before)
        return module


class PrepareModuleOutput(ParallelStyle):
    """Lay the module's output out: from ``output_layouts`` to
    ``desired_output_layouts``."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output=True):
        self.output_layouts = _one(output_layouts, "PrepareModuleOutput(output_layouts)")
        self.desired = _one(desired_output_layouts, "PrepareModuleOutput(desired_output_layouts)")
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        _check_mesh(device_mesh, type(self).__name__)

        def after(mod, args, output):
            laid = _as_layout(output, device_mesh, self.output_layouts, self.desired)
            return _leave(laid, device_mesh, None, self.use_local_output)

        module.register_forward_hook(after)
        return module


def _tuple(layouts):
    if layouts is None:
        return ()
    return tuple(layouts) if isinstance(layouts, (tuple, list)) else (layouts,)


class PackedColwiseParallel(ColwiseParallel):
    """``PackedColwiseParallel(pieces)``: the column split of a Linear whose
    rows are ``pieces`` equal blocks (3 for the GPT's fused q, k, v): the
    tensor family's split layer with each rank's share of every block (see
    the module docstring for why it is no DTensor)."""

    def __init__(self, pieces: int):
        super().__init__()
        if int(pieces) < 1:
            raise ValueError(f"PackedColwiseParallel: pieces must be at least 1, got {pieces}")
        self.pieces = int(pieces)

    def _apply(self, module, device_mesh):
        _check_mesh(device_mesh, type(self).__name__)
        if not isinstance(module, Linear):
            raise self._refuse(module, "an nn.Linear")
        group = device_mesh.get_group()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        out, pieces = module.out_features, self.pieces
        if out % pieces or (out // pieces) % world:
            raise ValueError(f"rank {dist.get_rank()}: PackedColwiseParallel({pieces}): "
                             f"out_features={out} must be {pieces} blocks each divisible by the "
                             f"{world} ranks; choose a width (n_embd) that {world} divides")
        rows = packed_rows(out, pieces, rank, world)
        layer = ColumnParallelLinear.from_linear(module, group, rows=rows)
        for param in (layer.weight, layer.bias):
            if param is not None:
                _checkpoint_whole(param, group, out, pieces)
        return layer

    def __repr__(self) -> str:
        return f"PackedColwiseParallel({self.pieces})"


def _checkpoint_whole(param, group, out: int, pieces: int) -> None:
    """A packed shard's Parameter as a state dict holds it: the whole tensor
    (the one-process model's rows, so that a checkpoint loads into any tp
    size, into the one-process model, or a DTensor layout): no Shard says
    the packed rows, so ``state_dict()`` and the checkpoint's state dicts
    gather them (one all_gather over the group, a collective every rank
    calls) and a load keeps this rank's rows. The flags, duck typed by
    ``Module.state_dict`` and ``minidist.distributed.checkpoint``:
    ``checkpoint_shape``, ``checkpoint_whole(local)`` and
    ``checkpoint_piece(whole)``."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    shape = (out,) + tuple(param.data.shape[1:])
    rows = [packed_rows(out, pieces, r, world) for r in range(world)]

    def whole(local):
        local = np.ascontiguousarray(backend.to_numpy(local))
        gathered = np.empty((world,) + local.shape, local.dtype)
        if world > 1:
            dist.all_gather_into_tensor(gathered, local, group=group)
        else:
            gathered[0] = local
        full = np.empty(shape, local.dtype)
        for r in range(world):
            full[rows[r]] = gathered[r]
        return full

    def piece(full):
        full = np.asarray(backend.to_numpy(full))
        if tuple(full.shape) != shape:
            raise ValueError(f"a packed shard's state is the whole tensor {shape}, got "
                             f"{tuple(full.shape)}")
        return full[rows[rank]].copy()

    param.checkpoint_shape, param.checkpoint_whole, param.checkpoint_piece = shape, whole, piece


__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
           "PrepareModuleInput", "PrepareModuleOutput", "PackedColwiseParallel"]
