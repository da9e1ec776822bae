"""Placements: how one tensor lies on one dimension of a device mesh (torch's
``Shard``, ``Replicate`` and ``Partial`` of ``torch.distributed.tensor``).

A DTensor's layout is one placement per mesh dimension:

=============  =======================================  =================================
placement      what the ranks along that mesh dim hold  the whole tensor is
=============  =======================================  =================================
``Shard(d)``   consecutive pieces of tensor dim ``d``   the pieces concatenated along d
``Replicate``  the same whole (at this dim)             any one rank's copy
``Partial``    a term each, all of the same shape       their sum (or ``reduce_op``)
=============  =======================================  =================================

The pieces of a ``Shard`` are ``torch.chunk``'s: ``ceil(L / n)`` elements each,
the last ones shorter or empty (33 on 2 ranks: 17, 16; 5 on 4: 2, 2, 1, 0),
and rank ``i`` along the mesh dim (its coordinate) holds the ``i``-th. On a
mesh of several dims the placements apply left to right: ``(Shard(0),
Shard(0))`` cuts dim 0 along mesh dim 0, then cuts each piece again along
mesh dim 1 (torch's default order). :func:`local_shape_and_offset` says which
box of the global tensor a rank holds; everything else (the collectives that
change a layout, the checkpoints that save one and load another) builds on it.

Cost: arithmetic on shapes; no message.
"""

from __future__ import annotations

import math

import numpy as np


class Placement:
    """One mesh dimension's part of a layout (torch's base class)."""

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False


class Shard(Placement):
    """``Shard(dim)``: the ranks along the mesh dim hold consecutive chunks of
    tensor dim ``dim`` (a negative dim counts from the end, as torch's, and
    is made positive when a DTensor takes it)."""

    __slots__ = ("dim",)

    def __init__(self, dim: int = 0):
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"Shard(dim): dim is a tensor dimension (an int), got {dim!r}")
        self.dim = dim

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __eq__(self, other) -> bool:
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self) -> int:
        return hash(("Shard", self.dim))

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"


class Replicate(Placement):
    """``Replicate()``: every rank along the mesh dim holds the same whole."""

    __slots__ = ()

    def is_replicate(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return isinstance(other, Replicate)

    def __hash__(self) -> int:
        return hash("Replicate")

    def __repr__(self) -> str:
        return "Replicate()"

    def __str__(self) -> str:
        return "R"


#: the reductions a Partial may wait for; each is one all_reduce's ``op``
REDUCE_OPS = ("sum", "avg", "max", "min")


class Partial(Placement):
    """``Partial(reduce_op="sum")``: each rank along the mesh dim holds a term;
    the tensor is their reduction, which no rank has yet (a matmul of a
    Shard(1) by a Shard(0) leaves one; an all_reduce makes it Replicate)."""

    __slots__ = ("reduce_op",)

    def __init__(self, reduce_op: str = "sum"):
        if reduce_op not in REDUCE_OPS:
            raise ValueError(f"Partial(reduce_op={reduce_op!r}): minidist's Partial reduces by "
                             f"one of {', '.join(REDUCE_OPS)}")
        self.reduce_op = reduce_op

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    def __eq__(self, other) -> bool:
        return isinstance(other, Partial) and other.reduce_op == self.reduce_op

    def __hash__(self) -> int:
        return hash(("Partial", self.reduce_op))

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


# --------------------------------------------------------------------------- chunks


def chunk_sizes(length: int, pieces: int) -> list[int]:
    """``torch.chunk``'s sizes of ``length`` elements cut into ``pieces``:
    ``ceil(length / pieces)`` each, the last shorter, trailing ones empty."""
    if pieces < 1:
        raise ValueError(f"chunk_sizes: cannot cut into {pieces} pieces")
    size = math.ceil(length / pieces) if length else 0
    return [max(0, min(size, length - i * size)) for i in range(pieces)]


def chunk_offset(length: int, pieces: int, index: int) -> int:
    """Where chunk ``index`` of :func:`chunk_sizes` starts."""
    return sum(chunk_sizes(length, pieces)[:index])


def normalize_placements(placements, ndim: int, mesh_ndim: int, what: str) -> tuple:
    """``placements`` as a tuple of one Placement per mesh dim, Shard dims made
    positive; a clear error for anything else."""
    if placements is None:
        placements = [Replicate()] * mesh_ndim
    if isinstance(placements, Placement):
        placements = [placements]
    placements = tuple(placements)
    if len(placements) != mesh_ndim:
        raise ValueError(f"{what}: a mesh of {mesh_ndim} dimension(s) takes {mesh_ndim} "
                         f"placement(s), one per mesh dim, got {len(placements)}: {placements}")
    out = []
    for p in placements:
        if not isinstance(p, Placement) or type(p) is Placement:
            raise TypeError(f"{what}: placements are Shard(dim), Replicate() or Partial(), "
                            f"got {p!r}")
        if isinstance(p, Shard):
            if not -ndim <= p.dim < max(ndim, 1) or ndim == 0:
                raise ValueError(f"{what}: {p!r} names a dimension the tensor of {ndim} "
                                 f"dimension(s) does not have")
            p = Shard(p.dim % ndim)
        out.append(p)
    return tuple(out)


def local_shape_and_offset(global_shape, mesh_shape, coordinate, placements):
    """The shape of the box of the global tensor this rank holds, and its
    first element's index (torch's ``compute_local_shape_and_global_offset``).
    Each mesh dim's Shard(d) cuts the current box's dim ``d`` again, left to
    right; Replicate and Partial leave it. Cost: O(mesh dims)."""
    shape, offset = list(global_shape), [0] * len(global_shape)
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            n, i = mesh_shape[mesh_dim], coordinate[mesh_dim]
            sizes = chunk_sizes(shape[p.dim], n)
            offset[p.dim] += sum(sizes[:i])
            shape[p.dim] = sizes[i]
    return tuple(shape), tuple(offset)


class DTensorSpec:
    """What a DTensor is beyond its local array: the mesh, the placements
    (one per mesh dim), the global shape and the dtype."""

    __slots__ = ("mesh", "placements", "shape", "dtype")

    def __init__(self, mesh, placements, shape, dtype):
        self.mesh, self.placements = mesh, tuple(placements)
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)

    def local_shape_and_offset(self, coordinate=None):
        """The box of the global tensor that the rank at ``coordinate`` (this
        rank's by default) holds."""
        coordinate = self.mesh.get_coordinate() if coordinate is None else coordinate
        return local_shape_and_offset(self.shape, self.mesh.shape, coordinate, self.placements)

    def __eq__(self, other) -> bool:
        return (isinstance(other, DTensorSpec) and self.mesh == other.mesh
                and self.placements == other.placements and self.shape == other.shape)

    def __repr__(self) -> str:
        return (f"DTensorSpec({layout_text(self.placements)}, shape={self.shape}, "
                f"mesh={self.mesh.shape})")


def layout_text(placements) -> str:
    """``(S(0), R)``: a layout in the short notation the plans print."""
    return "(" + ", ".join(str(p) for p in placements) + ")"


__all__ = ["Placement", "Shard", "Replicate", "Partial", "chunk_sizes", "chunk_offset",
           "local_shape_and_offset", "normalize_placements", "DTensorSpec", "layout_text", "REDUCE_OPS"]
