"""Context parallelism: the sequence cut across ranks, attention computed
across them.

Read in this order:

1. :mod:`.split`: which positions each rank holds (the zig-zag split);
2. :mod:`.ring_attention`: keys and values passed round a ring, merged by
   the online softmax;
3. :mod:`.ulysses`: the sequence split swapped for a head split by all_to_all;
4. :mod:`.gpt`: the GPT with either attention, through its one hook;
5. :mod:`.costs`: what each attention sends, by formula.

From another family: one communication region of the tensor family
(through :mod:`minidist.parallel.tensor`), for the loss's sum.
"""

from __future__ import annotations

from minidist.parallel.context.costs import (  # noqa: F401
    AttentionBytes,
    format_attention_bytes,
    ring_attention_bytes,
    ulysses_bytes,
)
from minidist.parallel.context.gpt import (  # noqa: F401
    ATTENTIONS,
    ContextParallelGPT,
    context_parallel_gpt,
)
from minidist.parallel.context.ring_attention import (  # noqa: F401
    GRAD_TAG,
    KV_TAG,
    merge,
    ring_attention,
)
from minidist.parallel.context.split import (  # noqa: F401
    DIAGONAL,
    FULL,
    LAYOUTS,
    SKIP,
    block_work,
    pair_kind,
    rank_chunks,
    rank_positions,
    shard_sequence,
)
from minidist.parallel.context.ulysses import (  # noqa: F401
    ALGORITHM,
    heads_to_sequence,
    sequence_to_heads,
    ulysses_attention,
)

__all__ = ["LAYOUTS", "FULL", "DIAGONAL", "SKIP", "rank_chunks", "rank_positions",
           "shard_sequence", "pair_kind", "block_work", "ring_attention", "merge", "KV_TAG",
           "GRAD_TAG", "ulysses_attention", "sequence_to_heads", "heads_to_sequence", "ALGORITHM",
           "ContextParallelGPT", "context_parallel_gpt", "ATTENTIONS", "AttentionBytes",
           "ring_attention_bytes", "ulysses_bytes", "format_attention_bytes"]
