"""3D parallelism on the GPT: data x tensor x pipeline parallel on one device
mesh, Megatron-LM's layout (Narayanan et al., 2021), with the weights of one
process.

The mesh. One ``init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp",
"dp", "tp"))``: row-major, so ``tp`` varies fastest (the tp ranks of a stage
are neighbours: on a real machine the same node, for the all_reduces of
every block), then ``dp``, and ``pp`` slowest (the point-to-point messages
between stages are the rarest). This is Megatron's default order
(tp-dp-pp, fastest first) and torchtitan's; any order of the three names
works, the groups are the mesh's.

What each rank holds. The GPT's layers, in order, ``[embeddings, block 0, ...,
block L-1, ln_f + lm_head]``, are cut into p v contiguous pipeline stages
(:func:`stage_blocks`: blocks balanced, the embeddings with the first blocks,
``ln_f`` and ``lm_head`` with the last); pipeline rank r keeps stages r,
r + p, ... (v virtual stages per rank with ``interleaved_1f1b``). Each stage
is made tensor-parallel over the ``tp`` group by the pieces of
:mod:`~minidist.parallel.tensor.gpt` (:func:`~minidist.parallel.tensor.gpt.shard_block`,
the vocab-parallel embedding and ``lm_head``, optionally sequence
parallelism), and the whole of that is replicated over the ``dp`` group.

What travels where, per batch:

* **tp** (every stage, every micro-batch): the all_reduces of the split
  blocks, 2 per block per pass (or reduce_scatter + all_gather with
  sequence parallelism), the embedding's and the loss's;
* **pp** (between neighbouring stages, the same tp rank on both sides): one
  (b, T, C) activation forward and its gradient back per micro-batch and
  stage boundary (b, T / tp, C with sequence parallelism: each tp rank sends
  its own piece); the first stage reads the token ids, the last the targets
  (the vocab-parallel cross-entropy, the logits never gathered);
* **dp**: one all_reduce of each rank's gradients after the last backward
  (:class:`~minidist.parallel.pipeline.executor.Pipeline`'s);
* **the embedding group** (Megatron's name): ``wte`` is tied to ``lm_head``,
  but the first stage holds one copy and the last stage another. Each copy
  gets the gradient of its own use; their sum is the tied weight's gradient,
  so the two ranks (same dp and tp coordinates, first and last pipeline
  rank) all_reduce it, and both copies then take the same step. With one
  pipeline rank, or a schedule on the V placement (pipeline rank 0 holds
  the first and the last stage: ZB-V, DualPipeV), both ends are one
  Parameter and nothing is sent.
* **clipping** (``step(max_norm=)``): one total norm over the mesh, the tp
  shards' terms summed over tp, the stages' over pp, the dp replicas and
  the tied weight counted once (the last stage's copy is flagged
  ``shared``, Megatron's flag); one all-reduce of one number per group.

Every rank runs :meth:`GPT3D.step` with the same global batch; a replica
trains on its contiguous share. Cost of the model per rank: 1 / (p tp) of
the blocks' weights (plus the embeddings on the end stages).
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist.distributed.device_mesh import DeviceMesh
from minidist.models.gpt import GPT
from minidist.nn.module import Module
from minidist.parallel.pipeline import Pipeline, Schedule, balanced_partition, make_schedule
from minidist.parallel.replicas import all_reduce_gradients
from minidist.parallel.tensor import (
    DEFAULT_ALGORITHM,
    TensorParallelGPT,
    embed_tokens,
    sequence_parallel_parameters,
    vocab_parallel_cross_entropy,
)

MESH_DIMS = ("pp", "dp", "tp")


def stage_blocks(n_layer: int, stages: int) -> list[range]:
    """The blocks of each of ``stages`` pipeline stages: ``[embeddings,
    block 0, ..., block n_layer-1, head]`` cut into contiguous, non-empty
    runs, the blocks balanced (the embeddings and the head count as nothing,
    so they ride with the first and last blocks). A stage may hold only the
    embeddings or only the head when there are n_layer + 2 stages."""
    if stages > n_layer + 2:
        raise ValueError(f"a GPT of {n_layer} blocks has {n_layer + 2} pieces (embeddings, "
                         f"blocks, head) to cut into {stages} pipeline stages; use at most "
                         f"{n_layer + 2} stages (pp x virtual_stages) or more layers")
    costs = [0.0] + [1.0] * n_layer + [0.0]
    cuts = balanced_partition(costs, stages)
    # piece i of the cut is block i - 1 (piece 0 the embeddings, piece n_layer + 1 the head)
    return [range(max(cut.start - 1, 0), min(cut.stop - 1, n_layer)) for cut in cuts]


class _Parts(Module):
    """The container of nanoGPT's names (``wte``, ``wpe``, ``h``, ``ln_f``), so
    a stage's parameters keep the GPT's names: ``transformer.h.3.attn...``."""

    def forward(self, *args):
        raise NotImplementedError("_Parts only holds a stage's modules; call the GPTStage")


class GPTStage(Module):
    """One pipeline stage of a tensor-parallel GPT: the embeddings if first,
    its blocks, ``ln_f`` and ``lm_head`` if last. ``forward`` takes the token
    ids (first stage) or the (B, T, C) residual stream and returns the
    stream, or this tp rank's columns of the logits (last stage).

    Parameters keep the whole GPT's names (``transformer.wte.weight``,
    ``transformer.h.2.mlp.c_fc.weight``, ``lm_head.weight``), each holding
    this tp rank's shard (:func:`~minidist.parallel.tensor.gpt.shard_index`)."""

    def __init__(self, shard: TensorParallelGPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last, self.blocks = bool(first), bool(last), blocks
        self.config = shard.config
        self.tp_rank, self.tp_size = shard.rank, shard.world_size
        self.sequence_parallel = shard.sequence_parallel
        self.group, self.algorithm = shard.group, shard.algorithm
        self.vocab_start = shard.vocab_start
        parts = shard.transformer
        self.transformer = _Parts()
        if first:
            self.transformer.wte, self.transformer.wpe = parts.wte, parts.wpe
        self.transformer.h = _Parts()
        for index in blocks:
            self.transformer.h.add_module(str(index), parts.h[index])
        if last:
            self.transformer.ln_f = parts.ln_f
            self.lm_head = shard.lm_head       # the same Parameter as wte when both are here

    def forward(self, x):
        t = self.transformer
        if self.first:
            x = embed_tokens(t.wte, t.wpe, x, self.config.block_size, self.tp_rank,
                             self.tp_size, self.sequence_parallel, "GPTStage")
        for block in t.h.children():
            x = block(x)
        if self.last:
            x = self.lm_head(t.ln_f(x))
        return x

    def loss(self, logits, targets):
        """The vocab-parallel cross-entropy (the last stage's), the same scalar on every tp rank."""
        return vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.group,
                                            self.algorithm, vocab_size=self.config.vocab_size)

    def extra_repr(self) -> str:
        held = (["embeddings"] if self.first else []) + [f"blocks {self.blocks.start}:"
                                                         f"{self.blocks.stop}"] \
            + (["ln_f, lm_head"] if self.last else [])
        return f"{', '.join(held)}; tp rank {self.tp_rank} of {self.tp_size}"


