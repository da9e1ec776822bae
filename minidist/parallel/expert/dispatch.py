"""Expert parallelism: a mixture of experts with its experts spread over ranks,
the tokens sent to them and back with all_to_all (GShard, Lepikhin et al., 2020;
Switch Transformer; DeepSpeed-MoE; torchtitan's ``ep``).

A :class:`~minidist.models.moe.MoE` layer holds E experts; on n ranks of an
expert-parallel group each rank holds E / n of them (rank j the experts
j E/n .. (j+1) E/n - 1) and its own tokens. The router is replicated: every
rank routes its own tokens (one capacity group per rank, the capacity
computed from the rank's own N tokens, as GShard's groups and DeepSpeed's
local capacity; no message is needed to decide what is dropped). Then, in
:meth:`ExpertParallelMoE.experts_on`:

1. **Counts**: the rows for each expert, (E,), in expert order; an
   all_to_all of these counts (E / n values to each rank) tells every rank
   how many rows each source sends to each of its experts.
2. **Dispatch**: an ``all_to_all_single`` of the rows themselves with
   uneven split sizes, ``input_split_sizes[j]`` the rows for rank j's
   experts (the rows are already grouped expert by expert, so rank by
   rank), ``output_split_sizes[i]`` what rank i sends here.
3. **Experts**: each local expert on the rows that arrived for it (from
   every source).
4. **Combine**: the outputs go back by the transposed all_to_all (split
   sizes swapped); the source gates and adds them into its tokens as on one
   process.

Backward is the same two all_to_alls transposed: :func:`all_to_all_rows` is
one autograd node whose backward sends the gradient rows back with the split
sizes swapped. The counts need no backward (they are integers, and kept).

Equal to one process: for each rank's tokens the output, the input's and
the router's gradients are those of the whole MoE on those tokens alone; an
expert's gradient is the sum over the group's ranks of what their tokens
give it (the tests check both, 2 and 4 ranks, float64).

Bytes per rank per layer (s bytes a value, width C; D_r the rows rank r
sends to other ranks' experts, R_r the rows it receives from other ranks;
:mod:`minidist.parallel.expert.costs` gives them from the routing):
forward (n - 1) E/n 8 bytes of counts plus (D_r + R_r) C s (dispatch and
combine), backward (D_r + R_r) C s. With routing spread evenly and nothing
dropped, D_r = R_r = (n - 1)/n k N.

**Training with expert and data parallelism** (a mesh ``dp x ep``): every
rank trains on its own batch; the dense parameters (attention, embeddings,
LayerNorms, routers) are replicated on all dp x ep ranks, an expert on the
dp ranks of one ep coordinate. :func:`allreduce_moe_grads` averages each kind
over its own group: the dense gradients over the world, the experts' over
``dp`` (the all_to_all's backward has already summed the ep ranks' tokens
into them), both divided by the world size. DDP cannot do it: it averages
every parameter over one group and starts from rank 0's weights, which
would overwrite the other ep ranks' experts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.device_mesh import as_group
from minidist.models.moe import MoE, MoEGPT, moe_layers, run_experts
from minidist.nn import Module, ModuleList
from minidist.parallel.replicas import all_reduce_gradients
from minidist.tensor import Tensor

#: The all_to_all's and all_reduce's algorithms: fixed, so the bytes each rank
#: sends are deterministic (the pairwise exchange is the one that takes uneven
#: pieces; the ring all_reduce's bytes have their formula).
ALL_TO_ALL = "pairwise"
ALL_REDUCE = "ring"


def all_to_all_rows(x: Tensor, send_rows, receive_rows, group=None,
                    algorithm: str = ALL_TO_ALL) -> Tensor:
    """Rows ``x[...send_rows[0]]`` to group rank 0, the next ``send_rows[1]``
    to rank 1, ...; the result holds ``receive_rows[i]`` rows from rank i,
    in rank order. One autograd node: its backward is the transposed
    all_to_all (the gradient rows sent back, split sizes swapped). Cost:
    (n - 1) alpha + the pairwise steps' larger sides' bytes, each way."""
    send_rows, receive_rows = [int(r) for r in send_rows], [int(r) for r in receive_rows]
    source = backend.to_numpy(x.data, contiguous=True)
    out = np.empty((sum(receive_rows),) + source.shape[1:], dtype=source.dtype)
    dist.all_to_all_single(out, source, output_split_sizes=receive_rows,
                           input_split_sizes=send_rows, group=group, algorithm=algorithm)

    def backward(grad):
        back = np.empty(source.shape, dtype=source.dtype)
        dist.all_to_all_single(back, backend.to_numpy(grad, contiguous=True), output_split_sizes=send_rows,
                               input_split_sizes=receive_rows, group=group, algorithm=algorithm)
        return (backend.from_numpy(back),)

    return Tensor._make(backend.from_numpy(out), (x,), backward, "all_to_all")


def exchange_counts(counts: np.ndarray, group=None, algorithm: str = ALL_TO_ALL) -> np.ndarray:
    """``counts`` (E,): the rows this rank sends to each expert; returns
    (n, E/n): row i the rows rank i sends to each of this rank's experts.
    One all_to_all of E int64 values (E/n to each rank)."""
    n = dist.get_world_size(group)
    received = np.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group, algorithm=algorithm)
    return received.reshape(n, counts.size // n)


@dataclass(frozen=True)
class Dispatch:
    """What one rank's layer sent in its last forward: ``sent`` (n,) rows to
    each rank of the group (its own included), ``received`` (n,) rows from
    each, and ``received_per_expert`` (n, E/n): rows from each rank for each
    of this rank's experts."""

    sent: np.ndarray
    received: np.ndarray
    received_per_expert: np.ndarray


