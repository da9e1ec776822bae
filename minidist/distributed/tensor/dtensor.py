"""DTensor: one tensor spread over a device mesh, and the layout that says how
(torch's ``torch.distributed.tensor.DTensor``).

A DTensor is a :class:`~minidist.tensor.Tensor` whose ``data`` is this rank's
local shard and whose spec says the rest: the mesh, one placement per mesh
dim, the global shape and the dtype. ``shape``, ``ndim``, ``size`` and
``numel()`` are the global tensor's (as torch's); ``data`` and ``grad`` are
this rank's local arrays, which is what an optimizer updates in place (torch's
``grad`` is a DTensor: here ``grad`` has the parameter's layout, its local
piece). ::

    mesh = init_device_mesh("cpu", (4,))
    x = distribute_tensor(Tensor(np.arange(12.).reshape(4, 3)), mesh, [Shard(0)])
    x.to_local()                       # rank r holds row r
    y = x.redistribute(mesh, [Replicate()])   # one all_gather
    print(plan(x, [Replicate()]))      # the same, said before it runs

Where a DTensor goes, the autograd follows: ``from_local``, ``to_local``,
``redistribute`` and the ops with a placement rule
(:mod:`minidist.distributed.tensor.ops`) are graph nodes; any other op on a
DTensor is refused (the Tensor's node maker asks, see
``minidist.tensor.set_placement_guard``), since it would compute on the local
shard as if it were the whole.

Where minidist answers differently from torch (the error says so): a DTensor's
``grad`` is its local array (above); ``redistribute(async_op=True)`` runs at
once; ``numpy()``, ``item()``, ``tolist()``, ``argmax()`` and the comparisons are
refused unless the DTensor is Replicate on every mesh dim (call
``full_tensor()`` or ``to_local()`` first, and say which you mean).

Cost: a DTensor holds its local shard only; making one from a local tensor
sends nothing (``run_check=True``: one all_gather of the shapes);
``distribute_tensor`` broadcasts the whole tensor from coordinate 0 along
each mesh dim (``src_data_rank=None``: no message, every rank cuts its own).
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.device_mesh import DeviceMesh
from minidist.distributed.tensor import redistribute as _redistribute
from minidist.distributed.tensor.placements import (
    DTensorSpec,
    Partial,
    Replicate,
    Shard,
    chunk_sizes,
    layout_text,
    normalize_placements,
)
from minidist.nn.parameter import Parameter
from minidist.tensor import Tensor, _is_float, set_placement_guard


def _check_mesh(mesh, what):
    if mesh is None:
        raise ValueError(f"{what}: give the device_mesh (init_device_mesh('cpu', (n,)))")
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"{what}: device_mesh must be a DeviceMesh, got {type(mesh).__name__}")
    return mesh


class DTensor(Tensor):
    """A tensor spread over a device mesh (the module docstring)."""

    __slots__ = ("_spec",)

    # ------------------------------------------------------------------ making nodes

    @staticmethod
    def _node(data, spec: DTensorSpec, parent, backward, op: str, cls=None) -> DTensor:
        """A DTensor node with one parent (``backward(grad)`` its gradient), as
        ``Tensor._make`` makes a Tensor's; ``parent=None``: a leaf."""
        out = (cls or DTensor).__new__(cls or DTensor)
        out.data, out.grad, out.name = data, None, None
        out._freed = out._retain = False
        out._hooks = out._grad_hooks = None
        out._op, out._spec = op, spec
        from minidist import tensor as _tensor
        if parent is not None and _tensor._grad_enabled and parent.requires_grad:
            out.requires_grad = True
            out._parents = (parent,)
            out._backward = lambda grad: (backward(grad),)
        else:
            out.requires_grad = False
            out._parents = ()
            out._backward = None
        return out

    @staticmethod
    def from_local(local_tensor, device_mesh=None, placements=None, *, run_check: bool = False,
                   shape=None, stride=None) -> DTensor:
        """This rank's ``local_tensor`` as its piece of a DTensor laid out by
        ``placements`` (no message). The global shape is ``shape`` when given,
        else as torch infers it: a Shard's dim is the local length times the
        mesh dim's size (right for even chunks only: pass ``shape`` for
        uneven ones). ``run_check=True`` gathers every rank's local shape and
        refuses a layout whose pieces do not fit, naming the rank; torch's
        check also broadcasts a Replicate's data, minidist's compares shapes
        only. Gradients flow to ``local_tensor``."""
        mesh = _check_mesh(device_mesh, "DTensor.from_local")
        local = local_tensor if isinstance(local_tensor, Tensor) else Tensor(local_tensor)
        placements = normalize_placements(placements, local.data.ndim, mesh.ndim,
                                          "DTensor.from_local")
        if shape is None:
            shape = list(local.data.shape)
            for mesh_dim, p in enumerate(placements):
                if isinstance(p, Shard):
                    shape[p.dim] *= mesh.shape[mesh_dim]
        spec = DTensorSpec(mesh, placements, shape, local.data.dtype)
        expected = spec.local_shape_and_offset()[0]
        if tuple(local.data.shape) != expected:
            raise ValueError(
                f"rank {dist.get_rank()}: DTensor.from_local: the local tensor has shape "
                f"{tuple(local.data.shape)}, but a {spec.shape} tensor laid out "
                f"{layout_text(placements)} on a mesh {mesh.shape} puts a {expected} piece "
                f"here (torch.chunk's sizes); pass shape= the global shape")
        if run_check:
            _check_shapes(spec, local.data.shape)
        return DTensor._node(local.data, spec, local, lambda g: g, "from_local")

    # ------------------------------------------------------------------ what it is

    @property
    def placements(self) -> tuple:
        return self._spec.placements

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._spec.mesh

    @property
    def shape(self):
        return self._spec.shape

    @property
    def ndim(self):
        return len(self._spec.shape)

    @property
    def size(self):
        return int(np.prod(self._spec.shape, dtype=np.int64))

    def numel(self) -> int:
        return self.size

    def __len__(self):
        return self._spec.shape[0]

    def __repr__(self) -> str:
        body = np.array2string(backend.to_numpy(self.data), precision=4, separator=", ")
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (f"DTensor(local_tensor={body}, device_mesh={self._spec.mesh!r}, "
                f"placements={self._spec.placements!r}, shape={self._spec.shape}{grad})")

    # ------------------------------------------------------------------ leaving the layout

    def to_local(self, *, grad_placements=None) -> Tensor:
        """This rank's piece, as a Tensor in the graph. Its gradient is taken
        to have this DTensor's layout, or ``grad_placements`` when given (for
        a local result whose gradient is partial, say): that gradient is then
        redistributed to this DTensor's layout in the backward."""
        spec = self._spec
        backward = (lambda g: g)
        if grad_placements is not None:
            grad_spec = DTensorSpec(spec.mesh, normalize_placements(
                grad_placements, len(spec.shape), spec.mesh.ndim, "to_local(grad_placements)"),
                spec.shape, spec.dtype)
            target = tuple(Replicate() if isinstance(p, Partial) else p for p in spec.placements)

            def backward(g):
                return backend.from_numpy(_redistribute.redistribute_array(
                    backend.to_numpy(g), grad_spec, target))
        return _make_local(self.data, self, backward)

    def full_tensor(self, *, grad_placements=None) -> Tensor:
        """The whole tensor on every rank: a redistribute to Replicate on every
        mesh dim (all_gathers, all_reduces), then ``to_local()``."""
        whole = self.redistribute(self._spec.mesh, [Replicate()] * self._spec.mesh.ndim)
        return whole.to_local(grad_placements=grad_placements)

    def redistribute(self, device_mesh=None, placements=None, *, async_op: bool = False,
                     forward_dtype=None, backward_dtype=None) -> DTensor:
        """This DTensor laid out by ``placements`` (see
        :mod:`~minidist.distributed.tensor.redistribute`: one named collective
        per changed mesh dim; ``plan(dt, placements)`` prints them first)."""
        mesh = self._spec.mesh if device_mesh is None else device_mesh
        if mesh != self._spec.mesh:
            raise NotImplementedError(
                "redistribute: moving a DTensor to another mesh is not supported (torch "
                "neither); gather it (full_tensor()) and distribute_tensor it on the new mesh")
        if forward_dtype is not None or backward_dtype is not None:
            raise NotImplementedError("redistribute(forward_dtype=, backward_dtype=) is not "
                                      "supported in minidist; cast before with .astype")
        return _redistribute.run(self, _redistribute.plan(self, placements), DTensor._node)

    # ------------------------------------------------------------------ refused

    # A DTensor replicated on every mesh dim holds the whole tensor on every
    # rank, so its numbers are the tensor's (a loss, say); any other layout's
    # local array is a piece, and the caller must say which array is meant.

    def numpy(self):
        return self._whole("numpy()").numpy()

    def item(self):
        return self._whole("item()").item()

    def tolist(self):
        return self._whole("tolist()").tolist()

    def _whole(self, what):
        if all(isinstance(p, Replicate) for p in self._spec.placements):
            return Tensor(self.data)
        raise TypeError(self._which(what))

    def _which(self, what):
        return (f"{what} of a DTensor ({layout_text(self._spec.placements)}): say which "
                f"array you mean, .full_tensor().{what} for the whole tensor (a collective) "
                f"or .to_local().{what} for this rank's piece")

    def _compare(self, what):
        raise TypeError(self._which(what).replace(f".{what}", f" {what} ..."))

    def __gt__(self, other):
        self._compare(">")

    def __ge__(self, other):
        self._compare(">=")

    def __lt__(self, other):
        self._compare("<")

    def __le__(self, other):
        self._compare("<=")

    def argmax(self, axis=None):
        if all(isinstance(p, Replicate) for p in self._spec.placements):
            return self.data.argmax(axis=axis)
        raise TypeError(self._which("argmax()"))

    def detach(self) -> DTensor:
        """The same local data and layout, cut from the graph."""
        return DTensor._node(self.data, self._spec, None, None, "")

    def _as_parameter(self, requires_grad: bool = True) -> DTensor:
        """``nn.Parameter(dtensor)``: a Parameter of this layout (a leaf)."""
        out = DTensor._node(self.data, self._spec, None, None, "", cls=DTensorParameter)
        out.requires_grad = bool(requires_grad) and _is_float(self.data.dtype)
        return out