def gpt_stages(model: GPT, stages: int, tp_group=None, sequence_parallel: bool = False,
               algorithm: str = DEFAULT_ALGORITHM) -> list[GPTStage]:
    """``model`` cut into ``stages`` pipeline stages (:func:`stage_blocks`),
    each made this rank's tensor-parallel shard over ``tp_group``. Every rank
    builds every stage (the Pipeline keeps its own): cheap for the models of
    a course, and every rank's copy starts from the same weights. On one
    rank the first and last stage share the tied ``wte`` / ``lm_head``
    Parameter; across ranks, see :class:`GPT3D`."""
    shard = TensorParallelGPT(model, tp_group, sequence_parallel, algorithm)
    cuts = stage_blocks(model.config.n_layer, stages)
    return [GPTStage(shard, blocks, first=index == 0, last=index == stages - 1)
            for index, blocks in enumerate(cuts)]


def _mesh_axes(mesh) -> np.ndarray:
    """The mesh's global ranks as an array indexed [pp, dp, tp]."""
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"GPT3D takes a DeviceMesh (init_device_mesh), got {type(mesh).__name__}")
    names = mesh.mesh_dim_names or ()
    if sorted(names) != sorted(MESH_DIMS):
        raise ValueError(f"GPT3D needs a mesh with the dimensions named 'pp', 'dp' and 'tp' "
                         f"(sizes of 1 allowed), got {names or mesh.shape}; make it with "
                         "init_device_mesh('cpu', (pp, dp, tp), mesh_dim_names=('pp', 'dp', 'tp'))")
    if mesh.size() != dist.get_world_size():
        raise ValueError("GPT3D needs the whole mesh, not a sub-mesh of it")
    return np.moveaxis(mesh.mesh, [names.index(n) for n in MESH_DIMS], [0, 1, 2])


