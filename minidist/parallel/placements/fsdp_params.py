"""One FSDP2 unit's parameters: each a ``Shard(0)`` DTensor, gathered together
and reduced together (torch's ``FSDPParam`` and ``FSDPParamGroup``).

Read :mod:`.mixed_precision_policy` first, then this, then
:mod:`.fully_shard` (the hooks that call it).

Sharded. Each parameter of the unit is cut along its dim 0 into torch.chunk's
pieces (``ceil(d0 / N)`` rows each, the last ranks fewer or none: 5 rows on
4 ranks hold 2, 2, 1, 0) and rank r's piece becomes a
:class:`~minidist.distributed.tensor.DTensorParameter` laid out
``(Shard(0),)``, or ``(Replicate(), Shard(0))`` on a 2-D ``(replicate,
shard)`` mesh (HSDP). That DTensor is what the module registers, so
``model.parameters()``, the optimizer and the state dict see the shards.
No message: every rank cuts the weights it holds (as torch, ranks must have
initialised the same weights: seed them alike).

Unsharded. Before the module computes, one all_gather brings every rank's
pieces of *all* the unit's parameters at once (torch's "copy-in"): each rank
packs its pieces, each padded to ``ceil(d0 / N)`` rows, into one flat array
of S elements (S = sum over the unit's parameters of ``ceil(d0 / N)`` times
the other dims' product), and the gathered (N, S) array holds rank r's
pieces in row r; each parameter is then copied out of it, its padding rows
dropped, into a plain :class:`~minidist.nn.Parameter` of the full shape
that the module computes with (registered in the module's place of the
DTensor until the unit is resharded).

Reduced. After the unit's backward the full gradients are packed the same
way, one row per destination rank, and one reduce_scatter leaves each rank
the sum of its rows; with HSDP one all_reduce over the replicate dim adds
the other replicas' sums. Divided by the data-parallel world (the ranks of
both dims), cast to the shard's dtype and added to its ``.grad`` (the
shard's local array), it is the average gradient of this rank's piece.

Padding: per parameter, to a multiple of N rows (FSDP1 pads one flat buffer
per unit to a multiple of N elements instead): a 5 x 7 weight on 4 ranks
sends 2 x 7 per rank, 56 elements for 35.

Cost per unit and step, per rank (ring algorithms, b bytes per element of
param_dtype, b' of reduce_dtype): each all_gather sends (N - 1) S b bytes,
the reduce_scatter (N - 1) S' b' (S' over the parameters with gradients),
HSDP's all_reduce 2 (R - 1) / R S' b' on R replicas. Memory: the shards
(their own dtype), and while the unit is unsharded its full weights and
the gathered (N, S) array until they are copied out.

Where NumPy keeps more than torch: minidist's layers keep the arrays their
backward reads in the autograd closure (``Linear`` keeps its weight), so a
unit resharded after its forward still has its full weights alive in the
graph until its backward has run (FSDP1's module docstring says the same);
the backward's all_gather refills those very arrays. Resharding after
forward therefore sends what torch's sends, but does not lower the peak
between forward and backward here; after backward (and after a forward
without a graph, ``no_grad``) the arrays are dropped for real.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import nn
from minidist.distributed.tensor import DTensor, DTensorSpec, Replicate, Shard, chunk_sizes


class FSDPParam:
    """One parameter of a unit: its shard (a DTensorParameter), where the
    module registers it, and the unsharded Parameter the module computes with."""

    def __init__(self, name: str, param, locations, mesh):
        self.name = name
        self.locations = locations            # [(module, attribute)]: a tied one has several
        data = param.data
        if data.ndim == 0:
            raise ValueError(f"rank {dist.get_rank()}: fully_shard: {name} is a 0-d parameter, "
                             "which has no dim 0 to shard (torch's Shard(0)); give it shape (1,)")
        self.shape = tuple(int(s) for s in data.shape)
        self.dtype = data.dtype
        self.requires_grad = bool(param.requires_grad)
        shards = mesh.shape[-1]
        self.rows = -(-self.shape[0] // shards)          # each rank's padded rows
        self.rest = int(np.prod(self.shape[1:], dtype=np.int64))
        self.padded = self.rows * self.rest              # its part of S, per rank
        placements = (Shard(0),) if mesh.ndim == 1 else (Replicate(), Shard(0))
        spec = DTensorSpec(mesh, placements, self.shape, self.dtype)
        (local_shape, offset) = spec.local_shape_and_offset()
        self.local_rows = local_shape[0]
        # A copy: a view would keep the whole weights alive behind the shard.
        local = np.array(data[offset[0]:offset[0] + self.local_rows], copy=True)
        self.sharded = nn.Parameter(DTensor._node(local, spec, None, None, ""),
                                    requires_grad=self.requires_grad)
        self.unsharded = None                 # made by the first all_gather
        self.kept = None                      # the unsharded array, while it lives

    def register(self, value) -> None:
        """Put ``value`` (the shard or the unsharded Parameter) in every place
        the module holds this parameter."""
        for module, attribute in self.locations:
            module._parameters[attribute] = value
            object.__setattr__(module, attribute, value)


class FSDPParamGroup:
    """A unit's parameters, gathered with one all_gather and reduced with one
    reduce_scatter (the module docstring)."""

    def __init__(self, params: list, mesh, policy, algorithm: str, label: str):
        self.params = params
        self.mesh = mesh
        self.policy = policy
        self.algorithm = algorithm
        self.label = label
        self.shard_group = mesh.get_group(mesh.ndim - 1)
        self.replicate_group = mesh.get_group(0) if mesh.ndim == 2 else None
        self.shards = mesh.shape[-1]
        self.replicas = mesh.shape[0] if mesh.ndim == 2 else 1
        dtypes = sorted({str(p.dtype) for p in params})
        if len(dtypes) > 1:
            raise TypeError(f"rank {dist.get_rank()}: fully_shard({label}): its parameters have "
                            f"dtypes {dtypes}; one all_gather needs one dtype: convert the "
                            "module (.to(dtype)) or fully_shard the parts apart")
        self.master_dtype = params[0].dtype
        self.compute_dtype = policy.compute_dtype(self.master_dtype)
        self.reduce_dtype = policy.gradient_dtype(self.master_dtype)
        self.gathered = self._offsets(params)
        self.with_grads = [p for p in params if p.requires_grad]
        self.reduced = self._offsets(self.with_grads)
        self.unsharded = False
        self.pending = None                   # (work, gathered array, send array)
        self.ledgers = []
        self.on_gradient = None               # set by fully_shard: called per ready gradient

    @staticmethod
    def _offsets(params) -> tuple[list[int], int]:
        offsets, total = [], 0
        for p in params:
            offsets.append(total)
            total += p.padded
        return offsets, total

    def _track(self, array):
        for ledger in self.ledgers:
            ledger.track("buffers", array)
        return array

    # -- unshard: the all_gather and the copy-out --------------------------
    def unshard(self, async_op: bool = False) -> None:
        """Start (``async_op``) or run the unit's all_gather; nothing when the
        unit is unsharded or its gather is already on its way."""
        if self.unsharded or self.pending is not None:
            if not async_op:
                self.wait_for_unshard()
            return
        offsets, total = self.gathered
        send = np.zeros(total, self.compute_dtype)
        for p, offset in zip(self.params, offsets):
            piece = send[offset:offset + p.padded].reshape((p.rows,) + p.shape[1:])
            piece[:p.local_rows] = p.sharded.data    # cast to param_dtype here
        gathered = self._track(np.empty(self.shards * total, self.compute_dtype))
        work = dist.all_gather_into_tensor(gathered, send, group=self.shard_group,
                                           async_op=True, algorithm=self.algorithm)
        work.test()                           # post its first messages now
        self.pending = (work, gathered, send)
        if not async_op:
            self.wait_for_unshard()

    def progress(self) -> None:
        """Move a prefetched all_gather on, without blocking (nothing runs in the background)."""
        if self.pending is not None:
            self.pending[0].test()

    def wait_for_unshard(self) -> None:
        """Finish the all_gather, copy every parameter out, register the unsharded ones."""
        if self.pending is None:
            return
        work, gathered, _ = self.pending
        work.wait()
        self.pending = None
        offsets, total = self.gathered
        rows = gathered.reshape(self.shards, total)
        for p, offset in zip(self.params, offsets):
            block = rows[:, offset:offset + p.padded].reshape(
                (self.shards * p.rows,) + p.shape[1:])[:p.shape[0]]
            if p.kept is None:                # its own array: a view would keep the padding
                p.kept = self._track(np.empty(p.shape, self.compute_dtype))
            np.copyto(p.kept, block)          # (or refill the array the backward reads)
            if p.unsharded is None:
                p.unsharded = nn.Parameter(p.kept, requires_grad=p.requires_grad)
                if p.requires_grad:
                    p.unsharded.register_post_accumulate_grad_hook(
                        lambda tensor: self.on_gradient())
            p.unsharded.data = p.kept
            p.register(p.unsharded)
        self.unsharded = True

    def reshard(self, keep_arrays: bool) -> None:
        """Register the shards again. ``keep_arrays``: the autograd graph still
        reads the unsharded arrays (between forward and backward: NumPy
        cannot free what a closure holds), so the backward's all_gather
        refills them; otherwise they are dropped."""
        if self.pending is not None:          # a prefetch nobody used: finish it first
            self.wait_for_unshard()
        if not self.unsharded:
            return
        for p in self.params:
            p.register(p.sharded)
            if not keep_arrays:
                p.kept = None
                p.unsharded.data = np.empty((0,) + p.shape[1:], p.unsharded.data.dtype)
        self.unsharded = False

    # -- the gradients: reduce_scatter (and all_reduce) --------------------
    def reduce_gradients(self) -> None:
        """Average the unit's full gradients over the data-parallel ranks into
        the shards' ``.grad`` (added to a gradient already there)."""
        offsets, total = self.reduced
        n = self.shards
        pack = self._track(np.zeros((n, total), self.reduce_dtype))
        for p, offset in zip(self.with_grads, offsets):
            grad = p.unsharded.grad
            if grad is None:
                raise RuntimeError(f"rank {dist.get_rank()}: fully_shard({self.label}): "
                                   f"{p.name} has no gradient to reduce")
            cells = pack[:, offset:offset + p.padded].reshape((n, p.rows) + p.shape[1:])
            for rank, (size, start) in enumerate(_chunks(p.shape[0], n)):
                cells[rank, :size] = grad[start:start + size]
        mine = np.empty(total, self.reduce_dtype)
        dist.reduce_scatter_tensor(mine, pack.reshape(-1), group=self.shard_group,
                                   algorithm=self.algorithm)
        del pack
        if self.replicate_group is not None and self.replicas > 1:
            dist.all_reduce(mine, group=self.replicate_group, algorithm=self.algorithm)
        mine /= self.reduce_dtype.type(n * self.replicas)
        for p, offset in zip(self.with_grads, offsets):
            local = mine[offset:offset + p.local_rows * p.rest].reshape(
                (p.local_rows,) + p.shape[1:]).astype(p.dtype)
            if p.sharded.grad is None:
                p.sharded.grad = local
            else:
                p.sharded.grad += local
            p.unsharded.grad = None


def _chunks(length: int, n: int) -> list[tuple[int, int]]:
    """(size, start) of torch.chunk's n pieces of ``length`` rows."""
    sizes = chunk_sizes(length, n)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    return list(zip(sizes, starts.tolist()))
