"""minidist.parallel: the ways of training on many ranks, one folder per family.

========================  ==============================================================
family                    what it splits, and where to start reading
========================  ==============================================================
``data/``                 the batch: DDP, compression hooks, ZeRO, FSDP, SyncBatchNorm,
                          checkpoint files, batch inference (start: ``ddp.py``)
``parameter_server/``     the weights onto servers: synchronous and asynchronous servers,
                          fault-tolerant servers, Hogwild, D2P, stragglers (``server.py``)
``model/``                the course's model parallelism: DistBelief, the conv/dense
                          hybrid, conv splits, a dense layer's bytes (``distbelief.py``)
``tensor/``               one layer's weight matrix (Megatron): regions, split layers,
                          the vocabulary, the GPT, torch's styles (``regions.py``)
``context/``              the sequence: the zig-zag split, ring attention, Ulysses, the
                          GPT (``split.py``)
``expert/``               a mixture's experts: the all_to_all dispatch (``dispatch.py``)
``pipeline/``             the layers into stages: schedules as data, the virtual clock,
                          the runtime (``schedules.py``)
``mesh/``                 several at once: the GPT on dp x tp x pp, the 3D planner
                          (``gpt_3d.py``)
========================  ==============================================================

Each family's ``__init__`` gives its reading order (communication, then the
layers, then the model, then the costs) and is its face: a family uses
another only through that face. Below the families, :mod:`.replicas` is the
glue they share (the same start with ``broadcast_module``, the same step with
``all_reduce_gradients``). What comes next finds its home the same way:
sharding as placements beside ``data/`` and ``tensor/``, training that
survives failures in a family of its own, local SGD beside ``data/``.

Every public name of every family is also a name of this package, imported
on first use (``from minidist.parallel import Pipeline``), so that importing
one strategy does not import them all. torch's names read as torch users
write them: ``DistributedDataParallel`` (``torch.nn.parallel``),
``FullyShardedDataParallel`` and ``ShardingStrategy``
(``torch.distributed.fsdp``), ``ZeroRedundancyOptimizer``
(``torch.distributed.optim``), ``SyncBatchNorm``, ``parallelize_module``,
``ColwiseParallel``, ``RowwiseParallel``
(``torch.distributed.tensor.parallel``). Three names are in two families each and
are not here: ``DEFAULT_ALGORITHM``, ``STRATEGIES`` and ``format_table``;
import them from their family. The paths of before the families still import, with a
warning naming the new one (:mod:`.moved`).
"""

from __future__ import annotations

import importlib

from minidist.parallel import moved as _moved

_moved.install()

