"""The gradient of a Replicate input that met a sharded one is partial: sum
it (Megatron's f, torch's backward of a Replicate operand).

When a Replicate tensor enters an op with a sharded one (``x @ w`` with ``x``
Replicate and ``w`` Shard(1); a Replicate LayerNorm weight on Shard(1)
activations; a Replicate weight on Shard(0) rows of a batch), each rank's
local op sees only its part of the output, so the gradient it computes for
the Replicate input holds only that part's contribution: a Partial. The
input's gradient must have its own layout (Replicate), so the backward sums
the terms: :func:`all_reduce_gradient` is the identity forward and one
all_reduce of the gradient per mesh dim named, backward.

Cost: forward nothing; backward one ring all_reduce of the input's local
array per mesh dim, 2 (n-1)/n x its bytes sent per rank.
"""

from __future__ import annotations

from minidist import backend
from minidist.distributed.tensor import redistribute as _redistribute
from minidist.distributed.tensor.placements import DTensorSpec, Replicate
from minidist.tensor import Tensor


def all_reduce_gradient(tensor: Tensor, mesh, mesh_dims) -> Tensor:
    """``tensor`` unchanged; its gradient summed over the groups of
    ``mesh_dims`` of ``mesh`` in the backward."""
    mesh_dims = tuple(sorted(set(mesh_dims)))
    if not mesh_dims:
        return tensor
    spec = DTensorSpec(mesh, [Replicate()] * mesh.ndim, tensor.data.shape, tensor.data.dtype)

    def backward(g):
        out = backend.to_numpy(g)
        for mesh_dim in mesh_dims:
            out = _redistribute._all_reduce(out, spec, mesh_dim, "sum")
        return (backend.from_numpy(out),)

    return Tensor._make(tensor.data, (tensor,), backward, "all_reduce_gradient")


__all__ = ["all_reduce_gradient"]
