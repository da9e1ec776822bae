"""``redistribute``: the one collective that turns a layout into another.

A change of placement on one mesh dim is one named step, run over that mesh
dim's group (n ranks), each an autograd node whose backward is the opposite
change of the gradient (a gradient has its tensor's placements; a Partial's
is Replicate, every term's gradient being the whole):

================  =================================  =========================  ===========
from -> to        forward                            bytes sent per rank        backward
================  =================================  =========================  ===========
S(d) -> R         all_gather along d                 (n-1)/n x padded whole     take own chunk
P -> R            all_reduce                         2 (n-1)/n x whole          nothing
P -> S(d)         reduce_scatter along d             (n-1)/n x padded whole     all_gather
R -> S(d)         take own chunk (a copy)            0                          all_gather
S(d) -> S(e)      all_to_all                         (n-1)/n x padded whole     all_to_all back
R -> P, S -> P    refused, as torch ("for internal use only")
================  =================================  =========================  ===========

"whole" is the box the group holds together (the local box before this mesh
dim's cut); "padded": uneven chunks travel padded to the largest chunk, as
torch's do, and are trimmed on arrival. Every collective is the ring (the
all_to_all pairwise), so the bytes are exactly the formulas above
(:mod:`minidist.distributed.collectives.traffic`).

On a mesh of several dims each mesh dim changes in turn, the last first.
When two mesh dims cut the same tensor dim (``(S(0), S(0))``) the inner cut
lies inside the outer one, so a change there would cut in the wrong order:
those dims go through Replicate (gather the inner, then the outer, then cut
again outer first). :func:`plan` says which steps will run, and what they
cost, before anything is sent; ``print(plan(dt, placements))`` shows it.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.collectives.traffic import ring_all_reduce_sent
from minidist.distributed.tensor.placements import (
    DTensorSpec,
    Partial,
    Replicate,
    Shard,
    chunk_sizes,
    layout_text,
    local_shape_and_offset,
    normalize_placements,
)
from minidist.units import format_bytes

ALGORITHM = "ring"
_OPS = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN"}


class Step:
    """One change of placement on one mesh dim: what it runs and sends."""

    def __init__(self, mesh_dim, src, dst, collective, nbytes, group_size, before, after):
        self.mesh_dim, self.src, self.dst = mesh_dim, src, dst
        self.collective, self.nbytes, self.group_size = collective, nbytes, group_size
        self.before, self.after = before, after

    def __repr__(self) -> str:
        return (f"Step(mesh_dim={self.mesh_dim}, {self.src}->{self.dst}, {self.collective}, "
                f"{self.nbytes} B)")


class Plan:
    """The steps of one redistribute, in order; ``str()`` is a table."""

    def __init__(self, spec, placements, steps):
        self.spec, self.placements, self.steps = spec, tuple(placements), list(steps)

    @property
    def nbytes(self) -> int:
        """Bytes this rank sends over the whole redistribute."""
        return sum(step.nbytes for step in self.steps)

    @property
    def collectives(self) -> list[str]:
        return [step.collective for step in self.steps]

    def __str__(self) -> str:
        head = (f"redistribute {layout_text(self.spec.placements)} -> "
                f"{layout_text(self.placements)} of a {tuple(self.spec.shape)} "
                f"{np.dtype(self.spec.dtype).name} tensor on a mesh {tuple(self.spec.mesh.shape)}")
        if not self.steps:
            return head + "\n  nothing to do: the layouts are the same"
        rows = [head]
        for number, step in enumerate(self.steps, 1):
            rows.append(f"  {number}. mesh dim {step.mesh_dim} ({step.group_size} ranks): "
                        f"{step.src} -> {step.dst}  {step.collective:<14} sends "
                        f"{format_bytes(step.nbytes)} per rank  {layout_text(step.before)} -> "
                        f"{layout_text(step.after)}")
        rows.append(f"  in all: {format_bytes(self.nbytes)} sent per rank")
        return "\n".join(rows)

    __repr__ = __str__


# --------------------------------------------------------------------------- planning


def _box(spec, placements):
    return local_shape_and_offset(spec.shape, spec.mesh.shape, spec.mesh.get_coordinate(),
                                  placements)[0]


def _max_box(spec, placements, mesh_dim):
    """The box with mesh dim ``mesh_dim``'s Shard replaced by Replicate (the
    whole the group holds together)."""
    whole = list(placements)
    whole[mesh_dim] = Replicate()
    return _box(spec, whole)


def _step_bytes(kind, spec, placements, mesh_dim, dst) -> int:
    n = spec.mesh.shape[mesh_dim]
    if n == 1:
        return 0
    itemsize = np.dtype(spec.dtype).itemsize
    whole = _max_box(spec, placements, mesh_dim)
    total = int(np.prod(whole, dtype=np.int64))
    if kind == "all_reduce":
        group, coords = _members(spec, mesh_dim)
        return ring_all_reduce_sent(total, n)[group.rank] * itemsize
    if kind in ("all_gather", "reduce_scatter"):
        d = (placements[mesh_dim] if kind == "all_gather" else dst).dim
        piece = total // whole[d] * max(chunk_sizes(whole[d], n)) if whole[d] else 0
        return (n - 1) * piece * itemsize
    if kind == "all_to_all":
        src = placements[mesh_dim]
        rest = total // (whole[src.dim] * whole[dst.dim]) if whole[src.dim] and whole[dst.dim] else 0
        block = max(chunk_sizes(whole[src.dim], n)) * max(chunk_sizes(whole[dst.dim], n)) * rest
        return (n - 1) * block * itemsize
    return 0


def _kind(src, dst) -> str:
    if src == dst:
        return ""
    if isinstance(dst, Partial):
        raise RuntimeError(
            f"Can not redistribute from {src} to {dst}: redistributing to Partial is for "
            f"internal use only (torch's rule); a Partial comes from an op (a matmul of "
            f"Shard(1) by Shard(0)) or from DTensor.from_local(..., [Partial()])")
    if isinstance(src, Shard):
        return "all_gather" if isinstance(dst, Replicate) else "all_to_all"
    if isinstance(src, Partial):
        return "all_reduce" if isinstance(dst, Replicate) else "reduce_scatter"
    return "local chunk"


def _conflicts(current, target, dirty):
    """The mesh dims that must go through Replicate: every dim cutting a
    tensor dim that a changing dim cuts, or will cut, when another mesh dim
    cuts it too."""
    def dims(p):
        return {p.dim} if isinstance(p, Shard) else set()
    touched = {}
    for i in range(len(current)):
        for d in dims(current[i]) | dims(target[i]):
            touched.setdefault(d, set()).add(i)
    out = set()
    for i in dirty:
        for d in dims(current[i]) | dims(target[i]):
            if len(touched[d]) > 1:
                out |= touched[d]
    return out


def plan(dtensor_or_spec, placements) -> Plan:
    """The steps that take a DTensor (or its spec) to ``placements``, with
    their collectives and bytes, before anything runs."""
    spec = getattr(dtensor_or_spec, "_spec", dtensor_or_spec)
    target = normalize_placements(placements, len(spec.shape), spec.mesh.ndim, "redistribute")
    current = list(spec.placements)
    dirty = [i for i in range(len(current)) if current[i] != target[i]]
    for i in dirty:
        _kind(current[i], target[i])  # refuse what cannot be done, before anything runs
    through = _conflicts(current, target, dirty)
    steps = []

    def move(i, dst):
        kind = _kind(current[i], dst)
        if not kind:
            return
        before = tuple(current)
        nbytes = _step_bytes(kind, spec, before, i, dst)
        current[i] = dst
        steps.append(Step(i, before[i], dst, kind, nbytes, spec.mesh.shape[i], before,
                          tuple(current)))

    for i in sorted(through, reverse=True):       # gather the inner cuts first
        move(i, Replicate())
    for i in sorted(through):                     # cut again, outer first
        move(i, target[i])
    for i in sorted(set(dirty) - through, reverse=True):
        move(i, target[i])
    return Plan(spec, target, steps)


# --------------------------------------------------------------------------- the steps on arrays


def _members(spec, mesh_dim):
    """For each group rank along ``mesh_dim``, its coordinate on that dim
    (the identity for a row-major mesh)."""
    mesh = spec.mesh
    coordinate = mesh.get_coordinate()
    index = tuple(slice(None) if k == mesh_dim else coordinate[k] for k in range(mesh.ndim))
    along = [int(r) for r in np.asarray(mesh.mesh)[index].reshape(-1)]
    group = mesh.get_group(mesh_dim)
    return group, [along.index(r) for r in group.ranks]


def _pad_along(array, dim, length):
    if array.shape[dim] == length:
        return array
    pad = [(0, 0)] * array.ndim
    pad[dim] = (0, length - array.shape[dim])
    return np.pad(array, pad)


def _gather(array, spec, placements, mesh_dim):
    """S(d) -> R: every chunk along d, padded to the largest, trimmed, joined."""
    d = placements[mesh_dim].dim
    group, coords = _members(spec, mesh_dim)
    n = len(coords)
    whole = _max_box(spec, placements, mesh_dim)
    sizes = chunk_sizes(whole[d], n)
    piece = np.ascontiguousarray(np.moveaxis(_pad_along(array, d, max(sizes)), d, 0))
    pieces = np.empty((n,) + piece.shape, piece.dtype)
    dist.all_gather_into_tensor(pieces, piece, group=group, algorithm=ALGORITHM)
    ordered = [None] * n
    for g, c in enumerate(coords):
        ordered[c] = pieces[g][:sizes[c]]
    return np.ascontiguousarray(np.moveaxis(np.concatenate(ordered, axis=0), 0, d))


def _chunk(array, spec, placements, mesh_dim, d):
    """R -> S(d): this rank's chunk of dim d (a copy)."""
    n, c = spec.mesh.shape[mesh_dim], spec.mesh.get_coordinate()[mesh_dim]
    sizes = chunk_sizes(array.shape[d], n)
    start = sum(sizes[:c])
    index = [slice(None)] * array.ndim
    index[d] = slice(start, start + sizes[c])
    return np.ascontiguousarray(array[tuple(index)])