#: family -> the public names its face exports (a test holds this table to the faces)
FAMILIES = {
    "data": (
        "CoordinatorDataParallel", "GradBucket", "DistributedDataParallel",
        "ErrorFeedbackState", "Int8State", "ThresholdState", "TopKState",
        "RandomKState", "PowerSGDState", "quantize_int8", "truncate_bf16",
        "expand_bf16", "orthogonalize", "compress_sign", "compress_threshold",
        "compress_topk", "compress_randomk", "allreduce_hook", "fp16_compress_hook",
        "bf16_compress_hook", "int8_hook", "sign_hook", "threshold_hook", "topk_hook",
        "randomk_hook", "powersgd_hook", "HOOKS", "ZeroRedundancyOptimizer",
        "ShardingStrategy", "FreedParameter", "freed_parameter",
        "FullyShardedDataParallel", "STAGES", "wrap", "zero_model_state_bytes",
        "zero_bytes_per_step", "SyncBatchNorm", "sync_batch_norm",
        "sync_batchnorm_bytes", "FORMAT", "VERSION", "save_checkpoint",
        "load_checkpoint", "parallel_predict", "predict", "shard_bounds", "OUTPUTS",
    ),
    "parameter_server": (
        "MODES", "ORDERS", "NO_STEP", "shard_ranges", "Layout", "Request",
        "HEADER_SIZE", "Push", "PushRecord", "ServerResult", "WorkerResult",
        "PendingPush", "ServerShard", "flat_parameters", "load_flat_parameters",
        "ParameterServer", "FAULT_TOLERANT_MODES", "CRASH_MOMENTS", "RANGE_TAG_STRIDE",
        "POLL_SECONDS", "REQUEST_SIZE", "IDENTITY_SIZE", "ServerCrash",
        "ReplicatedShard", "RangeCopy", "RangeReport", "FaultTolerantServerResult",
        "Failover", "FaultTolerantWorkerResult", "final_weights",
        "FaultTolerantParameterServer", "WEIGHTS", "WRITES", "SparseRows",
        "logistic_loss", "sgd_update", "example_order", "learning_rates", "serial_sgd",
        "shared_arrays", "updates_of_rank", "pass_length_of_rank", "hogwild_worker",
        "HogwildResult", "run_hogwild", "SERVER", "soft_threshold", "block_bounds",
        "block_order", "shard_rows", "objective", "shard_block_gradient",
        "significant_positions", "sum_in_worker_order", "proximal_block_step",
        "default_step_size", "D2PResult", "max_delay_schedule",
        "delayed_proximal_reference", "delayed_proximal_gradient", "Straggler",
    ),
    "model": (
        "DEFAULT_EXCHANGE_ALGORITHM", "DEFAULT_GATHER_ALGORITHM",
        "exchange_activations", "PartitionedLinear", "DistBeliefMLP",
        "DistBeliefTraffic", "distbelief_bytes", "all_gather_batch", "gather_batch",
        "split_at_first_linear", "HybridParallel", "DenseModelParallel", "LayerTraffic",
        "StrategyBytes", "STRATEGY_NAMES", "strategy_bytes", "format_strategy_table",
        "ChannelParallelConv2d", "SpatialParallelConv2d", "band", "halo_plan",
        "HaloPlan", "halo_context", "channel_parallel_bytes", "Traffic", "SplitBytes",
        "split_bytes",
    ),
    "tensor": (
        "copy_to_parallel_region", "reduce_from_parallel_region",
        "gather_from_parallel_region", "scatter_to_parallel_region",
        "gather_from_sequence_parallel_region",
        "reduce_scatter_to_sequence_parallel_region", "packed_rows",
        "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
        "vocab_parallel_cross_entropy", "vocab_range", "TensorParallelGPT",
        "tensor_parallel_gpt", "qkv_rows", "sequence_parallel_parameters",
        "shard_block", "embed_tokens", "shard_index", "ParallelStyle",
        "ColwiseParallel", "RowwiseParallel", "PackedColwiseParallel",
        "parallelize_module", "gpt_step_bytes", "gpt_activation_bytes",
        "format_step_bytes", "StepBytes", "ActivationBytes", "ring_reduce_scatter_sent",
        "sequence_parallel_values",
    ),
    "context": (
        "LAYOUTS", "FULL", "DIAGONAL", "SKIP", "rank_chunks", "rank_positions",
        "shard_sequence", "pair_kind", "block_work", "ring_attention", "merge",
        "KV_TAG", "GRAD_TAG", "ulysses_attention", "sequence_to_heads",
        "heads_to_sequence", "ALGORITHM", "ContextParallelGPT", "context_parallel_gpt",
        "ATTENTIONS", "AttentionBytes", "ring_attention_bytes", "ulysses_bytes",
        "format_attention_bytes",
    ),
    "expert": (
        "ExpertParallelMoE", "Dispatch", "all_to_all_rows", "exchange_counts",
        "expert_range", "expert_parallel_gpt", "allreduce_moe_grads",
        "expert_parameters", "dispatch_matrix", "dispatch_bytes", "DispatchBytes",
        "balanced_dispatch_bytes", "dense_mlp_all_reduce_bytes", "COUNT_BYTES",
    ),
    "pipeline": (
        "FORWARD", "BACKWARD", "SEND_ACTIVATION", "RECV_ACTIVATION", "SEND_GRAD",
        "RECV_GRAD", "OPTIMIZER_STEP", "KINDS", "PHASES", "UNIT_NS", "Action",
        "Schedule", "gpipe", "one_f_one_b", "interleaved_one_f_one_b",
        "schedule_from_order", "SCHEDULES", "make_schedule", "message_tag",
        "DeadlockError", "simulate_schedule", "bubble_fraction",
        "peak_live_microbatches", "compute_text", "compute_label", "step_label",
        "message_label", "memory_label", "balanced_partition", "layer_costs",
        "split_model", "split_microbatches", "Pipeline", "annotate_trace",
    ),
    "mesh": (
        "GPT3D", "GPTStage", "gpt_stages", "stage_blocks", "MESH_DIMS",
        "DROPOUT_MASK_BYTES", "ZERO_COLLECTIVES", "GPTShape", "Machine", "CLUSTER",
        "Plan", "why_not", "CollectiveCost", "StepPrediction", "parameters_per_rank",
        "predict_step", "peak_live", "factorisations", "PlanComparison",
        "compare_plans", "PlaybookChoice", "playbook_plan", "plan_command",
    ),
}

_FAMILY_OF = {name: family for family, names in FAMILIES.items() for name in names}

__all__ = sorted(_FAMILY_OF)


def __getattr__(name):
    family = _FAMILY_OF.get(name)
    if family is None:
        raise AttributeError(f"module 'minidist.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"minidist.parallel.{family}"), name)
    globals()[name] = value   # the next lookup is an ordinary attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
