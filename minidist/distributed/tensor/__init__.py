"""``minidist.distributed.tensor``: sharding as placements (torch's
``torch.distributed.tensor``).

A DTensor is one tensor laid out on a device mesh: on each mesh dim it is
cut (``Shard(d)``), copied (``Replicate()``) or a sum still to be taken
(``Partial()``). Every sharding of the course is one such layout: ZeRO and
FSDP's parameters are ``Shard(0)`` on the data-parallel dim, a column-parallel
weight ``Shard(0)``, a row-parallel one ``Shard(1)``, a row-parallel output
``Partial()``, sequence parallelism's activations ``Shard(1)``. And every
collective of those strategies is a change of layout (``redistribute``).

Read in this order:

1. ``placements.py``: Shard, Replicate, Partial; torch.chunk's sizes; which
   box of the global tensor a rank holds.
2. ``dtensor.py``: the DTensor, ``distribute_tensor``, ``from_local``,
   ``to_local``, ``full_tensor``.
3. ``redistribute.py``: each change of layout as one named collective, its
   bytes, its backward; ``plan`` prints it before it runs.
4. ``partial_gradient.py``: the backward all_reduce of a Replicate input
   that met a sharded one (Megatron's f).
5. ``ops.py``: the ops' placement rules (elementwise, matmul and linear,
   reductions and shapes, layer_norm, embedding, softmax, the
   vocabulary-parallel cross entropy), each a table in its docstring.
6. ``grad_norm.py``: the norm of gradients spread over ranks (summed over
   the mesh dims where a parameter is Shard), which makes
   ``minidist.nn.utils.clip_grad_norm_`` right on DTensors; torchtitan's
   ``clip_grad_norm_(..., pp_mesh=)``.
"""

from __future__ import annotations

from minidist.distributed.device_mesh import DeviceMesh, init_device_mesh
from minidist.distributed.tensor.dtensor import (
    DTensor,
    DTensorParameter,
    DTensorSpec,
    distribute_tensor,
)
from minidist.distributed.tensor.grad_norm import clip_grad_norm_
from minidist.distributed.tensor.ops import loss_parallel_depth  # installs the rules
from minidist.distributed.tensor.placements import (
    Partial,
    Placement,
    Replicate,
    Shard,
    chunk_sizes,
    local_shape_and_offset,
)
from minidist.distributed.tensor.redistribute import plan

__all__ = ["DTensor", "DTensorParameter", "DTensorSpec", "DeviceMesh", "Partial", "Placement",
           "Replicate", "Shard", "chunk_sizes", "clip_grad_norm_", "distribute_tensor",
           "init_device_mesh", "local_shape_and_offset", "loss_parallel_depth", "plan"]