def _all_reduce(array, spec, mesh_dim, reduce_op):
    out = np.array(array, copy=True, order="C")
    group, _ = _members(spec, mesh_dim)
    if len(group.ranks) > 1:
        dist.all_reduce(out, op=getattr(dist.ReduceOp, _OPS[reduce_op]), group=group,
                        algorithm=ALGORITHM)
    return out


def _reduce_scatter(array, spec, mesh_dim, d, reduce_op):
    """P -> S(d): the reduction of every rank's term, this rank keeping its chunk."""
    group, coords = _members(spec, mesh_dim)
    n = len(coords)
    sizes = chunk_sizes(array.shape[d], n)
    width = max(sizes)
    c = spec.mesh.get_coordinate()[mesh_dim]
    moved = np.moveaxis(array, d, 0)
    blocks = np.zeros((n, width) + moved.shape[1:], array.dtype)
    starts = np.cumsum([0] + sizes)
    for g, cg in enumerate(coords):        # group rank g receives coordinate cg's chunk
        blocks[g, :sizes[cg]] = moved[starts[cg]:starts[cg + 1]]
    mine = np.empty((width,) + moved.shape[1:], array.dtype)
    dist.reduce_scatter_tensor(mine, blocks.reshape((n * width,) + moved.shape[1:]),
                               op=getattr(dist.ReduceOp, _OPS[reduce_op]), group=group,
                               algorithm=ALGORITHM)
    return np.ascontiguousarray(np.moveaxis(mine[:sizes[c]], 0, d))