def _pipeline_words(key: tuple) -> str:
    schedule, microbatches, virtual = key
    return (f"schedule {schedule!r}, {microbatches} micro-batches, {virtual} virtual "
            f"stage{'s' if virtual != 1 else ''}")


class GPT3D:
    """A GPT trained on a DP x TP x PP device mesh (see the module docstring).

    ``GPT3D(model, mesh, schedule="1f1b", microbatches=2, virtual_stages=1,
    sequence_parallel=False)``: every rank passes the same ``model`` (same
    seed) and the same mesh. ``schedule`` is a name of :func:`make_schedule`
    (the zero-bubble ones among them) or a :class:`Schedule` built for the
    mesh's pp ranks, whose micro-batches and virtual stages are then used.
    :meth:`parameters` are this rank's shards (for its optimizer),
    :meth:`step` trains on one global batch.
    """

    def __init__(self, model: GPT, mesh, schedule="1f1b", microbatches: int = 2, *,
                 virtual_stages: int = 1, sequence_parallel: bool = False,
                 algorithm: str = DEFAULT_ALGORITHM):
        axes = _mesh_axes(mesh)
        if not isinstance(schedule, Schedule):
            schedule = make_schedule(schedule, mesh.size("pp"), microbatches, virtual_stages)
        microbatches, virtual_stages = schedule.microbatches, schedule.virtual_stages
        # Every rank of the mesh builds its stage now: all must run one
        # schedule, or they would exchange other messages (or train to other
        # weights). Agreed over the world when the mesh is the world, so that
        # a majority names the odd rank even where a pipeline has two stages
        # (a mesh of part of the world: over its pipeline group).
        whole = mesh.size() == dist.get_world_size()
        dist.agree("GPT3D", (schedule.name, int(microbatches), int(virtual_stages)),
                   group=None if whole else mesh.get_group("pp"), describe=_pipeline_words,
                   hint="Build every rank's GPT3D with the same schedule, micro-batches and "
                        "virtual stages.")
        self.mesh = mesh
        self.pp, self.dp, self.tp = (mesh.size(name) for name in MESH_DIMS)
        self.tp_group = mesh.get_group("tp")
        self.stages = gpt_stages(model, self.pp * virtual_stages, self.tp_group,
                                 sequence_parallel, algorithm)
        self.embedding_group = self._embedding_group(axes, schedule)
        self.pipeline = Pipeline(self.stages, schedule,
                                 pipeline_group=mesh.get_group("pp"),
                                 data_parallel_group=mesh.get_group("dp"),
                                 finalize_grads=self.finalize_grads)
        self.chunks = self.pipeline.chunks
        self.sequence_parallel = bool(sequence_parallel)
        # The last stage's copy of the tied weight is the first stage's, once
        # their gradients are summed: clipping counts the first one only
        # (Megatron's ``shared`` flag; each rank holds its own object).
        tied = self.tied_parameter()
        if self.embedding_group is not None and tied is not None and not any(
                chunk.first for chunk in self.chunks):
            tied.shared = True

    def _embedding_group(self, axes: np.ndarray, schedule: Schedule):
        """The two ranks that hold ``wte`` (first stage, pipeline rank 0) and
        ``lm_head`` (last stage, pipeline rank p - 1 on the loop placement)
        for this rank's dp and tp coordinates; None when one pipeline rank
        holds both (one rank, the V placement) or off its ends. Every rank
        makes every such group, in the same order (``new_group``'s rule)."""
        first = schedule.rank_of(0)[0]
        last = schedule.rank_of(schedule.total_stages - 1)[0]
        if first == last:
            return None
        me, mine = dist.get_rank(), None
        for d in range(self.dp):
            for t in range(self.tp):
                members = [int(axes[first, d, t]), int(axes[last, d, t])]
                group = dist.new_group(members)
                if me in members:
                    mine = group
        return mine

    # ------------------------------------------------------------------ queries

    def parameters(self) -> list:
        """This rank's parameters (its stages' shards), for its optimizer."""
        return self.pipeline.parameters()

    def named_parameters(self) -> dict:
        """{GPT name: this rank's shard} of this rank's stages."""
        named = {}
        for chunk in self.chunks:
            named.update(chunk.named_parameters())
        return named

    def tied_parameter(self):
        """This rank's copy of the tied ``wte`` / ``lm_head`` weight, or None."""
        for chunk in self.chunks:
            if chunk.first:
                return chunk.transformer.wte.weight
            if chunk.last:
                return chunk.lm_head.weight
        return None

    # ------------------------------------------------------------------ training

    def finalize_grads(self) -> None:
        """After the backwards and the data-parallel all_reduce: sum the tied
        weight's two gradients over the embedding group, and, with sequence
        parallelism, the sequence-sharded parameters' over the tp group."""
        tied = self.tied_parameter()
        if self.embedding_group is not None and tied is not None:
            all_reduce_gradients([tied], self.embedding_group)
        if self.sequence_parallel:
            all_reduce_gradients([param for chunk in self.chunks
                                  for _, param in sequence_parallel_parameters(chunk)],
                                 self.tp_group)

    def step(self, idx, targets, optimizer, *, max_norm: float | None = None,
             norm_type: float = 2.0):
        """One training step on the global batch (``idx`` and ``targets``,
        (B, T) token ids, the same on every rank): this rank's replica takes
        its share of the B sequences, the pipeline runs its schedule, the
        gradients are reduced over dp, the embedding group (and tp with
        sequence parallelism), ``optimizer`` steps. Returns the replica's
        mean loss on the last pipeline stage's ranks, None elsewhere.

        ``max_norm``: clip first, the total norm over the whole mesh: the tp
        shards summed over tp, the stages over pp, the dp replicas counted
        once, the tied weight once (:meth:`Pipeline.step`; the norm is then
        ``self.pipeline.total_norm``)."""
        replica = dist.get_rank(self.mesh.get_group("dp")) if self.dp > 1 else 0
        idx = np.array_split(np.asarray(idx), self.dp)[replica]
        targets = np.array_split(np.asarray(targets), self.dp)[replica]
        last = next((chunk for chunk in self.chunks if chunk.last), None)
        loss_fn = last.loss if last is not None else None
        return self.pipeline.step(idx, targets, loss_fn, optimizer, max_norm=max_norm,
                                  norm_type=norm_type)


__all__ = ["GPT3D", "GPTStage", "gpt_stages", "stage_blocks", "MESH_DIMS"]
