"""Tensor (and sequence) parallelism: one layer's weight matrix split across
the ranks of a group (Megatron-LM).

Read in this order:

1. :mod:`.regions`: the communication regions, the autograd functions whose
   forward or backward is a collective;
2. :mod:`.layers`: ``ColumnParallelLinear`` and ``RowParallelLinear`` built
   on them;
3. :mod:`.vocab`: the vocabulary split (embedding and cross-entropy);
4. :mod:`.gpt`: the GPT split by heads and by the MLP's columns, with
   sequence parallelism;
5. :mod:`.costs`: the GPT's bytes and activation memory, by formula.

This face is what the other families use (the model family's DistBelief and
hybrid take the regions and split layers, the context family a region, the
mesh family the GPT's pieces, the placements family the split layer of its
``PackedColwiseParallel``). torch's ``ColwiseParallel``, ``RowwiseParallel``
and ``parallelize_module`` are the placements family's: the same splits as
DTensor layouts.
"""

from __future__ import annotations

from minidist.parallel.tensor.costs import (  # noqa: F401
    ActivationBytes,
    StepBytes,
    format_step_bytes,
    gpt_activation_bytes,
    gpt_step_bytes,
    ring_reduce_scatter_sent,
    sequence_parallel_values,
)
from minidist.parallel.tensor.gpt import (  # noqa: F401
    TensorParallelGPT,
    embed_tokens,
    qkv_rows,
    sequence_parallel_parameters,
    shard_block,
    shard_index,
    tensor_parallel_gpt,
)
from minidist.parallel.tensor.layers import (  # noqa: F401
    ColumnParallelLinear,
    RowParallelLinear,
    packed_rows,
)
from minidist.parallel.tensor.regions import (  # noqa: F401
    DEFAULT_ALGORITHM,
    copy_to_parallel_region,
    gather_from_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_parallel_region,
)
from minidist.parallel.tensor.vocab import (  # noqa: F401
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
    vocab_range,
)

__all__ = ["DEFAULT_ALGORITHM", "copy_to_parallel_region", "reduce_from_parallel_region",
           "gather_from_parallel_region", "scatter_to_parallel_region",
           "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
           "packed_rows", "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy", "vocab_range", "TensorParallelGPT",
           "tensor_parallel_gpt", "qkv_rows", "sequence_parallel_parameters", "shard_block",
           "embed_tokens", "shard_index", "gpt_step_bytes", "gpt_activation_bytes",
           "format_step_bytes", "StepBytes", "ActivationBytes", "ring_reduce_scatter_sent",
           "sequence_parallel_values"]