def expert_range(n_expert: int, rank: int, world_size: int) -> tuple[int, int]:
    """The experts ``[start, stop)`` that ``rank`` of ``world_size`` holds."""
    if n_expert % world_size:
        raise ValueError(
            f"expert parallelism spreads n_expert={n_expert} experts "
            f"over {world_size} ranks, but {n_expert} is not divisible by {world_size}; use an "
            f"expert-parallel size that divides it "
            f"({', '.join(str(d) for d in range(1, n_expert + 1) if n_expert % d == 0)})")
    per_rank = n_expert // world_size
    return rank * per_rank, (rank + 1) * per_rank


class ExpertParallelMoE(MoE):
    """This rank's share of a :class:`~minidist.models.moe.MoE`,
    ``ExpertParallelMoE(moe, group)``: the whole router, the experts ``expert_start ..
    expert_stop - 1`` as ``experts`` (local indices from 0). ``forward`` is
    the MoE's; only :meth:`experts_on` differs. Keeps ``dispatch``, a
    :class:`Dispatch`, after each forward."""

    def __init__(self, moe: MoE, group=None, algorithm: str = ALL_TO_ALL):
        """A copy of ``moe``'s router and of this rank's experts (every rank
        passes the same ``moe``); ``group``: a ProcessGroup, None (the
        world) or a 1-D device mesh. No weights are drawn (MoE's own
        constructor would draw them): they are copied."""
        if not isinstance(moe, MoE):
            raise TypeError(f"ExpertParallelMoE needs a MoE, got {type(moe).__name__}")
        Module.__init__(self)
        group = as_group(group, "expert parallelism")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        start, stop = expert_range(moe.n_expert, rank, world)
        self.n_expert, self.top_k, self.capacity_factor = moe.n_expert, moe.top_k, moe.capacity_factor
        self.router = copy.deepcopy(moe.router)
        self.experts = ModuleList([copy.deepcopy(moe.experts[e]) for e in range(start, stop)])
        self.routing, self.aux_loss, self.dispatch = None, None, None
        self.group, self.algorithm = group, algorithm
        self.world_size, self.rank = world, rank
        self.expert_start, self.expert_stop = start, stop

    def experts_on(self, rows: Tensor, expert: np.ndarray) -> Tensor:
        n, local = self.world_size, self.expert_stop - self.expert_start
        destination = expert // local
        if np.any(np.diff(destination) < 0):
            raise ValueError("ExpertParallelMoE: the rows must come grouped by the rank of their "
                             "expert (Routing.order() gives them so)")
        counts = np.bincount(expert, minlength=self.n_expert).astype(np.int64)
        sent = counts.reshape(n, local).sum(axis=1)
        per_expert = exchange_counts(counts, self.group, self.algorithm)
        received = per_expert.sum(axis=1)
        arrived = all_to_all_rows(rows, sent, received, self.group, self.algorithm)
        # Arrived rows: source by source, within a source expert by expert.
        local_expert = np.repeat(np.tile(np.arange(local), n), per_expert.reshape(-1))
        out = run_experts(self.experts, arrived, local_expert)
        self.dispatch = Dispatch(sent, received, per_expert)
        return all_to_all_rows(out, received, sent, self.group, self.algorithm)

    def extra_repr(self) -> str:
        return (f"experts {self.expert_start}..{self.expert_stop - 1} of {self.n_expert} "
                f"(rank {self.rank} of {self.world_size}), top_k={self.top_k}, "
                f"capacity_factor={self.capacity_factor}")


def expert_parallel_gpt(model: MoEGPT, group=None, algorithm: str = ALL_TO_ALL) -> MoEGPT:
    """A copy of ``model`` whose MoE layers hold this rank's experts of the
    expert-parallel ``group`` (a ProcessGroup, None for the world, or a 1-D
    mesh such as ``mesh["ep"]``); ``model`` is left whole. Every rank passes
    the same model (same seed)."""
    if not isinstance(model, MoEGPT):
        raise TypeError(f"expert_parallel_gpt needs a MoEGPT, got {type(model).__name__}")
    shard = copy.deepcopy(model)
    for block, source in zip(shard.transformer.h, model.transformer.h):
        block.mlp = ExpertParallelMoE(source.mlp, group, algorithm)
    return shard


def expert_parameters(model) -> set[int]:
    """The ids of the parameters of the model's experts (not their routers)."""
    return {id(p) for layer in moe_layers(model) for p in layer.experts.parameters()}


def allreduce_moe_grads(model, dp_group=None, algorithm: str = ALL_REDUCE) -> None:
    """After ``backward()`` on every rank's own batch (each loss a mean over
    its tokens): leave in every gradient the mean over all ranks' batches.
    Dense parameters are summed over the world, the experts' over
    ``dp_group`` (the ranks holding the same experts: ``mesh["dp"]``), each
    in one ring all_reduce, then divided by the world size. A parameter
    without a gradient counts as zero."""
    dp_group = as_group(dp_group, "allreduce_moe_grads")
    experts = expert_parameters(model)
    params = list(model.parameters())
    all_reduce_gradients([p for p in params if id(p) not in experts], None, algorithm=algorithm)
    all_reduce_gradients([p for p in params if id(p) in experts], dp_group, algorithm=algorithm)
    scale = 1.0 / dist.get_world_size()
    for p in params:
        p.grad *= scale


__all__ = ["ExpertParallelMoE", "Dispatch", "all_to_all_rows", "exchange_counts", "expert_range",
           "expert_parallel_gpt", "allreduce_moe_grads", "expert_parameters"]