class DTensorParameter(DTensor, Parameter):
    """A DTensor a Module learns: ``nn.Parameter(distribute_tensor(...))``
    (what torch's ``distribute_module`` and ``fully_shard`` put on a module)."""

    __slots__ = ()

    def __init__(self, *args, **kwargs):  # made by DTensor._as_parameter, filled there
        pass

    def __repr__(self) -> str:
        return "Parameter containing:\n" + DTensor.__repr__(self)


def _check_shapes(spec, local_shape):
    """run_check: every rank's local shape against the layout's, one rank named."""
    mesh = spec.mesh
    world = dist.get_world_size()
    mine = np.zeros((max(len(spec.shape), 1),), np.int64)
    mine[:len(local_shape)] = local_shape
    shapes = np.empty((world,) + mine.shape, np.int64)
    dist.all_gather_into_tensor(shapes, mine)
    for rank in (int(r) for r in np.asarray(mesh.mesh).reshape(-1)):   # this rank's mesh
        coordinate = tuple(int(c) for c in np.argwhere(np.asarray(mesh.mesh) == rank)[0])
        want = spec.local_shape_and_offset(coordinate)[0]
        if tuple(shapes[rank][:len(spec.shape)]) != tuple(want):
            raise ValueError(
                f"rank {rank}: DTensor.from_local(run_check=True): its local shape "
                f"{tuple(shapes[rank][:len(spec.shape)])} does not fit a {spec.shape} tensor "
                f"laid out {layout_text(spec.placements)}, which puts {tuple(want)} there")