def _all_to_all(array, spec, placements, mesh_dim, e):
    """S(d) -> S(e): send rank j the part of my d-chunk that falls in its
    e-chunk; join what comes back along d."""
    d = placements[mesh_dim].dim
    group, coords = _members(spec, mesh_dim)
    n = len(coords)
    whole = _max_box(spec, placements, mesh_dim)
    d_sizes, e_sizes = chunk_sizes(whole[d], n), chunk_sizes(whole[e], n)
    dw, ew = max(d_sizes), max(e_sizes)
    c = spec.mesh.get_coordinate()[mesh_dim]
    e_starts = np.cumsum([0] + e_sizes)
    block_shape = list(array.shape)
    block_shape[d], block_shape[e] = dw, ew
    send = np.zeros([n] + block_shape, array.dtype)
    for g, cg in enumerate(coords):
        index = [slice(None)] * array.ndim
        index[e] = slice(e_starts[cg], e_starts[cg + 1])
        part = array[tuple(index)]
        send[g][tuple(slice(0, s) for s in part.shape)] = part
    received = np.empty_like(send)
    dist.all_to_all_single(received, send, group=group, algorithm="pairwise")  # bytes of the table
    ordered = [None] * n
    for g, cg in enumerate(coords):
        index = [slice(None)] * array.ndim
        index[d] = slice(0, d_sizes[cg])
        index[e] = slice(0, e_sizes[c])
        ordered[cg] = received[g][tuple(index)]
    return np.ascontiguousarray(np.concatenate(ordered, axis=d))


