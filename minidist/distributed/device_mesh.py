"""The device mesh: the world's ranks laid out as an n-dimensional array, one
process group per slice along each dimension (torch's
``torch.distributed.device_mesh``).

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mesh.mesh                      # array([[0, 1], [2, 3]]): row-major, as torch
    tp = mesh["tp"]                # this rank's row: ranks 0, 1 on ranks 0 and 1
    dist.all_reduce(x, group=mesh.get_group("tp"))   # sums over this rank's row
    mesh.get_local_rank("dp")      # this rank's index along "dp"
    DistributedDataParallel(model, process_group=mesh["dp"])  # a 1-D mesh is a group

Where the groups come from. Dimension ``d`` of a mesh of shape ``(n0, n1, ...)``
cuts the ranks into ``size / n_d`` groups of ``n_d``: the ranks that share
every coordinate but the ``d``-th. Each is made with :func:`~.world.new_group`,
which every rank of the world must call, in the same order, with the same
ranks (its channel number keeps the groups' messages apart); so every rank
makes every group of every dimension, in torch's order (dimension by
dimension, the slices in row-major order of the other coordinates), and keeps
those it belongs to. A dimension as large as the world is the world's own
group, as torch's is on the CPU. Making a mesh of shape ``(n0, ..., nk)`` costs
``sum(size / n_d)`` calls to ``new_group``, no message: a group is a number.
Before them the ranks agree on the shape and names (:mod:`.agreement`, 2 (n - 1)
small messages): a rank that passes others is named at once, instead of
waiting later on a group the others never made.

Slicing (``mesh["dp", "tp"]``) makes no group: the sub-mesh keeps the groups
of the dimensions it names, and holds the slice of the ranks that contains
this rank (two ranks of other slices get other sub-meshes).

Where minidist answers differently from torch (the error says so):

* the mesh must hold every rank of the world: torch 2.13 lets a mesh be smaller
  than the world (the ranks outside it get ``get_coordinate() is None``),
  which minidist's strategies have no use for;
* ``device_type`` "cpu" is minidist's NumPy arrays; "cuda" is accepted once
  CuPy is the array backend (``minidist.backend.use("cupy")``: the arrays live
  on the GPU and the collectives stage them through host memory), refused
  before; other device types are refused;
* ``mesh.size(mesh_dim)`` also takes a dimension's name (torch's takes an index).

A 1-D mesh may stand for a group wherever a strategy takes one (torch's
``device_mesh=`` arguments): :func:`as_group`. The collectives keep torch's
meaning, a ProcessGroup: ``group=mesh["tp"]`` there says to call
``get_group()``.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed import world as _world
from minidist.distributed.agreement import agree

_DEVICE_TYPES = ("cpu", "cuda")


# --------------------------------------------------------------------------- the layout alone


def mesh_layout(mesh_shape) -> np.ndarray:
    """The global ranks of a mesh of ``mesh_shape``, row-major (torch's
    ``torch.arange(world).view(mesh_shape)``): the last dimension varies fastest."""
    shape = _checked_shape(mesh_shape)
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)


def groups_along(mesh: np.ndarray, dim: int) -> list[list[int]]:
    """The groups of dimension ``dim`` of the rank array ``mesh``: the ranks that
    share every other coordinate, in torch's order (the slices in row-major
    order of the other coordinates). Cost: one pass over the array."""
    mesh = np.asarray(mesh)
    return np.moveaxis(mesh, dim, -1).reshape(-1, mesh.shape[dim]).tolist()


def _checked_shape(mesh_shape) -> tuple[int, ...]:
    if isinstance(mesh_shape, (int, np.integer)):
        mesh_shape = (mesh_shape,)
    try:
        shape = tuple(int(n) for n in mesh_shape)
    except (TypeError, ValueError):
        raise TypeError(f"mesh_shape must be a tuple of whole numbers, such as (2, 4), got "
                        f"{mesh_shape!r}") from None
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"mesh_shape {mesh_shape!r}: every dimension needs at least one rank, "
                         "and a mesh at least one dimension, such as (2, 4)")
    return shape


def _checked_names(names, ndim: int) -> tuple[str, ...] | None:
    if names is None:
        return None
    if isinstance(names, str):
        names = (names,)
    names = tuple(names)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"mesh_dim_names must be strings, got {names!r}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RuntimeError(f"Each mesh_dim_name must be unique: {', '.join(map(repr, repeated))} "
                           f"appears more than once in mesh_dim_names {names}")
    if len(names) != ndim:
        raise RuntimeError(f"mesh_shape and mesh_dim_names should have the same length: the "
                           f"mesh has {ndim} dimension(s), mesh_dim_names {names} names "
                           f"{len(names)}")
    return names


def _checked_device_type(device_type: str) -> str:
    if not isinstance(device_type, str):
        raise TypeError(f"device_type must be a string such as 'cpu', got "
                        f"{type(device_type).__name__}")
    if device_type and not device_type.isalpha():
        raise RuntimeError(f"Device type with index is not supported but got {device_type!r} "
                           "(as torch): pass the type alone, 'cpu' or 'cuda'")
    if device_type not in _DEVICE_TYPES:
        raise RuntimeError(f"device_type {device_type!r}: minidist's arrays are NumPy's ('cpu') "
                           "or, with the CuPy backend, on an NVIDIA GPU ('cuda')")
    if device_type == "cuda":
        from minidist import backend

        if backend.name() != "cupy":
            raise RuntimeError(
                "device_type 'cuda': minidist's arrays are NumPy's (on the CPU) until CuPy is "
                "the array backend. Call minidist.backend.use('cupy') (or set "
                "MINIDIST_BACKEND=cupy) before making the mesh, or use device_type 'cpu'.")
    return device_type


# --------------------------------------------------------------------------- the mesh


class DeviceMesh:
    """The world's ranks as an n-dimensional array, with this rank's group
    along each dimension (torch's class; see the module docstring).

    ``DeviceMesh(device_type, mesh, mesh_dim_names=None)`` takes the array of
    global ranks itself (every rank of the world once, in any order); every
    rank must make the same mesh, since it makes the groups. Most code calls
    :func:`init_device_mesh`, which lays the ranks out row-major."""

    def __init__(self, device_type: str, mesh, *, mesh_dim_names=None) -> None:
        device_type = _checked_device_type(device_type)
        ranks = np.array(mesh, dtype=np.int64)
        if ranks.ndim == 0:
            ranks = ranks.reshape(1)
        names = _checked_names(mesh_dim_names, ranks.ndim)
        world = _world.current()
        _check_holds_the_world(ranks, world.world_size)
        coordinate = tuple(int(i) for i in np.argwhere(ranks == world.rank)[0])
        groups = []
        for dim in range(ranks.ndim):
            if ranks.shape[dim] == world.world_size:
                groups.append(world.group)  # the whole world, as torch's CPU mesh
                continue
            mine = None
            for members in groups_along(ranks, dim):  # every rank makes every group
                group = _world.new_group(members)
                if world.rank in members:
                    mine = group
            groups.append(mine)
        self._setup(device_type, ranks, names, groups, coordinate, root=None)

    def _setup(self, device_type, ranks, names, groups, coordinate, root) -> None:
        self._device_type = device_type
        self._mesh = ranks
        self._mesh.flags.writeable = False
        self._names = names
        self._groups = list(groups)
        self._coordinate = coordinate
        self._root = root

    # ------------------------------------------------------------------ what it is

    @property
    def device_type(self) -> str:
        return self._device_type

    @property
    def mesh(self) -> np.ndarray:
        """The global ranks (read-only); a sub-mesh's are the slice holding this rank."""
        return self._mesh

    @property
    def mesh_dim_names(self) -> tuple[str, ...] | None:
        return self._names

    @property
    def ndim(self) -> int:
        return self._mesh.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._mesh.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        """The ranks along ``mesh_dim`` (an index or a name), or in the whole mesh."""
        if mesh_dim is None:
            return int(self._mesh.size)
        return int(self._mesh.shape[self._dim(mesh_dim)])

    def get_rank(self) -> int:
        """This process's global rank (torch's method)."""
        return _world.get_rank()

    def get_coordinate(self) -> tuple[int, ...]:
        """This rank's index along every dimension: ``mesh.mesh[coordinate] == rank``."""
        return self._coordinate

    # ------------------------------------------------------------------ its groups

    def get_group(self, mesh_dim: int | str | None = None):
        """This rank's :class:`~.process_group.ProcessGroup` along ``mesh_dim`` (a
        name or an index; None for a 1-D mesh): the ranks that share every
        other coordinate with it."""
        if mesh_dim is None:
            if self.ndim > 1:
                raise RuntimeError(
                    f"get_group(): this mesh has {self.ndim} dimensions "
                    f"{self._dims_text()}, one group each; name one, get_group("
                    f"{self._example_dim()!r}), or get them all with get_all_groups()")
            mesh_dim = 0
        return self._groups[self._dim(mesh_dim)]

    def get_all_groups(self) -> list:
        """This rank's group along each dimension, in order."""
        return list(self._groups)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's rank in its group along ``mesh_dim`` (None for a 1-D mesh).
        For a row-major mesh it is the coordinate along that dimension; a group
        numbers its members in the sorted order of their global ranks (torch's
        ``new_group``), so a mesh given in another order may differ."""
        if mesh_dim is None and self.ndim > 1:
            raise RuntimeError(
                f"get_local_rank(): this mesh has {self.ndim} dimensions {self._dims_text()}; "
                f"name one, get_local_rank({self._example_dim()!r})")
        return self.get_group(mesh_dim).rank

    # ------------------------------------------------------------------ sub-meshes

    def __getitem__(self, mesh_dim_names) -> DeviceMesh:
        """The sub-mesh of the named dimensions holding this rank (no group is
        made: it keeps the groups of those dimensions). Names must follow the
        mesh's order (torch's rule): ``mesh["dp", "tp"]``, not ``mesh["tp", "dp"]``."""
        if not self._names:
            raise RuntimeError("Cannot slice a DeviceMesh without mesh_dim_names: make it with "
                               "init_device_mesh(..., mesh_dim_names=('dp', 'tp')), or ask "
                               "for a dimension's group by index, mesh.get_group(0)")
        names = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
        if names == self._names:
            return self
        unknown = [name for name in names if name not in self._names]
        if unknown or not names:
            raise KeyError(f"Invalid mesh_dim_names {names}: {', '.join(map(repr, unknown))} "
                           f"is not a dimension of this mesh; valid names are {list(self._names)}")
        if len(set(names)) != len(names):
            raise KeyError(f"Invalid mesh_dim_names {names}: a dimension is named twice")
        dims = [self._names.index(name) for name in names]
        if dims != sorted(dims):
            in_order = tuple(self._names[d] for d in sorted(dims))
            raise KeyError(f"Invalid mesh_dim_names {names}: mesh dim indices should be in "
                           f"ascending order (as torch), mesh{list(in_order)} rather; the mesh's "
                           f"order is {self._names}")
        index = tuple(slice(None) if d in dims else self._coordinate[d] for d in range(self.ndim))
        sub = object.__new__(DeviceMesh)
        sub._setup(self._device_type, self._mesh[index], names,
                   [self._groups[d] for d in dims], tuple(self._coordinate[d] for d in dims),
                   root=self._root or self)
        return sub

    # ------------------------------------------------------------------ helpers

    def _dim(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if not self._names or mesh_dim not in self._names:
                raise KeyError(f"Mesh dimension {mesh_dim!r} does not exist; this mesh's "
                               f"dimensions are {self._dims_text()}")
            return self._names.index(mesh_dim)
        if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, (int, np.integer)):
            raise TypeError(f"mesh_dim must be a dimension's index or name, got {mesh_dim!r}")
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh_dim {mesh_dim} is out of range for a mesh of {self.ndim} "
                             f"dimension(s) {self._dims_text()}")
        return int(mesh_dim) % self.ndim

    def _dims_text(self) -> str:
        if self._names:
            return "(" + ", ".join(f"{n}={s}" for n, s in zip(self._names, self.shape)) + ")"
        return str(self.shape)

    def _example_dim(self):
        return self._names[0] if self._names else 0

    def __repr__(self) -> str:
        return (f"DeviceMesh({self._dims_text()}, {self._device_type!r}, "
                f"mesh={self._mesh.tolist()})")

    def __eq__(self, other) -> bool:
        if not isinstance(other, DeviceMesh):
            return NotImplemented
        return (self._device_type == other._device_type and self._names == other._names
                and np.array_equal(self._mesh, other._mesh))

    def __hash__(self) -> int:
        return hash((self._device_type, self._names, self.shape, self._mesh.tobytes()))


def _check_holds_the_world(ranks: np.ndarray, world_size: int) -> None:
    product = " x ".join(map(str, ranks.shape))
    if ranks.size != world_size:
        raise RuntimeError(
            f"the mesh holds {product} = {ranks.size} ranks, but this run has "
            f"{world_size} (the world size): make the product of mesh_shape equal "
            f"{world_size}, or start {ranks.size} ranks. (torch lets a mesh be smaller than "
            "the world; minidist's mesh holds every rank.)")
    if sorted(ranks.ravel().tolist()) != list(range(world_size)):
        missing = sorted(set(range(world_size)) - set(ranks.ravel().tolist()))
        raise RuntimeError(f"the mesh {ranks.tolist()} must hold every rank 0..{world_size - 1} "
                           f"once; missing {missing}")


def init_device_mesh(device_type: str, mesh_shape, *, mesh_dim_names=None) -> DeviceMesh:
    """A :class:`DeviceMesh` of ``mesh_shape`` over the world, ranks laid out
    row-major (torch's function). Every rank calls it, with the same
    arguments: it makes the groups of every dimension (``new_group``)."""
    shape = _checked_shape(mesh_shape)
    names = _checked_names(mesh_dim_names, len(shape))
    _checked_device_type(device_type)
    world_size = _world.get_world_size()
    if int(np.prod(shape)) != world_size:
        product = " x ".join(map(str, shape))
        named = f" {dict(zip(names, shape))}" if names else ""
        raise RuntimeError(
            f"init_device_mesh({device_type!r}, {shape}){named}: the mesh holds {product} = "
            f"{int(np.prod(shape))} ranks, but this run has {world_size} (the world size). "
            f"Make the product of mesh_shape equal {world_size}, or start "
            f"{int(np.prod(shape))} ranks. (torch lets a mesh be smaller than the world; "
            "minidist's mesh holds every rank.)")
    # A rank with another shape or other names would make other groups and
    # wait on one the others never joined: agree first, the odd rank named.
    agree("init_device_mesh", (shape, names), describe=_mesh_words,
          hint="A mesh is made by every rank of the world from the same shape and names.")
    return DeviceMesh(device_type, mesh_layout(shape), mesh_dim_names=names)


def _mesh_words(value) -> str:
    shape, names = value
    return f"mesh_shape {shape}" + (f", mesh_dim_names {names}" if names else "")


def trace_header(mesh_shape, mesh_dim_names=None) -> dict:
    """The trace header fields that name a mesh (``mesh_shape``,
    ``mesh_dim_names``), from a :class:`DeviceMesh` or a shape and names: add
    them to a run's trace (``pipeline.annotate_trace(path, fields)``) and the
    timeline colours each message and collective by the mesh dimension it
    runs along (``viz.timeline``, ``minidist viz TRACE --timeline out.png``)."""
    if isinstance(mesh_shape, DeviceMesh):
        mesh_shape, mesh_dim_names = mesh_shape.shape, mesh_shape.mesh_dim_names
    shape = _checked_shape(mesh_shape)
    names = _checked_names(mesh_dim_names, len(shape)) or tuple(f"dim{d}" for d in range(len(shape)))
    return {"mesh_shape": list(shape), "mesh_dim_names": list(names)}


def as_group(group_or_mesh, what: str = "group", *, device_mesh=None):
    """The process group a strategy's ``group=`` stands for: None (the world)
    and a ProcessGroup as they are, a 1-D :class:`DeviceMesh` its one group.
    ``device_mesh`` is torch's keyword of DDP and FSDP, the other way to say
    it (not both, as torch). A mesh of more dimensions has a group per
    dimension: the error says to name one. Cost: an isinstance check."""
    if device_mesh is not None:
        if group_or_mesh is not None:
            raise ValueError(f"{what}: pass process_group or device_mesh, not both (as torch)")
        if not isinstance(device_mesh, DeviceMesh):
            raise TypeError(f"{what}: device_mesh must be a DeviceMesh (init_device_mesh), got "
                            f"{type(device_mesh).__name__}")
        group_or_mesh = device_mesh
    if not isinstance(group_or_mesh, DeviceMesh):
        return group_or_mesh
    if group_or_mesh.ndim != 1:
        example = group_or_mesh._example_dim()
        raise ValueError(
            f"{what}: a {group_or_mesh.ndim}-D DeviceMesh {group_or_mesh._dims_text()} has one "
            f"group per dimension; pass the one it runs over, mesh[{example!r}] or "
            f"mesh.get_group({example!r})")
    return group_or_mesh.get_group()