def _make_local(data, parent, backward):
    """A plain Tensor node over ``parent``'s data (``to_local``)."""
    out = Tensor.__new__(Tensor)
    out.data, out.grad, out.name = data, None, None
    out._freed = out._retain = False
    out._hooks = out._grad_hooks = None
    out._op = "to_local"
    from minidist import tensor as _tensor
    if _tensor._grad_enabled and parent.requires_grad:
        out.requires_grad, out._parents = True, (parent,)
        out._backward = lambda grad: (backward(grad),)
    else:
        out.requires_grad, out._parents, out._backward = False, (), None
    return out



def distribute_tensor(tensor, device_mesh=None, placements=None, *,
                      src_data_rank: int | None = 0) -> DTensor:
    """The whole ``tensor`` laid out on ``device_mesh`` by ``placements``
    (default: Replicate on every mesh dim), a leaf with the tensor's
    ``requires_grad``. Every rank passes a tensor of the same shape; with
    ``src_data_rank=0`` (torch's default) the values are those of the rank
    at coordinate 0 of every mesh dim, broadcast along each (so ranks that
    passed different values agree); ``None``: each rank cuts its own, no
    message. A Partial(sum) holds value / n on each rank (torch's rule), a
    Partial(avg), max or min the value."""
    mesh = _check_mesh(device_mesh, "distribute_tensor")
    source = tensor if isinstance(tensor, Tensor) else Tensor(tensor)
    if isinstance(source, DTensor):
        raise ValueError("distribute_tensor: the tensor is already a DTensor; use "
                         "redistribute to change its layout")
    placements = normalize_placements(placements, source.data.ndim, mesh.ndim,
                                      "distribute_tensor")
    array = np.ascontiguousarray(backend.to_numpy(source.data))
    if src_data_rank is not None:
        if src_data_rank != 0:
            raise NotImplementedError("distribute_tensor(src_data_rank=): minidist takes 0 "
                                      "(coordinate 0 of each mesh dim) or None")
        array = array.copy()
        for mesh_dim in range(mesh.ndim):
            group, coords = _redistribute._members(
                DTensorSpec(mesh, placements, array.shape, array.dtype), mesh_dim)
            if len(coords) > 1:
                dist.broadcast(array, src=group.ranks[coords.index(0)], group=group)
    spec = DTensorSpec(mesh, placements, array.shape, array.dtype)
    (shape, offset) = spec.local_shape_and_offset()
    local = np.ascontiguousarray(array[tuple(slice(o, o + s) for o, s in zip(offset, shape))])
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Partial) and p.reduce_op == "sum":
            local = local / mesh.shape[mesh_dim]
    out = DTensor._node(backend.from_numpy(local.astype(array.dtype, copy=False)), spec,
                        None, None, "")
    out.requires_grad = source.requires_grad
    return out


def _refuse_unruled(parents, op):
    for parent in parents:
        if isinstance(parent, DTensor):
            raise TypeError(
                f"{op or 'this op'} on a DTensor ({layout_text(parent._spec.placements)}, "
                f"shape {parent._spec.shape}): minidist has no placement rule for it, and on the "
                f"local shard alone it would compute a wrong whole. The rules are listed in "
                f"minidist.distributed.tensor.ops; call .full_tensor() for the whole tensor or "
                f".to_local() for this rank's piece first")


set_placement_guard(_refuse_unruled)

__all__ = ["DTensor", "DTensorParameter", "DTensorSpec", "distribute_tensor", "chunk_sizes"]