def _forward(array, spec, step):
    before, i, src, dst = step.before, step.mesh_dim, step.src, step.dst
    if step.collective == "all_gather":
        return _gather(array, spec, before, i)
    if step.collective == "all_reduce":
        return _all_reduce(array, spec, i, src.reduce_op)
    if step.collective == "reduce_scatter":
        return _reduce_scatter(array, spec, i, dst.dim, src.reduce_op)
    if step.collective == "local chunk":
        return _chunk(array, spec, before, i, dst.dim)
    return _all_to_all(array, spec, before, i, dst.dim)


def _backward(grad, spec, step):
    """The opposite change, on the gradient (whose layout is ``step.after``,
    a Partial's gradient being Replicate)."""
    after, i, src = step.after, step.mesh_dim, step.src
    if step.collective == "all_gather":               # R -> S(d): own chunk
        return _chunk(grad, spec, after, i, src.dim)
    if step.collective == "all_reduce":
        if src.reduce_op == "sum":
            return grad
        if src.reduce_op == "avg":
            return grad / spec.mesh.shape[i]
        raise RuntimeError(f"the gradient of a {src} -> Replicate redistribute is not defined "
                           f"(which term was the {src.reduce_op}?); use Partial(sum) or "
                           f"Partial(avg) where a gradient flows")
    if step.collective in ("reduce_scatter", "local chunk"):   # S(d) -> R: all_gather
        gathered = _gather(grad, spec, after, i)
        if step.collective == "reduce_scatter" and src.reduce_op == "avg":
            gathered = gathered / spec.mesh.shape[i]
        return gathered
    return _all_to_all(grad, spec, after, i, src.dim)


def run(dtensor, target_plan: Plan, make_node):
    """Run the plan's steps on ``dtensor``, each an autograd node made by
    ``make_node(data, spec, parent, backward, op)``; returns the last."""
    spec = dtensor._spec
    node = dtensor
    for step in target_plan.steps:
        here = DTensorSpec(spec.mesh, step.before, spec.shape, spec.dtype)
        data = backend.to_numpy(node.data)
        out = _forward(data, here, step)
        node = make_node(backend.from_numpy(out), DTensorSpec(spec.mesh, step.after,
                                                                   spec.shape, spec.dtype),
                             node, _grad_function(here, step),
                             f"redistribute {step.src}->{step.dst}")
    if not target_plan.steps:
        node = make_node(dtensor.data, spec, dtensor, lambda g: g, "redistribute")
    return node


def _grad_function(spec, step):
    def backward(grad):
        return backend.from_numpy(_backward(backend.to_numpy(grad), spec, step))
    return backward


def redistribute_array(array, spec, placements):
    """The local array of ``spec``'s layout turned into ``placements``'
    (no autograd): used by the gradients of the ops and the checkpoints."""
    steps = plan(spec, placements).steps
    for step in steps:
        array = _forward(array, DTensorSpec(spec.mesh, step.before, spec.shape, spec.dtype), step)
    return array


__all__ = ["Plan", "Step", "plan", "run", "redistribute_array", "ALGORITHM"]
